"""The chart's RBAC, from the operator's own traffic on the real API server.

The chart is installed in each mode with two replicas in peering (the HA configuration); the
operator, in its pod under the chart's ServiceAccount, lives a short story (create a one-member
cluster, scale it to two, delete it). The API server enforces the rendered roles, and its audit
log (`make cluster` records ServiceAccounts' requests) says what the operator asked for: nothing
was refused, nothing left its scope, and every grant was used or is listed below with the reason
the story cannot show it. Cluster-wide, the story's cluster lives in another namespace; after
`helm uninstall` nothing of the release is left, cluster-scoped roles included.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.k8s import kube

AUDIT_LOG = kube.ROOT / ".cluster" / "logs" / "audit.log"
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
ANSWERED = ("ResponseStarted", "ResponseComplete")

# Granted although the story does not show it, and why.
NOT_SEEN_HERE: dict[Grant, str] = {
    ("", "persistentvolumeclaims", "patch"): (
        "volume expansion only (spec.storage.size raised): tests/k8s/test_day2.py asks it"
    ),
    ("raftlog.dev", "raftclusters/finalizers", "update"): (
        "not a call: kopf.adopt sets blockOwnerDeletion on the members' owner references, which "
        "API servers running the OwnerReferencesPermissionEnforcement admission plugin (not a "
        "default one) authorize against this grant"
    ),
    **{
        (group, resource, "create"): (
            "a server-side apply that creates the object is authorized as a create as well as a "
            "patch (the API server refuses it otherwise); the audit log records it as a patch"
        )
        for group, resource in (("", "services"), ("policy", "poddisruptionbudgets"))
    },
}


@dataclass(frozen=True)
class Call:
    group: str
    resource: str  # with "/subresource" when there is one
    verb: str
    namespace: str | None  # None: cluster-scoped, or across every namespace
    code: int


def calls_of(user: str, since: float, until: float) -> list[Call]:
    """The audit log's answered requests of `user` (received in [since, until)), once each.

    A watch is logged as ResponseComplete only when it ends, which can be well after the
    operator's pod is gone; its ResponseStarted (long-running requests only) says it was
    allowed and served. A refused request has ResponseComplete alone.
    """
    out, seen = [], set()
    for line in AUDIT_LOG.read_text().splitlines():
        ev = json.loads(line)
        if ev["user"]["username"] != user or ev["stage"] not in ANSWERED:
            continue
        if ev["auditID"] in seen:
            continue
        seen.add(ev["auditID"])
        if not since <= kube.parse_time(ev["requestReceivedTimestamp"]) < until:
            continue
        ref = ev.get("objectRef")
        if ref is None:  # discovery (/api, /apis/...): allowed to every user
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        out.append(Call(ref.get("apiGroup", ""), resource, ev["verb"], ref.get("namespace"),
                        ev.get("responseStatus", {}).get("code", 0)))  # fmt: skip
    return out


def grants(ns: str, release: str) -> tuple[set[Grant], set[Grant]]:
    """(cluster-wide, in `ns`) grants of the release's ServiceAccount, read from the cluster."""
    subject = {"kind": "ServiceAccount", "name": release, "namespace": ns}

    def rules_grants(rules: list[dict[str, Any]]) -> set[Grant]:
        return {(g, r, v) for rule in rules for g in rule["apiGroups"]
                for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip

    cluster: set[Grant] = set()
    for b in kube.items("clusterrolebindings"):
        if subject in (b.get("subjects") or []):
            cluster |= rules_grants(kube.get("clusterrole", b["roleRef"]["name"])["rules"])
    local: set[Grant] = set()
    for b in kube.items("rolebindings", ns):
        if subject in (b.get("subjects") or []):
            kind = "role" if b["roleRef"]["kind"] == "Role" else "clusterrole"
            role = kube.get(kind, b["roleRef"]["name"], ns if kind == "role" else None)
            local |= rules_grants(role["rules"])
    return cluster, local


def settled(ns: str, n: int) -> bool:
    st = kube.get("raftcluster", "rbac", ns).get("status") or {}
    members = st.get("members", [])
    return len(members) == n and all(m["role"] == "voter" and m["ready"] for m in members)


# Cluster-wide, the operator would also act on the RaftClusters of the tests beside it.
@pytest.mark.parametrize(
    "mode", ["namespaced", pytest.param("cluster", marks=pytest.mark.cluster_wide)]
)
def test_every_call_is_allowed_and_every_grant_is_used(
    namespace: str, other_namespace: str, mode: str
) -> None:
    """Cluster-wide, the story's RaftCluster lives in another namespace than the release."""
    ns, release = namespace, kube.RELEASE
    where = other_namespace if mode == "cluster" else ns
    since = time.time() - 1
    kube.helm("install", release, str(kube.CHART), "-n", ns, "--set", f"watch.mode={mode}",
              "--set", "replicaCount=2", "--wait", "--timeout", "180s")  # fmt: skip
    try:
        body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
                "metadata": {"name": "rbac"},
                "spec": {"replicas": 1, "partitions": 1,
                         "raft": {"learnerPromotionStableWindow": 0.5},
                         "resources": {"requests": {"cpu": "100m"}}}}  # fmt: skip
        kube.kubectl("apply", "-n", where, "-f", "-", stdin=json.dumps(body))
        kube.until("one voter ready", lambda: settled(where, 1), 180)
        kube.kubectl("scale", "raft/rbac", "-n", where, "--replicas", "2")
        kube.until("two voters ready", lambda: settled(where, 2), 180)
        kube.kubectl("delete", "raft", "rbac", "-n", where, "--timeout=120s")
        members = "raftlog.dev/cluster=rbac"
        kube.until("members gone", lambda: not kube.items("pods", where, members), 120)
        cluster, local = grants(ns, release)
    finally:
        # helm deletes the roles and the Deployment together: the operator's last calls on its
        # way out (leaving the peering) may find its grants gone; they are not the story's.
        until = time.time()
        kube.helm("uninstall", release, "-n", ns, "--wait", "--timeout", "120s")
    calls = kube.until(
        "the audit log has the operator's calls",
        lambda: calls_of(f"system:serviceaccount:{ns}:{release}", since, until) or None, 30,
    )  # fmt: skip
    refused = sorted({c for c in calls if c.code == 403}, key=str)
    assert refused == [], f"{mode}: the API server refused the operator: {refused}"

    def allowed(c: Call) -> bool:
        grant = (c.group, c.resource, c.verb)
        return grant in cluster or (c.namespace == ns and grant in local)

    assert [c for c in calls if not allowed(c)] == []
    used = {(c.group, c.resource, c.verb) for c in calls}
    unused = (cluster | local) - used - set(NOT_SEEN_HERE)
    assert unused == set(), f"{mode}: granted but never used: {sorted(unused)}"
    expected = {
        ("raftlog.dev", "raftclusters", "watch"),
        ("raftlog.dev", "raftclusters/status", "patch"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "events", "create"),
        ("", "services", "patch"),
        ("policy", "poddisruptionbudgets", "patch"),
        ("kopf.dev", "clusterkopfpeerings" if mode == "cluster" else "kopfpeerings", "patch"),
    }
    assert expected <= used, expected - used
    if mode == "namespaced":  # no call leaves the watched namespace (kopf's scanning is off)
        assert all(c.namespace == ns for c in calls), [c for c in calls if c.namespace != ns]
    else:
        assert ("", "namespaces", "list") not in used
    # helm uninstall leaves nothing of the release, its cluster-scoped roles included.
    kube.until("nothing of the release left", lambda: kube.release_objects(ns) == [], 120)
    kube.say(f"rbac {mode}: {len(calls)} calls, {len(used)} grants used, none refused")
