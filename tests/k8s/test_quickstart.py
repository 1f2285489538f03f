"""The README's Kubernetes quick start, as a user types it, on the real cluster, then the
chart's upgrade and uninstall.

`helm install` of the chart (the operator in its pod, under the chart's ServiceAccount, so the
API server enforces its RBAC), `kubectl apply -f examples/raftcluster.yaml`, `kubectl get raft`
with the printer columns, `kubectl scale` through the scale subresource to 5 voters (learners
promoted only after the stable window) and back to 3, and `kubectl describe` with the events;
`helm upgrade` rolls the operator and restarts no member; `helm uninstall` leaves nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.k8s import kube

IMAGE = "ghcr.io/raftlog/raftlog:0.1.0"  # the chart's default, built and imported locally
WINDOW_S = 3.0  # examples/raftcluster.yaml: learnerPromotionStableWindow


def raft(ns: str, name: str = "orders") -> dict[str, Any]:
    return kube.get("raftcluster", name, ns)


def roles(obj: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["role"] for m in (obj.get("status") or {}).get("members") or []}


def settled(obj: dict[str, Any], replicas: int) -> bool:
    st = obj.get("status") or {}
    return bool(st.get("readyReplicas") == replicas and st.get("phase") == "Running")


def available(obj: dict[str, Any]) -> bool:
    return (kube.condition(obj, "Available") or {}).get("status") == "True"


def test_quickstart_apply_get_scale_up_and_down(operator: str) -> None:
    ns = operator
    started = time.monotonic()
    kube.kubectl("apply", "-n", ns, "-f", "examples/raftcluster.yaml")
    kube.until("orders Available", lambda: available(raft(ns)), 240)
    kube.say(f"kubectl apply -> Available: {time.monotonic() - started:.1f} s")
    kube.until("3 members ready", lambda: settled(raft(ns), 3), 120)

    # Printer columns, through the short name, as the API server's Table output renders them.
    table = kube.kubectl("get", "raft", "-n", ns).splitlines()
    assert table[0].split() == [
        "NAME", "REPLICAS", "READY", "PARTITIONS", "LEADERS", "PHASE", "AVAILABLE", "AGE"
    ]  # fmt: skip
    row = table[1].split()
    assert row[:4] == ["orders", "3", "3", "2"] and row[6] == "True", table
    # LEADERS: the leaders of the partitions (one name when one member leads both).
    assert set(row[4].split(",")) == set(raft(ns)["status"]["leaders"].values()), table

    # Members run the locally built image (the node cannot pull: there is no registry).
    pods = kube.items("pods", ns, "raftlog.dev/cluster=orders")
    assert sorted(p["metadata"]["name"] for p in pods) == ["orders-0", "orders-1", "orders-2"]
    for p in pods:
        [c] = p["spec"]["containers"]
        assert c["image"] == IMAGE and c["imagePullPolicy"] == "IfNotPresent"
        assert p["status"]["phase"] == "Running"
        # The image's core compiled by mypyc, from the image's own sources (native.py).
        raw = f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}:7001/proxy/v1/status"
        assert json.loads(kube.kubectl("get", "--raw", raw))["compiled"] is True
    claims = kube.items("pvc", ns, "raftlog.dev/cluster=orders")
    assert {c["status"]["phase"] for c in claims} == {"Bound"}, claims

    # Scale up through the scale subresource; watch every member's role as it goes.
    started = time.monotonic()
    out = kube.kubectl("scale", "raft/orders", "-n", ns, "--replicas", "5")
    assert "scaled" in out
    scale = f"/apis/raftlog.dev/v1alpha1/namespaces/{ns}/raftclusters/orders/scale"
    assert json.loads(kube.kubectl("get", "--raw", scale))["spec"]["replicas"] == 5
    learner_at: dict[str, float] = {}
    voter_at: dict[str, float] = {}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        obj = raft(ns)
        now = time.monotonic()
        for name, role in roles(obj).items():
            if role == "learner":
                learner_at.setdefault(name, now)
            elif role == "voter" and name in learner_at:
                voter_at.setdefault(name, now)
        r = roles(obj)
        if len(r) == 5 and set(r.values()) == {"voter"} and available(obj):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"5 voters: not within 300 s; roles {roles(raft(ns))}")
    kube.say(f"kubectl scale 3 -> 5 voters: {time.monotonic() - started:.1f} s")
    assert sorted(voter_at) == ["orders-3", "orders-4"], (learner_at, voter_at)
    for name in voter_at:  # promoted only after the window (polled every 0.5 s)
        assert voter_at[name] - learner_at[name] >= WINDOW_S - 1.0, (name, learner_at, voter_at)

    events = json.loads(kube.kubectl(
        "get", "events", "-n", ns, "--field-selector",
        "involvedObject.kind=RaftCluster,involvedObject.name=orders", "-o", "json",
    ))["items"]  # fmt: skip
    reasons = [e["reason"] for e in events]
    assert reasons.count("LearnerAdded") >= 2 and reasons.count("Promoted") >= 2, reasons
    described = kube.kubectl("describe", "raft", "orders", "-n", ns)
    assert "Promoted" in described and "orders-4 is a voter of every partition" in described

    # And back to 3: the highest ordinals leave, the cluster stays available.
    started = time.monotonic()
    kube.kubectl("scale", "raft/orders", "-n", ns, "--replicas", "3")

    def three() -> bool:
        obj = raft(ns)
        names = sorted(
            p["metadata"]["name"] for p in kube.items("pods", ns, "raftlog.dev/cluster=orders")
        )
        return (sorted(roles(obj)) == ["orders-0", "orders-1", "orders-2"]
                and names == ["orders-0", "orders-1", "orders-2"] and available(obj))  # fmt: skip

    kube.until("back to 3 members", three, 300)
    kube.say(f"kubectl scale 5 -> 3: {time.monotonic() - started:.1f} s")
    assert set(roles(raft(ns)).values()) == {"voter"}
    reasons = [e["reason"] for e in json.loads(kube.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=orders", "-o", "json"
    ))["items"]]  # fmt: skip
    assert reasons.count("MemberRemoved") >= 2, reasons

    # helm upgrade rolls the operator and restarts no member; the new operator works.
    members = {p["metadata"]["name"]: p["metadata"]["uid"]
               for p in kube.items("pods", ns, "raftlog.dev/cluster=orders")}  # fmt: skip
    operators = {p["metadata"]["uid"] for p in kube.items("pods", ns, kube.RELEASE_PODS)}
    kube.helm("upgrade", "raftlog-operator", str(kube.CHART), "-n", ns,
              "--set", "operator.intervalSeconds=2", "--wait", "--timeout", "180s")  # fmt: skip
    assert kube.helm("history", "raftlog-operator", "-n", ns).count("\n") >= 2
    rolled = {p["metadata"]["uid"] for p in kube.items("pods", ns, kube.RELEASE_PODS)
              if not p["metadata"].get("deletionTimestamp")}  # fmt: skip
    assert rolled and not rolled & operators
    kube.kubectl("scale", "raft/orders", "-n", ns, "--replicas", "4")
    kube.until("4 members ready", lambda: settled(raft(ns), 4), 240)
    after = {p["metadata"]["name"]: p["metadata"]["uid"]
             for p in kube.items("pods", ns, "raftlog.dev/cluster=orders")}  # fmt: skip
    assert {k: after[k] for k in members} == members  # no member restarted by the upgrade

    # Deleted, then uninstalled: nothing of either is left but the CRDs (helm never deletes a
    # chart's CRDs: other releases' RaftClusters live in them).
    kube.kubectl("delete", "raft", "orders", "-n", ns, "--timeout=180s")
    kube.helm("uninstall", "raftlog-operator", "-n", ns, "--wait", "--timeout", "120s")
    kube.until("nothing left", lambda: kube.release_objects(ns) == [] and not kube.kubectl(
        "get", "pods,pvc,svc,pdb,secret", "-n", ns, "-l", "raftlog.dev/cluster=orders",
        "-o", "name").strip(), 120)  # fmt: skip
    assert "raftclusters.raftlog.dev" in kube.kubectl("get", "crd", "-o", "name")
