"""`spec.archive` on the local runtime against the real S3 server (issue 21): three members archive
under appends, `status.archive` follows the archived index up to the sealed part of the log, a
stopped store is named in `status.problems` (and the Degraded condition) while appends go on,
and the problem clears once the store is back; `raftctl local up --object-store` runs a server of
its own for as long as the cluster runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store
from tests.operator.test_local_cli import read_until
from tests.operator.test_local_day2 import Load
from tests.operator.test_local_operator import Harness, running

from raftlog.cli.main import main
from raftlog.harness.s3 import WEED_ENV, S3Server, weed_binary
from raftlog.node.storage.archive_manifest import Manifest
from raftlog.operator.local_cli import started_at
from raftlog.operator.models import RaftClusterStatus

pytestmark = [pytest.mark.s3, pytest.mark.operator]

BUCKET = "archive"
PREFIX = "c"
# More than a 4 KiB segment holds of the load's entries (62-64 each, of about 64 bytes): what a
# member may not have archived yet, its segment being written.
SEGMENT_ENTRIES = 80


def manifest_text(s3: S3Server, partitions: int) -> str:
    return (
        "apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nmetadata:\n  name: c\n"
        f"spec:\n  replicas: 3\n  partitions: {partitions}\n"
        "  raft: {learnerPromotionLag: 10, learnerPromotionStableWindow: 2}\n"
        "  storage: {segmentBytes: 4096}\n"  # small segments: sealed, so archived, soon
        f"  archive:\n    url: s3://{BUCKET}/{PREFIX}\n    endpoint: {s3.endpoint}\n"
        f"    region: {s3.region}\n    credentialsSecret: c-s3\n    intervalSeconds: 0.2\n"
    )


def write_secret(base: Path, s3: S3Server) -> None:
    """The local runtime's Secret: a folder with a file per key, as Kubernetes mounts one."""
    folder = base / "secrets" / "c-s3"
    folder.mkdir(parents=True)
    (folder / "accessKeyId").write_text(s3.access_key)
    (folder / "secretAccessKey").write_text(s3.secret_key)


def stored_manifest(s3: S3Server, p: int) -> Manifest | None:
    store = S3Store(BUCKET, **s3.obstore_config())
    try:
        raw = bytes(obstore.get(store, f"{PREFIX}/p{p}/manifest.json").bytes())
    except FileNotFoundError:
        return None
    return Manifest.from_json("manifest", raw)


def archived(s: RaftClusterStatus, partitions: int, above: dict[int, int]) -> bool:
    """Every partition archived past `above` and its last pass fine on every member."""
    entries = s.archive.partitions if s.archive else []
    return len(entries) == partitions and all(
        a.archived_index > above.get(a.partition, 0) and a.last_error is None and not a.failing_on
        for a in entries
    )


def failing(s: RaftClusterStatus) -> bool:
    return any(p.startswith("spec.archive: partition 0: archiving fails on") for p in s.problems)


def failing_on_all(s: RaftClusterStatus) -> bool:
    """Partition 0's failure reported, by each of the three members."""
    return (
        failing(s)
        and s.archive is not None
        and set(s.archive.partitions[0].failing_on) == {"c-0", "c-1", "c-2"}
    )


