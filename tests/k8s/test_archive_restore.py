"""Archive, backup and restore (issue 21) on the real Kubernetes, against a real S3 server in the
cluster: SeaweedFS's `weed mini` (the image `cluster/images.py` makes of the cached static `weed`)
as a Deployment with its data on a PVC, behind a Service; the bucket made with its own shell.

Under a loader pod's appends: a RaftCluster with `spec.archive` (credentials from a Secret)
archives (status.archive); `kubectl raft backup c b1 --wait` reports each partition's index;
after more appends, `kubectl raft restore r --from c --to backup:b1 --apply` creates a cluster
that comes back at exactly those indexes: every record acknowledged before the backup was asked
is read from each of its members, none the source committed after the backup point, and it takes
appends of its own. Then the store goes away (scaled to 0): the source's status names
ArchiveFailing while its appends go on, and it clears once the store is back. Each step's time
goes to the suite's figures."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from cluster.images import SEAWEEDFS_REF

from raftlog.client import AsyncClient
from raftlog.operator.controls import BACKUP
from tests.k8s import kube, load
from tests.k8s.test_day2 import DAY2_SPEC
from tests.k8s.test_journeys import apply, member_urls, reasons, settled, status, write
from tests.k8s.test_kubectl_raft import raft

BUCKET = "raftlog"
ACCESS_KEY, SECRET_KEY = "raftlog-k8s", "raftlog-k8s-secret-key"
S3 = "s3"  # the Deployment, its Service and its PVC
PARTITIONS = 2
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
              "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
# Every port named (as local_s3.py does): weed's defaults differ between its modes.
WEED_PORTS = {"master.port": 9333, "master.port.grpc": 19333, "volume.port": 8080,
              "volume.port.grpc": 18080, "filer.port": 8888, "filer.port.grpc": 18888,
              "s3.port": 8333, "s3.port.grpc": 18333, "admin.port": 23646,
              "admin.port.grpc": 33646}  # fmt: skip


def timed(what: str, started: float) -> float:
    took = time.monotonic() - started
    kube.say(f"archive {what}: {took:.1f} s")
    return took


def archive_spec(ns: str, name: str) -> dict[str, Any]:
    return {
        "url": f"s3://{BUCKET}/{name}",
        "endpoint": f"http://{S3}.{ns}.svc:{WEED_PORTS['s3.port']}",
        "region": "us-east-1",
        "credentialsSecret": "s3-credentials",
        "intervalSeconds": 1.0,
    }


def apply_objects(ns: str, *objs: dict[str, Any]) -> None:
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps({"apiVersion": "v1",
                 "kind": "List", "items": list(objs)}))  # fmt: skip


def start_s3(ns: str) -> None:
    """weed mini in a Deployment (so it can be scaled to 0 and back), its objects on a PVC (so
    they outlive that), its identity from a Secret, the S3 port behind a Service."""
    identity = {"name": "raftlog", "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}  # fmt: skip
    config = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-config"},
              "stringData": {"s3.json": json.dumps({"identities": [identity]})}}  # fmt: skip
    credentials = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials"},
                   "stringData": {"accessKeyId": ACCESS_KEY,
                                  "secretAccessKey": SECRET_KEY}}  # fmt: skip
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": S3},
           "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    command = [
        "/weed", "-logtostderr=true", "mini", "-ip=127.0.0.1", "-ip.bind=0.0.0.0", "-dir=/data",
        *(f"-{k}={v}" for k, v in WEED_PORTS.items()),
        "-admin.port.legacy=0", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0",
        "-s3.port.lance=0", "-s3.config=/config/s3.json", "-master.volumeSizeLimitMB=64",
        "-master.telemetry=false",
    ]  # fmt: skip
    labels = {"app": S3}
    container = {
        "name": "weed", "image": SEAWEEDFS_REF, "imagePullPolicy": "Never",
        "command": command, "env": [{"name": "HOME", "value": "/tmp"}],
        "securityContext": RESTRICTED,
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "ports": [{"containerPort": WEED_PORTS["s3.port"], "name": "s3"}],
        "readinessProbe": {"tcpSocket": {"port": "s3"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "data", "mountPath": "/data"},
                         {"name": "config", "mountPath": "/config", "readOnly": True}],
    }  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": S3},
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "automountServiceAccountToken": False,
                "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
                "containers": [container],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": S3}},
                            {"name": "config", "secret": {"secretName": "s3-config"}}],
            }},
        },
    }  # fmt: skip
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": S3},
               "spec": {"selector": labels, "ports": [
                   {"name": "s3", "port": WEED_PORTS["s3.port"], "targetPort": "s3"}]}}  # fmt: skip
    apply_objects(ns, config, credentials, pvc, deployment, service)


def weed_shell(ns: str, *commands: str) -> str:
    """`weed shell` in the server's pod; what it printed."""
    done = kube.run(
        ["kubectl", "exec", "-i", "-n", ns, f"deploy/{S3}", "--", "/weed", "shell",
         f"-master=127.0.0.1:{WEED_PORTS['master.port']}",
         f"-filer=127.0.0.1:{WEED_PORTS['filer.port']}"],
        stdin="\n".join([*commands, "exit"]) + "\n", timeout=60,
    )  # fmt: skip
    return done.stdout + done.stderr


