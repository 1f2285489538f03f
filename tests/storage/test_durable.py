"""DurableStorage: hard state, snapshots (chunks, interrupted installs), holds, disk faults."""

from __future__ import annotations

import errno
import os

import pytest
from tests.storage.helpers import ents

from raftlog.node.core.errors import Compacted, SafetyViolation
from raftlog.node.core.types import HardState, Membership, SnapshotMeta
from raftlog.node.record import Record, encode_record
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import CorruptFile, SnapshotCorruption, StorageFailed
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.snapshots import Chunk

ABC = Membership.of(["a", "b", "c"])


def open_storage(path, **kw) -> DurableStorage:
    kw.setdefault("segment_bytes", 1024)
    return DurableStorage(str(path), **kw)


def test_fresh_partition_persists_bootstrap_membership_and_hard_state(tmp_path):
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(3, "b", 0), ents(1, 10, 3))
    s.save(HardState(3, "b", 7), [])
    s.close()
    s2 = open_storage(tmp_path, bootstrap=Membership.of(["x"]))  # ignored: it exists
    hs, snap = s2.initial_state()
    assert hs == HardState(3, "b", 7)
    assert snap == SnapshotMeta(0, 0, ABC)
    assert s2.entries(1, 11) == ents(1, 10, 3)


def test_hard_state_damage_refuses(tmp_path):
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(5, "a", 0), [])
    s.close()
    raw = (tmp_path / "hardstate").read_bytes()
    (tmp_path / "hardstate").write_bytes(raw.replace(b'"a"', b'"c"'))
    with pytest.raises(CorruptFile, match="hard state checksum mismatch"):
        open_storage(tmp_path)


def table_snapshot(n: int) -> bytes:
    t = KeyedTable()
    from raftlog.node.core.types import Entry

    for i in range(1, n + 1):
        t.apply(Entry(i, 1, data=encode_record(Record(key=b"k%d" % (i % 5), value=b"v%d" % i))))
    return t.snapshot()


def test_snapshot_create_compact_and_reopen(tmp_path):
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 150), ents(1, 200, 1))
    data = table_snapshot(150)
    s.create_snapshot(SnapshotMeta(150, 1, ABC), data)
    with pytest.raises(SafetyViolation, match="pass the snapshot"):
        s.compact(152)
    assert s.compact(151) == 150
    assert s.compaction_floor() == s.first_index() == 151  # inside a segment: the floor is exact
    with pytest.raises(Compacted):
        s.entries(150, 152)
    with pytest.raises(Compacted):
        s.term(148)
    assert s.term(150) == 1 and s.entries(151, 152) == ents(151, 151, 1)
    s.close()
    s2 = open_storage(tmp_path)
    assert s2.snapshot_meta() == SnapshotMeta(150, 1, ABC)
    assert s2.snapshot_data() == data
    assert KeyedTable.restore(s2.snapshot_data()).rows == KeyedTable.restore(data).rows
    # Reopened, the floor is the oldest segment's first entry: only whole segments were deleted.
    floor = s2.compaction_floor()
    assert 1 < floor <= 151
    assert (s2.first_index(), s2.last_index(), s2.term(150)) == (floor, 200, 1)
    assert s2.entries(floor, 201) == ents(floor, 200, 1)


def test_snapshot_above_commit_is_refused(tmp_path):
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 5), ents(1, 10, 1))
    with pytest.raises(SafetyViolation, match="above the commit index"):
        s.create_snapshot(SnapshotMeta(8, 1, ABC), b"")


def leader_with_snapshot(path) -> tuple[DurableStorage, bytes]:
    src = open_storage(path, bootstrap=ABC)
    src.save(HardState(2, "a", 300), ents(1, 300, 2))
    data = table_snapshot(300) + os.urandom(5000)  # big enough for several chunks
    src.create_snapshot(SnapshotMeta(300, 2, ABC), data)
    return src, data


