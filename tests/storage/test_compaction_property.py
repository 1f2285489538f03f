"""Compaction never removes an entry above the snapshot index or below a live retention hold."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.storage.helpers import ents

from raftlog.node.core.errors import Compacted, SafetyViolation
from raftlog.node.core.types import HardState, Membership, SnapshotMeta
from raftlog.node.storage.durable import DurableStorage

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 60)),
        st.tuples(st.just("snapshot"), st.integers(0, 100)),
        st.tuples(st.just("compact"), st.integers(0, 400)),
        st.tuples(st.just("hold"), st.integers(1, 400)),
        st.tuples(st.just("release"), st.integers(0, 2)),
        st.tuples(st.just("time"), st.integers(1, 20)),
        st.tuples(st.just("reopen"), st.just(0)),
    ),
    max_size=50,
)


@settings(max_examples=80, deadline=None)
@given(ops=OPS)
def test_compaction_respects_snapshot_and_live_holds(tmp_path_factory, ops):
    path = str(tmp_path_factory.mktemp("part"))
    now = [0.0]

    def open_() -> DurableStorage:
        return DurableStorage(
            path, bootstrap=Membership.of(["a"]), segment_bytes=700, clock=lambda: now[0]
        )

    s = open_()
    holders = ["spark", "tail", "audit"]
    for op, arg in ops:
        last = s.last_index()
        if op == "append":
            s.save(HardState(1, "a", last + arg), ents(last + 1, last + arg, 1))
        elif op == "snapshot":
            index = s.initial_state()[0].commit * arg // 100
            if index > s.snapshot_meta().index:
                s.create_snapshot(SnapshotMeta(index, s.term(index), Membership.of(["a"])), b"")
        elif op == "compact":
            snap = s.snapshot_meta().index
            if arg - 1 > snap:
                floor_before = s.compaction_floor()
                with pytest.raises(SafetyViolation, match="pass the snapshot"):
                    s.compact(arg)
                assert s.compaction_floor() == floor_before, "a refused compaction removed entries"
            else:
                s.compact(arg)
        elif op == "hold":
            try:
                s.set_hold(holders[arg % 3], arg, ttl_seconds=10)
            except Compacted:
                assert arg < s.first_index(), "a hold above the floor was refused"
        elif op == "release":
            s.holds.release(holders[arg])
        elif op == "time":
            now[0] += arg
        else:
            s.close()
            s = open_()
        first = s.first_index()
        assert first - 1 <= s.snapshot_meta().index, "an entry above the snapshot was removed"
        for h in s.holds.live():
            assert first <= h.min_index, f"live hold {h} passed by the floor {first}"
        if s.last_index() >= first:
            assert s.entries(first, s.last_index() + 1) == ents(first, s.last_index(), 1)
    s.close()