@pytest.mark.slow
@pytest.mark.asyncio
async def test_three_members_archive_under_appends_and_say_when_the_store_is_down(
    tmp_path: Path,
) -> None:
    partitions = 2
    with S3Server(tmp_path / "s3", buckets=(BUCKET,)) as s3:
        base = tmp_path / "cluster"
        base.mkdir()
        write_secret(base, s3)
        h = Harness(base, manifest_text(s3, partitions))
        try:
            await h.until("bootstrap", running(3), 60)
            load = Load(h, partitions)
            load.start()

            # Archiving under appends: the archived index rises, as the store's manifest says.
            st = await h.until("archived", lambda s: archived(s, partitions, {}), 60)
            first = {a.partition: a.archived_index for a in st.archive.partitions}  # type: ignore[union-attr]
            st = await h.until("archived more", lambda s: archived(s, partitions, first), 60)
            await load.halt()
            # Once appends stop, every sealed segment gets archived: the archived index reaches
            # the commit index but for the segment being written. A 4 KiB segment holds 62-64 of
            # these entries (a run whose load stopped near a segment's end had 61 unarchived,
            # over the 60 this allowed): fewer than SEGMENT_ENTRIES.
            for p in range(partitions):
                st = await h.until(
                    f"p{p} caught up with its manifest",
                    lambda s, p=p: (
                        (m := stored_manifest(s3, p)) is not None
                        and s.archive is not None
                        and s.archive.partitions[p].archived_index == m.archived_index
                        and s.archive.partitions[p].lag_entries < SEGMENT_ENTRIES
                    ),
                    60,
                )
            assert st.archive is not None
            for a in st.archive.partitions:
                commit = a.archived_index + a.lag_entries
                assert a.archived_index > first[a.partition] and commit > a.archived_index
                assert a.reported_by == st.leaders[str(a.partition)]
            assert st.problems == [] and st.phase == "Running"

            # The store down: appends go on, the problem names the partition and the error.
            load.start()
            s3.stop()
            # Each member's own pass finds the store down at its own moment: wait for all three.
            st = await h.until("the archive's failure reported by every member", failing_on_all, 60)
            problem = next(p for p in st.problems if p.startswith("spec.archive: partition 0"))
            entry = st.archive.partitions[0]  # type: ignore[union-attr]
            assert entry.last_error and entry.last_error[:200] in problem, (entry, problem)
            assert set(entry.failing_on) == {"c-0", "c-1", "c-2"}, entry
            degraded = next(c for c in st.conditions if c.type == "Degraded")
            assert degraded.status == "True" and degraded.reason == "ArchiveFailing"
            assert "spec.archive: partition 0" in degraded.message
            available = next(c for c in st.conditions if c.type == "Available")
            assert available.status == "True"
            held = {a.partition: a.archived_index for a in st.archive.partitions}  # type: ignore[union-attr]
            acked = len(load.acked)
            for _ in range(300):  # the producer may be in a retry pause: awaited, not sampled
                if len(load.acked) > acked + 50:
                    break
                await asyncio.sleep(0.1)
            assert len(load.acked) > acked + 50, "appends stopped with the store"
            assert "ArchiveFailing" in h.reasons()

            # Back (same folder, same ports): the problem clears and archiving catches up.
            s3.start()
            st = await h.until(
                "the archive recovered",
                lambda s: not failing(s) and archived(s, partitions, held),
                90,
            )
            assert not any(p.startswith("spec.archive") for p in st.problems)
            assert "ArchiveRecovered" in h.reasons()
            await load.halt()
            await load.all_read_back()
        finally:
            await h.op.close()


