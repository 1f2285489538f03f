"""The node's journal (`storage/journal.py`): replay by content, checkpoints, torn tails and
damage, snapshot installs, and `raftctl wal check` reading it."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from tests.storage.helpers import ents
from tests.storage.test_durable import FailingDisk

from raftlog.cli.main import main
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from raftlog.node.storage import journal as jr
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import CorruptFile, StorageFailed, WalCorruption
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.journal import (
    Journal,
    Reset,
    _segment_path,
    commit_past_log,
    list_journal,
    read_journal,
    replay_into,
)
from raftlog.node.storage.recovery import analyze_wal
from raftlog.node.storage.wal import Wal

ABC = Membership.of(["a", "b", "c"])


def frames(entries: list[Entry], commit: int | None = None) -> bytes:
    out = b"".join(fmt.encode_entry(e) for e in entries)
    return out + (fmt.encode_commit(commit) if commit is not None else b"")


def terms(w: Wal) -> list[tuple[int, int]]:
    return [(e.index, e.term) for e in w.entries(w.first_index(), w.last_index() + 1)]


def count_fdatasyncs(j: Journal) -> list[int]:
    """The journal's fdatasyncs from now on, counted in the list's one item."""
    syncs = [0]
    real = j.ops.fdatasync

    def counted(fd: int) -> None:
        syncs[0] += 1
        real(fd)

    j.ops.fdatasync = counted  # type: ignore[method-assign]
    return syncs


def fill_until_due(j: Journal, storages: dict[int, DurableStorage]) -> int:
    """Write 20 entries of 200 bytes at a time to every partition until a checkpoint is due;
    returns the next index."""
    index = 1
    while not j.due():
        for s in storages.values():
            s.write(HardState(1, None, index), ents(index, index + 19, 1, size=200))
        index += 20
    return index


# ----------------------------------------------------------------------------- replay rules
def test_replay_keeps_what_is_there_replaces_above_the_commit_and_drops_the_stale(tmp_path):
    w = Wal.open(str(tmp_path / "wal"), durable=False)
    w.append(ents(1, 10, 1))
    w.append_commit(5)
    notes = replay_into(
        w,
        [
            frames(ents(1, 10, 1)),  # already there: kept, nothing rewritten
            frames(ents(8, 11, 2)),  # above the commit (5): replaces 8..10, appends 11
            frames(ents(3, 4, 3)),  # committed entries differ: overwritten later, dropped
            frames([], commit=9),
            frames(ents(20, 21, 2)),  # leaves a gap: cut by a later truncation, dropped
        ],
    )
    assert terms(w) == [(i, 1) for i in range(1, 8)] + [(i, 2) for i in range(8, 12)]
    assert w.commit == 9
    assert notes == [
        "1 journal records cut by a later truncation or install",
        "1 journal records overwritten later",
    ]
    w.close()


def test_replay_at_the_edges_of_the_log_and_of_its_commit(tmp_path):
    w = Wal.open(str(tmp_path / "wal"), durable=False)
    w.append(ents(1, 10, 1))
    w.append_commit(5)
    notes = replay_into(
        w,
        [
            frames(ents(5, 5, 2)),  # differs at the commit index itself: stale, dropped
            frames(ents(12, 12, 1)),  # a gap of one (11 never came): cut, dropped
            frames([], commit=30),  # past the last entry kept: taken down to it
        ],
    )
    assert terms(w) == [(i, 1) for i in range(1, 11)]
    assert w.commit == 10
    assert notes == [
        "1 journal records cut by a later truncation or install",
        "1 journal records overwritten later",
    ]
    w.close()


def test_a_records_entries_and_the_commit_after_them_are_judged_as_its_entries_alone(tmp_path):
    """A Ready's entries and its commit index travel in one record: cut or overwritten entries
    are noted as such though a commit record follows them in the record."""
    w = Wal.open(str(tmp_path / "wal"), durable=False)
    w.append(ents(1, 10, 1))
    w.append_commit(5)
    notes = replay_into(
        w,
        [
            frames(ents(20, 21, 2), commit=6),  # a gap: cut, dropped; its commit still taken
            frames(ents(3, 4, 3), commit=7),  # below the commit and different: stale
            frames(ents(11, 12, 1), commit=12),  # follows: applied, and the commit with it
        ],
    )
    assert terms(w) == [(i, 1) for i in range(1, 13)]
    assert w.commit == 12
    assert notes == [
        "1 journal records cut by a later truncation or install",
        "1 journal records overwritten later",
    ]
    w.close()


def test_a_ready_is_one_journal_record_with_its_commit(tmp_path):
    j, st = open_node(tmp_path / "node", n=1)
    st[0].write(HardState(1, None, 0), ents(1, 5, 1))
    st[0].write(HardState(1, None, 5), ents(6, 7, 1))
    st[0].write(HardState(1, None, 7), [])
    j.sync()
    close_node(j, st)
    ops = read_journal(str(tmp_path / "node" / "journal")).ops[0]
    assert ops == [frames(ents(1, 5, 1)), frames(ents(6, 7, 1), commit=5), frames([], commit=7)]


def test_a_replayed_reset_discards_what_came_before_it(tmp_path):
    w = Wal.open(str(tmp_path / "wal"), durable=False)
    w.append(ents(1, 5, 1))

    replay_into(w, [frames(ents(6, 29, 1)), Reset(40, 3), frames(ents(41, 42, 3))])
    assert w.first_index() == 41 and terms(w) == [(41, 3), (42, 3)]
    w.close()


# ----------------------------------------------------------------------------- a node's disk
def open_node(
    root: Path, n: int = 2, storage: dict[str, Any] | None = None, **kw
) -> tuple[Journal, dict[int, DurableStorage]]:
    """A node's journal and `n` partitions' storage (`storage`: more of their arguments)."""
    j = Journal(str(root / "journal"), **kw)
    storages = {
        p: DurableStorage(
            str(root / f"p{p}"), bootstrap=ABC, journal=j.partition(p), **(storage or {})
        )
        for p in range(n)
    }
    j.start({p: s.wal for p, s in storages.items()})
    return j, storages


def close_node(j: Journal, storages: dict[int, DurableStorage]) -> None:
    for s in storages.values():
        s.close()
    j.close()


def power_loss(root: Path, n: int = 2) -> int:
    """Cut each WAL's active segment after the journal's checkpoint (never synced there)."""
    trusted = read_journal(str(root / "journal")).trusted
    cut = 0
    for p in range(n):
        seg = analyze_wal(str(root / f"p{p}" / "wal")).segments[-1]
        drop = [r for r in seg.scan.records if r.kind == fmt.T_ENTRY and r.index > trusted[p]]
        with open(seg.path, "r+b") as f:
            f.truncate(drop[0].offset if drop else seg.scan.valid_end)
        cut += len(drop)
    return cut


def test_one_fsync_for_every_partition_and_nothing_synced_is_lost_to_a_power_loss(tmp_path):
    j, storages = open_node(tmp_path)
    for p, s in storages.items():
        s.write(HardState(1, None, 0), ents(1, 49, 1, size=30 + p))
        s.write(HardState(1, None, 40), [])
    syncs = count_fdatasyncs(j)
    storages[0].sync()  # the partition's sync is the journal's: both partitions' writes
    assert syncs == [1]
    close_node(j, storages)
    assert power_loss(tmp_path) == 98
    j, storages = open_node(tmp_path)
    for p, s in storages.items():
        assert s.last_index() == 49 and s.commit_index() == 40
        assert s.entries(1, 50) == ents(1, 49, 1, size=30 + p)
        assert any("replayed" in r for r in s.recovery)
    close_node(j, storages)
    # The restart checkpointed: one journal segment, nothing left to replay.
    assert len(list_journal(str(tmp_path / "journal"))) == 1
    assert read_journal(str(tmp_path / "journal")).ops == {}


def test_a_commit_record_never_synced_survives_a_kill_and_may_go_with_a_power_loss(tmp_path):
    # What the crash test's audit allows: a commit index read back from the page cache may go
    # back after a power loss, never below what was synced, and the entries it covered stay.
    root, copy = tmp_path / "node", tmp_path / "power-loss"
    j, storages = open_node(root, n=1)
    s = storages[0]
    s.write(HardState(1, None, 4), ents(1, 9, 1))
    j.sync()  # the entries are durable (a leader commits only synced entries)...
    s.write(HardState(1, None, 9), [])  # ... and their commit record is written, not synced
    close_node(j, storages)  # the process dies: the WAL's write is in the page cache alone
    shutil.copytree(root, copy)
    j, storages = open_node(root, n=1)  # a plain kill: the page cache is what the disk reads
    assert storages[0].commit_index() == 9
    close_node(j, storages)
    assert power_loss(copy, n=1) == 9
    j, storages = open_node(copy, n=1)
    s = storages[0]
    assert s.commit_index() == 4 and s.entries(1, 10) == ents(1, 9, 1)
    close_node(j, storages)


def test_a_checkpoint_syncs_the_wals_and_drops_the_journal_before_it(tmp_path):
    j, storages = open_node(tmp_path, checkpoint_bytes=64 * 1024)

    async def run() -> None:
        fill_until_due(j, storages)
        j.sync()
        before = list_journal(str(tmp_path / "journal"))

        async def durable() -> None:
            j.sync()

        await j.checkpoint(lambda: {p: s.wal for p, s in storages.items()}, durable)
        after = list_journal(str(tmp_path / "journal"))
        assert len(before) == 1 and after == [before[0] + 1]
        assert j.checkpoints == 1 and not j.due()

    asyncio.run(run())
    last = {p: s.last_index() for p, s in storages.items()}
    close_node(j, storages)
    found = read_journal(str(tmp_path / "journal"))
    assert found.trusted == last and found.ops == {}  # everything was in the WALs, synced
    assert power_loss(tmp_path) == 0


def test_an_unfinished_checkpoint_replays_from_the_one_before(tmp_path):
    j, storages = open_node(tmp_path)
    storages[0].write(HardState(1, None, 0), ents(1, 9, 1))
    j.sync()
    # A checkpoint that started (new segment) but never got to DONE: the crash came first.
    j._open_segment({p: s.last_index() for p, s in storages.items()})
    storages[0].write(None, ents(10, 19, 1))
    j.sync()
    close_node(j, storages)
    assert len(list_journal(str(tmp_path / "journal"))) == 2
    power_loss(tmp_path)
    j, storages = open_node(tmp_path)
    assert storages[0].last_index() == 19
    close_node(j, storages)


def journal_with_a_torn_tail(root: Path) -> Path:
    """A node's journal whose last record (entry 30 of partition 0, after 1..29 in an earlier
    sync) a kill tore; returns the torn segment."""
    j, storages = open_node(root)
    storages[0].write(HardState(1, None, 0), ents(1, 29, 1))
    j.sync()
    storages[0].write(None, ents(30, 30, 1))
    j.sync()
    close_node(j, storages)
    journal = root / "journal"
    seg = journal / f"{list_journal(str(journal))[-1]:016x}.jrn"
    raw = seg.read_bytes()
    seg.write_bytes(raw[: len(raw.rstrip(b"\0")) - 3])  # the last record cut short
    return seg


def test_a_whole_record_after_damage_is_found_whatever_its_header_holds():
    """Found on the way (a new record type widened the shape searched for): the search for a
    whole record after damage took only matches that do not overlap, so a header whose CRC
    bytes looked like a body's start hid the record just after it, and damage before the last
    whole records was cut as a torn tail. The WAL's own search had the same flaw."""
    rng = random.Random(7)
    for i in range(3000):
        body = jr._PART.pack(jr.J_FRAMES, 0) + rng.randbytes(rng.randrange(1, 40))
        assert jr._valid_record_follows(b"\xff" * 9 + jr._frame(body), 0), i
        entry = fmt.encode_entry(Entry(rng.randrange(1, 10**6), 3, EntryKind.NORMAL, body))
        assert fmt._valid_record_follows(b"\xff" * 9 + entry, 0), i


