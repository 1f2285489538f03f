"""RBAC from the operator's own traffic: the real operator process, started with the arguments
the chart gives it, runs a short story against the API emulator (create a cluster, scale it,
delete it) with kopf peering on; every recorded API call, mapped to (apiGroup, resource, verb),
must be allowed by the Role/ClusterRole the chart renders for that mode, and every grant must
have been used or be listed below with the reason the story cannot show it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from tests.chart.helm import objects
from tests.loopback import free_loopback_net
from tests.operator import kube_emulator
from tests.operator.kube_emulator import Cluster

from raftlog.node.local import free_ports

pytestmark = [pytest.mark.chart, pytest.mark.slow]

SA = ("raftlog-system", "raftlog-operator")  # the chart's ServiceAccount (namespace, name)
NS = "default"
PEERING = "raftlog-operator"
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# Granted although the story does not show it, and why.
NOT_SEEN_HERE: dict[Grant, str] = {
    ("raftlog.dev", "raftclusters/finalizers", "update"): (
        "kopf.adopt sets blockOwnerDeletion on the members' owner references; API servers with "
        "the OwnerReferencesPermissionEnforcement admission plugin then require this grant "
        "(the emulator runs no admission)"
    ),
}

# chart mode -> values; both run with peering (two replicas), the HA configuration.
MODES: dict[str, dict[str, Any]] = {
    "cluster": {"watch": {"mode": "cluster"}, "replicaCount": 2},
    "namespaced": {"watch": {"mode": "namespaced", "namespaces": [NS]}, "replicaCount": 2},
}


@dataclass(frozen=True)
class Call:
    group: str
    resource: str  # with "/subresource" when there is one
    verb: str
    namespace: str | None  # None: cluster-scoped, or across every namespace


def to_call(method: str, path: str, query: str) -> Call | None:
    """An API request as RBAC sees it; None for discovery (allowed to every user)."""
    parts = [p for p in path.split("/") if p]
    if parts in (["api"], ["apis"], ["api", "v1"]) or (len(parts) == 3 and parts[0] == "apis"):
        return None
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    watch = parse_qs(query).get("watch", [""])[0] in ("true", "1")
    verb = {
        "GET": ("watch" if watch else "list") if len(rest) == 1 else "get",
        "POST": "create",
        "PATCH": "patch",
        "PUT": "update",
        "DELETE": "delete" if len(rest) > 1 else "deletecollection",
    }[method]
    return Call(group, resource, verb, namespace)


def _grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


class Rbac:
    """The rendered roles as the API server's RBAC authorizer reads them for the operator."""

    def __init__(self, objs: list[dict[str, Any]]) -> None:
        subject = {"kind": "ServiceAccount", "namespace": SA[0], "name": SA[1]}
        roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
                 for o in objs if o["kind"] in ("Role", "ClusterRole")}  # fmt: skip
        self.cluster: set[Grant] = set()
        self.namespaced: dict[str, set[Grant]] = {}
        for b in objs:
            if (
                b["kind"] not in ("RoleBinding", "ClusterRoleBinding")
                or subject not in b["subjects"]
            ):
                continue
            ref = b["roleRef"]
            ns = b["metadata"].get("namespace")
            rules = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
            if b["kind"] == "ClusterRoleBinding":
                self.cluster |= _grants(rules)
            else:
                self.namespaced.setdefault(ns, set()).update(_grants(rules))

    def allows(self, call: Call) -> bool:
        grant = (call.group, call.resource, call.verb)
        if grant in self.cluster:
            return True
        return call.namespace is not None and grant in self.namespaced.get(call.namespace, set())

    def granted(self) -> set[Grant]:
        return self.cluster.union(*self.namespaced.values())