def make_bucket(ns: str) -> bool:
    out = weed_shell(ns, f"s3.bucket.create -name {BUCKET}", "s3.bucket.list")
    return any(line.split()[:1] == [BUCKET] for line in out.splitlines() if line.startswith("  "))


def s3_ready(ns: str) -> bool:
    d = kube.get("deployment", S3, ns)
    return int((d.get("status") or {}).get("readyReplicas") or 0) >= 1


def scale_s3(ns: str, replicas: int) -> None:
    kube.kubectl("scale", "deployment", S3, "-n", ns, f"--replicas={replicas}")


def lines(ns: str, pod: str) -> int:
    return kube.kubectl("logs", "-n", ns, pod, check=False).count("\n")


def acked_so_far(ns: str, pod: str) -> list[tuple[str, str]]:
    out = kube.kubectl("logs", "-n", ns, pod)
    return [tuple(json.loads(x)) for x in out.splitlines() if x.startswith("[")]


def read_all(url: str, partition: int) -> dict[int, str]:
    """Every committed record of a partition one member serves: index -> value."""

    async def run() -> dict[int, str]:
        got: dict[int, str] = {}
        async with AsyncClient([url], retries=20) as client:
            start = 1
            while True:
                reply = await client.read(partition, start, limit=1000, endpoint=url)
                got.update({r["index"]: r["value"] for r in reply["records"]})
                if reply["next"] == start:
                    return got
                start = reply["next"]

    return asyncio.run(run())


def archived(st: dict[str, Any]) -> bool:
    parts = (st.get("archive") or {}).get("partitions") or []
    return any((p.get("archivedIndex") or 0) > 0 and not p.get("lastError") for p in parts)


def archive_problems(st: dict[str, Any]) -> list[str]:
    return [p for p in st.get("problems") or [] if p.startswith("spec.archive:")]


def archive_failing(st: dict[str, Any]) -> bool:
    """status.problems says the archive fails, and Degraded says ArchiveFailing."""
    degraded = kube.condition({"status": st}, "Degraded") or {}
    return (degraded.get("status"), degraded.get("reason")) == ("True", "ArchiveFailing") and any(
        "archiving fails" in p for p in archive_problems(st)
    )


def archive_clear(st: dict[str, Any]) -> bool:
    degraded = kube.condition({"status": st}, "Degraded") or {}
    parts = (st.get("archive") or {}).get("partitions") or []
    return (
        degraded.get("reason") != "ArchiveFailing"
        and not archive_problems(st)
        and bool(parts)
        and all(not p.get("lastError") and not p.get("failingOn") for p in parts)
    )