def test_a_torn_journal_tail_is_cut(tmp_path):
    journal_with_a_torn_tail(tmp_path)
    found = read_journal(str(tmp_path / "journal"))
    assert found.repairs and "torn tail" in found.repairs[0]
    assert len(found.ops[0]) == 1  # the first write's record; the cut one is gone
    power_loss(tmp_path)
    j, storages = open_node(tmp_path)  # opens: what was cut was never acknowledged
    assert storages[0].last_index() == 29
    close_node(j, storages)


def test_a_torn_tail_left_behind_a_newer_checkpoint_is_superseded_not_damage(tmp_path):
    """Killed while writing (a torn tail), then killed again on the next start after its new
    segment's checkpoint but before the old segment is deleted: the torn segment is no longer
    the last. Found by the crash test in CI (`journal record checksum mismatch` refusing to
    open); the journal before a complete checkpoint is never replayed, so its tail is not
    damage. A torn tail with records in a later segment of the same checkpoint still is."""
    journal = journal_with_a_torn_tail(tmp_path).parent

    def killed(seq: int) -> None:
        raise RuntimeError("killed before the old segments were deleted")

    j = Journal(str(journal))
    storages = {p: DurableStorage(str(tmp_path / f"p{p}"), bootstrap=ABC, journal=j.partition(p))
                for p in range(2)}  # fmt: skip
    j._drop_before = killed  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="killed"):
        j.start({p: s.wal for p, s in storages.items()})
    close_node(j, storages)
    assert len(list_journal(str(journal))) == 2  # the torn one is not the last any more
    found = read_journal(str(journal))
    assert any("torn tail" in r for r in found.repairs)
    j, storages = open_node(tmp_path)  # opens; entry 30 is in the WAL, which start synced
    assert storages[0].last_index() == 30
    close_node(j, storages)