# ----------------------------------------------------------------------------- raftctl local


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def local_up_with_store(
    tmp_path: Path, base: Path, replicas: str, archive: str
) -> subprocess.Popen[str]:
    """`raftctl local up --object-store` of a cluster `orders` (`replicas`, `archive` in YAML)
    with its data in `base`."""
    manifest = tmp_path / "orders.yaml"
    manifest.write_text(
        "apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nmetadata: {name: orders}\n"
        f"spec:\n  {replicas}\n  partitions: 1\n  archive: {archive}\n"
    )
    env = {**os.environ, "RAFTLOG_DURABLE": "false", WEED_ENV: str(weed_binary())}
    return subprocess.Popen(
        [sys.executable, "-m", "raftlog.cli.main", "local", "up", "-f", str(manifest),
         "--data-dir", str(base), "--object-store"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@pytest.mark.slow
def test_local_up_object_store_runs_a_server_for_as_long_as_the_cluster(tmp_path: Path) -> None:
    base = tmp_path / "state"
    proc = local_up_with_store(
        tmp_path, base, "replicas: 3", "{url: 's3://orders-archive/prod', intervalSeconds: 0.5}"
    )
    lines: list[str] = []
    pid = None
    try:
        read_until(proc, "object store: http://127.0.0.1:", lines, 90)
        read_until(proc, "Ctrl-C", lines, 90)
        state = json.loads((base / "cluster.json").read_text())
        pid = state["objectStore"]["pid"]
        assert pid and alive(pid)
        store = base / "object-store"
        creds = (store / "credentials").read_text().split()
        assert len(creds) == 2 and (store / "credentials").stat().st_mode & 0o077 == 0
        # The members reach it with its credentials (the bucket was made for them): their
        # archive passes work (a missing bucket or refused key would be in status.problems).
        deadline = time.monotonic() + 60
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = json.loads((base / "status.json").read_text())
            parts = (status.get("archive") or {}).get("partitions") or []
            if parts and all(a["lastError"] is None and not a["failingOn"] for a in parts):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"archive never reported fine: {status.get('archive')}")
        assert status["archive"]["url"] == "s3://orders-archive/prod"
        assert not status["problems"]
        ports = json.loads((store / "ports.json").read_text())
        server = S3Server(store, access_key=creds[0], secret_key=creds[1], ports=ports)
        assert server.endpoint == state["objectStore"]["endpoint"]
        assert "orders-archive" in server.list_buckets()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    # Stopped with the cluster, its data kept for the next `local up`.
    assert pid is not None and not alive(pid)
    assert (base / "object-store" / "data").is_dir()


def test_local_down_after_local_up_was_killed_stops_its_object_store_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a review: the object store runs in a session of its own, as the members do,
    and outlived a `local up` killed with SIGKILL; `local down` stopped the members only."""
    base = tmp_path / "state"
    proc = local_up_with_store(tmp_path, base, "replicas: 1", "{url: 's3://orders-archive/p'}")
    lines: list[str] = []
    try:
        read_until(proc, "Ctrl-C", lines, 90)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    state = json.loads((base / "cluster.json").read_text())
    store, nodes = state["objectStore"]["pid"], state["pids"]

    def running(pid: int) -> bool:  # not a zombie: nothing here may reap the orphans
        return started_at(pid) is not None

    assert running(store) and all(running(p) for p in nodes)  # outlived it
    capsys.readouterr()
    assert main(["local", "down", "--data-dir", str(base)]) == 0
    assert not running(store) and not any(running(p) for p in nodes)
    assert capsys.readouterr().out == "stopped 1 node\n"  # not "not running" (a planted bug)


@pytest.mark.timeout(120)  # a refusal missed starts a real `local up`, which blocks until stopped
def test_local_up_object_store_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        "apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nmetadata: {name: p}\n"
        "spec: {replicas: 1}\n"
    )
    base = tmp_path / "state"
    assert main(["local", "up", "-f", str(plain), "--data-dir", str(base), "--object-store"]) == 1
    assert "--object-store: the manifest has no spec.archive" in capsys.readouterr().err
    assert main(["local", "up", "-f", str(plain), "--data-dir", str(base), "--weed", "/x"]) == 1
    assert "--weed: only with --object-store" in capsys.readouterr().err
    archiving = tmp_path / "a.yaml"
    archiving.write_text(
        "apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nmetadata: {name: a}\n"
        "spec:\n  replicas: 1\n  archive: {url: 's3://abc/x'}\n"
    )
    missing = tmp_path / "no-weed"
    args = ["local", "up", "-f", str(archiving), "--data-dir", str(tmp_path / "a"),
            "--object-store", "--weed", str(missing)]  # fmt: skip
    assert main(args) == 1
    assert f"--object-store: weed: {missing} is not a file" in capsys.readouterr().err
