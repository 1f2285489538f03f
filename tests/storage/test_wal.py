"""The WAL on its own: reads, roll-over, truncation, compaction, and reopening after each."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.storage.helpers import ents, payload

from raftlog.node.core.errors import Compacted, SafetyViolation, Unavailable
from raftlog.node.core.types import Entry, EntryKind, Membership
from raftlog.node.storage import wal as wal_module
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.recovery import list_segments
from raftlog.node.storage.wal import Wal


def open_wal(path, **kw) -> Wal:
    kw.setdefault("segment_bytes", 1024)
    return Wal.open(str(path), **kw)


def reset_over(path, last: int, index: int, term: int) -> tuple[Wal, dict[str, bytes]]:
    """A WAL of entries 1..`last` (term 1, synced), reopened and reset to a snapshot at
    (`index`, `term`); and the bytes its segments had before, to put back as a crash before the
    reset's unlinks would leave them."""
    w = open_wal(path)
    w.append(ents(1, last, 1))
    w.sync()
    w.close()
    saved = {n: (path / n).read_bytes() for _, n in list_segments(str(path))}
    w = open_wal(path)
    w.reset(index, term)
    return w, saved


def put_back(path, saved: dict[str, bytes]) -> None:
    for name, raw in saved.items():  # the old segments reappear (crash before the unlinks)
        (path / name).write_bytes(raw)


def test_entries_round_trip_across_segments_and_reopen(tmp_path):
    w = open_wal(tmp_path)
    written = ents(1, 300, 1) + ents(301, 400, 2, size=500)
    for i in range(0, len(written), 7):
        w.append(written[i : i + 7])
    w.sync()
    assert w.segment_count() > 10, "1 KiB segments must have rolled over"
    assert w.entries(1, 401) == written
    assert w.entries(150, 278) == written[149:277]  # a backfill-sized range spanning segments
    assert [w.term(i) for i in (0, 1, 300, 301, 400)] == [0, 1, 1, 2, 2]
    w.close()
    w2 = open_wal(tmp_path)
    assert w2.recovery == []
    assert (w2.first_index(), w2.last_index()) == (1, 400)
    assert w2.entries(1, 401) == written
    with pytest.raises(Unavailable):
        w2.entries(400, 402)
    with pytest.raises(Unavailable):
        w2.term(401)


def test_new_wal_is_anchored_at_its_base(tmp_path):
    w = open_wal(tmp_path, base_index=50, base_term=3)
    assert (w.first_index(), w.last_index(), w.term(50)) == (51, 50, 3)
    with pytest.raises(Compacted):
        w.term(49)
    with pytest.raises(SafetyViolation):
        w.append(ents(53, 54, 3))  # a gap
    with pytest.raises(SafetyViolation, match="leaves a gap after the last index 50"):
        w.append(ents(52, 52, 3))  # a gap of one entry
    w.append(ents(51, 52, 3))
    assert w.last_index() == 52


def test_truncation_replaces_a_divergent_tail_durably(tmp_path):
    w = open_wal(tmp_path)
    w.append(ents(1, 100, 1))
    w.append_commit(20)
    w.sync()
    segments_before = w.segment_count()
    w.append(ents(30, 40, 2))  # overlaps: 30..100 of term 1 are dropped
    w.sync()
    assert w.last_index() == 40
    assert w.segment_count() < segments_before
    assert w.entries(28, 41) == ents(28, 29, 1) + ents(30, 40, 2)
    with pytest.raises(SafetyViolation, match="committed"):
        w.append(ents(15, 16, 2))
    w.close()
    w2 = open_wal(tmp_path)
    assert w2.entries(1, 41) == ents(1, 29, 1) + ents(30, 40, 2)
    assert w2.commit == 20, "the commit record cut with the tail is written again"


def test_the_last_committed_entry_is_never_truncated(tmp_path):
    w = open_wal(tmp_path)
    w.append(ents(1, 10, 1))
    w.append_commit(7)
    with pytest.raises(SafetyViolation, match="committed"):
        w.truncate_from(7)
    with pytest.raises(SafetyViolation, match="outside the log"):
        w.truncate_from(11)  # nothing there to remove
    w.truncate_from(8)
    assert w.last_index() == 7