def test_backup_then_restore_into_a_new_cluster_and_the_store_down(operator: str) -> None:
    ns = operator
    started = time.monotonic()
    start_s3(ns)
    kube.until("the S3 server ready", lambda: s3_ready(ns), 180)
    kube.until(f"bucket {BUCKET} made", lambda: make_bucket(ns), 60, every=2)
    timed("S3 server (weed mini) up and its bucket made", started)

    # ------------------------------------------------------------- a cluster that archives
    started = time.monotonic()
    spec = {**DAY2_SPEC, "partitions": PARTITIONS, "archive": archive_spec(ns, "c")}
    apply(ns, "c", spec)
    kube.until("c settled at 3", lambda: settled(status(ns, "c"), 3), 240)
    loader = load.start(ns, "c", "arc")
    kube.until("c archives under the load", lambda: lines(ns, loader) >= 100
               and archived(status(ns, "c")), 180)  # fmt: skip
    timed("created, under load, status.archive shows an archived index", started)

    # ------------------------------------------------------------- kubectl raft backup --wait
    before = acked_so_far(ns, loader)  # acknowledged before the backup is asked for
    started = time.monotonic()
    out = raft("backup", "c", "b1", "--wait", "--timeout", "120", "-n", ns)
    timed("kubectl raft backup c b1 --wait", started)
    b1 = next(b for b in status(ns, "c")["backups"] if b["name"] == "b1")
    assert b1["state"] == "done", b1
    point = {p["partition"]: p["index"] for p in b1["partitions"]}
    assert set(point) == set(range(PARTITIONS)), b1
    shown = ", ".join(f"{p}@{i}" for p, i in sorted(point.items()))
    assert f"backup b1: done: partition@index {shown}" in out, out
    assert kube.get("raftcluster", "c", ns)["metadata"]["annotations"][BACKUP] == "b1"
    assert "BackupDone" in reasons(ns, "c")
    # Asked again: refused, nothing written.
    assert "already asked for" in raft("backup", "c", "b1", "-n", ns, expect=1)
    text = raft("status", "c", "-n", ns)
    assert "Backups (oldest first):" in text and "b1" in text, text

    taken = lines(ns, loader)
    kube.until("appends after the backup", lambda: lines(ns, loader) >= taken + 50, 120)

    # ------------------------------------------------------------- kubectl raft restore --apply
    printed = raft("restore", "r", "--from", "c", "--to", "backup:b1", "-n", ns)
    assert f"url: s3://{BUCKET}/c-restored-r" in printed, printed
    started = time.monotonic()
    out = raft("restore", "r", "--from", "c", "--to", "backup:b1", "--apply", "-n", ns)
    assert "created" in out, out
    kube.until("r restored and settled at 3", lambda: settled(status(ns, "r"), 3), 300)
    timed("kubectl raft restore --apply -> the restored cluster Running with 3 ready", started)
    st = status(ns, "r")
    assert st["restore"]["state"] == "planned", st["restore"]
    assert {p["partition"]: p["index"] for p in st["restore"]["partitions"]} == point
    assert "RestorePlanned" in reasons(ns, "r")
    view = json.loads(raft("status", "r", "-n", ns, "-o", "json"))
    assert view["restore"]["partitions"] == st["restore"]["partitions"]

    # What the source committed, with its indexes (tiered reads serve what it compacted).
    source = read_all(next(iter(member_urls(ns, "c").values())), 0)
    after_point = {v for i, v in source.items() if i > point[0]}
    assert after_point, "the source committed records after the backup point"
    wanted = {v for _, v in before}
    for name, url in member_urls(ns, "r").items():
        got = {p: read_all(url, p) for p in range(PARTITIONS)}
        values = set(got[0].values())
        lost = wanted - values
        assert not lost, f"{name}: {len(lost)} acknowledged before the backup not restored"
        extra = after_point & values
        assert not extra, f"{name}: {len(extra)} committed after the backup point restored"
        for p in range(PARTITIONS):
            assert max(got[p], default=0) <= point[p], (name, p, max(got[p]), point[p])
            assert all(source.get(i) == v for i, v in got[0].items()), name
    kube.say(f"archive: {len(wanted)} acknowledged before b1 read back from 3 members of r")

    # The restored cluster takes appends, after its restored log.
    written = write(ns, "r", 20, "new")
    new = read_all(next(iter(member_urls(ns, "r").values())), 0)
    indexes = [i for i, v in new.items() if v in {v for _, v in written}]
    assert len(indexes) == 20 and min(indexes) > point[0], (indexes, point)
    kube.kubectl("delete", "raft", "r", "-n", ns, "--wait=false")

    # ------------------------------------------------------------- to a chosen index
    # Point in time by index: partition 0 up to an index below the backup's, exactly.
    cut = point[0] - 25
    started = time.monotonic()
    raft("restore", "r2", "--from", "c", "--to", f"index:0={cut}", "--apply", "-n", ns)
    kube.until("r2 restored and settled at 3", lambda: settled(status(ns, "r2"), 3), 300)
    timed(f"kubectl raft restore --to index:0={cut} -> Running with 3 ready", started)
    st = status(ns, "r2")
    assert {p["partition"]: p["index"] for p in st["restore"]["partitions"]}[0] == cut
    for name, url in member_urls(ns, "r2").items():
        mine = read_all(url, 0)
        assert max(mine) <= cut, (name, max(mine), cut)
        held = {i: v for i, v in source.items() if i <= cut}
        assert {i: mine.get(i) for i in held} == held, f"{name}: not the source's log up to {cut}"
    kube.kubectl("delete", "raft", "r2", "-n", ns, "--wait=false")

    # ------------------------------------------------------------- the store down, then back
    started = time.monotonic()
    scale_s3(ns, 0)
    kube.until("the S3 server gone", lambda: not kube.items("pods", ns, f"app={S3}"), 120)
    down = lines(ns, loader)
    kube.until("ArchiveFailing on c", lambda: archive_failing(status(ns, "c")), 120)
    timed("store scaled to 0 -> status.problems and Degraded ArchiveFailing", started)
    st = status(ns, "c")
    kube.say(f"archive: store down: {st['problems']}")
    kube.until("appends go on while the store is down",
               lambda: lines(ns, loader) >= down + 50, 120)  # fmt: skip
    assert archive_failing(status(ns, "c"))
    started = time.monotonic()
    scale_s3(ns, 1)
    kube.until("the S3 server back", lambda: s3_ready(ns), 180)
    kube.until("the archive recovered", lambda: archive_clear(status(ns, "c")), 180)
    timed("store scaled back to 1 -> ArchiveFailing cleared", started)
    assert {"ArchiveFailing", "ArchiveRecovered"} <= set(reasons(ns, "c"))

    load.stop(ns, loader)
    acked = load.acked(ns, loader)
    on_c = set(read_all(next(iter(member_urls(ns, "c").values())), 0).values())
    assert all(v in on_c for _, v in acked), "an acknowledged record of c is missing"
    kube.say(f"archive: {len(acked)} acknowledged on c, all read back after the outage")
