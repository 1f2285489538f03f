"""The WAL's bulk read (`Wal.read_raw` and `Rows.add_raw`): the same NORMAL entries as
`entries()`, bounded by bytes, and never a damaged record served."""

from __future__ import annotations

import os

import pytest
from tests.storage.helpers import ents

from raftlog.node.core.errors import Compacted, Unavailable
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.errors import WalCorruption
from raftlog.node.storage.segment import Rows
from raftlog.node.storage.wal import Wal


def bulk(w: Wal, lo: int, hi: int, max_bytes: int = 1 << 30) -> Rows:
    rows = Rows()
    for raw in w.read_raw(lo, hi, max_bytes):
        rows.add_raw(raw)
    return rows


def as_tuples(rows: Rows) -> list[tuple[int, int, bytes]]:
    return list(zip(rows.index, rows.term, rows.data, strict=True))


def normal(entries: list[Entry]) -> list[tuple[int, int, bytes]]:
    return [(e.index, e.term, e.data) for e in entries if e.kind == EntryKind.NORMAL]


def written_wal(path: str) -> tuple[Wal, list[Entry]]:
    """A WAL of small segments, with no-op and config entries among the records and commit
    records between them (as the node writes them)."""
    w = Wal.open(path, segment_bytes=1024)
    written = ents(1, 300, 1) + ents(301, 400, 2, size=300)
    written[0] = Entry(1, 1, EntryKind.NOOP, b"")
    written[300] = Entry(301, 2, EntryKind.NOOP, b"")
    written[149] = Entry(150, 1, EntryKind.CONFIG, b"members")
    for i in range(0, len(written), 7):
        w.append(written[i : i + 7])
        w.append_commit(written[min(i + 6, len(written) - 1)].index)
    w.sync()
    w._tail.clear()  # the bulk read never uses the tail cache; `entries` must not either here
    return w, written


def test_bulk_read_equals_the_entries_across_segments(tmp_path):
    w, written = written_wal(str(tmp_path))
    assert w.segment_count() > 10
    for lo, hi in ((1, 401), (150, 278), (2, 3), (301, 401), (400, 401)):
        assert as_tuples(bulk(w, lo, hi)) == normal(written[lo - 1 : hi - 1]), (lo, hi)
    w.close()
    w2 = Wal.open(str(tmp_path), segment_bytes=1024)  # offsets rebuilt by the scan at open
    assert as_tuples(bulk(w2, 1, 401)) == normal(written)


def test_bulk_read_stops_after_about_max_bytes_with_at_least_one_entry(tmp_path):
    w, written = written_wal(str(tmp_path))
    raws = w.read_raw(301, 401, 1)
    assert len(raws) == 1 and len(raws[0].offsets) == 1, "one entry, however small the budget"
    raws = w.read_raw(301, 401, 2000)
    got = sum(len(r.offsets) for r in raws)
    assert 2000 <= sum(len(r.buf) for r in raws) < 2000 + 400, "about the budget, not more"
    assert 1 < got < 100
    rows = bulk(w, 301, 401, 2000)
    assert as_tuples(rows) == normal(written[300 : 300 + got])


def test_bulk_read_refuses_what_is_not_there(tmp_path):
    w, _ = written_wal(str(tmp_path))
    with pytest.raises(Unavailable):
        w.read_raw(390, 402, 1 << 20)
    floor = w.first_index()
    w.compact(200)
    assert w.first_index() > floor
    with pytest.raises(Compacted):
        w.read_raw(w.first_index() - 1, 300, 1 << 20)
    assert as_tuples(bulk(w, w.first_index(), 401))[-1][0] == 400


@pytest.mark.parametrize("where", ["data", "header", "kind"])
def test_a_record_damaged_after_open_is_never_served(tmp_path, where):
    w, written = written_wal(str(tmp_path))
    raw = w.read_raw(120, 121, 1 << 20)[0]
    off = raw.offsets[0]
    # A bit flipped on disk after the WAL was opened (the scan at open saw it intact). The
    # kind's: the entry reads as a no-op, which a read skips, unless its checksum is checked.
    at, bit = {"data": (30, 0x10), "header": (12, 0x10), "kind": (8 + 17, 0x01)}[where]
    at += off
    fd = os.open(raw.path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([byte[0] ^ bit]), at)
    finally:
        os.close(fd)
    with pytest.raises(WalCorruption) as e:
        bulk(w, 100, 140)
    assert e.value.path == raw.path and e.value.offset == off and e.value.index == 120
    assert as_tuples(bulk(w, 121, 140)) == normal(written[120:139]), "the rest still reads"


def test_a_whole_record_of_another_entry_where_the_index_points_is_never_served(tmp_path):
    """A record whose checksum holds but that is not the entry the in-memory index says (the
    file changed under the WAL): refused, naming the entry expected, not skipped."""
    w, written = written_wal(str(tmp_path))
    raw = w.read_raw(120, 121, 1 << 20)[0]
    off = raw.offsets[0]
    other = fmt.encode_entry(Entry(121, 1, EntryKind.NORMAL, written[119].data))
    assert len(other) == 8 + fmt.REC_HEAD.unpack_from(raw.buf, 0)[0], "the same length"
    fd = os.open(raw.path, os.O_RDWR)
    try:
        os.pwrite(fd, other, off)
    finally:
        os.close(fd)
    with pytest.raises(WalCorruption, match="not the entry the index says") as e:
        bulk(w, 100, 140)
    assert e.value.path == raw.path and e.value.offset == off and e.value.index == 120


def test_a_file_cut_short_under_the_reader_names_the_record_cut(tmp_path):
    w, written = written_wal(str(tmp_path))
    seg = w._segment_of(120)
    last = seg.last_index
    assert last > 121
    cut_at = seg.offsets[last - seg.first_index]
    os.truncate(seg.path, cut_at + 10)  # the file's last entry record cut after 10 bytes
    with pytest.raises(WalCorruption, match="record cut short") as e:
        bulk(w, 120, last + 1)
    assert (e.value.path, e.value.offset, e.value.index) == (seg.path, cut_at, last)
    assert as_tuples(bulk(w, 120, last)) == normal(written[119 : last - 1]), "the rest reads"