def test_a_commit_record_past_the_last_entry_is_taken_down_to_it_on_open(tmp_path):
    """Even one past: a mark naming an entry that is not there would be served as committed."""
    w = open_wal(tmp_path)
    w.append(ents(1, 10, 1))
    w.append_commit(11)  # the WAL writes what it is given; open must not trust it
    w.sync()
    w.close()
    w2 = open_wal(tmp_path)
    assert w2.commit == 10
    assert any("past the last entry" in m for m in w2.recovery), w2.recovery


def test_commit_is_recovered_from_the_wal(tmp_path):
    w = open_wal(tmp_path)
    w.append(ents(1, 10, 1))
    w.append_commit(4)
    w.append_commit(9)
    w.append_commit(7)  # never goes back
    w.sync()
    w.close()
    assert open_wal(tmp_path).commit == 9


def test_a_commit_index_riding_with_an_append_is_recorded_after_its_entries(tmp_path):
    w = open_wal(tmp_path)
    w.append(ents(1, 4, 1), commit=2)
    assert w.commit == 2
    w.append(ents(5, 5, 1), commit=5)  # one entry, and the commit index covering it
    assert w.commit == 5
    w.append(ents(6, 6, 1), commit=5)  # not above: nothing more recorded
    w.sync()
    w.close()
    w2 = open_wal(tmp_path)
    assert (w2.last_index(), w2.commit, w2.recovery) == (6, 5, [])


def test_compaction_deletes_whole_segments_only(tmp_path):
    w = open_wal(tmp_path)
    w.append(ents(1, 200, 1))
    w.sync()
    seg_firsts = sorted(int(n.split("-")[1][:-4], 16) for _, n in list_segments(str(tmp_path)))
    target = 120
    dropped = w.compact(target)
    floor = w.first_index()
    assert floor <= target, "never past the asked index"
    assert floor == max(f for f in seg_firsts if f <= target), "whole segments below it go"
    assert dropped == floor - 1
    assert w.term(floor - 1) == 1, "the anchor below the floor is kept in the segment header"
    with pytest.raises(Compacted):
        w.entries(floor - 1, floor)
    w.close()
    w2 = open_wal(tmp_path)
    assert (w2.first_index(), w2.last_index()) == (floor, 200)
    assert w2.entries(floor, 201) == ents(floor, 200, 1)
    assert w2.compact(10_000) > 0 and w2.segment_count() == 1, "the active segment stays"


def test_config_entries_are_indexed(tmp_path):
    w = open_wal(tmp_path)
    m = Membership.of(["a", "b"]).encode()
    batch = [
        Entry(
            i, 1, EntryKind.CONFIG if i % 25 == 0 else EntryKind.NORMAL, m if i % 25 == 0 else b"x"
        )
        for i in range(1, 101)
    ]
    w.append(batch)
    w.sync()
    assert w.config_indexes == [25, 50, 75, 100]
    w.append(ents(60, 61, 2))
    assert w.config_indexes == [25, 50]
    w.close()
    assert open_wal(tmp_path).config_indexes == [25, 50]


def test_reset_starts_a_new_log(tmp_path):
    w = open_wal(tmp_path)
    w.append(ents(1, 50, 1))
    w.sync()
    w.reset(500, 7)
    assert (w.first_index(), w.last_index(), w.term(500)) == (501, 500, 7)
    w.append(ents(501, 502, 7))
    w.sync()
    w.close()
    w2 = open_wal(tmp_path)
    assert (w2.first_index(), w2.entries(501, 503)) == (501, ents(501, 502, 7))
    assert len(list_segments(str(tmp_path))) == 1


def test_reset_leftovers_are_removed_on_open(tmp_path):
    w, saved = reset_over(tmp_path, 50, 500, 7)
    w.close()
    put_back(tmp_path, saved)
    w2 = open_wal(tmp_path)
    assert (w2.first_index(), w2.last_index()) == (501, 500)
    assert any("superseded by a snapshot install" in r for r in w2.recovery)
    assert len(list_segments(str(tmp_path))) == 1


