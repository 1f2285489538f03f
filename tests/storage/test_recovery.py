"""Torn writes and bit flips: a torn tail recovers, damage anywhere else refuses to open."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest
from tests.storage.helpers import ents, records_end

from raftlog.node.core.types import Entry
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


def test_a_whole_record_right_after_a_damaged_byte_is_not_a_torn_tail(tmp_path):
    """One stray byte before the newest segment's last record: that record was written after
    it, so this is damage (refused), not a torn tail whose cut would drop a good entry."""
    raw = (
        fmt.encode_header(1, 0, fmt.FLAG_RESET)
        + b"".join(fmt.encode_entry(Entry(i, 1, data=b"x" * 20)) for i in (1, 2, 3))
        + b"\xff"
        + fmt.encode_entry(Entry(4, 1, data=b"x" * 20))
    )
    (tmp_path / "0000000000000001-0000000000000001.wal").write_bytes(raw)
    with pytest.raises(WalCorruption):
        Wal.open(str(tmp_path))


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
