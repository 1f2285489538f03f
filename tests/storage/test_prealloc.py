"""Preallocated segments: the records end where the zeros begin, at every restart and crash."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from tests.storage.helpers import ents, records_end

from raftlog.cli.main import main
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.errors import WalCorruption
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.prealloc import SPARE_NAME
from raftlog.node.storage.recovery import analyze_wal, list_segments
from raftlog.node.storage.wal import Wal

SEG = 16 * 1024


def zeros_entries(lo: int, hi: int, term: int) -> list[Entry]:
    """Entries whose data is mostly zeros: a scan that stops at the first zeros would stop early."""
    return [Entry(i, term, EntryKind.NORMAL, b"%d:" % i + bytes(64)) for i in range(lo, hi + 1)]


def segments(path: Path) -> list[Path]:
    return [path / name for _, name in list_segments(str(path))]


def assert_allocated(seg: Path, end: int, size: int = SEG) -> None:
    raw = seg.read_bytes()
    assert len(raw) == size, "the segment is allocated at its full size"
    assert records_end(str(seg)) == end
    assert raw[end:] == bytes(size - end), "only zeros after the records"


def test_appends_restart_and_more_appends_continue_at_the_right_offset(tmp_path):
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    w.append(zeros_entries(1, 50, 1))
    w.append_commit(20)
    w.sync()
    end = w._segments[-1].end
    w.close()
    (seg,) = segments(tmp_path)
    assert_allocated(seg, end)
    again = Wal.open(str(tmp_path), segment_bytes=SEG)
    assert again.recovery == [], "zeros after the last record are its end, not damage"
    assert (again.last_index(), again.commit) == (50, 20)
    assert again.entries(1, 51) == zeros_entries(1, 50, 1)
    again.append(zeros_entries(51, 60, 1))
    again.sync()
    end = again._segments[-1].end
    again.close()
    assert_allocated(seg, end)
    third = Wal.open(str(tmp_path), segment_bytes=SEG)
    assert third.recovery == [] and third.entries(1, 61) == zeros_entries(1, 60, 1)
    third.close()


def test_a_crash_before_any_record_in_a_fresh_segment(tmp_path):
    live, image = tmp_path / "live", tmp_path / "image"
    w = Wal.open(str(live), segment_bytes=SEG, base_index=10, base_term=3)
    shutil.copytree(live, image)  # what a kill -9 leaves: the header, then allocated zeros
    w.close()
    (seg,) = segments(image)
    assert_allocated(seg, fmt.HEADER_SIZE)
    again = Wal.open(str(image), segment_bytes=SEG)
    assert again.recovery == []
    assert (again.first_index(), again.last_index(), again.term(10)) == (11, 10, 3)
    again.append(ents(11, 20, 3))
    again.sync()
    again.close()
    third = Wal.open(str(image), segment_bytes=SEG)
    assert third.entries(11, 21) == ents(11, 20, 3)
    third.close()


@pytest.mark.parametrize("fill", ["zeros", "garbage"])
def test_a_torn_last_record_is_cut_and_the_space_allocated_again(tmp_path, fill):
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    w.append(zeros_entries(1, 29, 1) + ents(30, 30, 1))  # the last one ends in no zeros
    w.sync()
    last_off, end = w._segments[-1].offsets[-1], w._segments[-1].end
    w.close()
    (seg,) = segments(tmp_path)
    assert_allocated(seg, end)
    raw = seg.read_bytes()
    for cut in range(last_off + 1, end):
        # The write of record 30 landed only up to `cut`: zeros (never written) or leftovers.
        tail = bytes(end - cut) if fill == "zeros" else b"\xa5" * (end - cut)
        seg.write_bytes(raw[:cut] + tail + raw[end:])
        again = Wal.open(str(tmp_path), segment_bytes=SEG)
        assert again.last_index() == 29, f"cut at {cut}"
        assert any("torn tail" in r for r in again.recovery), f"cut at {cut}"
        again.close()
        assert_allocated(seg, last_off)
    again = Wal.open(str(tmp_path), segment_bytes=SEG)
    again.append(ents(30, 40, 2))  # written where the torn record was
    again.sync()
    again.close()
    third = Wal.open(str(tmp_path), segment_bytes=SEG)
    assert third.recovery == []
    assert third.entries(1, 41) == zeros_entries(1, 29, 1) + ents(30, 40, 2)
    third.close()


def test_a_crash_right_after_a_rotation_leaves_an_empty_preallocated_segment(tmp_path):
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    while w.segment_count() < 3:
        w.append(zeros_entries(w.last_index() + 1, w.last_index() + 10, 1))
    w.sync()
    newest = w._segments[-1]
    sealed_last, sealed_end = newest.first_index - 1, w._segments[-2].end
    w.close()
    _, second, third = segments(tmp_path)
    assert not (tmp_path / SPARE_NAME).exists(), "close removes any spare it prepared"
    # The crash came after the rotation (header durable) and before the new segment's first
    # record reached the disk; the next spare was being prepared.
    third.write_bytes(third.read_bytes()[: fmt.HEADER_SIZE] + bytes(SEG - fmt.HEADER_SIZE))
    (tmp_path / SPARE_NAME).write_bytes(bytes(4096))
    assert second.stat().st_size == sealed_end, "a sealed segment ends at its last record"
    again = Wal.open(str(tmp_path), segment_bytes=SEG)
    assert again.recovery == []
    assert (again.segment_count(), again.last_index()) == (3, sealed_last)
    assert again.entries(1, sealed_last + 1) == zeros_entries(1, sealed_last, 1)
    again.append(ents(sealed_last + 1, sealed_last + 5, 2))
    again.sync()
    again.close()
    assert_allocated(third, again._segments[-1].end)
    reopened = Wal.open(str(tmp_path), segment_bytes=SEG)
    assert reopened.entries(sealed_last + 1, sealed_last + 6) == ents(
        sealed_last + 1, sealed_last + 5, 2
    )
    reopened.close()


def test_zeros_with_records_after_them_are_corruption_not_the_end(tmp_path):
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    w.append(zeros_entries(1, 40, 1))
    w.sync()
    offsets, end = list(w._segments[-1].offsets), w._segments[-1].end
    w.close()
    (seg,) = segments(tmp_path)
    assert_allocated(seg, end)
    raw = bytearray(seg.read_bytes())
    raw[offsets[19] : offsets[25]] = bytes(offsets[25] - offsets[19])  # a lost write mid-log
    seg.write_bytes(bytes(raw))
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path), segment_bytes=SEG)
    assert (info.value.offset, info.value.index) == (offsets[19], 20)
    assert seg.read_bytes() == bytes(raw), "nothing is changed on a refused open"


def test_truncation_in_a_preallocated_segment_leaves_no_stale_records(tmp_path):
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    w.append(zeros_entries(1, 40, 1))
    w.append_commit(10)
    w.sync()
    w.append(ents(21, 22, 2))  # a new leader's shorter suffix replaces 21..40
    w.sync()
    end = w._segments[-1].end
    w.close()
    (seg,) = segments(tmp_path)
    assert_allocated(seg, end)
    again = Wal.open(str(tmp_path), segment_bytes=SEG)
    assert again.recovery == [] and again.last_index() == 22
    assert again.entries(1, 23) == zeros_entries(1, 20, 1) + ents(21, 22, 2)
    again.close()


@pytest.mark.parametrize("big_size", [4 * SEG, SEG + 1024], ids=["much", "a_little"])
def test_a_lower_segment_size_seals_the_larger_segment_at_its_records(tmp_path, big_size):
    w = Wal.open(str(tmp_path), segment_bytes=big_size)
    w.append(zeros_entries(1, 20, 1))
    w.sync()
    w.close()
    (big,) = segments(tmp_path)
    assert big.stat().st_size == big_size
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    while w.segment_count() < 2:
        w.append(zeros_entries(w.last_index() + 1, w.last_index() + 10, 1))
    w.sync()
    sealed_end, last = w._segments[0].end, w.last_index()
    w.close()
    assert sealed_end < big_size, "allocated space was left past the records"
    assert big.stat().st_size == sealed_end, "the zeros of a sealed segment would be damage"
    again = Wal.open(str(tmp_path), segment_bytes=SEG)
    assert again.recovery == [] and again.entries(1, last + 1) == zeros_entries(1, last, 1)
    again.close()


def test_without_fsync_segments_grow_with_their_records(tmp_path):
    w = Wal.open(str(tmp_path), segment_bytes=SEG, durable=False)
    w.append(ents(1, 10, 1))
    end = w._segments[-1].end
    w.close()
    (seg,) = segments(tmp_path)
    assert seg.stat().st_size == end


def test_wal_check_on_preallocated_segments(tmp_path, capsys):
    wal = tmp_path / "wal"
    w = Wal.open(str(wal), segment_bytes=SEG)
    w.append(zeros_entries(1, 40, 1))
    w.sync()
    offsets, end = list(w._segments[-1].offsets), w._segments[-1].end
    w.close()
    (seg,) = segments(wal)
    raw = seg.read_bytes()
    assert main(["wal", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "entries     1..40 (40 entries" in out and "status      OK" in out
    assert f"({end / 1024:.1f} KiB of records)" in out and "will" not in out
    assert seg.read_bytes() == raw, "check is read-only"
    damaged = bytearray(raw)
    damaged[offsets[10] : offsets[12]] = bytes(offsets[12] - offsets[10])
    seg.write_bytes(bytes(damaged))
    assert main(["wal", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "CORRUPTED: impossible record length 0" in out and "(log index 11)" in out
    assert seg.read_bytes() == bytes(damaged)
    assert os.path.getsize(seg) == SEG


class NoSpace(FileOps):
    """A disk that allocates part of what is asked, then fails (as a full ext4 does), or a
    filesystem that cannot allocate at all."""

    def __init__(self, err: int, part: int) -> None:
        self.err = err
        self.part = part
        self.calls = 0

    def allocate(self, fd: int, size: int) -> None:
        self.calls += 1
        if self.part:
            os.posix_fallocate(fd, 0, self.part)
        raise OSError(self.err, os.strerror(self.err))


@pytest.mark.parametrize(
    ("err", "part"), [(errno.ENOSPC, 6 * 1024), (errno.EOPNOTSUPP, 0), (errno.EINVAL, 0)]
)
def test_without_space_to_allocate_the_wal_runs_on_with_growing_segments(tmp_path, err, part):
    ops = NoSpace(err, part)
    w = Wal.open(str(tmp_path), segment_bytes=SEG, ops=ops)
    while w.segment_count() < 3:  # rotations, with a spare prepared for each
        w.append(ents(w.last_index() + 1, w.last_index() + 10, 1, size=200))
        w.sync()
    last = w.last_index()
    w.close()
    assert ops.calls >= 3, "allocation was tried"
    assert not (tmp_path / SPARE_NAME).exists()
    for seg in segments(tmp_path):
        assert seg.stat().st_size == records_end(str(seg)), "no allocated space kept"
    again = Wal.open(str(tmp_path), segment_bytes=SEG, ops=ops)
    assert (again.last_index(), again.recovery) == (last, [])
    again.append(ents(last + 1, last + 5, 1, size=200))
    again.close()
    assert Wal.open(str(tmp_path), segment_bytes=SEG).last_index() == last + 5


class Recorder(FileOps):
    def __init__(self) -> None:
        self.ops: list[str] = []

    def truncate(self, fd: int, size: int) -> None:
        self.ops.append("truncate")
        super().truncate(fd, size)

    def unlink(self, path: str) -> None:
        self.ops.append("unlink")
        super().unlink(path)

    def fsync_dir(self, path: str) -> None:
        self.ops.append("fsync_dir")
        super().fsync_dir(path)


def test_truncation_makes_removed_segments_durable_before_cutting_the_kept_one(tmp_path):
    # Otherwise a crash could bring back a removed segment after a kept one that ends in zeros.
    rec = Recorder()
    w = Wal.open(str(tmp_path), segment_bytes=SEG, ops=rec)
    while w.segment_count() < 2:
        w.append(ents(w.last_index() + 1, w.last_index() + 10, 1, size=200))
    rec.ops.clear()
    w.truncate_from(w._segments[-1].first_index - 3)
    w.close()
    assert rec.ops.index("unlink") < rec.ops.index("fsync_dir") < rec.ops.index("truncate")


def test_wal_check_on_a_live_wal_never_reads_zeros_before_new_records(tmp_path):
    # The allocated space is read up to its first hole, so the writer's records landing past
    # what the reader saw as zeros can never look like zeros followed by records (damage).
    w = Wal.open(str(tmp_path), segment_bytes=8 << 20)

    def write() -> None:
        while w._segments[-1].end < (3 << 20):
            w.append(ents(w.last_index() + 1, w.last_index() + 60, 1, size=200))
            time.sleep(0.0002)  # lets the checks run between (and during) appends

    writer = threading.Thread(target=write)
    writer.start()
    seen, damaged = [], []
    try:
        while writer.is_alive():  # checks for as long as the writer writes, however it is paced
            found = analyze_wal(str(tmp_path))
            seen.append(found.segments[-1].last_index)
            if found.corruption is not None:
                damaged.append(str(found.corruption))
    finally:
        writer.join()
        w.close()
    assert damaged == []
    assert len(set(seen)) > 20, "the checks raced the writer"


def test_records_written_after_a_hole_in_the_newest_segment_are_read_and_judged(tmp_path):
    """The newest segment is read only up to its first hole when nothing follows it; records
    past a hole (writes that reached the disk after ones that never did) are damage, not the
    log's end, and opening refuses at the first record missing."""
    entries = zeros_entries(1, 200, 1)
    records = [fmt.encode_entry(e) for e in entries]
    offsets = [fmt.HEADER_SIZE + sum(len(r) for r in records[:i]) for i in range(len(records))]
    assert offsets[150] - offsets[50] > 2 * 4096, "a hole of a whole block between them"
    seg = tmp_path / "0000000000000001-0000000000000001.wal"
    fd = os.open(seg, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, fmt.encode_header(1, 0, fmt.FLAG_RESET) + b"".join(records[:50]), 0)
        os.pwrite(fd, b"".join(records[150:]), offsets[150])
        assert os.lseek(fd, 0, os.SEEK_HOLE) < offsets[150], "the file has a hole"
    finally:
        os.close(fd)
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path), segment_bytes=SEG)
    assert (info.value.path, info.value.offset, info.value.index) == (str(seg), offsets[50], 51)


