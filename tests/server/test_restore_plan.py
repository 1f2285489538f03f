"""Restore from an archive held in memory (`server/restore.py`), without an S3 server: what a
restored partition holds on disk (the archived entries up to the index, committed; a snapshot
there and one membership entry after it, both naming the new voters), which partitions a member
counts as held, and the time targets that cannot be placed. The journeys against the real S3
server are in tests/s3/test_backup_restore.py and tests/s3/test_local_restore.py."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from tests.server.test_archive_settings import MemoryStore

from raftlog.node.core.raft import Role
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership
from raftlog.node.record import Record, encode_record
from raftlog.node.server import archive, restore
from raftlog.node.server.restore_target import Target
from raftlog.node.storage.durable import DurableStorage


async def archived(tmp_path: Path, entries: list[Entry], commit: int) -> MemoryStore:
    """A one-partition archive (prefix "x") of `entries`, flushed up to `commit`."""
    storage = DurableStorage(
        str(tmp_path / "src"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    storage.save(HardState(1, None, commit), entries)

    class Driver:
        archive_floor = 1
        raft = types.SimpleNamespace(role=Role.LEADER, term=1, commit=commit, leader="n1")

        def __init__(self) -> None:
            self.storage = storage

        async def linearizable_point(self) -> int:
            return commit

    store = MemoryStore()
    a = archive.Archiver(types.SimpleNamespace(drivers={0: Driver()}, id="n1"), store, "x", 3600)  # type: ignore[arg-type]
    assert await a.flush(0) == commit
    storage.close()
    return store


def blobs(n: int) -> list[Entry]:
    return [Entry(i, 1, EntryKind.NORMAL, b"x" * 40) for i in range(1, n + 1)]


@pytest.mark.asyncio
async def test_a_restored_partition_is_the_archived_log_then_the_new_voters(
    tmp_path: Path,
) -> None:
    store = await archived(tmp_path, blobs(60), 60)
    path = str(tmp_path / "dst" / "p0")
    (tmp_path / "dst").mkdir()
    done = await restore.restore_partition(store, "x", 0, 45, path, ["a", "b", "c"])
    assert (done.index, done.first_index, done.entries) == (45, 1, 45)
    s = DurableStorage(path, durable=False)
    try:
        hs, snap = s.initial_state()
        assert (snap.index, hs.commit) == (45, 45)
        assert snap.membership == Membership.of(["a", "b", "c"])
        assert [e.data for e in s.entries(1, 46)] == [b"x" * 40] * 45
        # One entry after the restored log: the new voters, not committed yet.
        assert s.last_index() == 46
        (config,) = s.entries(46, 47)
        assert config.kind == EntryKind.CONFIG
        assert Membership.decode(config.data) == Membership.of(["a", "b", "c"])
    finally:
        s.close()
    assert restore._holds(path)
    # A member's first start holds nothing yet: an empty directory is not a partition.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not restore._holds(str(empty))
    assert not restore._holds(str(tmp_path / "absent"))


@pytest.mark.asyncio
async def test_a_time_target_is_refused_where_no_record_carries_a_time(tmp_path: Path) -> None:
    store = await archived(tmp_path, blobs(30), 30)
    with pytest.raises(restore.RestoreError, match="partition 0: no archived record carries"):
        await restore.resolve(store, "x", 1, Target("time", time_ms=10**12))


@pytest.mark.asyncio
async def test_a_time_target_cuts_before_the_first_record_stamped_after_it(
    tmp_path: Path,
) -> None:
    # Stamps not rising with the index: the cut is before the first one after the time.
    stamps = [100, 300, 200, 250, 400, 150, 500]
    entries = [
        Entry(i + 1, 1, EntryKind.NORMAL, encode_record(Record(None, b"v", {}, t)))
        for i, t in enumerate(stamps)
    ]
    store = await archived(tmp_path, entries, len(entries))
    got = await restore.resolve(store, "x", 1, Target("time", time_ms=260))
    assert got == {0: 1}  # index 2 (300) is the first after 260
    assert await restore.resolve(store, "x", 1, Target("time", time_ms=1000)) == {0: 7}


@pytest.mark.asyncio
async def test_a_backup_name_is_taken_once_unless_the_same_backup_is_resumed() -> None:
    store = MemoryStore()
    flushed: list[int] = []

    async def flush(p: int) -> int:
        flushed.append(p)
        return 10 + p

    first = await restore.take_backup(store, "x", "b1", 2, flush)
    assert first.partitions == {0: 10, 1: 11} and flushed == [0, 1]
    with pytest.raises(restore.RestoreError, match="'b1' exists already"):
        await restore.take_backup(store, "x", "b1", 2, flush)
    resumed = await restore.take_backup(store, "x", "b1", 2, flush, adopt=True)
    assert resumed == first and flushed == [0, 1]  # the record it wrote, no second flush