def operator_args(objs: list[dict[str, Any]]) -> list[str]:
    [deploy] = [o for o in objs if o["kind"] == "Deployment"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["raftlog-operator"]
    return list(container["args"])


class Story:
    def __init__(self, root: Path, values: dict[str, Any]) -> None:
        self.root = root
        self.objs = objects(values)
        self.k8s = Cluster(root)
        self.k8s.start()
        self.net = free_loopback_net()
        self.health = free_ports(1)[0]
        clusterwide = values["watch"]["mode"] == "cluster"
        kind = "ClusterKopfPeering" if clusterwide else "KopfPeering"
        plural = "clusterkopfpeerings" if clusterwide else "kopfpeerings"
        peering = {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": {"name": PEERING}}
        self.k8s.call(lambda: self.k8s.emu.create(plural, "" if clusterwide else NS, peering))
        # The chart's own arguments; only the liveness address moves to a free local port.
        args = [a for a in operator_args(self.objs) if not a.startswith("--liveness=")]
        assert f"--peering={PEERING}" in args and "--standalone" not in args
        env = {
            **os.environ,
            "KUBECONFIG": str(self.k8s.kubeconfig()),
            "POD_ID": "raftlog-operator-0",
            "RAFTLOG_OPERATOR_MEMBER_URL": f"http://127.{self.net}.{{ordinal}}.1:{{port}}",
            "RAFTLOG_OPERATOR_INTERVAL_S": "0.3",
            "RAFTLOG_OPERATOR_METRICS_PORT": "0",
        }
        with (root / "operator.log").open("ab") as log:
            self.operator = subprocess.Popen(
                [sys.executable, "-m", "raftlog.operator.main", *args,
                 f"--liveness=http://127.0.0.1:{self.health}/healthz"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def close(self) -> None:
        if self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(20)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait()
        self.k8s.stop()

    def until(self, what: str, pred: Callable[[], Any], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if out := pred():
                return out
            time.sleep(0.2)
        tail = (self.root / "operator.log").read_text()[-3000:]
        raise AssertionError(f"{what}: not within {timeout} s\n{tail}")

    def emu(self, fn: Callable[[kube_emulator.Emulator], Any]) -> Any:
        return self.k8s.call(lambda: fn(self.k8s.emu))

    def settled(self, n: int) -> bool:
        obj = self.emu(lambda e: e.get("raftclusters", NS, "rbac")) or {}
        members = (obj.get("status") or {}).get("members", [])
        return len(members) == n and all(m["role"] == "voter" and m["ready"] for m in members)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def run(self) -> list[Call]:
        """Create a one-member cluster, scale it to two (a learner, promoted), delete it."""
        self.until("kopf's liveness endpoint answers", self.healthy, 30)
        body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
                "metadata": {"name": "rbac"},
                "spec": {"replicas": 1, "partitions": 1,
                         "raft": {"learnerPromotionStableWindow": 0.5}}}  # fmt: skip
        self.emu(lambda e: e.create("raftclusters", NS, body))
        self.until("one voter ready", lambda: self.settled(1))
        self.emu(lambda e: e.patch("raftclusters", NS, "rbac", {"spec": {"replicas": 2}}))
        self.until("two voters ready", lambda: self.settled(2), 90)
        self.emu(lambda e: e.delete("raftclusters", NS, "rbac"))
        self.until(
            "everything removed",
            lambda: self.emu(lambda e: e.get("raftclusters", NS, "rbac") is None
                             and not e.list("pods", NS) and not e.list("secrets", NS)),
        )  # fmt: skip
        peers = self.emu(lambda e: e.list("clusterkopfpeerings", None) + e.list("kopfpeerings", NS))
        assert "raftlog-operator-0" in peers[0].get("status", {}), peers  # kopf's keep-alive
        calls = list(self.k8s.emu.calls)
        return [c for c in (to_call(*call) for call in calls) if c is not None]


@pytest.fixture
def peering_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """kopf's peering resources served by the emulator (the chart ships their CRDs)."""
    monkeypatch.setitem(
        kube_emulator.GROUPS,
        ("kopf.dev", "v1"),
        {
            "kopfpeerings": ("KopfPeering", True),
            "clusterkopfpeerings": ("ClusterKopfPeering", False),
        },
    )
    yield


def test_to_call_maps_requests_as_rbac_does():
    assert to_call("GET", "/apis/raftlog.dev/v1alpha1/raftclusters", "watch=true&x=1") == Call(
        "raftlog.dev", "raftclusters", "watch", None
    )
    assert to_call("GET", "/api/v1/namespaces/d/pods", "labelSelector=a%3Db") == Call(
        "", "pods", "list", "d"
    )
    assert to_call("GET", "/api/v1/namespaces/d/secrets/s", "") == Call("", "secrets", "get", "d")
    assert to_call(
        "PATCH", "/apis/raftlog.dev/v1alpha1/namespaces/d/raftclusters/c/status", ""
    ) == Call("raftlog.dev", "raftclusters/status", "patch", "d")
    assert to_call("DELETE", "/api/v1/namespaces/d/pods/p", "") == Call("", "pods", "delete", "d")
    assert to_call("POST", "/apis/policy/v1/namespaces/d/poddisruptionbudgets", "") == Call(
        "policy", "poddisruptionbudgets", "create", "d"
    )
    assert to_call("GET", "/apis/policy/v1", "") is None and to_call("GET", "/api", "") is None


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_call_is_allowed_and_every_grant_is_used(mode, tmp_path, peering_api):
    story = Story(tmp_path, MODES[mode])
    try:
        calls = story.run()
    finally:
        story.close()
    rbac = Rbac(story.objs)
    used = {(c.group, c.resource, c.verb) for c in calls}
    denied = sorted({c for c in calls if not rbac.allows(c)}, key=str)
    assert denied == [], f"{mode}: the chart's RBAC denies calls the operator makes: {denied}"
    unused = rbac.granted() - used - set(NOT_SEEN_HERE)
    assert unused == set(), f"{mode}: granted but never used: {sorted(unused)}"
    # The story did exercise what it is meant to show (a regression in it would hide grants).
    expected = {
        ("raftlog.dev", "raftclusters", "watch"),
        ("raftlog.dev", "raftclusters/status", "patch"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "persistentvolumeclaims", "delete"),
        ("", "events", "create"),
        ("kopf.dev", "clusterkopfpeerings" if mode == "cluster" else "kopfpeerings", "patch"),
    }
    assert expected <= used, expected - used
    if mode == "namespaced":  # no call leaves the watched namespace (kopf's scanning is off)
        assert all(c.namespace == NS for c in calls), [c for c in calls if c.namespace != NS]
    else:
        assert ("", "namespaces", "list") not in used
    print(f"{mode}: {len(calls)} calls, grants used: {sorted(used)}")


def test_the_rbac_reading_scopes_roles_to_their_namespace():
    rbac = Rbac(objects(MODES["namespaced"]))
    assert rbac.allows(Call("", "pods", "create", NS))
    assert not rbac.allows(Call("", "pods", "create", "kube-system"))  # a Role's namespace only
    assert not rbac.allows(Call("", "pods", "list", None))  # not across namespaces
    assert not rbac.allows(Call("", "namespaces", "watch", None))  # nothing cluster-scoped
    assert not rbac.allows(Call("", "secrets", "list", NS))  # get, never list
    cluster = Rbac(objects(MODES["cluster"]))
    assert cluster.allows(Call("", "pods", "list", None)) and not cluster.allows(
        Call("", "namespaces", "list", None)
    )


@pytest.mark.parametrize("mode", ["default", "cluster"])
def test_a_standalone_operator_gets_the_same_grants_without_peering(mode):
    values: dict[str, Any] = {} if mode == "default" else {"watch": {"mode": "cluster"}}
    ha = MODES["namespaced" if mode == "default" else "cluster"]
    peering = {g for g in Rbac(objects(ha)).granted() if g[0] == "kopf.dev"}
    assert peering and Rbac(objects(values)).granted() == Rbac(objects(ha)).granted() - peering
