"""DurableStorage: hard state, snapshots (chunks, interrupted installs), holds, disk faults."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from crc32c import crc32c
from tests.storage.helpers import ents, records_end

from raftlog.node.core.errors import Compacted, SafetyViolation
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from raftlog.node.record import Record, encode_record
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import (
    CorruptFile,
    SnapshotCorruption,
    SnapshotNoRoom,
    StorageFailed,
    WalCorruption,
)
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.segment import encode_commit
from raftlog.node.storage.snapshots import (
    SPACE_KEPT,
    Chunk,
    SnapshotReceiver,
    SnapshotStore,
    snapshot_name,
    space_kept,
)

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


def test_a_term_and_vote_are_on_disk_before_save_returns(tmp_path):
    """The vote is what keeps a member from voting twice in a term: written without its
    fsyncs, a power loss could forget a vote already sent (a planted bug survived the tests
    that do not cut power)."""

    class Syncs(FileOps):
        def __init__(self) -> None:
            self.events: list[str] = []

        def fsync(self, fd: int) -> None:
            self.events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
            super().fsync(fd)

        def fsync_dir(self, path: str) -> None:
            self.events.append("fsync_dir")
            super().fsync_dir(path)

        def replace(self, src: str, dst: str) -> None:
            self.events.append("replace " + os.path.basename(dst))
            super().replace(src, dst)

    disk = Syncs()
    s = open_storage(tmp_path, bootstrap=ABC, ops=disk)
    disk.events.clear()
    s.save(HardState(5, "b", 0), [])
    hard = [e for e in disk.events if "hardstate" in e or e == "fsync_dir"]
    assert hard[:3] == ["fsync hardstate.tmp", "replace hardstate", "fsync_dir"], disk.events
    s.close()


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


def test_an_upload_that_starts_leaves_a_snapshot_verified_and_offered(tmp_path):
    """An upload that starts removes the partition's oldest partial files but the newest, and
    never one verified whole and offered to the core (the oldest here): the core installs it in
    its next pass, from that file."""
    src, data = leader_with_snapshot(tmp_path / "src")
    chunks = list(src.snapshots.chunks(chunk_bytes=1000))
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    offered = dst.snapshots.receiver(300, 2)
    for c in chunks:
        offered.write(c)
    meta, _ = offered.verify()

    def partials() -> list[str]:
        return sorted(p.name for p in (tmp_path / "dst" / "snap").glob("*.partial"))

    for index in (400, 500, 600):  # other uploads start meanwhile, each after the one before
        time.sleep(0.01)  # written later by the clock of file times too
        dst.snapshots.receiver(index, 3).write(chunks[0])
    assert partials() == [
        f"{i:020}-{t:020}.snap.partial" for i, t in ((300, 2), (500, 3), (600, 3))
    ]
    dst.install_received(offered, meta)
    assert dst.snapshot_meta() == SnapshotMeta(300, 2, ABC) and dst.snapshot_data() == data


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


def test_a_hard_state_file_lost_beside_entries_refuses_the_open(tmp_path):
    """The vote of term 9 is in the hard state only (the log's last term is 2). Taken as term
    0 or 2 with no vote, this member would vote again in term 9."""
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(2, "b", 0), ents(1, 5, 2))
    s.save(HardState(9, "c", 0), [])
    s.close()
    (tmp_path / "hardstate").unlink()
    with pytest.raises(CorruptFile) as info:
        open_storage(tmp_path)
    assert info.value.path == str(tmp_path / "hardstate")
    assert "holds entries up to 5 (term 2)" in str(info.value)
    assert "--join" in str(info.value)


def test_no_hard_state_yet_beside_no_entries_opens(tmp_path):
    """A new member (bootstrapped, or waiting to join) has no hard state file yet."""
    open_storage(tmp_path, bootstrap=ABC).close()
    again = open_storage(tmp_path)
    assert (again.initial_state()[0].term, again.last_index()) == (0, 0)
    again.close()


def test_a_hard_state_file_lost_beside_a_snapshot_alone_refuses_the_open(tmp_path):
    """Found by a fault helper: a partition compacted whole (a snapshot, no entry past it) whose
    hard state file was deleted opened as term 0, its vote forgotten. A member has a snapshot
    past its initial members only after a term of its own: it took it from entries, or it was
    installed after the leader's first append, whose term was saved before any answer."""
    src, _ = leader_with_snapshot(tmp_path / "src")
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    dst.save(HardState(2, "a", 0), [])
    rx = dst.snapshots.receiver(300, 2)
    assert all(rx.write(c) for c in src.snapshots.chunks(chunk_bytes=1000))
    meta, data = rx.verify()
    dst.install_snapshot(meta, data)
    dst.close()
    installed = open_storage(tmp_path / "dst")
    assert installed.snapshot_meta().index == meta.index == installed.last_index() > 0
    assert (installed.initial_state()[0].term, installed.initial_state()[0].vote) == (2, "a")
    installed.close()
    (tmp_path / "dst" / "hardstate").unlink()
    with pytest.raises(CorruptFile) as info:
        open_storage(tmp_path / "dst")
    assert info.value.path == str(tmp_path / "dst" / "hardstate")


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


# ---- the snapshot file and its transfer ------------------------------------------------------


def snapshot_file(s: DurableStorage) -> Path:
    assert s.snapshots.file is not None
    return Path(s.snapshots.file)


def _header_length(raw: bytes) -> int:
    return int.from_bytes(raw[8:12], "little")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(lambda raw: raw[:7] + b"2" + raw[8:], "bad magic", id="magic"),
        pytest.param(lambda raw: raw[:10], "cut short in the header", id="cut-in-length"),
        pytest.param(
            lambda raw: raw[: 12 + _header_length(raw) + 2],
            "cut short in the header",
            id="cut-in-header-checksum",
        ),
        pytest.param(
            lambda raw: raw.replace(b'"index": 300', b'"index": 301', 1),
            "header checksum mismatch",
            id="header-edited",
        ),
        pytest.param(lambda raw: raw[:-1], "data is {n_minus_1} bytes", id="data-cut"),
        pytest.param(lambda raw: raw + b"\0", "data is {n_plus_1} bytes", id="data-extended"),
        pytest.param(
            lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "data checksum mismatch", id="data-flip"
        ),
    ],
)
def test_a_damaged_snapshot_file_refuses_to_open_naming_the_damage(
    tmp_path: Path, damage: Callable[[bytes], bytes], reason: str
) -> None:
    src, data = leader_with_snapshot(tmp_path)
    file = snapshot_file(src)
    src.close()
    file.write_bytes(damage(file.read_bytes()))
    n = len(data)
    expected = reason.format(n_minus_1=n - 1, n_plus_1=n + 1)
    with pytest.raises(SnapshotCorruption) as info:
        open_storage(tmp_path)
    assert info.value.reason.startswith(expected)
    assert info.value.path == str(file)


