"""`helm install`, `helm upgrade` and `helm uninstall` of the chart with the real helm CLI,
namespaced and cluster-wide: upgrades restart no member, and uninstall leaves nothing behind but
the CRDs (helm never deletes a chart's CRDs: the RaftClusters of other releases live in them)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from tests.k8s import kube

RELEASE = "raftlog-operator"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
SPEC = {"replicas": 3, "partitions": 1, "resources": {"requests": {"cpu": "100m"}}}


def apply(ns: str, name: str) -> None:
    body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": name}, "spec": SPEC}  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(body))


def ready(ns: str, name: str) -> bool:
    st = kube.get("raftcluster", name, ns).get("status") or {}
    return st.get("readyReplicas") == 3 and st.get("phase") == "Running"


def release_objects(ns: str) -> list[str]:
    """What the release labelled in `ns`, and cluster-wide."""
    namespaced = kube.kubectl(
        "get", "deploy,rs,pods,sa,role,rolebinding,svc,pdb,cm,secret,networkpolicy,kopfpeering",
        "-n", ns, "-l", INSTANCE, "-o", "name",
    )  # fmt: skip
    cluster = json.loads(kube.kubectl(
        "get", "clusterrole,clusterrolebinding,clusterkopfpeering", "-l", INSTANCE, "-o", "json"
    ))["items"]  # fmt: skip
    mine = [f"{o['kind']}/{o['metadata']['name']}" for o in cluster
            if (o["metadata"].get("annotations") or {}).get("meta.helm.sh/release-namespace")
            == ns]  # fmt: skip
    return namespaced.split() + mine


@pytest.fixture
def other_namespace(cluster: None) -> Iterator[str]:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    kube.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    yield ns
    kube.kubectl("delete", "namespace", ns, "--timeout=180s", check=False, timeout=200)


def test_upgrade_restarts_no_member_and_uninstall_leaves_nothing(namespace: str) -> None:
    ns = namespace
    kube.helm("install", RELEASE, str(kube.CHART), "-n", ns, "--wait", "--timeout", "180s")
    apply(ns, "u")
    kube.until("u ready", lambda: ready(ns, "u"), 240)
    before = {p["metadata"]["name"]: p["metadata"]["uid"]
              for p in kube.items("pods", ns, "raftlog.dev/cluster=u")}  # fmt: skip
    operator_before = {p["metadata"]["uid"] for p in kube.items("pods", ns, INSTANCE)}
    kube.helm("upgrade", RELEASE, str(kube.CHART), "-n", ns, "--set", "operator.intervalSeconds=2",
              "--wait", "--timeout", "180s")  # fmt: skip
    assert kube.helm("history", RELEASE, "-n", ns).count("\n") >= 2
    operator_after = {p["metadata"]["uid"] for p in kube.items("pods", ns, INSTANCE)}
    assert operator_after and not operator_after & operator_before  # the operator rolled
    kube.kubectl("scale", "raft/u", "-n", ns, "--replicas", "4")  # the new one works
    kube.until("u at 4", lambda: (kube.get("raftcluster", "u", ns).get("status") or {})
               .get("readyReplicas") == 4, 240)  # fmt: skip
    after = {p["metadata"]["name"]: p["metadata"]["uid"]
             for p in kube.items("pods", ns, "raftlog.dev/cluster=u")}  # fmt: skip
    assert {k: after[k] for k in before} == before  # no member restarted by the upgrade
    kube.kubectl("delete", "raft", "u", "-n", ns, "--timeout=180s")
    kube.helm("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
    kube.until("nothing of the release left", lambda: release_objects(ns) == [], 120)
    assert "raftclusters.raftlog.dev" in kube.kubectl("get", "crd", "-o", "name")


def test_a_cluster_wide_install_manages_other_namespaces(
    namespace: str, other_namespace: str
) -> None:
    ns = namespace
    kube.helm("install", RELEASE, str(kube.CHART), "-n", ns, "--set", "watch.mode=cluster",
              "--wait", "--timeout", "180s")  # fmt: skip
    try:
        apply(other_namespace, "w")
        kube.until("w ready in another namespace", lambda: ready(other_namespace, "w"), 240)
        kube.kubectl("delete", "raft", "w", "-n", other_namespace, "--timeout=180s")
    finally:
        kube.helm("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s")
    kube.until("nothing of the release left, cluster-scoped included",
               lambda: release_objects(ns) == [], 120)  # fmt: skip
