"""The WAL on its own: reads, roll-over, truncation, compaction, and reopening after each."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.storage.helpers import ents, payload

from raftlog.node.core.errors import Compacted, SafetyViolation, Unavailable
from raftlog.node.core.types import Entry, EntryKind, Membership
from raftlog.node.storage import wal as wal_module
from raftlog.node.storage.recovery import list_segments
from raftlog.node.storage.wal import Wal


def open_wal(path, **kw) -> Wal:
    kw.setdefault("segment_bytes", 1024)
    return Wal.open(str(path), **kw)


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
    w = open_wal(tmp_path)
    w.append(ents(1, 50, 1))
    w.sync()
    w.close()
    saved = {n: (tmp_path / n).read_bytes() for _, n in list_segments(str(tmp_path))}
    w = open_wal(tmp_path)
    w.reset(500, 7)
    w.close()
    for name, raw in saved.items():  # the old segments reappear (crash before the unlinks)
        (tmp_path / name).write_bytes(raw)
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
                assert w.entries(a, hi + 1) == disk.entries(a, hi + 1)
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