def test_a_snapshot_keeps_the_learners_of_its_membership(tmp_path: Path) -> None:
    members = Membership.of(["a", "b", "c"], learners=("d", "e"))
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 10), ents(1, 10, 1))
    s.create_snapshot(SnapshotMeta(10, 1, members), b"table")
    s.close()
    again = open_storage(tmp_path)
    assert again.snapshot_meta() == SnapshotMeta(10, 1, members)
    again.close()


def test_a_snapshot_write_cut_short_leaves_no_file_behind_after_a_restart(tmp_path: Path) -> None:
    open_storage(tmp_path, bootstrap=ABC).close()
    leftover = tmp_path / "snap" / (snapshot_name(10, 1) + ".tmp")
    leftover.write_bytes(b"the first half of a snapshot")  # the crash came during the write
    again = open_storage(tmp_path)
    assert not leftover.exists()
    assert again.snapshot_meta() == SnapshotMeta(0, 0, ABC)
    again.close()


def test_peek_reads_the_newest_of_two_snapshot_files_left_by_a_crash(tmp_path: Path) -> None:
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 20), ents(1, 20, 1))
    s.create_snapshot(SnapshotMeta(10, 1, ABC), b"old")
    s.write_snapshot_file(SnapshotMeta(20, 1, ABC), b"new")  # the crash comes before adopting it
    s.close()
    assert len(list((tmp_path / "snap").glob("*.snap"))) == 2
    assert SnapshotStore.peek(str(tmp_path / "snap")) == SnapshotMeta(20, 1, ABC)
    again = open_storage(tmp_path)
    assert (again.snapshot_meta(), again.snapshot_data()) == (SnapshotMeta(20, 1, ABC), b"new")
    again.close()


