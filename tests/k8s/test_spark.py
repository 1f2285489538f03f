"""Spark on Kubernetes for real: `examples/spark/spark-submit-archive.sh` submits the archive job
in cluster mode (`spark-submit --master k8s://...`) on raftlog's Spark image; driver and
executors are pods in the RaftCluster's namespace (Pod Security "restricted"), reading the
members by their DNS names, holding retention with the operator's token. The job lands every
acknowledged record in Parquet exactly once across a killed executor and a driver killed and
submitted again."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import images
from cluster.up import CTRD_SOCK

from tests.k8s import kube, load
from tests.spark.helpers import JVM_ENV

EXAMPLES = kube.ROOT / "examples" / "spark"
SMALL = {"resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}
RECORDS = {0: 1500, 1: 700}  # acknowledged records per partition, written before the job


@pytest.fixture(scope="module")
def spark_image() -> str:
    """raftlog's Spark image, built without Docker (cached) and in the node's containerd."""
    started = time.monotonic()
    image = images.spark_image()
    images.import_image(image.tar, image.ref, str(CTRD_SOCK))
    kube.say(f"Spark image {image.ref} ready in {time.monotonic() - started:.0f} s")
    return image.ref


def api_server() -> str:
    return kube.kubectl(
        "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
    )


def submit(ns: str, image: str, log: Path, *job_args: str) -> subprocess.Popen[bytes]:
    """The example script, as its header says to run it, with pyspark's spark-submit."""
    env = {
        **kube.env(),
        "K8S_API": api_server(),
        "IMAGE": image,
        "CLUSTER": "orders",
        "NAMESPACE": ns,
        "MEMBERS": "3",
        "EXECUTORS": "2",
        "CPU_REQUEST": "100m",
        # Less CPU for a job of small batches, in the pods (the script's option) and in the
        # submitting JVM here (the `java` launcher's variable).
        "JAVA_OPTIONS": JVM_ENV["JDK_JAVA_OPTIONS"],
        **JVM_ENV,
        "PATH": f"{kube.ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
    }
    env.pop("PYSPARK_PYTHON", None)  # the submitter's Python is not the pods'
    with log.open("ab") as out:
        return subprocess.Popen(
            ["bash", str(EXAMPLES / "spark-submit-archive.sh"), *job_args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def pods(ns: str, role: str) -> list[dict[str, Any]]:
    return kube.items("pods", ns, f"spark-role={role}")


def running(ns: str, role: str) -> list[str]:
    return [p["metadata"]["name"] for p in pods(ns, role) if p["status"].get("phase") == "Running"]


def batches(ns: str, driver: str) -> int:
    """Micro-batches the driver reported (its `archive batch N:` lines)."""
    out = kube.kubectl("logs", "-n", ns, driver, check=False)
    done = [int(n) for n in re.findall(r"^archive batch (\d+):", out, re.M)]
    return max(done, default=-1) + 1


# Reads the archive as a reader of it would, through the file sink's log (its paths are the
# pods' /data/...): a local Spark in a pod on the same image and volume, one JSON line a row.
CHECK = r"""
import json
from pyspark.sql import SparkSession, functions as F

spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
df = spark.read.parquet("/data/orders/records")
for r in df.select("partition", "index", F.col("key").cast("string"),
                   F.col("value").cast("string")).toLocalIterator():
    print("ROW", json.dumps(list(r)))
spark.stop()
"""


def archived_rows(ns: str, image: str) -> list[tuple[int, int, str, str]]:
    """Every row of the Parquet archive, read in the cluster (`CHECK`)."""
    name = f"check-{int(time.time())}"
    volume = {"name": "archive", "persistentVolumeClaim": {"claimName": "raftlog-archive"}}
    mount = {"name": "archive", "mountPath": "/data", "readOnly": True}
    command = ["/opt/raftlog/bin/python", "-c", CHECK]
    kube.start_pod(ns, name, image, command, 185, volumes=[volume], mounts=[mount], env=JVM_ENV)
    out = kube.pod_output(ns, name, 300)
    rows = [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]
    return [(int(p), int(i), str(k), str(v)) for p, i, k, v in rows]


@pytest.fixture
def orders(operator: str) -> Iterator[str]:
    ns = operator
    spec = {"replicas": 3, "partitions": 2, **SMALL}
    body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": "orders"}, "spec": spec}  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(body))

    def settled() -> bool:
        st = kube.get("raftcluster", "orders", ns).get("status") or {}
        members = st.get("members", [])
        return (
            st.get("phase") == "Running"
            and len(members) == 3
            and all(m["role"] == "voter" and m["ready"] for m in members)
        )

    kube.until("orders settled at 3", settled, 240)
    for manifest in ("rbac.yaml", "archive-pvc.yaml"):
        kube.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / manifest))
    yield ns


