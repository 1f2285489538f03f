"""Anchored appends at the follower: log matching, divergent tails, the snapshot boundary."""

from __future__ import annotations

import pytest

from raftlog.node.core.errors import SafetyViolation
from raftlog.node.core.messages import AppendRequest, AppendResponse
from raftlog.node.core.raft import Raft
from raftlog.node.core.types import Entry, HardState, Membership, SnapshotMeta
from raftlog.node.storage.memory import MemoryStorage
from tests.core.helpers import CFG, drain, sent, storage_with


def ents(*pairs: tuple[int, int]) -> tuple[Entry, ...]:
    return tuple(Entry(i, t, data=b"%d/%d" % (i, t)) for i, t in pairs)


def append(
    raft: Raft,
    storage: MemoryStorage,
    prev: tuple[int, int],
    entries: tuple[Entry, ...],
    commit: int = 0,
    term: int = 5,
) -> AppendResponse:
    raft.step(AppendRequest("a", raft.id, term, prev[0], prev[1], entries, commit))
    replies = sent(drain(raft, storage), AppendResponse)
    assert len(replies) == 1
    reply = replies[0]
    assert isinstance(reply, AppendResponse)
    return reply


def follower_after_snapshot(
    index: int, term: int, tail: list[tuple[int, int]]
) -> tuple[Raft, MemoryStorage]:
    s = MemoryStorage(Membership.of(["a", "b", "c"]))
    s.install_snapshot(SnapshotMeta(index, term, Membership.of(["a", "b", "c"])), b"")
    s.save(HardState(term=term, commit=index), list(ents(*tail)))
    return Raft("b", CFG, s), s


class TestSnapshotBoundary:
    """002_f5bff6f8b22299fd: prev-log checks at the snapshot index use the snapshot's term."""

    def test_prev_at_snapshot_index_with_snapshot_term_is_accepted(self) -> None:
        raft, s = follower_after_snapshot(100, 3, [])
        reply = append(raft, s, (100, 3), ents((101, 5), (102, 5)), commit=102)
        assert reply.success and reply.index == 102
        assert s.last_index() == 102 and raft.commit == 102

    def test_prev_at_snapshot_index_with_wrong_term_is_rejected(self) -> None:
        raft, s = follower_after_snapshot(100, 3, [])
        reply = append(raft, s, (100, 4), ents((101, 5)))
        assert not reply.success and reply.index == 100
        assert s.last_index() == 100

    def test_prev_below_snapshot_counts_as_a_match_and_covered_entries_are_skipped(self) -> None:
        raft, s = follower_after_snapshot(100, 3, [])
        reply = append(raft, s, (98, 3), ents((99, 3), (100, 3), (101, 5)), commit=101)
        assert reply.success and reply.index == 101
        assert [e.index for e in s.entries(101, 102)] == [101]

    def test_boundary_after_compaction_with_trailing_entries(self) -> None:
        s = storage_with([(i, 2) for i in range(1, 21)], commit=20)
        s.create_snapshot(SnapshotMeta(20, 2, Membership.of(["a", "b", "c"])), b"")
        s.compact(16)  # entries 16..20 kept; 15 is the boundary, known by its term
        raft = Raft("b", CFG, s)
        assert append(raft, s, (15, 2), ents((16, 2))).success
        assert not append(raft, s, (15, 1), ents((16, 2))).success
        assert append(raft, s, (3, 2), ()).success


def test_mismatch_hint_points_at_the_last_entry_that_can_match() -> None:
    # Follower has 1..3 of term 1 and a divergent 4..6 of term 2; leader's prev is (8, 4).
    s = storage_with([(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)])
    raft = Raft("b", CFG, s)
    reply = append(raft, s, (8, 4), ents((9, 4)))
    assert not reply.success and reply.index == 8
    assert (reply.hint_index, reply.hint_term) == (6, 2)
    reply = append(raft, s, (5, 3), ents((6, 3)))
    assert (reply.hint_index, reply.hint_term) == (5, 2)
    reply = append(raft, s, (5, 1), ents((6, 3)))
    assert (reply.hint_index, reply.hint_term) == (3, 1)


def test_divergent_uncommitted_tail_is_truncated_and_replaced() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 1), (4, 2)], commit=3)
    raft = Raft("b", CFG, s)
    reply = append(raft, s, (3, 1), ents((4, 3), (5, 3)), commit=5)
    assert reply.success
    assert [(e.index, e.term) for e in s.entries(1, 6)] == [(1, 1), (2, 1), (3, 1), (4, 3), (5, 3)]


def test_matching_entries_do_not_truncate_a_longer_log() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 1), (4, 1)])
    raft = Raft("b", CFG, s)
    reply = append(raft, s, (1, 1), ents((2, 1)), commit=4, term=1)
    assert reply.success and reply.index == 2
    assert s.last_index() == 4
    # The high-water mark never passes the last entry known to match the leader (2), even
    # though the leader's is 4 and the follower holds 4 entries.
    assert raft.commit == 2


def test_truncating_a_committed_entry_is_a_fatal_error() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 1)], commit=3)
    raft = Raft("b", CFG, s)
    with pytest.raises(SafetyViolation, match="committed"):
        raft.step(AppendRequest("a", "b", 5, 1, 1, ents((2, 4), (3, 4)), 3))


def test_storage_refuses_to_overwrite_durable_committed_entries() -> None:
    s = storage_with([(1, 1), (2, 1)], commit=2)
    with pytest.raises(SafetyViolation, match="committed"):
        s.save(None, list(ents((2, 3))))