def test_reading_a_snapshot_whose_file_vanished_reports_the_missing_file(tmp_path: Path) -> None:
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 10), ents(1, 10, 1))
    s.create_snapshot(SnapshotMeta(10, 1, ABC), b"table")
    assert s.snapshots.read_latest() == (SnapshotMeta(10, 1, ABC), b"table")
    file = snapshot_file(s)
    file.unlink()  # removed behind the node's back, not replaced by a newer snapshot
    with pytest.raises(FileNotFoundError) as info:
        s.snapshots.read_latest()
    assert info.value.filename == str(file)
    s.close()


def test_adopting_a_local_file_of_the_snapshot_just_installed_keeps_that_snapshot(
    tmp_path: Path,
) -> None:
    """A local snapshot at 20 is written while the leader installs its own at 20: both have the
    same file name. The local one is not adopted, and the installed one must stay."""
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 20), ents(1, 20, 1))
    meta = SnapshotMeta(20, 1, ABC)
    path = s.write_snapshot_file(meta, b"table at 20")
    s.install_snapshot(meta, b"table at 20")
    assert s.adopt_snapshot(meta, path) is False
    assert s.snapshot_data() == b"table at 20"
    s.close()
    again = open_storage(tmp_path)
    assert (again.snapshot_meta(), again.snapshot_data()) == (meta, b"table at 20")
    again.close()


def test_a_transfer_resumed_from_the_bytes_received_installs_the_snapshot(tmp_path: Path) -> None:
    src, data = leader_with_snapshot(tmp_path / "src")
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 2)
    for c in list(src.snapshots.chunks(chunk_bytes=1000))[:3]:
        rx.write(c)
    rx = dst.snapshots.receiver(300, 2)  # the next attempt asks how much is already here
    resumed = list(src.snapshots.chunks(chunk_bytes=1000, start=rx.received))
    assert resumed[0].offset == rx.received == 3000
    assert all(install_all(dst, rx, resumed, data))


def install_all(
    dst: DurableStorage, rx: SnapshotReceiver, chunks: list[Chunk], data: bytes
) -> list[bool]:
    """Write `chunks` (what each write returned: False for bytes already held), verify the
    file as the snapshot at 300 of term 2 holding `data`, and install it."""
    taken = [rx.write(c) for c in chunks]
    meta, got = rx.verify()
    assert (meta, got) == (SnapshotMeta(300, 2, ABC), data)
    dst.install_received(rx, meta)
    assert dst.snapshot_data() == data
    return taken


def test_a_chunk_one_byte_past_what_was_received_is_refused(tmp_path: Path) -> None:
    src, _ = leader_with_snapshot(tmp_path / "src")
    raw = snapshot_file(src).read_bytes()
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 2)
    assert rx.write(Chunk.of(raw, 0, 1000))
    with pytest.raises(SnapshotCorruption, match="chunk at offset 1001, expected 1000"):
        rx.write(Chunk.of(raw, 1001, 1000))
    assert rx.received == dst.snapshots.receiver(300, 2).received == 1000


def test_a_partial_file_larger_than_the_snapshot_sent_starts_over_and_installs(
    tmp_path: Path,
) -> None:
    """Bytes of another, larger file under the same index and term (a peer's, or one left by a
    restart) made every chunk of the real one a retransmission: it never installed."""
    src, data = leader_with_snapshot(tmp_path / "src")
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    raw_len = snapshot_file(src).stat().st_size
    Path(dst.snapshots.receiver(300, 2).partial).write_bytes(b"j" * (raw_len + 500))
    rx = dst.snapshots.receiver(300, 2)
    assert rx.received == raw_len + 500
    assert all(install_all(dst, rx, list(src.snapshots.chunks(chunk_bytes=1000)), data))


def test_a_chunk_past_its_total_or_giving_another_total_is_refused(tmp_path: Path) -> None:
    src, _ = leader_with_snapshot(tmp_path / "src")
    raw = snapshot_file(src).read_bytes()
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 2)
    first = Chunk.of(raw, 0, 1000)
    with pytest.raises(SnapshotCorruption, match="ends at 1000, past 999"):
        rx.write(Chunk(0, first.data, first.crc32c, 999))
    assert rx.write(first) and rx.received == 1000
    second = Chunk.of(raw, 1000, 1000)
    with pytest.raises(SnapshotCorruption, match="chunk at offset 1000, expected 0"):
        rx.write(Chunk(1000, second.data, second.crc32c, len(raw) + 1))
    assert rx.received == dst.snapshots.receiver(300, 2).received == 0


