"""Backups and restore through the operator on the local runtime against the real S3 server
(issue 21): a backup asked for with the `raftlog.dev/backup` annotation under appends, then a
new cluster created with `spec.restore` from it holds every record acknowledged before the
backup was asked, none acknowledged after it was taken, and takes appends of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.operator.test_local_day2 import Load, annotate
from tests.operator.test_local_operator import Harness, running

from raftlog.client import AsyncClient
from raftlog.harness.s3 import S3Server
from raftlog.operator.controls import BACKUP
from raftlog.operator.models import RaftClusterStatus

pytestmark = [pytest.mark.s3, pytest.mark.operator, pytest.mark.slow, pytest.mark.asyncio]

BUCKET = "archive"
PARTITIONS = 2


def manifest(s3: S3Server, name: str, restore: str | None = None) -> str:
    text = (
        f"apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nmetadata:\n  name: {name}\n"
        f"spec:\n  replicas: 3\n  partitions: {PARTITIONS}\n"
        "  raft: {learnerPromotionLag: 10, learnerPromotionStableWindow: 2}\n"
        "  storage: {segmentBytes: 4096}\n"
        f"  archive:\n    url: s3://{BUCKET}/{name}\n    endpoint: {s3.endpoint}\n"
        f"    region: {s3.region}\n    credentialsSecret: s3\n    intervalSeconds: 0.3\n"
    )
    if restore is not None:
        text += f"  restore:\n    url: s3://{BUCKET}/c\n    target: {restore}\n"
    return text


def secret(base: Path, s3: S3Server) -> Path:
    folder = base / "secrets" / "s3"
    folder.mkdir(parents=True)
    (folder / "accessKeyId").write_text(s3.access_key)
    (folder / "secretAccessKey").write_text(s3.secret_key)
    return base


def backup_done(name: str) -> Callable[[RaftClusterStatus], bool]:
    def pred(s: RaftClusterStatus) -> bool:
        return any(b.name == name and b.state != "pending" for b in s.backups)

    return pred


async def read_all(h: Harness, p: int) -> dict[int, str]:
    got: dict[int, str] = {}
    async with AsyncClient(h.op.endpoints(), retries=20) as client:
        start = 1
        while True:
            reply = await client.read(p, start, limit=1000)
            got.update({r["index"]: r["value"] for r in reply["records"]})
            if reply["next"] == start:
                return got
            start = reply["next"]


async def test_a_backup_by_annotation_then_a_new_cluster_restored_from_it(
    tmp_path: Path,
) -> None:
    with S3Server(tmp_path / "s3", buckets=(BUCKET,)) as s3:
        src = Harness(secret(tmp_path / "c", s3), manifest(s3, "c"))
        try:
            await src.until("bootstrap", running(3), 60)
            load = Load(src, PARTITIONS)
            load.start()
            while len(load.acked) < 150:
                await asyncio.sleep(0.1)
            before = list(load.acked)  # acknowledged before the backup is asked for
            annotate(src, BACKUP, "b1")
            st = await src.until("backup b1", backup_done("b1"), 60)
            b1 = next(b for b in st.backups if b.name == "b1")
            assert b1.state == "done", b1.message
            point = {p.partition: p.index for p in b1.partitions}
            assert "BackupDone" in src.reasons()
            taken = len(load.acked)
            while len(load.acked) < taken + 100:
                await asyncio.sleep(0.1)
            await load.halt()
            after = [a for a in load.acked if a[1] > point[a[0]]]  # committed after the point
            assert after, "appends after the backup"
        finally:
            await src.op.close()

        dst = Harness(secret(tmp_path / "r", s3), manifest(s3, "r", restore="backup:b1"))
        try:
            st = await dst.until("restored and running", running(3), 90)
            assert st.restore is not None and st.restore.state == "planned"
            assert {p.partition: p.index for p in st.restore.partitions} == point
            assert "RestorePlanned" in dst.reasons()
            for p in range(PARTITIONS):
                got = await read_all(dst, p)
                lost = [(i, v) for q, i, v in before if q == p and got.get(i) != v]
                assert not lost, f"partition {p}: acknowledged before the backup, not restored"
                extra = [(i, v) for q, i, v in after if q == p and i in got]
                assert not extra, f"partition {p}: committed after the backup, restored"
                assert max(got) <= point[p]
            # The restored cluster takes appends after the restored log.
            async with AsyncClient(dst.op.endpoints(), retries=20) as client:
                r = await client.append(0, [{"key": "k", "value": "after"}])
                assert r.first_index > point[0]
        finally:
            await dst.op.close()


async def test_a_point_in_time_restore_holds_the_records_stamped_up_to_the_time(
    tmp_path: Path,
) -> None:
    """Records stamped before T, then after it (the producer's timestamps); a cluster restored
    to T holds every one of the first and none of the second, in every partition."""
    t_before, t_after = 1_700_000_000_000, 1_700_000_600_000
    restore_at = t_before + 300_000
    with S3Server(tmp_path / "s3", buckets=(BUCKET,)) as s3:
        src = Harness(secret(tmp_path / "c", s3), manifest(s3, "c"))
        acked: dict[int, list[tuple[int, str, int]]] = {p: [] for p in range(PARTITIONS)}
        try:
            await src.until("bootstrap", running(3), 60)
            async with AsyncClient(src.op.endpoints(), retries=20) as client:
                for stamp, tag in ((t_before, "early"), (t_after, "late")):
                    for p in range(PARTITIONS):
                        for i in range(0, 40, 4):
                            js = range(i, i + 4)
                            recs = [
                                {"key": f"k{j}", "value": f"{tag}-{j}", "timestamp_ms": stamp + j}
                                for j in js
                            ]
                            r = await client.append(p, recs)
                            acked[p] += [
                                (r.first_index + k, f"{tag}-{j}", stamp + j)
                                for k, j in enumerate(js)
                            ]
            # A backup archives everything committed (the active segment's records included).
            annotate(src, BACKUP, "all")
            st = await src.until("backup all", backup_done("all"), 60)
            assert next(b for b in st.backups if b.name == "all").state == "done"
        finally:
            await src.op.close()

        target = f"time:{restore_at}"
        dst = Harness(secret(tmp_path / "t", s3), manifest(s3, "t", restore=target))
        try:
            st = await dst.until("restored to a time and running", running(3), 90)
            assert st.restore is not None and st.restore.state == "planned"
            for p in range(PARTITIONS):
                got = await read_all(dst, p)
                early = [(i, v) for i, v, ts in acked[p] if ts <= restore_at]
                late = [(i, v) for i, v, ts in acked[p] if ts > restore_at]
                assert early and late
                assert all(got.get(i) == v for i, v in early), f"partition {p}: early lost"
                assert not [i for i, _ in late if i in got], f"partition {p}: late restored"
                planned = next(x.index for x in st.restore.partitions if x.partition == p)
                assert planned == min(i for i, _ in late) - 1
        finally:
            await dst.op.close()
