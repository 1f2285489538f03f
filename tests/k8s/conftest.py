"""Fixtures of the `k8s` suite: the running cluster of `make cluster`, and a namespace per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.k8s import kube


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/k8s/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def cluster() -> None:
    """The cluster must be up: a missing one fails the suite (it is never skipped)."""
    if not kube.KUBECONFIG.exists():
        pytest.fail(f"{kube.KUBECONFIG} is missing: run `make cluster` first (make test does)")
    nodes = kube.items("nodes")
    ready = [n for n in nodes if (kube.condition(n, "Ready") or {}).get("status") == "True"]
    assert ready, f"no Ready node: {[n['metadata']['name'] for n in nodes]}"


@pytest.fixture
def namespace(cluster: None) -> Iterator[str]:
    ns = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    try:
        yield ns
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
