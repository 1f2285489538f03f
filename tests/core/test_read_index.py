"""ReadIndex: a read point confirmed by a quorum of voters, never by a deposed leader."""

from __future__ import annotations

import pytest

from raftlog.node.core.errors import NotLeader
from raftlog.node.core.messages import AppendResponse, HeartbeatRequest, HeartbeatResponse
from raftlog.node.core.raft import Raft
from raftlog.node.core.types import ReadState
from raftlog.node.storage.memory import MemoryStorage
from tests.core.helpers import CFG, drain, sent, storage_with
from tests.core.test_raft_core import elect


def leader_with_commit() -> tuple[Raft, MemoryStorage]:
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    r.step(AppendResponse("b", "a", r.term, True, 2))
    drain(r, s)  # the no-op of this term is committed
    assert r.commit == 2
    return r, s


def reads(raft: Raft, storage: MemoryStorage) -> list[ReadState]:
    out = []
    while raft.has_ready():
        rd = raft.ready()
        storage.save(rd.hard_state, rd.entries)
        out.extend(rd.read_states)
        raft.advance(rd)
    return out


def test_read_index_waits_for_a_quorum_of_heartbeat_answers():
    r, s = leader_with_commit()
    r.read_index(7)
    rd = drain(r, s)
    beats = [
        m for m in sent(rd, HeartbeatRequest) if isinstance(m, HeartbeatRequest) and m.ctx == 7
    ]
    assert {m.dst for m in beats} == {"b", "c"}
    assert reads(r, s) == []
    r.step(HeartbeatResponse("c", "a", r.term, ctx=6))  # an older round does not confirm 7
    assert reads(r, s) == []
    r.step(HeartbeatResponse("c", "a", r.term, ctx=7))
    assert reads(r, s) == [ReadState(7, 2)]


def test_a_later_confirmation_confirms_earlier_requests():
    r, s = leader_with_commit()
    r.read_index(1)
    r.read_index(2)
    drain(r, s)
    r.step(HeartbeatResponse("b", "a", r.term, ctx=2))
    assert reads(r, s) == [ReadState(1, 2), ReadState(2, 2)]


def test_a_leader_that_lost_its_quorum_never_answers():
    r, s = leader_with_commit()
    r.read_index(3)
    drain(r, s)
    r.step(HeartbeatRequest("b", "a", r.term + 1, 0))  # a newer leader exists
    assert r.role != "leader"
    r.step(HeartbeatResponse("c", "a", r.term, ctx=3))
    assert reads(r, s) == []
    assert r.pending_reads() == 0
    with pytest.raises(NotLeader):
        r.read_index(4)


def test_a_new_leader_waits_for_its_first_commit():
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)  # the no-op at index 2 is not committed yet
    r.read_index(5)
    drain(r, s)
    r.step(HeartbeatResponse("b", "a", r.term, ctx=5))
    assert reads(r, s) == [], "the commit index of an earlier term is not a safe read point"
    r.step(AppendResponse("b", "a", r.term, True, 2))
    drain(r, s)
    r.step(HeartbeatResponse("b", "a", r.term, ctx=5))
    assert reads(r, s) == [ReadState(5, 2)]


def test_single_voter_answers_at_once():
    s = storage_with([], voters=("a",))
    r = Raft("a", CFG, s)
    r.hup()
    drain(r, s)
    drain(r, s)
    assert r.role == "leader" and r.commit >= 1
    r.read_index(9)
    assert reads(r, s) == [ReadState(9, r.commit)]


@pytest.mark.parametrize("voters", [("a", "b", "c"), ("a", "b")])
def test_a_leader_that_removed_itself_counts_only_the_voters_acks(voters):
    """Found by a review: a leader whose removal is appended (not committed) counted its own
    ack, so with voters {b, c} left b's answer alone confirmed a read that c, having elected
    itself with b's later vote and committed a write, had passed; with {b} left it answered
    at once."""
    s = storage_with([(1, 1)], term=1, voters=voters)
    r = Raft("a", CFG, s)
    elect(r, s)
    for v in voters[1:]:
        r.step(AppendResponse(v, "a", r.term, True, 2))
    drain(r, s)
    r.propose_membership("remove", "a")
    drain(r, s)
    assert "a" not in r.membership.voters and r.role == "leader"
    rest = [v for v in voters if v != "a"]
    r.read_index(4)
    assert reads(r, s) == [], "no answer without a voter's ack"
    drain(r, s)
    r.step(HeartbeatResponse(rest[0], "a", r.term, ctx=4))
    confirmed = reads(r, s)
    if len(rest) == 1:
        assert confirmed == [ReadState(4, r.commit)], "the one voter left confirms it"
        return
    assert confirmed == [], "one of three voters is no majority"
    r.step(HeartbeatResponse(rest[1], "a", r.term, ctx=4))
    assert reads(r, s) == [ReadState(4, r.commit)]


def test_a_learners_answer_does_not_confirm_a_read():
    r, s = leader_with_commit()
    index, _ = r.propose_membership("add_learner", "d")
    r.step(AppendResponse("b", "a", r.term, True, index))
    drain(r, s)
    r.read_index(7)
    drain(r, s)
    r.step(HeartbeatResponse("d", "a", r.term, ctx=7))
    assert reads(r, s) == [], "a learner is no part of the quorum"
    r.step(HeartbeatResponse("c", "a", r.term, ctx=7))
    assert [q.request_id for q in reads(r, s)] == [7]