def test_the_archive_job_on_kubernetes_lands_every_record_once_across_lost_pods(
    orders: str, spark_image: str, tmp_path: Path
) -> None:
    ns = orders
    loaders = {p: load.start(ns, "orders", f"p{p}x", n, partition=p) for p, n in RECORDS.items()}
    acked = {p: load.acked(ns, name) for p, name in loaders.items()}
    assert {p: len(a) for p, a in acked.items()} == RECORDS

    # First run: small micro-batches (about 110), so that there is time to lose pods along the
    # way and some are left for the second run (at 60 a batch the first once nearly finished
    # while the executor it lost was replaced: the second had nothing left to write).
    log = tmp_path / "spark-submit.log"
    started = time.monotonic()
    first = submit(ns, spark_image, log, "--once", "--max-offsets-per-trigger", "20")
    driver: str = kube.until(
        "the driver running", lambda: next(iter(running(ns, "driver")), None), 240
    )
    kube.until("two executors running", lambda: len(running(ns, "executor")) >= 2 or None, 240)
    kube.until("two micro-batches", lambda: batches(ns, driver) >= 2 or None, 240)
    victim = running(ns, "executor")[0]
    kube.kubectl("delete", "pod", "-n", ns, victim, "--grace-period=0", "--force")
    kube.say(f"executor {victim} killed after {batches(ns, driver)} micro-batches")
    # Spark asks for a new executor in its place, and the job goes on.
    kube.until(
        "a new executor in the killed one's place",
        lambda: len([e for e in running(ns, "executor") if e != victim]) >= 2 or None,
        240,
    )
    at_kill = batches(ns, driver)
    kube.until("three more micro-batches", lambda: batches(ns, driver) >= at_kill + 3 or None, 240)
    done_before = batches(ns, driver)
    kube.kubectl("delete", "pod", "-n", ns, driver, "--grace-period=0", "--force")
    kube.say(f"driver {driver} killed after {done_before} micro-batches")
    first.wait(timeout=180)

    # Submitted again: it resumes from the checkpoint on the volume and finishes the backlog.
    kube.until("the first run's pods gone", lambda: not running(ns, "executor") or None, 180)
    second = submit(ns, spark_image, log, "--once")
    assert second.wait(timeout=600) == 0, log.read_text()[-3000:]
    [driver2] = [p for p in pods(ns, "driver") if p["metadata"]["name"] != driver]
    assert driver2["status"]["phase"] == "Succeeded", kube.kubectl(
        "logs", "-n", ns, driver2["metadata"]["name"]
    )
    out = kube.kubectl("logs", "-n", ns, driver2["metadata"]["name"])
    total = sum(RECORDS.values())
    kube.say(f"archive on Kubernetes: {total} records in {time.monotonic() - started:.0f} s")

    rows = archived_rows(ns, spark_image)
    counts = collections.Counter((p, i) for p, i, _, _ in rows)
    assert max(counts.values()) == 1, "a record archived twice"
    for p, records in acked.items():
        got = {(k, v) for q, _, k, v in rows if q == p}
        assert got == set(records), f"partition {p}: {len(got)} archived of {len(records)}"
    # The second driver resumed where the first stopped: it wrote only what was left.
    written = int(re.search(r"archive: (\d+) records written", out).group(1))  # type: ignore[union-attr]
    assert 0 < written < total, out[-2000:]