def test_an_upload_the_volume_cannot_hold_is_refused_before_a_byte_is_written(
    tmp_path: Path,
) -> None:
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    rx = dst.snapshots.receiver(300, 2)
    data = b"x" * 100
    margin = 256 * 1024 * 1024  # what other tests may write or delete meanwhile
    kept = space_kept(st)
    with pytest.raises(SnapshotNoRoom, match=f"{free - kept + margin} bytes does not fit"):
        rx.write(Chunk(0, data, crc32c(data), free - kept + margin))
    assert not Path(rx.partial).exists() and rx.received == 0
    assert rx.write(Chunk(0, data, crc32c(data), free - kept - margin))


@pytest.mark.parametrize(
    ("volume", "kept"),
    [(10 * 1024**3, SPACE_KEPT), (640 * 1024**2, SPACE_KEPT), (100 * 1024**2, 10 * 1024**2)],
)
def test_a_small_volume_keeps_a_tenth_of_itself_free_rather_than_64_mib(
    volume: int, kept: int
) -> None:
    st = os.statvfs_result((4096, 4096, volume // 4096, 0, 0, 0, 0, 0, 0, 255))
    assert space_kept(st) == kept


def test_a_received_snapshot_of_the_right_index_but_another_term_is_refused(
    tmp_path: Path,
) -> None:
    src, _ = leader_with_snapshot(tmp_path / "src")  # index 300, term 2
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 3)
    for c in src.snapshots.chunks(chunk_bytes=1000):
        rx.write(c)
    with pytest.raises(SnapshotCorruption, match="holds index 300 term 2, expected 300 3"):
        rx.verify()
    assert dst.snapshot_meta().index == 0


def test_after_a_transfer_fails_verification_the_next_starts_from_nothing_and_installs(
    tmp_path: Path,
) -> None:
    src, data = leader_with_snapshot(tmp_path / "src")
    raw = snapshot_file(src).read_bytes()
    rotten = raw[:-1] + bytes([raw[-1] ^ 1])  # each chunk's checksum holds, the file's does not
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 2)
    for offset in range(0, len(rotten), 1000):
        rx.write(Chunk.of(rotten, offset, 1000))
    with pytest.raises(SnapshotCorruption, match="data checksum mismatch"):
        rx.verify()
    rx = dst.snapshots.receiver(300, 2)  # the sender asks again how much is here
    assert rx.received == 0
    for c in src.snapshots.chunks(chunk_bytes=1000):
        rx.write(c)
    meta, got = rx.verify()
    assert (meta.index, got) == (300, data)


def test_an_aborted_transfer_is_discarded(tmp_path: Path) -> None:
    src, _ = leader_with_snapshot(tmp_path / "src")
    dst = open_storage(tmp_path / "dst", bootstrap=ABC)
    rx = dst.snapshots.receiver(300, 2)
    for c in list(src.snapshots.chunks(chunk_bytes=1000))[:2]:
        rx.write(c)
    rx.abort()
    assert dst.snapshots.receiver(300, 2).received == 0
    assert not list((tmp_path / "dst" / "snap").glob("*.partial"))


# ---- opening: the WAL against the snapshot ---------------------------------------------------


def test_a_wal_starting_one_entry_past_the_snapshot_s_next_refuses_to_open(tmp_path: Path) -> None:
    """The snapshot ends at F-2 and the WAL starts at F: entry F-1 is in neither, and opening
    must say so rather than start with a hole in the log."""
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 200), ents(1, 200, 1))
    s.create_snapshot(SnapshotMeta(150, 1, ABC), b"")
    s.compact(151)
    s.close()
    reopened = open_storage(tmp_path)
    first = reopened.first_index()  # the oldest segment kept
    reopened.close()
    assert first > 2
    for f in (tmp_path / "snap").glob("*.snap"):
        f.unlink()
    SnapshotStore(str(tmp_path / "snap")).save(SnapshotMeta(first - 2, 1, ABC), b"")
    with pytest.raises(WalCorruption, match=f"entries {first - 1}..{first - 1} are missing"):
        open_storage(tmp_path)