def test_chunked_install_interrupted_at_every_chunk_boundary_keeps_the_old_state(tmp_path):
    src, data = leader_with_snapshot(tmp_path / "src")
    chunks = list(src.snapshots.chunks(chunk_bytes=1000))
    assert len(chunks) >= 6 and chunks[-1].last and not chunks[0].last
    dst_path = tmp_path / "dst"
    dst = open_storage(dst_path, bootstrap=ABC)
    dst.save(HardState(2, "a", 20), ents(1, 40, 2))
    old = (dst.snapshot_meta(), dst.snapshot_data(), dst.entries(1, 41), dst.initial_state())
    dst.close()
    for stop in range(len(chunks)):  # the transfer dies after `stop` chunks, then the process
        dst = open_storage(dst_path)
        rx = dst.snapshots.receiver(300, 2)
        rx.abort()  # each round starts from nothing, to stop at exactly this boundary
        rx = dst.snapshots.receiver(300, 2)
        for c in chunks[:stop]:
            rx.write(c)
        dst.close()
        again = open_storage(dst_path)
        assert (
            again.snapshot_meta(),
            again.snapshot_data(),
            again.entries(1, 41),
            again.initial_state(),
        ) == old, f"interrupted after {stop} chunks"
        again.close()
    # Finally the whole transfer, resumed from where the last attempt stopped.
    dst = open_storage(dst_path)
    rx = dst.snapshots.receiver(300, 2)
    assert rx.received == sum(len(c.data) for c in chunks[:-1])
    for c in chunks:
        rx.write(c)  # the ones already received are skipped
    meta, got = rx.verify()
    assert (meta.index, got) == (300, data)
    dst.install_received(rx, meta)
    assert (dst.first_index(), dst.last_index(), dst.term(300)) == (301, 300, 2)
    dst.close()
    final = open_storage(dst_path)
    assert final.snapshot_meta() == SnapshotMeta(300, 2, ABC)
    assert final.snapshot_data() == data
    assert final.initial_state()[0].commit == 300


def test_damaged_chunks_are_refused(tmp_path):
    src, _ = leader_with_snapshot(tmp_path / "src")
    chunks = list(src.snapshots.chunks(chunk_bytes=1000))
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 2)
    bad = Chunk(0, b"x" + chunks[0].data[1:], chunks[0].crc32c, chunks[0].total)
    with pytest.raises(SnapshotCorruption, match="checksum mismatch"):
        rx.write(bad)
    with pytest.raises(SnapshotCorruption, match="expected 0"):
        rx.write(chunks[1])
    # A whole file that does not verify (here: the wrong snapshot) is discarded, never installed.
    rx = dst.snapshots.receiver(299, 2)
    for c in chunks:
        rx.write(c)
    with pytest.raises(SnapshotCorruption, match="expected 299 2"):
        rx.verify()
    assert rx.received == 0 and dst.snapshot_meta().index == 0


def test_crash_between_snapshot_rename_and_log_reset_is_finished_on_open(tmp_path):
    _, data = leader_with_snapshot(tmp_path / "src")
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    dst.save(HardState(2, "a", 20), ents(1, 40, 1))  # diverges from the leader's term-2 log
    dst.snapshots.save(SnapshotMeta(300, 2, ABC), data)  # the crash comes before the reset
    dst.close()
    again = open_storage(tmp_path / "dst")
    assert any("interrupted snapshot install" in r for r in again.recovery)
    assert (again.first_index(), again.last_index(), again.term(300)) == (301, 300, 2)
    assert again.initial_state()[0].commit == 300


def test_an_interrupted_install_whose_index_is_inside_the_log_is_finished_on_open(tmp_path):
    """The snapshot's index is held by the log, but in another term: the entries above it
    (term 1, not the leader's) must not survive the install."""
    _, data = leader_with_snapshot(tmp_path / "src")
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    dst.save(HardState(2, "a", 20), ents(1, 40, 1))
    dst.snapshots.save(SnapshotMeta(30, 2, ABC), data)  # the crash comes before the reset
    dst.close()
    again = open_storage(tmp_path / "dst")
    assert any("interrupted snapshot install" in r for r in again.recovery)
    assert (again.first_index(), again.last_index(), again.term(30)) == (31, 30, 2)