def test_closing_removes_the_spare_prepared_for_the_next_segment(tmp_path):
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    while w._spare is None:  # prepared once the active segment is half full
        assert w.segment_count() == 1, "no spare was prepared in the first segment"
        w.append(ents(w.last_index() + 1, w.last_index() + 5, 1, size=200))
    w.append(ents(w.last_index() + 1, w.last_index() + 5, 1, size=200))
    assert w.segment_count() == 1
    w.close()
    assert not (tmp_path / SPARE_NAME).exists(), "its allocated space is not left behind"
    assert os.listdir(tmp_path) == [segments(tmp_path)[0].name]


def test_a_torn_tail_cut_on_a_disk_that_cannot_allocate_is_not_grown_back(tmp_path):
    w = Wal.open(str(tmp_path), segment_bytes=SEG)
    w.append(zeros_entries(1, 30, 1))
    w.sync()
    last_off = w._segments[-1].offsets[-1]
    w.close()
    (seg,) = segments(tmp_path)
    raw = seg.read_bytes()
    seg.write_bytes(raw[: last_off + 20])  # entry 30 torn, and no allocated space after it
    again = Wal.open(str(tmp_path), segment_bytes=SEG, ops=NoSpace(errno.EOPNOTSUPP, 0))
    assert again.last_index() == 29 and len(again.recovery) == 1
    again.close()
    assert seg.stat().st_size == last_off, "cut at the last whole record, and left there"
