"""Torn writes and bit flips: a torn tail recovers, damage anywhere else refuses to open."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest
from tests.storage.helpers import ents, records_end

from raftlog.node.core.types import Entry, EntryKind, Membership
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.errors import WalCorruption
from raftlog.node.storage.recovery import analyze_wal, list_segments
from raftlog.node.storage.wal import Wal


def build(path, n=60, size=40) -> tuple[list[str], tuple[list[Entry], dict[int, tuple[str, int]]]]:
    w = Wal.open(str(path), segment_bytes=2048)
    written = ents(1, n, 1, size=size)
    for i in range(0, n, 5):
        w.append(written[i : i + 5])
        w.append_commit(max(0, i - 3))
        w.sync()
    offsets = {
        i: (s.path, s.offsets[i - s.first_index])
        for s in w._segments
        for i in range(s.first_index, s.last_index + 1)
    }
    w.close()
    return [str(path / n) for _, n in list_segments(str(path))], (written, offsets)


def test_torn_tail_at_every_byte_of_the_last_record_recovers(tmp_path, caplog):
    segs, (written, offsets) = build(tmp_path)
    last = segs[-1]
    raw = Path(last).read_bytes()[: records_end(last)]
    last_path, last_off = offsets[60]
    assert last_path == last
    entry_end = last_off + 8 + fmt.ENTRY_HEAD.size + len(written[-1].data)
    assert entry_end < len(raw), "a commit record follows the last entry"
    for cut in range(last_off + 1, len(raw)):
        expect = 60 if cut >= entry_end else 59
        Path(last).write_bytes(raw[:cut])
        with caplog.at_level(logging.WARNING):
            w = Wal.open(str(tmp_path), segment_bytes=2048)
        assert w.last_index() == expect, f"cut at {cut}"
        assert w.entries(1, expect + 1) == written[:expect]
        if cut != entry_end:  # there, the file simply ends after entry 60
            assert any("torn tail" in r for r in w.recovery)
            assert "torn tail" in caplog.text
        w.close()
        kept = last_off if expect == 59 else entry_end
        after = Path(last).read_bytes()
        assert after[:kept] == raw[:kept]
        assert after[kept:] == bytes(len(after) - kept), "the torn bytes are removed from disk"
        Path(last).write_bytes(raw)


def test_zero_filled_tail_ends_the_log(tmp_path):
    """Zeros after the last record (preallocated, or space a crash left unfilled) are its end."""
    segs, (written, _) = build(tmp_path)
    with Path(segs[-1]).open("ab") as f:
        f.write(b"\0" * 4096)
    w = Wal.open(str(tmp_path), segment_bytes=2048)
    assert w.entries(1, 61) == written and not w.recovery


def test_bit_flip_in_the_final_record_is_a_torn_tail(tmp_path):
    segs, (written, _) = build(tmp_path)
    raw = bytearray(Path(segs[-1]).read_bytes())
    raw[records_end(segs[-1]) - 3] ^= 0x10
    Path(segs[-1]).write_bytes(bytes(raw))
    w = Wal.open(str(tmp_path), segment_bytes=2048)
    # The final record is the commit record written after entry 60: only it is dropped.
    assert w.entries(1, 61) == written
    assert w.commit == 47, "the commit index falls back to the previous record (52 -> 47)"
    assert any("checksum mismatch" in r for r in w.recovery)


@pytest.mark.parametrize("seed", range(60))
def test_bit_flip_before_the_tail_refuses_with_file_offset_and_index(tmp_path, seed):
    _, (_, offsets) = build(tmp_path)
    rng = random.Random(seed)
    # Any entry but the very last: in a sealed segment or in the middle of the active one.
    index = rng.randrange(1, 59)
    path, off = offsets[index]
    raw = bytearray(Path(path).read_bytes())
    pos = off + rng.randrange(0, 8 + 18 + 10)  # length, crc, or body of that record
    raw[pos] ^= 1 << rng.randrange(8)
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path), segment_bytes=2048)
    err = info.value
    assert err.path == path
    assert err.offset == off
    assert err.index == index
    assert path in str(err) and f"offset {off}" in str(err) and f"log index {index}" in str(err)
    assert "refusing to start" in str(err)
    assert Path(path).read_bytes() == bytes(raw), "nothing is changed on a refused open"


@pytest.mark.parametrize(
    ("records", "reason"),
    [
        ([(1, 0), (2, 0), (4, 0), (5, 0)], "entry 4 where 3 belongs"),  # a gap
        ([(1, 0), (2, 0), (2, 0), (3, 0)], "entry 2 where 3 belongs"),  # a repeat
        ([(1, 0), (2, 3), (3, 0)], "unknown entry kind 3"),
    ],
)
def test_records_whose_checksums_hold_but_not_their_order_or_kind_are_refused(
    tmp_path, records, reason
):
    raw = fmt.encode_header(1, 0, fmt.FLAG_RESET) + b"".join(
        fmt.encode_entry(Entry(i, 1, kind=kind, data=b"x")) for i, kind in records
    )
    (tmp_path / "0000000000000001-0000000000000001.wal").write_bytes(raw)
    with pytest.raises(WalCorruption, match=reason):
        Wal.open(str(tmp_path))


@pytest.mark.parametrize(
    "last",
    [fmt.encode_entry(Entry(4, 1, data=b"x" * 20)), fmt.encode_commit(3)],
    ids=["entry", "commit"],
)
def test_a_whole_record_right_after_a_damaged_byte_is_not_a_torn_tail(tmp_path, last):
    """One stray byte before the newest segment's last record: that record was written after
    it, so this is damage (refused), not a torn tail whose cut would drop a good entry."""
    raw = (
        fmt.encode_header(1, 0, fmt.FLAG_RESET)
        + b"".join(fmt.encode_entry(Entry(i, 1, data=b"x" * 20)) for i in (1, 2, 3))
        + b"\xff"
        + last
    )
    (tmp_path / "0000000000000001-0000000000000001.wal").write_bytes(raw)
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path))
    assert info.value.offset == len(raw) - len(last) - 1 and info.value.index == 4


@pytest.mark.parametrize("after", ["commit", "config"])
def test_a_damaged_entry_whose_own_append_wrote_a_record_after_it_is_refused(tmp_path, after):
    """The newest entry damaged, and after it only what the same append wrote: the commit
    index riding along, or a membership change. Whole records after the damage: not a torn
    tail, and cutting there would drop an acknowledged entry."""
    w = Wal.open(str(tmp_path))
    w.append(ents(1, 9, 1))
    if after == "commit":
        w.append(ents(10, 10, 1), commit=10)
    else:
        w.append([*ents(10, 10, 1), Entry(11, 1, EntryKind.CONFIG, Membership.of(["a"]).encode())])
    w.sync()
    path, off = w._segments[-1].path, w._segments[-1].offsets[9]
    w.close()
    raw = bytearray(Path(path).read_bytes())
    raw[off + 30] ^= 0x04  # a byte of entry 10's data
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path))
    assert (info.value.path, info.value.offset, info.value.index) == (path, off, 10)
    assert "record checksum mismatch" in str(info.value)


def test_damage_at_the_journal_checkpoints_last_index_is_not_a_replayable_tail(tmp_path):
    """Entries past the journal's last checkpoint (`trusted_last`) are in the journal, so damage
    there is a tail to replay; the entry at `trusted_last` itself was durable only here."""
    segs, (_, offsets) = build(tmp_path)
    index = 58  # in the newest segment, valid records after it
    path, off = offsets[index]
    assert path == segs[-1]
    raw = bytearray(Path(path).read_bytes())
    raw[off + 12] ^= 0x10  # a byte of its body
    Path(path).write_bytes(bytes(raw))
    assert analyze_wal(str(tmp_path), trusted_last=index - 1).corruption is None
    damage = analyze_wal(str(tmp_path), trusted_last=index).corruption
    assert damage is not None and damage.index == index, damage


def test_torn_tail_of_a_sealed_segment_is_corruption(tmp_path):
    segs, _ = build(tmp_path)
    assert len(segs) > 2
    raw = Path(segs[0]).read_bytes()
    Path(segs[0]).write_bytes(raw[:-5])
    with pytest.raises(WalCorruption, match="cut short"):
        Wal.open(str(tmp_path), segment_bytes=2048)


def test_missing_middle_segment_is_refused(tmp_path):
    segs, _ = build(tmp_path)
    os.unlink(segs[1])
    with pytest.raises(WalCorruption, match="does not continue"):
        Wal.open(str(tmp_path), segment_bytes=2048)


def test_header_damage(tmp_path):
    segs, _ = build(tmp_path)
    raw = Path(segs[0]).read_bytes()
    Path(segs[0]).write_bytes(b"X" + raw[1:])
    with pytest.raises(WalCorruption, match="bad magic"):
        Wal.open(str(tmp_path), segment_bytes=2048)
    Path(segs[0]).write_bytes(raw)
    # A flipped bit in a sealed segment's previous term (or first index, or flags): its
    # header's checksum says so, the log is not read under wrong indexes.
    sealed = Path(segs[1]).read_bytes()
    Path(segs[1]).write_bytes(sealed[:16] + bytes([sealed[16] ^ 1]) + sealed[17:])
    with pytest.raises(WalCorruption, match="header checksum"):
        Wal.open(str(tmp_path), segment_bytes=2048)
    Path(segs[1]).write_bytes(sealed)
    # A header torn while the newest segment was being created is a crash, not damage: cut
    # short, or whole in length with its last bytes not written.
    header = fmt.encode_header(61, 1, 0)
    for torn in (header[:10], header[:-1] + bytes([header[-1] ^ 0xFF])):
        new = tmp_path / "00000000000000ff-0000000000000100.wal"
        new.write_bytes(torn)
        w = Wal.open(str(tmp_path), segment_bytes=2048)
        assert w.last_index() == 60 and not new.exists()
        w.close()


@pytest.mark.parametrize("damaged", [2, 3, 10])
@pytest.mark.parametrize("fill", ["zeros", "garbage"])
def test_damage_spanning_several_records_before_valid_ones_is_corruption(tmp_path, damaged, fill):
    """Synced entries after a damaged stretch must not be dropped as if they were a torn tail."""
    w = Wal.open(str(tmp_path))  # one segment, and no commit record after the damage
    w.append(ents(1, 100, 1))
    w.sync()
    offsets = list(w._segments[-1].offsets)
    w.close()
    seg = next(tmp_path.glob("*.wal"))
    raw = bytearray(seg.read_bytes())
    a, b = offsets[49], offsets[49 + damaged]
    raw[a:b] = bytes(b - a) if fill == "zeros" else random.Random(damaged).randbytes(b - a)
    seg.write_bytes(bytes(raw))
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path))
    assert info.value.index == 50


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("length", [10, 30])
def test_a_header_cut_short_in_an_older_segment_is_damage_not_a_crash_during_creation(
    tmp_path, which, length
):
    """Only the newest segment can have been cut while being created: an older one whose header
    is cut short is refused, naming the file and the header's length, and is left as it is
    (removing it, as a torn new segment is, would drop its entries)."""
    segs, _ = build(tmp_path)
    assert len(segs) > 2
    Path(segs[which]).write_bytes(Path(segs[which]).read_bytes()[:length])
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path), segment_bytes=2048)
    err = info.value
    assert (err.path, err.offset, err.index) == (segs[which], 0, None)
    assert f"segment header is {length} bytes, not {fmt.HEADER_SIZE}" in str(err)
    assert os.path.getsize(segs[which]) == length


def test_a_segment_anchored_on_another_term_than_the_last_before_it_is_refused(tmp_path):
    """The header's previous term is what a follower's append is checked against once the
    segments below are compacted: one that is not the term of the entry before it is damage."""
    segs, _ = build(tmp_path)
    raw = Path(segs[1]).read_bytes()
    first, prev_term, flags = fmt.decode_header(segs[1], raw)
    Path(segs[1]).write_bytes(
        fmt.encode_header(first, prev_term + 1, flags) + raw[fmt.HEADER_SIZE :]
    )
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path), segment_bytes=2048)
    err = info.value
    assert (err.path, err.offset, err.index) == (segs[1], 0, first)
    assert f"found {first} after term {prev_term + 1}" in str(err)
    assert f"expected first index {first} after term {prev_term}" in str(err)


def test_a_damaged_header_of_the_newest_segment_with_records_in_it_is_refused(tmp_path):
    """Only a header cut while its segment was being created (nothing after it) is a crash to
    clean up; a newest segment with records whose header is damaged is refused, not removed."""
    segs, _ = build(tmp_path)
    raw = Path(segs[-1]).read_bytes()
    assert len(raw) > fmt.HEADER_SIZE + 100
    Path(segs[-1]).write_bytes(raw[:9] + bytes([raw[9] ^ 1]) + raw[10:])  # its first index
    with pytest.raises(WalCorruption, match="header checksum") as info:
        Wal.open(str(tmp_path), segment_bytes=2048)
    assert (info.value.path, info.value.offset) == (segs[-1], 0)
    assert Path(segs[-1]).exists() and len(Path(segs[-1]).read_bytes()) == len(raw)


def test_a_torn_tail_is_reported_with_what_was_cut_and_where(tmp_path):
    segs, (written, offsets) = build(tmp_path)
    last = segs[-1]
    raw = Path(last).read_bytes()[: records_end(last)]
    _, off = offsets[60]
    length = fmt.ENTRY_HEAD.size + len(written[-1].data)
    for cut, reason in (
        (off + 5, "record header cut short"),
        (off + 8, f"record of {length} bytes cut short"),
        (off + 20, f"record of {length} bytes cut short"),
    ):
        Path(last).write_bytes(raw[:cut])
        w = Wal.open(str(tmp_path), segment_bytes=2048)
        name = os.path.basename(last)
        assert w.recovery == [
            f"truncate a torn tail of {name}: {reason} at offset {off} ({cut - off} bytes dropped)"
        ]
        assert w.last_index() == 59
        w.close()


def test_damage_in_a_sealed_segment_is_refused_there_even_after_the_journal_checkpoint(tmp_path):
    """A sealed segment was fsynced when the next one began: damage in it is never a tail the
    journal replays, and the refusal names that segment, offset and entry."""
    segs, (_, offsets) = build(tmp_path)
    index = next(i for i in range(60, 0, -1) if offsets[i][0] == segs[-2])  # sealed, last entry
    path, off = offsets[index]
    raw = bytearray(Path(path).read_bytes())
    raw[off + 30] ^= 0x10
    Path(path).write_bytes(bytes(raw))
    with pytest.raises(WalCorruption) as info:
        Wal.open(str(tmp_path), segment_bytes=2048, trusted_last=index - 5)
    err = info.value
    assert (err.path, err.offset, err.index) == (path, off, index)
    assert "record checksum mismatch" in str(err)


def test_damage_after_the_journal_checkpoint_is_cut_like_a_torn_tail(tmp_path):
    _, (written, offsets) = build(tmp_path)
    index = 58  # in the newest segment, valid records after it
    path, off = offsets[index]
    raw = bytearray(Path(path).read_bytes())
    raw[off + 30] ^= 0x10
    Path(path).write_bytes(bytes(raw))
    w = Wal.open(str(tmp_path), segment_bytes=2048, trusted_last=index - 1)
    assert w.last_index() == index - 1 and w.entries(1, index) == written[: index - 1]
    (repair,) = w.recovery
    assert f"record checksum mismatch at offset {off}, after the checkpoint" in repair
    w.close()
    after = Path(path).read_bytes()
    assert after[:off] == bytes(raw[:off]) and after[off:] == bytes(len(after) - off)


def test_a_newest_segment_repeating_the_one_before_it_is_refused(tmp_path):
    """Same first index and previous term as the segment before: the log would hold the same
    indexes twice."""
    segs, _ = build(tmp_path)
    Path(segs[-1]).write_bytes(Path(segs[-2]).read_bytes())
    with pytest.raises(WalCorruption, match="does not continue") as info:
        Wal.open(str(tmp_path), segment_bytes=2048)
    assert info.value.path == segs[-1] and info.value.offset == 0


def test_a_torn_tail_after_corruption_is_not_among_the_repairs_opening_makes(tmp_path):
    """Opening refuses: the report must not say it will cut a tail."""
    segs, _ = build(tmp_path)
    os.unlink(segs[-2])
    end = records_end(segs[-1])
    Path(segs[-1]).write_bytes(Path(segs[-1]).read_bytes()[: end - 3])
    found = analyze_wal(str(tmp_path))
    assert found.corruption is not None and found.corruption.path == segs[-1]
    assert found.segments[-1].scan.torn is not None
    assert found.torn is None and found.repairs() == []