# --------------------------------------------------------------------------- model-based
ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 30), st.integers(0, 8)),
        st.tuples(st.just("commit"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("compact"), st.integers(0, 60), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_wal_matches_a_list_model_through_any_operations(tmp_path_factory, ops):
    """Appends (with overlaps), commits, compactions and reopens agree with a plain list."""
    path = tmp_path_factory.mktemp("wal")
    w = open_wal(path, segment_bytes=600)
    model: dict[int, Entry] = {}
    term = 1
    commit = 0
    for op, a, b in ops:
        last = w.last_index()
        if op == "append":
            term += 1
            start = max(commit + 1, w.first_index(), last + 1 - b)
            batch = [
                Entry(i, term, EntryKind.NORMAL, payload(i, term)) for i in range(start, start + a)
            ]
            w.append(batch)
            for i in list(model):
                if i >= start:
                    del model[i]
            model.update({e.index: e for e in batch})
        elif op == "commit":
            commit = max(commit, min(a, last))
            w.append_commit(commit)
        elif op == "compact":
            w.compact(min(a, commit + 1))
            for i in list(model):
                if i < w.first_index():
                    del model[i]
        else:
            w.sync()
            w.close()
            w = open_wal(path, segment_bytes=600)
            assert w.recovery == []
            assert w.commit == commit
        w.sync()
        lo, hi = w.first_index(), w.last_index()
        assert sorted(model) == list(range(lo, hi + 1))
        assert w.entries(lo, hi + 1) == [model[i] for i in range(lo, hi + 1)]
        for sub in (max(lo, hi - 3), max(lo, (lo + hi) // 2)):  # short reads: the tail cache
            assert w.entries(sub, hi + 1) == [model[i] for i in range(sub, hi + 1)]
        assert all(w.term(i) == model[i].term for i in range(lo, hi + 1))
    w.close()


def test_tail_cache_follows_truncation_reset_and_its_bounds(tmp_path, monkeypatch):
    """Reads served from memory agree with the disk after overlaps, trims and a reset."""
    monkeypatch.setattr(wal_module, "TAIL_CACHE_ENTRIES", 8)
    monkeypatch.setattr(wal_module, "TAIL_CACHE_BYTES", 10_000)
    w = open_wal(tmp_path)

    def check() -> None:
        lo, hi = w.first_index(), w.last_index()
        disk = open_wal(tmp_path)
        try:
            for a in range(lo, hi + 1):
                for b in range(a, hi + 2):  # ranges ending below the last entry too
                    assert w.entries(a, b) == disk.entries(a, b), (a, b)
        finally:
            disk.close()

    w.append(ents(1, 20, term=1))
    w.sync()
    check()
    w.append(ents(17, 25, term=2))  # overlaps the cached tail: 17.. replaced
    w.sync()
    check()
    assert [e.term for e in w.entries(15, 26)] == [1, 1] + [2] * 9
    w.append([Entry(26, 2, EntryKind.NORMAL, b"x" * 9_000)])  # over the byte bound: trimmed
    w.sync()
    check()
    w.reset(40, 3)
    w.append(ents(41, 43, term=3))
    w.sync()
    check()
    assert [e.index for e in w.entries(41, 44)] == [41, 42, 43]
    w.close()


def test_the_term_below_the_floor_is_the_anchor_of_the_oldest_segment_kept(tmp_path):
    w = open_wal(tmp_path)
    for t in range(1, 31):  # a new term every 10 entries, so neighbouring segments differ
        w.append(ents(10 * t - 9, 10 * t, t))
    w.sync()
    w.compact(150)
    floor = w.first_index()
    assert 100 < floor <= 150 and w._segments[-1].first_index > floor + 20
    expected = (floor - 2) // 10 + 1  # the term of entry floor - 1
    assert w.term(floor - 1) == expected
    w.close()
    w2 = open_wal(tmp_path)
    assert (w2.first_index(), w2.term(floor - 1)) == (floor, expected)


def test_a_configuration_entry_at_the_truncation_or_the_floor_is_indexed_as_the_log_is(tmp_path):
    w = open_wal(tmp_path)
    m = Membership.of(["a", "b"]).encode()
    w.append([*ents(1, 59, 1), Entry(60, 1, EntryKind.CONFIG, m), *ents(61, 100, 1)])
    assert w.config_indexes == [60]
    w.append(ents(60, 61, 2))  # the configuration entry at 60 is replaced
    assert w.config_indexes == []
    # A configuration entry first in a segment, then the segments below it compacted.
    w.append(ents(62, 200, 2))
    first = w._segments[3].first_index
    w.truncate_from(first)
    w.append([Entry(first, 3, EntryKind.CONFIG, m), *ents(first + 1, first + 40, 3)])
    assert w._segments[3].first_index == first and w.config_indexes == [first]
    w.append_commit(first)
    w.compact(first)
    assert w.first_index() == first
    assert w.config_indexes == [first], "the floor's own entry is still in the log"
    w.sync()
    w.close()
    assert open_wal(tmp_path).config_indexes == [first]


def test_a_reset_commits_the_snapshot_it_starts_after(tmp_path):
    w = open_wal(tmp_path)
    w.append([*ents(1, 29, 1), Entry(30, 1, EntryKind.CONFIG, Membership.of(["a"]).encode())])
    w.append(ents(31, 50, 1))
    w.append_commit(10)
    assert w.config_indexes == [30]
    w.reset(500, 7)
    assert w.commit == 500
    assert w.config_indexes == [], "the old log's membership changes went with it"
    assert len(list_segments(str(tmp_path))) == 1, "the old log's files are gone"
    with pytest.raises(SafetyViolation):
        w.truncate_from(500)


class SyncCounter(FileOps):
    """Counts fdatasyncs; `during` runs inside the next one (a write landing while it runs)."""

    def __init__(self) -> None:
        self.fdatasyncs = 0
        self.during: Callable[[], None] | None = None

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        during, self.during = self.during, None
        if during is not None:
            during()
        super().fdatasync(fd)


def test_sync_fdatasyncs_what_was_written_and_only_then(tmp_path):
    disk = SyncCounter()
    w = open_wal(tmp_path, ops=disk)
    w.append(ents(1, 3, 1))
    w.sync()
    assert disk.fdatasyncs == 1
    w.sync()
    assert disk.fdatasyncs == 1, "nothing written since"
    w.append_commit(2)
    w.sync()
    assert disk.fdatasyncs == 2, "a commit record alone is synced too"
    w.append(ents(4, 4, 1), commit=3)
    w.sync()
    assert disk.fdatasyncs == 3
    # A write that lands while the fsync runs (the owner appends while a worker thread syncs)
    # is not covered by it: the next sync must fdatasync again.
    w.append(ents(5, 5, 1))
    disk.during = lambda: w.append(ents(6, 6, 1))
    w.sync()
    assert disk.fdatasyncs == 4
    w.sync()
    assert disk.fdatasyncs == 5


class SyncLog(FileOps):
    """Records, in order, fsyncs and truncations (with the file's name), directory fsyncs,
    unlinks and renames: what each step made durable before it returned."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    @staticmethod
    def _name(fd: int) -> str:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))

    def fsync(self, fd: int) -> None:
        self.events.append(("fsync", self._name(fd)))
        super().fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        self.events.append(("truncate", self._name(fd)))
        super().truncate(fd, size)

    def fsync_dir(self, path: str) -> None:
        self.events.append(("fsync_dir", ""))
        super().fsync_dir(path)

    def unlink(self, path: str) -> None:
        self.events.append(("unlink", os.path.basename(path)))
        super().unlink(path)

    def replace(self, src: str, dst: str) -> None:
        self.events.append(("replace", os.path.basename(dst)))
        super().replace(src, dst)


def test_rolling_truncation_compaction_and_reset_are_durable_before_they_return(tmp_path):
    disk = SyncLog()
    w = open_wal(tmp_path, ops=disk)
    w.append(ents(1, 10, 1))
    sealed = os.path.basename(w._segments[-1].path)
    disk.events.clear()
    while w.segment_count() < 2:
        w.append(ents(w.last_index() + 1, w.last_index() + 5, 1))
    new = os.path.basename(w._segments[-1].path)
    ev = disk.events
    assert ev.index(("fsync", sealed)) < ev.index(("replace", new)), "sealed before the next"
    while w.segment_count() < 4:
        w.append(ents(w.last_index() + 1, w.last_index() + 5, 1))
    kept = os.path.basename(w._segments[-2].path)
    disk.events.clear()
    w.truncate_from(w._segments[-1].first_index - 2)
    assert disk.events[-1] == ("fsync", kept), "the cut and the commit record after it"
    w.append_commit(w.last_index() - 1)
    w.append(ents(w.last_index() + 1, w.last_index() + 40, 1))
    disk.events.clear()
    assert w.compact(w.commit) > 0
    assert disk.events[-1] == ("fsync_dir", "") and disk.events[0][0] == "unlink"
    disk.events.clear()
    w.reset(1000, 5)
    assert disk.events[-1] == ("fsync_dir", ""), "the old segments' removal"
    assert sum(1 for e in disk.events if e[0] == "unlink") >= 2
    w.close()


def test_what_opening_repairs_is_durable_before_it_returns(tmp_path):
    w, saved = reset_over(tmp_path, 20, 100, 2)
    w.append(ents(101, 110, 2))
    active = w._segments[-1]
    name, end = os.path.basename(active.path), active.end
    w.close()
    put_back(tmp_path, saved)
    with open(tmp_path / name, "r+b") as f:  # and the newest record is torn
        f.truncate(end - 3)
    disk = SyncLog()
    w2 = open_wal(tmp_path, ops=disk)
    assert w2.last_index() == 109 and len(w2.recovery) == len(saved) + 1, w2.recovery
    assert ("fsync_dir", "") in disk.events, "the removal of the superseded segments"
    ev = disk.events
    assert ("fsync", name) in ev[ev.index(("truncate", name)) :], "the cut torn tail"


def test_leftovers_of_a_reset_inside_the_old_log_are_removed_on_open(tmp_path):
    """A snapshot install whose index is inside the log (its term differs there): the new
    segment starts below the old ones' indexes, and still supersedes them all."""
    w, saved = reset_over(tmp_path, 150, 40, 2)
    assert len(saved) > 3
    w.append(ents(41, 45, 2))
    w.close()
    put_back(tmp_path, saved)
    w2 = open_wal(tmp_path)
    assert (w2.first_index(), w2.last_index(), w2.term(40)) == (41, 45, 2)
    assert w2.entries(41, 46) == ents(41, 45, 2)
    assert len(w2.recovery) == len(saved) and len(list_segments(str(tmp_path))) == 1


def test_the_commit_index_is_at_least_the_floor_after_its_records_were_compacted(tmp_path):
    """Only committed entries are compacted: with the segment holding the last commit record
    gone, the commit index opened is the entry below the floor, not 0."""
    w = open_wal(tmp_path)
    while w._segments[-1].end < w.segment_bytes:
        w.append(ents(w.last_index() + 1, w.last_index() + 1, 1))
    full = w.last_index()
    w.append_commit(full)  # into the full segment: the next append starts a new one
    w.append(ents(full + 1, full + 40, 1))
    assert w.compact(full + 1) == full and w.first_index() == full + 1
    w.sync()
    w.close()
    w2 = open_wal(tmp_path)
    assert w2.first_index() == full + 1 and w2.commit == full


def test_write_behind_records_reach_their_own_segment_and_every_read(tmp_path, monkeypatch):
    """With write-behind (the journal's WALs) the newest records wait in memory: a read past
    the tail cache writes them first, and each goes to the segment it belongs to."""
    monkeypatch.setattr(wal_module, "TAIL_CACHE_ENTRIES", 8)
    w = open_wal(tmp_path, durable=False)
    w.write_behind = 1 << 20  # never written out for size: only by rolls, reads and close
    written = ents(1, 100, 1)
    for i in range(0, 100, 7):
        w.append(written[i : i + 7])
    assert w.segment_count() > 3
    assert w.entries(1, 101) == written, "read from the files, after writing what is held"
    w.append(ents(101, 110, 1))
    assert w.entries(95, 111) == written[94:] + ents(101, 110, 1)
    w.append(ents(111, 120, 1))
    w.append(ents(115, 118, 2))  # overlaps records still held: written before the cut
    now = written + ents(101, 114, 1) + ents(115, 118, 2)
    assert w.entries(1, 119) == now
    w.close()
    w2 = open_wal(tmp_path, durable=False)
    assert w2.recovery == [] and w2.entries(1, 119) == now


def test_a_reset_drops_what_write_behind_holds_for_the_log_it_replaces(tmp_path):
    w = open_wal(tmp_path, durable=False)
    w.write_behind = 1 << 20
    w.append(ents(1, 8, 1))  # held, never written to the old segment's file
    w.reset(50, 2)
    w.append(ents(51, 54, 2))
    assert w.entries(51, 55) == ents(51, 54, 2)
    w.close()
    w2 = open_wal(tmp_path, durable=False)
    assert (w2.recovery, w2.first_index(), w2.entries(51, 55)) == ([], 51, ents(51, 54, 2))


def test_compaction_keeps_the_segment_holding_the_index_asked(tmp_path):
    """Entries below `new_first_index` are covered by a snapshot; the one at it is not."""
    w = open_wal(tmp_path)
    w.append(ents(1, 100, 1))
    edge = w._segments[1].last_index
    assert w.compact(edge) == w._segments[0].first_index - 1
    assert w.first_index() <= edge and w.entries(edge, edge + 1) == ents(edge, edge, 1)
    assert w.compact(edge + 1) > 0 and w.first_index() == edge + 1
