"""Fixtures of the `k8s` suite: the running cluster of `make cluster`, and a namespace per test.

The cluster is one node of this machine's 2 cores: a test's namespace is gone, with its pods and
their CPU requests, before the next test starts. A failed test prints what its namespace held
before its fixtures tear it down.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import layout

from raftlog.operator.crd import CRD_PATH
from raftlog.operator.models import GROUP, PLURAL
from tests.k8s import kube

CRD_NAME = f"{PLURAL}.{GROUP}"


# The longest tests (minutes each) first. `make test` runs the suite on two workers with
# `--dist worksteal`, which hands the first worker the first half of the list and steals only
# from a queue's tail: these run one after another on that worker while the other runs the
# rest. Spread over both workers (5b168d3) they ran beside each other on the two cores, each
# took longer, and so did the suite outside `k8s`: `make test` 20 min against 16 to 17.
LONGEST_FIRST = (
    "test_day2_controls_under_load_lose_no_acknowledged_record",
    "test_the_archive_job_on_kubernetes_lands_every_record_once_across_lost_pods",
    "test_create_scale_heal_snapshot_scale_down_under_load_and_delete",
    "test_backup_then_restore_into_a_new_cluster_and_the_store_down",
    "test_quickstart_apply_get_scale_up_and_down",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/k8s/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.k8s)

    def rank(item: pytest.Item) -> int:
        name = getattr(item, "originalname", item.name)
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    ns = getattr(item, "funcargs", {}).get("namespace")
    if report.when in ("setup", "call") and report.failed and isinstance(ns, str):
        # Now, before the fixtures' teardown deletes the RaftClusters and their pods. A setup
        # failure is the operator's chart not coming up (`helm install --wait`).
        _dump(ns)
        _dump_node(ns)
    return report


def _dump(ns: str) -> None:
    """What the namespace held when the test failed: objects, events, the operator's log, the
    RaftClusters' status, and each member's own view (`/v1/status` through the API server) and
    the end of its log."""
    print(f"\n--- what {ns} held when the test failed ---", file=sys.stderr)
    for args in (["get", "raft,pods,pvc,svc,pdb", "-o", "wide"],
                 ["get", "events", "--sort-by=.lastTimestamp"],
                 ["logs", "deploy/raftlog-operator", "--tail=60"],
                 ["get", "raft", "-o", "jsonpath={.items[*].status}"]):  # fmt: skip
        print(kube.run(["kubectl", "-n", ns, *args]).stdout, file=sys.stderr)
    for pod in kube.items("pods", ns, "app.kubernetes.io/name=raftlog"):
        name = pod["metadata"]["name"]
        raw = f"/api/v1/namespaces/{ns}/pods/{name}:7001/proxy/v1/status"
        got = kube.run(["kubectl", "get", "--raw", raw])
        print(f"{name} /v1/status: {(got.stdout or got.stderr).strip()[:6000]}", file=sys.stderr)
        tail = kube.run(["kubectl", "-n", ns, "logs", name, "--tail=25"])
        print(f"{name} log:\n{(tail.stdout or tail.stderr).rstrip()}", file=sys.stderr)


def _dump_node(ns: str) -> None:
    """Why the namespace's pods are not running, as the node saw it: the pods' own events and
    states, the node's conditions and free disk, the kubelet's and containerd's last words on
    the namespace, and any network plugin or runtime call still running (a stuck one holds
    every pod start after it)."""
    print(f"\n--- the node, for {ns} ---", file=sys.stderr)
    for pod in kube.items("pods", ns):
        if (kube.condition(pod, "Ready") or {}).get("status") != "True":
            name = pod["metadata"]["name"]
            got = kube.run(["kubectl", "-n", ns, "describe", "pod", name]).stdout
            print("\n".join(got.splitlines()[-40:]), file=sys.stderr)
    for node in kube.items("nodes"):
        for c in node["status"].get("conditions", []):
            print(f"node {c['type']}={c['status']} {c.get('message', '')}", file=sys.stderr)
    print(kube.run(["df", "-h", str(layout.STATE), "/tmp"]).stdout, file=sys.stderr)
    logs = layout.STATE / "logs"
    for log, pattern, n in (("kubelet.log", ns, 40), ("containerd.log", "level=error", 15)):
        lines = [line for line in kube.run(["grep", "-E", pattern, str(logs / log)]).stdout
               .splitlines() if "code = NotFound" not in line]  # fmt: skip
        print(f"{log}, its last {min(len(lines), n)} lines matching {pattern!r}:", file=sys.stderr)
        print("\n".join(line[:400] for line in lines[-n:]), file=sys.stderr)
    ps = kube.run(["ps", "-eo", "pid,etimes,args"]).stdout.splitlines()
    stuck = [p for p in ps if re.search(r"/usr/lib/cni/|(^|[\s/])runc\s|iptables", p)]
    print(
        "network plugins, runc and iptables running:",
        *stuck or ["none"],
        sep="\n  ",
        file=sys.stderr,
    )


@pytest.fixture(scope="session")
def cluster() -> None:
    """The cluster must be up: a missing one fails the suite (it is never skipped)."""
    if not kube.KUBECONFIG.exists():
        pytest.fail(f"{kube.KUBECONFIG} is missing: run `make cluster` first (make test does)")
    nodes = kube.items("nodes")
    ready = [n for n in nodes if (kube.condition(n, "Ready") or {}).get("status") == "True"]
    assert ready, f"no Ready node: {[n['metadata']['name'] for n in nodes]}"
    # The CRD in the cluster is the repository's (helm installs a chart's CRDs only once).
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(kube.ROOT / CRD_PATH))

    def established() -> bool:
        cond = kube.condition(kube.get("crd", CRD_NAME), "Established")
        return cond is not None and cond.get("status") == "True"

    kube.until(f"CRD {CRD_NAME} Established", established, timeout=60)


def _namespace() -> str:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    # The API server enforces Pod Security "restricted" on every pod of the test: the
    # operator's (the chart's) and the members' (the operator's).
    kube.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    # The controller manager adds both to a new namespace. A pod made before the CA's
    # ConfigMap fails to mount its token volume, and the kubelet's retries back off to 2 min:
    # on a loaded machine that can read as a pod stuck in ContainerCreating.
    kube.until(
        f"{ns}'s default ServiceAccount and kube-root-ca.crt",
        lambda: kube.run(["kubectl", "-n", ns, "get", "sa/default", "cm/kube-root-ca.crt"])
        .returncode == 0,
        60,
        every=0.2,
    )  # fmt: skip
    return ns


def _delete(ns: str) -> None:
    """Gone are the members (their CPU requests hold the next test's pods back); the rest of
    the namespace (an operator replica leaving its peering, say) finishes on its own."""
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    members = "app.kubernetes.io/name=raftlog"
    kube.until(f"{ns}'s members gone", lambda: not kube.items("pods", ns, members), 180)


@pytest.fixture
def other_namespace(cluster: None) -> Iterator[str]:
    ns = _namespace()
    yield ns
    _delete(ns)


@pytest.fixture
def namespace(cluster: None) -> Iterator[str]:
    ns = _namespace()
    try:
        yield ns
    finally:
        _delete(ns)


@pytest.fixture
def operator(namespace: str) -> Iterator[str]:
    """The chart installed in `namespace` (its default: watch the release's namespace); unless
    the test uninstalled it itself, the namespace's RaftClusters are deleted before the operator
    goes (the finalizer is its)."""
    started = time.monotonic()
    kube.helm("install", kube.RELEASE, str(kube.CHART), "-n", namespace,
              "--wait", "--timeout", "180s")  # fmt: skip
    kube.say(f"helm install --wait: {time.monotonic() - started:.1f} s")
    try:
        yield namespace
    finally:
        if kube.RELEASE in kube.helm("list", "-n", namespace, "-q").split():
            kube.kubectl("delete", "raft", "--all", "-n", namespace, "--timeout=180s",
                         check=False)  # fmt: skip
            kube.helm("uninstall", kube.RELEASE, "-n", namespace, "--wait", "--timeout", "120s")