def test_a_torn_tail_before_records_of_the_same_checkpoint_is_damage(tmp_path):
    """The tail of the segment replay starts in cannot be torn when a later segment, whose
    checkpoint never completed, holds records written after it."""

    seg = journal_with_a_torn_tail(tmp_path)
    journal, seq = seg.parent, list_journal(str(seg.parent))[-1]
    later = jr.encode_checkpoint({0: 29, 1: 0}) + jr._frame(
        struct.pack("<BI", jr.J_FRAMES, 0) + frames(ents(31, 31, 1))
    )
    (journal / f"{seq + 1:016x}.jrn").write_bytes(later)
    with pytest.raises(WalCorruption, match="cut short"):
        read_journal(str(journal))


def test_damage_in_a_journal_with_whole_records_after_it_refuses_to_open(tmp_path):
    j, storages = open_node(tmp_path)
    for i in range(5):
        storages[0].write(HardState(1, None, 0), ents(1 + 10 * i, 10 + 10 * i, 1))
        j.sync()
    close_node(j, storages)
    seg = tmp_path / "journal" / f"{list_journal(str(tmp_path / 'journal'))[-1]:016x}.jrn"
    raw = bytearray(seg.read_bytes())
    raw[len(raw.rstrip(b"\0")) // 2] ^= 0x10
    seg.write_bytes(bytes(raw))
    with pytest.raises(WalCorruption, match="journal record checksum mismatch"):
        read_journal(str(tmp_path / "journal"))


def test_a_snapshot_install_is_journaled_before_the_reset(tmp_path):
    j, storages = open_node(tmp_path, n=1)
    s = storages[0]
    s.write(HardState(1, None, 3), ents(1, 19, 1))
    j.sync()
    s.install_snapshot(SnapshotMeta(50, 2, ABC), b"")
    s.write(None, ents(51, 54, 2))
    j.sync()
    close_node(j, storages)
    power_loss(tmp_path, n=1)
    j, storages = open_node(tmp_path, n=1)
    s = storages[0]
    assert s.first_index() == 51 and s.last_index() == 54
    assert [e.term for e in s.entries(51, 55)] == [2, 2, 2, 2]
    close_node(j, storages)


def test_a_replayed_install_leaves_no_commit_above_its_log(tmp_path):
    """Found by a review: entries after an install and their commit record reached the WAL's
    file (write-behind flushed) but not the journal's disk before a kill; the next open read
    commit 58 from the file, the replayed RESET dropped the entries and kept it, and the
    partition stopped at the leader's next append (a committed entry overwritten)."""
    j, storages = open_node(tmp_path, n=1)
    s = storages[0]
    s.install_snapshot(SnapshotMeta(50, 2, ABC), b"")
    s.write(HardState(2, None, 58), ents(51, 60, 2))
    s.wal.flush()  # in the WAL's file; the journal never synced them
    close_node(j, storages)
    j, storages = open_node(tmp_path, n=1)
    s = storages[0]
    assert (s.last_index(), s.commit_index()) == (50, 50)
    close_node(j, storages)


def test_entries_a_snapshot_install_discarded_are_not_replayed_from_the_journal(
    tmp_path: Path,
) -> None:
    """Entries 41..60 of term 1 are in the journal when a snapshot at 50 of term 2 replaces the
    log: a restart replays the journal, and must not put 51..60 back behind the snapshot."""
    j, storages = open_node(tmp_path, n=1)
    s = storages[0]
    s.write(HardState(1, None, 40), ents(1, 60, 1))
    j.sync()
    s.install_snapshot(SnapshotMeta(50, 2, ABC), b"")
    j.sync()
    close_node(j, storages)
    power_loss(tmp_path, n=1)
    j, storages = open_node(tmp_path, n=1)
    s = storages[0]
    assert (s.first_index(), s.last_index(), s.term(50)) == (51, 50, 2)
    close_node(j, storages)


def test_wal_check_reads_the_journal(tmp_path, capsys):
    j, storages = open_node(tmp_path)
    storages[1].write(HardState(1, None, 0), ents(1, 4, 1))
    j.sync()
    close_node(j, storages)
    assert main(["wal", "check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"journal {tmp_path / 'journal'}" in out
    assert "to replay   1 records of 1 partitions" in out


def test_a_commit_past_every_entry_a_replay_leaves_is_a_loss_and_nothing_else_is():
    ok: list[tuple[int, list[Any]]] = [
        (10, [frames(ents(8, 11, 2), commit=11)]),  # a truncation above the commit, then on
        (10, [frames(ents(3, 4, 3)), frames([], commit=9)]),  # a stale record: below the end
        (10, [frames(ents(20, 21, 2)), frames([], commit=10)]),  # cut (uncommitted) tail
        (10, [frames(ents(20, 21, 2)), Reset(30, 2), frames([], commit=30)]),  # an install
        (0, [frames(ents(1, 3, 1), commit=2), frames(ents(4, 5, 1), commit=5)]),
    ]
    for last, ops in ok:
        assert commit_past_log(last, ops) is None, ops
    assert commit_past_log(10, [frames([], commit=11)]) == (11, 10)
    assert commit_past_log(10, [frames(ents(12, 14, 1), commit=13)]) == (13, 10)  # a gap
    assert commit_past_log(10, [frames(ents(11, 12, 1)), frames([], commit=13)]) == (13, 12)


def test_committed_entries_gone_from_a_wal_under_its_checkpoint_refuse_to_open(tmp_path, capsys):
    """Found by a fault helper: with a WAL's newest segment deleted (the journal's checkpoint
    had made it durable), the node replayed the journal's later records as "cut by a later
    truncation", took their commit records down to the WAL's end and started without entries
    it had acknowledged: as a leader it then overwrote them. A commit the journal records past
    every entry a replay leaves refuses to open, and `wal check` says so."""
    j, storages = open_node(tmp_path, n=1, storage={"segment_bytes": 4096}, checkpoint_bytes=32768)
    s = storages[0]

    async def checkpoint() -> int:
        index = fill_until_due(j, storages)
        j.sync()

        async def durable() -> None:
            j.sync()

        await j.checkpoint(lambda: {0: s.wal}, durable)
        return index

    index = asyncio.run(checkpoint())
    s.write(HardState(1, None, index + 5), ents(index, index + 9, 1, size=200))
    j.sync()
    close_node(j, storages)
    wal = tmp_path / "p0" / "wal"
    trusted = read_journal(str(tmp_path / "journal")).trusted[0]
    assert trusted == index - 1
    while (left := analyze_wal(str(wal)).segments[-1].last_index) >= trusted:
        max(wal.iterdir()).unlink()  # the newest segments, down below the checkpoint
    reason = (
        f"the journal records commit index {index + 5}, but the WAL and the journal hold "
        f"entries only up to {left}: committed entries {left + 1}..{index + 5} are missing (a "
        "WAL segment deleted or cut)"
    )
    with pytest.raises(CorruptFile) as e:
        open_node(tmp_path, n=1, storage={"segment_bytes": 4096})
    assert e.value.path == str(wal)
    assert e.value.reason.startswith(f"is short: {reason}. Restore the segments, or remove")
    assert main(["wal", "check", str(tmp_path / "p0")]) == 1
    out = capsys.readouterr().out
    assert f"status      CORRUPTED: {reason}" in out, out


def test_committed_entries_gone_with_nothing_journaled_since_the_checkpoint_refuse_too(
    tmp_path, capsys
):
    """Found by a review: the check above read the commit records journaled since the last
    checkpoint only, and every start checkpoints: after a restart (or on a quiet partition)
    there was nothing to compare with, and the same loss opened. The checkpoint records each
    partition's commit index now (in its CHECKPOINT record, after what older versions read)."""
    kw: dict[str, Any] = {"n": 1, "storage": {"segment_bytes": 4096}}
    j, storages = open_node(tmp_path, **kw)
    storages[0].write(HardState(1, None, 200), ents(1, 200, 1, size=100))
    j.sync()
    close_node(j, storages)
    close_node(*open_node(tmp_path, **kw))  # a start: its checkpoint, nothing journaled since
    found = read_journal(str(tmp_path / "journal"))
    assert (found.ops, found.trusted, found.committed) == ({}, {0: 200}, {0: 200})
    wal = tmp_path / "p0" / "wal"
    while (left := analyze_wal(str(wal)).segments[-1].last_index) >= 200:
        max(wal.iterdir()).unlink()
    # A node rolled back reads the checkpoint as before: its body starts as theirs did.
    older = jr.encode_checkpoint({0: 200, 1: 7})[8:]
    assert jr.encode_checkpoint({0: 200, 1: 7}, {0: 200, 1: 5})[8:].startswith(older)
    with pytest.raises(CorruptFile, match=f"records commit index 200, .* up to {left}:"):
        open_node(tmp_path, **kw)
    assert main(["wal", "check", str(tmp_path)]) == 1
    assert f"committed entries {left + 1}..200 are missing" in capsys.readouterr().out


def test_a_torn_frames_record_is_a_torn_tail_even_with_a_whole_wal_record_inside(tmp_path):
    """A FRAMES record carries WAL records framed as the journal's own; torn after a whole one
    of them, what is left must read as a torn tail (cut), not as damage followed by a journal
    record (which refused to start the node after a crash)."""

    def wal_record(index: int) -> bytes:
        return jr._frame(b"\x01" + struct.pack("<QQ", index, 2) + b"x" * 20)

    whole = jr._frame(struct.pack("<BI", jr.J_FRAMES, 0) + wal_record(5))
    torn = jr._frame(struct.pack("<BI", jr.J_FRAMES, 0) + wal_record(5) + wal_record(6))
    cut = torn[: 8 + 5 + len(wal_record(5)) + 10]  # inside the second WAL record
    path = tmp_path / "0000000000000001.jrn"
    path.write_bytes(whole + cut)
    records, why = jr._records(str(path))
    assert len(records) == 1 and why is not None and "cut short" in why.reason


# ----------------------------------------------------------------------------- write-behind
def on_file(root: Path, p: int) -> int:
    """The last entry index a partition's WAL files hold (what a kill would leave)."""
    return analyze_wal(str(root / f"p{p}" / "wal")).segments[-1].last_index


def test_write_behind_holds_the_records_until_a_read_needs_them_and_a_kill_loses_none(tmp_path):
    root, killed = tmp_path / "node", tmp_path / "killed"
    j, storages = open_node(root, n=1)
    s = storages[0]
    s.write(HardState(1, None, 0), ents(1, 20, 1))
    s.write(HardState(1, None, 20), [])
    j.sync()  # durable in the journal; the WAL file has not been written
    assert on_file(root, 0) == 0
    shutil.copytree(root, killed)  # a SIGKILL now: the page cache is what the disk reads
    raws = s.read_raw(1, 21, 1 << 20)  # a bulk read (by file) writes them first
    assert sum(len(r.offsets) for r in raws) == 20 and on_file(root, 0) == 20
    close_node(j, storages)
    j, storages = open_node(killed, n=1)
    s = storages[0]
    assert s.last_index() == 20 and s.commit_index() == 20
    assert s.entries(1, 21) == ents(1, 20, 1)
    assert any("replayed" in r for r in s.recovery)
    close_node(j, storages)


def test_a_commit_index_written_out_survives_a_kill_and_the_next_sync_makes_it_durable(tmp_path):
    """What a node does for a commit index alone before readers see it (`Node._pass`): the
    journal writes it to the file without an fdatasync; a kill keeps it, and the next sync,
    with nothing more journaled, still makes it durable."""
    root, killed = tmp_path / "node", tmp_path / "killed"
    j, storages = open_node(root, n=1)
    s = storages[0]
    s.write(HardState(1, None, 4), ents(1, 9, 1))
    j.sync()
    s.write(HardState(1, None, 9), [])  # held by write-behind and journaled, in memory alone
    syncs = count_fdatasyncs(j)
    assert j.write_out() and syncs == [0]
    shutil.copytree(root, killed)  # a SIGKILL now: the page cache is what the disk reads
    j.sync()
    assert syncs == [1]  # written out, but not synced until now
    close_node(j, storages)
    j, storages = open_node(killed, n=1)
    assert storages[0].commit_index() == 9
    close_node(j, storages)


def test_a_journal_write_out_waits_for_a_checkpoints_segment_change(tmp_path):
    """After a checkpoint starts a new segment, the old one's tail goes first (with a sync):
    written out before it, the new segment would hold records past ones never written."""
    j, storages = open_node(tmp_path, n=1)
    storages[0].write(HardState(1, None, 0), ents(1, 3, 1))
    j._open_segment({0: 0})  # as `checkpoint` does, before its sync
    storages[0].write(HardState(1, None, 3), [])
    assert not j.write_out()
    j.sync()
    storages[0].write(HardState(1, None, 3), ents(4, 4, 1))
    assert j.write_out()
    j.sync()
    close_node(j, storages)
    j, storages = open_node(tmp_path, n=1)
    assert storages[0].last_index() == 4 and storages[0].commit_index() == 3
    close_node(j, storages)


def test_a_journal_write_out_waits_for_a_running_sync(tmp_path):
    j, storages = open_node(tmp_path, n=1)
    storages[0].write(HardState(1, None, 0), ents(1, 3, 1))
    with j._io:  # a sync in the fsync thread holds it
        assert not j.write_out()
    assert j.write_out()
    close_node(j, storages)


def test_write_behind_writes_once_it_holds_enough_and_before_a_roll(tmp_path):
    j, storages = open_node(tmp_path, n=1, storage={"segment_bytes": 256 * 1024})
    s = storages[0]
    held = s.wal.write_behind
    assert held > 0
    index = 1
    while on_file(tmp_path, 0) == 0:  # 1 KiB entries: written once `held` bytes wait
        s.write(None, ents(index, index, 1, size=1024))
        index += 1
        assert index * 1024 < 2 * held
    while s.wal.segment_count() == 1:
        s.write(None, ents(index, index, 1, size=1024))
        index += 1
    sealed = s.wal.sealed_segments()[0]
    assert analyze_wal(str(tmp_path / "p0" / "wal")).segments[0].last_index == sealed.last_index
    close_node(j, storages)


def test_a_checkpoint_writes_what_write_behind_holds_before_the_journal_goes(tmp_path):
    root, killed = tmp_path / "node", tmp_path / "killed"
    j, storages = open_node(root, n=1)
    storages[0].write(HardState(1, None, 5), ents(1, 9, 1))

    async def durable() -> None:
        j.sync()

    asyncio.run(j.checkpoint(lambda: {p: s.wal for p, s in storages.items()}, durable))
    shutil.copytree(root, killed)  # killed right after: the journal before it is deleted
    close_node(j, storages)
    assert read_journal(str(killed / "journal")).ops == {}
    j, storages = open_node(killed, n=1)
    assert storages[0].entries(1, 10) == ents(1, 9, 1) and storages[0].commit_index() == 5
    close_node(j, storages)


def test_a_failed_write_behind_stops_the_partition_and_loses_nothing_the_journal_holds(tmp_path):
    disk = FailingDisk("write", errno.EIO, after=10**9)  # the WAL's disk; the journal's is fine
    j, storages = open_node(tmp_path, n=1, storage={"ops": disk})
    s = storages[0]
    s.write(HardState(1, None, 0), ents(1, 30, 1))
    s.write(HardState(1, None, 30), [])
    j.sync()  # acknowledged: durable in the journal, held for the WAL file
    disk.after = 0
    with pytest.raises(StorageFailed) as info:
        s.read_raw(1, 31, 1 << 20)  # the read writes what is held: the disk fails (torn)
    assert info.value.errno == errno.EIO and s.failed is info.value
    with pytest.raises(StorageFailed):
        s.write(None, ents(31, 31, 1))
    close_node(j, storages)
    j, storages = open_node(tmp_path, n=1)  # a healthy disk again: the journal fills the WAL
    s = storages[0]
    assert s.entries(1, 31) == ents(1, 30, 1) and s.commit_index() == 30
    close_node(j, storages)


class CountingDisk(FileOps):
    """Counts the bytes written through it."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)
        super().write(fd, data)


def test_a_snapshot_install_drops_what_write_behind_holds_for_the_log_it_replaces(tmp_path):
    disk = CountingDisk()
    j, storages = open_node(tmp_path, n=1, storage={"ops": disk})
    s = storages[0]
    s.write(HardState(1, None, 0), ents(1, 40, 1, size=200))  # ~8 KiB held, below the mark
    j.sync()
    before = disk.written
    s.install_snapshot(SnapshotMeta(50, 2, ABC), b"")
    assert disk.written - before < 1024, "the replaced log's records were written"
    s.write(None, ents(51, 54, 2))
    j.sync()
    close_node(j, storages)
    j, storages = open_node(tmp_path, n=1)
    assert storages[0].first_index() == 51 and storages[0].last_index() == 54
    close_node(j, storages)


def test_a_wal_with_write_behind_refuses_its_own_sync(tmp_path):
    """Its held records are not in the file, and a sync runs off the owner's loop."""
    j, storages = open_node(tmp_path, n=1)
    with pytest.raises(RuntimeError, match="write-behind"):
        storages[0].wal.sync()
    close_node(j, storages)


# ----------------------------------------------------------------------------- what is synced when
class EventDisk(FileOps):
    """Records, in order, each fdatasync and directory fsync (with the file's path) and each
    unlink, for tests of what a step made durable before the next one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def fdatasync(self, fd: int) -> None:
        self.events.append(("fdatasync", os.readlink(f"/proc/self/fd/{fd}")))
        super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        self.events.append(("fsync_dir", os.path.realpath(path)))
        super().fsync_dir(path)

    def unlink(self, path: str) -> None:
        self.events.append(("unlink", os.path.realpath(path)))
        super().unlink(path)


def test_a_checkpoint_syncs_each_written_wal_and_the_journal_directory_before_its_done(
    tmp_path: Path,
) -> None:
    # The DONE lets the next restart skip every record before it: a WAL not fdatasynced by
    # then (or a new segment whose directory entry is not durable) is lost to a power loss
    # once the old journal is deleted. The power-loss model of the other tests cannot see a
    # missing fdatasync, so the calls themselves are checked, in order.
    disk = EventDisk()
    j, storages = open_node(tmp_path, ops=disk, storage={"ops": disk})
    for s in storages.values():
        s.write(HardState(1, None, 5), ents(1, 9, 1))
    j.sync()

    async def durable() -> None:
        disk.events.append(("durable", ""))
        j.sync()

    disk.events.clear()
    asyncio.run(j.checkpoint(lambda: {p: s.wal for p, s in storages.items()}, durable))
    close_node(j, storages)
    marks = [i for i, e in enumerate(disk.events) if e[0] == "durable"]
    assert len(marks) == 2  # the CHECKPOINT, then the DONE
    between = disk.events[marks[0] : marks[1]]
    for p in storages:
        wal_dir = str((tmp_path / f"p{p}" / "wal").resolve())
        assert any(k == "fdatasync" and os.path.dirname(f) == wal_dir for k, f in between), p
    assert ("fsync_dir", str((tmp_path / "journal").resolve())) in between


def test_a_restart_syncs_every_wal_before_it_deletes_the_journal_it_replayed(
    tmp_path: Path,
) -> None:
    # The replayed records (and a killed process's writes, read back from the page cache)
    # are durable only in the old journal until the WALs are synced.
    j, storages = open_node(tmp_path)
    for s in storages.values():
        s.write(HardState(1, None, 5), ents(1, 9, 1))
    j.sync()
    close_node(j, storages)  # killed: the journal holds what the WALs were never synced with
    old = [str((tmp_path / "journal").resolve() / f"{seq:016x}.jrn") for seq in list_journal(
        str(tmp_path / "journal"))]  # fmt: skip
    disk = EventDisk()
    j, storages = open_node(tmp_path, ops=disk, storage={"ops": disk})
    close_node(j, storages)
    first_unlink = disk.events.index(("unlink", old[0]))
    for p in storages:
        wal_dir = str((tmp_path / f"p{p}" / "wal").resolve())
        synced = [
            i
            for i, (k, f) in enumerate(disk.events)
            if k == "fdatasync" and os.path.dirname(f) == wal_dir
        ]
        assert synced and synced[0] < first_unlink, (p, disk.events)


def test_a_snapshot_installs_reset_is_fdatasynced_before_the_wal_is_reset(tmp_path: Path) -> None:
    # Journaled but not yet durable, a power loss right after the WAL's reset would replay the
    # entries the install discarded, behind the snapshot.
    disk = EventDisk()
    j, storages = open_node(tmp_path, n=1, ops=disk)
    s = storages[0]
    s.write(HardState(1, None, 3), ents(1, 19, 1))
    j.sync()
    real_reset = s.wal.reset

    def reset(index: int, term: int) -> None:
        disk.events.append(("wal reset", ""))
        real_reset(index, term)

    s.wal.reset = reset  # type: ignore[method-assign]
    disk.events.clear()
    s.install_snapshot(SnapshotMeta(50, 2, ABC), b"")
    close_node(j, storages)
    journal_dir = str((tmp_path / "journal").resolve())
    at = disk.events.index(("wal reset", ""))
    assert any(
        k == "fdatasync" and os.path.dirname(f) == journal_dir for k, f in disk.events[:at]
    ), disk.events


def test_replay_starts_at_the_newest_complete_checkpoint_when_an_older_one_is_left(
    tmp_path: Path,
) -> None:
    # Killed between a checkpoint's DONE and deleting the segment before it: two complete
    # checkpoints on disk. The newer one's positions are what the WALs were synced to (and
    # what tells a torn WAL tail from damage before it); the older one's are stale.
    j, storages = open_node(tmp_path)
    storages[0].write(HardState(1, None, 0), ents(1, 9, 1))
    j.sync()
    j._open_segment({0: 9, 1: 0})  # as `checkpoint` does...
    j._done()
    j.sync()  # ...up to its DONE, durable; the process dies before `_drop_before`
    storages[0].write(None, ents(10, 12, 1))
    j.sync()
    close_node(j, storages)
    segments = list_journal(str(tmp_path / "journal"))
    assert len(segments) == 2
    found = read_journal(str(tmp_path / "journal"))
    assert found.start == segments[-1]
    assert found.trusted == {0: 9, 1: 0}
    assert len(found.ops[0]) == 1  # entries 10..12 alone
    j, storages = open_node(tmp_path)
    assert storages[0].entries(1, 13) == ents(1, 12, 1)
    close_node(j, storages)


def test_a_checkpoint_that_cannot_create_its_segment_is_tried_again_without_loss(tmp_path):
    """A new segment not created (here a directory in its place; a full disk alike) fails the
    checkpoint, not the journal: the WALs' descriptors it opened are closed, writes go on into
    the old segment, and the next try creates the very segment the first one could not."""
    j, storages = open_node(tmp_path, checkpoint_bytes=64 * 1024)
    journal = tmp_path / "journal"
    (before,) = list_journal(str(journal))
    blocker = Path(_segment_path(str(journal), before + 1))
    blocker.mkdir()

    async def durable() -> None:
        j.sync()

    def wals() -> dict[int, Any]:
        return {p: s.wal for p, s in storages.items()}

    async def run() -> None:
        index = fill_until_due(j, storages)
        fds = len(os.listdir("/proc/self/fd"))
        with pytest.raises(IsADirectoryError):
            await j.checkpoint(wals, durable)
        assert len(os.listdir("/proc/self/fd")) == fds
        assert j.failed is None and j.checkpoints == 0 and j.due()
        for s in storages.values():
            s.write(HardState(1, None, index), ents(index, index + 1, 1))
        j.sync()
        blocker.rmdir()
        await j.checkpoint(wals, durable)
        assert list_journal(str(journal)) == [before + 1] and j.checkpoints == 1

    asyncio.run(run())
    last = {p: s.last_index() for p, s in storages.items()}
    close_node(j, storages)
    assert read_journal(str(journal)).trusted == last
    assert power_loss(tmp_path) == 0