def test_a_vote_in_a_term_already_saved_is_saved_too(tmp_path):
    """Term 3 saved with no vote (a candidate refused), then a vote in term 3: a restart must
    still know it, or the member could vote twice in one term (two leaders)."""
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(3, None, 0), [])
    s.save(HardState(3, "b", 0), [])
    s.close()
    hard = open_storage(tmp_path).initial_state()[0]
    assert (hard.term, hard.vote) == (3, "b")


def test_compaction_never_passes_a_live_retention_hold(tmp_path):
    now = [1000.0]
    s = open_storage(tmp_path, bootstrap=ABC, clock=lambda: now[0])
    s.save(HardState(1, "a", 400), ents(1, 400, 1))
    s.create_snapshot(SnapshotMeta(400, 1, ABC), b"")
    s.set_hold("spark-archive", 120, ttl_seconds=30)
    s.compact(401)
    assert s.compaction_floor() <= 120, "a live hold keeps its index"
    assert s.entries(120, 121)
    s.close()
    s = open_storage(tmp_path, clock=lambda: now[0])  # holds survive a restart
    assert [h.holder for h in s.holds.live()] == ["spark-archive"]
    s.compact(401)
    assert s.compaction_floor() <= 120
    now[0] += 31  # not renewed: it expires
    assert s.holds.floor() is None
    s.compact(401)
    assert s.compaction_floor() > 120
    with pytest.raises(ValueError, match="ttl_seconds"):
        s.set_hold("x", 500, ttl_seconds=0)
    with pytest.raises(Compacted, match="min_index: 5 is already compacted"):
        s.set_hold("late", 5, ttl_seconds=10)


class FailingDisk(FileOps):
    """A disk that fails the n-th write or fsync with the given errno (after a partial write)."""

    def __init__(self, op: str, err: int, after: int = 0) -> None:
        self.op, self.err, self.after = op, err, after

    def _maybe_fail(self, op: str) -> None:
        if op == self.op:
            if self.after == 0:
                raise OSError(self.err, os.strerror(self.err))
            self.after -= 1

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        if self.op == "write" and self.after == 0:
            os.write(fd, bytes(data)[: len(data) // 2])  # a torn write, then the error
        self._maybe_fail("write")
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fdatasync(fd)


@pytest.mark.parametrize(
    ("op", "err"), [("write", errno.ENOSPC), ("write", errno.EIO), ("fsync", errno.EIO)]
)
def test_disk_fault_stops_writes_keeps_reads_and_recovers_cleanly(tmp_path, op, err):
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 30), ents(1, 50, 1))
    s.close()
    disk = FailingDisk(op, err, after=10**9)
    s = open_storage(tmp_path, ops=disk)
    disk.after = 0
    with pytest.raises(StorageFailed) as info:
        s.save(HardState(1, "a", 30), ents(51, 60, 1))
    assert info.value.errno == err
    assert "writes to this partition are stopped" in str(info.value)
    assert s.failed is info.value
    with pytest.raises(StorageFailed):  # permanent: no retry after a failed fsync
        s.save(None, ents(61, 61, 1))
    with pytest.raises(StorageFailed):
        s.create_snapshot(SnapshotMeta(30, 1, ABC), b"")
    assert s.entries(1, 31) == ents(1, 30, 1), "committed reads are still served"
    s.close()
    again = open_storage(tmp_path)
    assert again.entries(1, 51) == ents(1, 50, 1), "no corruption: the durable prefix is intact"
    # What the failed write or fsync left in the page cache may survive, but only as a clean
    # prefix of the batch (a torn record is cut): never a damaged entry.
    last = again.last_index()
    assert 50 <= last <= 60
    assert again.entries(51, last + 1) == ents(51, 60, 1)[: last - 50]