def test_a_snapshot_durable_before_the_commit_record_it_covers_restarts_committed_up_to_it(
    tmp_path: Path,
) -> None:
    """Group commit writes the commit record and syncs it later; a snapshot at the new commit
    index is synced on its own. A crash in between loses the record but not the snapshot: what
    the snapshot covers is committed all the same."""
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 100), ents(1, 200, 1))
    s.write(HardState(1, "a", 150), [])  # the commit record, not synced yet
    s.create_snapshot(SnapshotMeta(150, 1, ABC), b"table at 150")
    s.close()
    last = sorted((tmp_path / "wal").glob("*.wal"))[-1]
    end = records_end(str(last))
    record = encode_commit(150)
    raw = bytearray(last.read_bytes())
    assert raw[end - len(record) : end] == record
    raw[end - len(record) : end] = bytes(len(record))  # the crash lost it with the page cache
    last.write_bytes(bytes(raw))
    again = open_storage(tmp_path)
    assert again.snapshot_meta().index == 150
    assert again.initial_state()[0].commit == 150
    again.close()


def test_the_floor_below_the_snapshot_keeps_the_term_before_it_and_nothing_older(
    tmp_path: Path,
) -> None:
    """Compaction keeps the most recent entries, so the floor sits below the snapshot, here
    inside the only segment. The term of the entry just before the floor stays known (a
    leader's previous entry for a follower there); anything older reads as compacted, however
    it is read."""
    s = open_storage(tmp_path, bootstrap=ABC, segment_bytes=64 * 1024)
    s.save(HardState(3, "a", 300), ents(1, 100, 1) + ents(101, 200, 2) + ents(201, 300, 3))
    s.create_snapshot(SnapshotMeta(300, 3, ABC), b"")
    assert s.compact(101) == 100
    assert s.first_index() == 101
    assert (s.term(100), s.term(101)) == (1, 2)
    with pytest.raises(Compacted):
        s.term(99)
    with pytest.raises(Compacted):
        s.entries(100, 102)
    with pytest.raises(Compacted):
        s.read_raw(100, 102, 1 << 20)
    assert [(r.first, list(r.terms)) for r in s.read_raw(101, 103, 1 << 20)] == [(101, [2, 2])]
    s.close()


def test_a_membership_change_right_after_the_snapshot_is_known_after_a_restart(
    tmp_path: Path,
) -> None:
    abcd = Membership.of(["a", "b", "c", "d"])
    s = open_storage(tmp_path, bootstrap=ABC)
    change = Entry(11, 1, EntryKind.CONFIG, abcd.encode())
    s.save(HardState(1, "a", 11), [*ents(1, 10, 1), change, *ents(12, 12, 1)])
    s.create_snapshot(SnapshotMeta(10, 1, ABC), b"")
    s.close()
    again = open_storage(tmp_path)
    assert again.config_entries(again.snapshot_meta().index + 1) == [change]
    again.close()


class FlakyDisk(FileOps):
    """Fails the next fsync once `armed`, then is healthy again."""

    def __init__(self) -> None:
        self.armed = False

    def fsync(self, fd: int) -> None:
        if self.armed:
            self.armed = False
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self.fsync(fd)


def test_after_one_failed_fsync_no_snapshot_is_written_even_if_the_disk_recovers(
    tmp_path: Path,
) -> None:
    disk = FlakyDisk()
    s = open_storage(tmp_path, bootstrap=ABC, ops=disk)
    s.save(HardState(1, "a", 30), ents(1, 30, 1))
    disk.armed = True
    with pytest.raises(StorageFailed) as info:
        s.save(HardState(1, "a", 40), ents(31, 40, 1))
    with pytest.raises(StorageFailed) as again:
        s.create_snapshot(SnapshotMeta(30, 1, ABC), b"table at 30")
    assert again.value is info.value
    assert s.snapshot_meta().index == 0
    s.close()
    assert open_storage(tmp_path).snapshot_meta().index == 0


