"""examples/spark/sparkapplication-archive.yaml validated by the real API server against the
Kubeflow spark-operator's own CRD (v2.5.2, tests/k8s/data): a server-side dry run with strict
field validation accepts it, and refuses it once a field is misspelt or of the wrong type (so
the check can fail). The spark-operator itself cannot be built here (its module is refused by
the Go proxy), so nothing submits the application."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.k8s import kube

CRD = kube.ROOT / "tests" / "k8s" / "data" / "sparkoperator.k8s.io_sparkapplications-v2.5.2.yaml.gz"
CRD_NAME = "sparkapplications.sparkoperator.k8s.io"
EXAMPLE = kube.ROOT / "examples" / "spark" / "sparkapplication-archive.yaml"


@pytest.fixture(scope="module")
def spark_application_crd(cluster: None) -> Iterator[None]:
    kube.kubectl(
        "apply", "--server-side", "-f", "-", stdin=gzip.decompress(CRD.read_bytes()).decode()
    )
    try:

        def established() -> bool:
            cond = kube.condition(kube.get("crd", CRD_NAME), "Established")
            return cond is not None and cond.get("status") == "True"

        kube.until(f"CRD {CRD_NAME} Established", established, timeout=60)
        yield
    finally:
        kube.kubectl("delete", "crd", CRD_NAME, "--wait=false", check=False)


def dry_run(app: dict[str, Any], ns: str) -> tuple[int, str]:
    app = {**app, "metadata": {**app["metadata"], "namespace": ns}}
    done = kube.run(
        ["kubectl", "apply", "-n", ns, "--dry-run=server", "--validate=strict", "-f", "-"],
        yaml.safe_dump(app),
    )
    return done.returncode, done.stdout + done.stderr


def test_the_example_is_a_valid_spark_application(spark_application_crd, namespace):
    app = yaml.safe_load(EXAMPLE.read_text())
    code, out = dry_run(app, namespace)
    assert code == 0, out
    assert "raftlog-archive-orders created (server dry run)" in out
    misspelt = yaml.safe_load(EXAMPLE.read_text())
    misspelt["spec"]["driver"]["cpus"] = 1
    code, out = dry_run(misspelt, namespace)
    assert code != 0 and 'unknown field "spec.driver.cpus"' in out, out
    wrong = yaml.safe_load(EXAMPLE.read_text())
    wrong["spec"]["executor"]["instances"] = "two"
    code, out = dry_run(wrong, namespace)
    assert code != 0 and "spec.executor.instances" in out, out