def test_a_term_behind_the_log_is_raised_on_open(tmp_path):
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(2, "b", 0), ents(1, 5, 2))
    s.wal.append(ents(6, 8, 4))  # durable entries of term 4, but the crash beat the hard state
    s.wal.sync()
    s.close()
    again = open_storage(tmp_path)
    hs, _ = again.initial_state()
    assert (hs.term, hs.vote) == (4, None)
    assert any("raised the term from 2 to 4" in r for r in again.recovery)


def test_a_retransmitted_last_chunk_is_not_taken_twice(tmp_path):
    src, _ = leader_with_snapshot(tmp_path / "src")
    chunks = list(src.snapshots.chunks(chunk_bytes=1000))
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 2)
    assert all(rx.write(c) for c in chunks)
    assert rx.write(chunks[-1]) is False, "a retransmission is recognised as one"
    meta, _ = rx.verify()
    dst.install_received(rx, meta)
    assert dst.snapshot_meta().index == 300


class FailingUnlink(FileOps):
    def __init__(self) -> None:
        self.fail = False

    def unlink(self, path: str) -> None:
        if self.fail:
            raise OSError(errno.EROFS, "Read-only file system")
        super().unlink(path)


def test_a_failed_reset_leaves_a_readable_storage_and_no_open_files(tmp_path):
    disk = FailingUnlink()
    s = open_storage(tmp_path, bootstrap=ABC, ops=disk)
    s.save(HardState(1, "a", 30), ents(1, 300, 1))  # several segments
    fds_before = len(os.listdir("/proc/self/fd"))
    disk.fail = True
    with pytest.raises(StorageFailed):
        s.install_snapshot(SnapshotMeta(500, 2, ABC), b"")
    # Reads go on, against the new (empty) log behind the snapshot, and no descriptor of a
    # closed segment is ever read again.
    assert (s.first_index(), s.last_index(), s.term(500)) == (501, 500, 2)
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 1, "old segments' files are closed"
    s.close()
    again = open_storage(tmp_path)  # the leftovers are superseded and removed on open
    assert (again.first_index(), again.last_index()) == (501, 500)


def test_opening_without_a_bootstrap_never_decides_the_membership(tmp_path):
    """Found by the crash test: its audit opened a directory the child had not initialised yet,
    wrote an empty membership as the snapshot at 0, and the next run could never elect itself."""
    inspected = open_storage(tmp_path)  # e.g. a tool, or a member waiting to join
    assert inspected.snapshot_meta().membership == Membership()
    inspected.close()
    assert not list((tmp_path / "snap").glob("*.snap")), "nothing was decided on disk"
    s = open_storage(tmp_path, bootstrap=ABC)  # the real first start still bootstraps
    assert s.snapshot_meta().membership == ABC
    s.close()
    assert open_storage(tmp_path).snapshot_meta().membership == ABC


def test_wal_stays_bounded_when_a_segment_holds_more_than_one_pass_removes(tmp_path):
    """The defaults' shape, scaled down: a segment holds ~10x `max_entries_per_compaction`
    entries (64 MiB holds ~500,000 records of 100 bytes; a pass removes at most 100,000). The
    floor must keep up with the applied index and old segments must go."""
    from raftlog.node.core.config import RaftConfig
    from raftlog.node.server.compaction_pass import compact_behind

    cfg = RaftConfig(
        compact_every_operations=100, compact_number_entries=20, max_entries_per_compaction=150
    )
    s = DurableStorage(str(tmp_path), bootstrap=ABC, durable=False, segment_bytes=32 * 1024)
    last = 0
    for _ in range(100):  # 10,000 entries of ~60 bytes: ~20 segments' worth
        s.save(HardState(1, "a", last + 100), ents(last + 1, last + 100, 1))
        last += 100
        s.create_snapshot(SnapshotMeta(last, 1, ABC), b"")
        compact_behind(s, last, last, cfg)
    assert s.compaction_floor() >= last - cfg.compact_number_entries - 100
    segments = len(os.listdir(tmp_path / "wal"))
    assert segments <= 3, f"{segments} segments kept for a floor at {s.compaction_floor()}"
    s.close()
