"""Fixtures of the `k8s` suite: the running cluster of `make cluster`, and a namespace per test.

The cluster is one node of this machine's 2 cores: a test's namespace is gone, with its pods and
their CPU requests, before the next test starts. A failed test prints what its namespace held.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from raftlog.operator.crd import CRD_PATH
from raftlog.operator.models import GROUP, PLURAL
from tests.k8s import kube

CRD_NAME = f"{PLURAL}.{GROUP}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/k8s/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.k8s)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    item.stash.setdefault(FAILED, False)
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


FAILED = pytest.StashKey[bool]()


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
def namespace(cluster: None, request: pytest.FixtureRequest) -> Iterator[str]:
    ns = _namespace()
    try:
        yield ns
    finally:
        if request.node.stash.get(FAILED, False):
            print(f"\n--- what {ns} held when the test failed ---", file=sys.stderr)
            for args in (["get", "raft,pods,pvc,svc,pdb", "-o", "wide"],
                         ["get", "events", "--sort-by=.lastTimestamp"],
                         ["logs", "deploy/raftlog-operator", "--tail=60"]):  # fmt: skip
                print(kube.run(["kubectl", "-n", ns, *args]).stdout, file=sys.stderr)
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