def test_a_failed_snapshot_write_is_a_storage_failure_that_stops_the_partition(
    tmp_path: Path,
) -> None:
    disk = FlakyDisk()
    s = open_storage(tmp_path, bootstrap=ABC, ops=disk)
    s.save(HardState(1, "a", 30), ents(1, 30, 1))
    disk.armed = True  # the snapshot's own fsync fails
    with pytest.raises(StorageFailed) as info:
        s.create_snapshot(SnapshotMeta(30, 1, ABC), b"table at 30")
    assert info.value.errno == errno.EIO
    assert s.failed is info.value
    with pytest.raises(StorageFailed):
        s.save(HardState(1, "a", 40), ents(31, 40, 1))
    s.close()


def test_a_snapshot_older_than_the_latest_is_ignored(tmp_path: Path) -> None:
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 200), ents(1, 200, 1))
    s.create_snapshot(SnapshotMeta(150, 1, ABC), b"table at 150")
    s.compact(151)
    s.create_snapshot(SnapshotMeta(100, 1, ABC), b"table at 100")  # e.g. a pass started earlier
    assert (s.snapshot_meta().index, s.snapshot_data()) == (150, b"table at 150")
    s.close()
    again = open_storage(tmp_path)
    assert (again.snapshot_meta().index, again.snapshot_data()) == (150, b"table at 150")
    again.close()


def test_a_snapshot_one_past_the_commit_index_is_refused_created_or_adopted(
    tmp_path: Path,
) -> None:
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 5), ents(1, 10, 1))
    past = SnapshotMeta(6, 1, ABC)
    with pytest.raises(SafetyViolation, match="above the commit index 5"):
        s.create_snapshot(past, b"")
    path = s.write_snapshot_file(past, b"")
    with pytest.raises(SafetyViolation, match="above the commit index 5"):
        s.adopt_snapshot(past, path)
    assert s.snapshot_meta().index == 0
    s.create_snapshot(SnapshotMeta(5, 1, ABC), b"")  # at the commit index: taken
    assert s.snapshot_meta().index == 5
    s.close()


def test_a_failed_snapshot_file_write_stops_the_partition_and_the_first_failure_stays(
    tmp_path: Path,
) -> None:
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 30), ents(1, 30, 1))
    first = s.snapshot_write_failed(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert first.errno == errno.ENOSPC
    assert s.failed is first
    with pytest.raises(StorageFailed):
        s.save(HardState(1, "a", 40), ents(31, 40, 1))
    later = s.snapshot_write_failed(OSError(errno.EIO, os.strerror(errno.EIO)))
    assert later is first and s.failed is first, "the cause is the first failure"
    s.close()


def test_a_hold_at_the_floor_is_taken_and_a_bad_hold_below_it_is_a_bad_request(
    tmp_path: Path,
) -> None:
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 400), ents(1, 400, 1))
    s.create_snapshot(SnapshotMeta(400, 1, ABC), b"")
    s.compact(201)
    floor = s.compaction_floor()
    assert floor == 201
    assert s.set_hold("spark-archive", floor, ttl_seconds=30).min_index == floor
    with pytest.raises(ValueError, match="ttl_seconds"):  # a 400, not a 410 for the index
        s.set_hold("late", floor - 1, ttl_seconds=0)
    s.close()


def test_a_hold_on_the_first_entry_keeps_the_whole_log(tmp_path: Path) -> None:
    s = open_storage(tmp_path, bootstrap=ABC)
    s.save(HardState(1, "a", 400), ents(1, 400, 1))
    s.create_snapshot(SnapshotMeta(400, 1, ABC), b"")
    s.set_hold("spark-archive", 1, ttl_seconds=30)
    assert s.compact(401) == 0
    assert s.compaction_floor() == 1
    assert s.entries(1, 401) == ents(1, 400, 1)
    s.close()


def test_a_pass_reports_the_floor_the_storage_kept_under_its_own_hold(tmp_path: Path) -> None:
    from raftlog.node.core.config import RaftConfig
    from raftlog.node.server.compaction_pass import compact_behind

    s = open_storage(tmp_path, bootstrap=ABC, segment_bytes=64 * 1024)
    s.save(HardState(1, "a", 200), ents(1, 200, 1))
    s.create_snapshot(SnapshotMeta(200, 1, ABC), b"")
    s.set_hold("spark-archive", 120, ttl_seconds=30)
    done = compact_behind(s, 200, 200, RaftConfig(compact_number_entries=0))
    assert (done.dropped, done.floor) == (119, 120) == (119, s.compaction_floor())
    s.close()
