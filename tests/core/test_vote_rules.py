"""The rules of votes and quorums, one core at a time: one vote per term, kept through
step-downs, a new vote in a new term, and majorities (not halves) for elections and commits."""

from __future__ import annotations

from typing import TypeVar

from raftlog.node.core.messages import (
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    PreVoteRequest,
    PreVoteResponse,
    VoteRequest,
    VoteResponse,
)
from raftlog.node.core.raft import Raft, Ready, Role
from raftlog.node.storage.memory import MemoryStorage
from tests.core.helpers import CFG, drain, storage_with

FOUR = ("a", "b", "c", "d")
M = TypeVar("M")


def sent(rd: Ready, kind: type[M]) -> list[M]:
    return [m for m in rd.messages if isinstance(m, kind)]


def role(r: Raft) -> Role:
    return r.role  # read through a call: each step may change it (no narrowing across steps)


def vote_reply(raft: Raft, storage: MemoryStorage, req: VoteRequest) -> bool:
    raft.step(req)
    replies = sent(drain(raft, storage), VoteResponse)
    assert len(replies) == 1
    return replies[0].granted


def voter_that_voted_for_a(term: int = 2) -> tuple[Raft, MemoryStorage]:
    s = storage_with([(1, 1)], term=1)
    b = Raft("b", CFG, s)
    assert vote_reply(b, s, VoteRequest("a", "b", term, 1, 1))
    assert b.term == term and s.hard_state.vote == "a"
    return b, s


def test_one_vote_per_term_while_no_leader_is_known() -> None:
    b, s = voter_that_voted_for_a()
    assert not vote_reply(b, s, VoteRequest("c", "b", 2, 5, 1))  # c's log is even longer
    assert vote_reply(b, s, VoteRequest("a", "b", 2, 1, 1))  # the same candidate again: yes
    assert s.hard_state.vote == "a"


def test_a_vote_cast_in_a_term_already_reached_is_written_before_the_answer() -> None:
    """Term 2 reached by a candidate refused for its short log, then a vote in term 2: only
    the vote changed, and it must reach storage in the Ready that sends the grant (else a
    restart forgets it and the node may vote again in term 2)."""
    s = storage_with([(1, 1)], term=1)
    b = Raft("b", CFG, s)
    assert not vote_reply(b, s, VoteRequest("c", "b", 2, 0, 0))
    assert b.term == 2 and s.hard_state.vote is None
    b.step(VoteRequest("a", "b", 2, 1, 1))
    rd = b.ready()
    assert sent(rd, VoteResponse)[0].granted
    assert rd.hard_state is not None and (rd.hard_state.term, rd.hard_state.vote) == (2, "a")


def test_a_term_learned_without_a_vote_is_written_before_the_answer() -> None:
    """A leader of term 3 heard by a node that never voted: only the term changed (the vote
    stays None), and the answer claiming term 3 must not go out before it is stored."""
    s = storage_with([(1, 1)], term=1)
    b = Raft("b", CFG, s)
    b.step(HeartbeatRequest("a", "b", 3, 0))
    rd = b.ready()
    assert rd.messages and rd.hard_state is not None
    assert (rd.hard_state.term, rd.hard_state.vote) == (3, None)


def test_a_lost_pre_vote_keeps_the_vote_of_the_term() -> None:
    """Back to follower in the same term after a lost pre-vote: the vote cast stays cast."""
    b, s = voter_that_voted_for_a()
    b.hup()
    pre = sent(drain(b, s), PreVoteRequest)
    assert role(b) == Role.PRE_CANDIDATE and {m.dst for m in pre} == {"a", "c"}
    for peer in ("a", "c"):
        b.step(PreVoteResponse(peer, "b", 2, False))
    drain(b, s)
    assert role(b) == Role.FOLLOWER and b.term == 2
    assert not vote_reply(b, s, VoteRequest("c", "b", 2, 5, 1)), "voted twice in term 2"
    assert s.hard_state.vote == "a"


def test_hearing_the_terms_leader_keeps_the_vote() -> None:
    """A pre-candidate that hears this term's leader steps down in the same term; its vote
    stays cast once it has lost track of the leader again."""
    b, s = voter_that_voted_for_a()
    b.hup()
    drain(b, s)
    b.step(HeartbeatRequest("a", "b", 2, 0))
    drain(b, s)
    assert role(b) == Role.FOLLOWER and b.leader == "a"
    b.hup()  # the leader went quiet: a pre-vote forgets the leader
    drain(b, s)
    for peer in ("a", "c"):
        b.step(PreVoteResponse(peer, "b", 2, False))
    drain(b, s)
    assert b.leader is None and b.term == 2
    assert not vote_reply(b, s, VoteRequest("c", "b", 2, 5, 1)), "voted twice in term 2"


def test_a_new_term_brings_a_new_vote() -> None:
    b, s = voter_that_voted_for_a(term=2)
    assert vote_reply(b, s, VoteRequest("c", "b", 3, 1, 1))
    assert (b.term, s.hard_state.vote) == (3, "c")


def test_the_candidate_with_the_older_last_term_loses_even_with_a_longer_log() -> None:
    s = storage_with([(1, 1), (2, 3)], term=3)
    b = Raft("b", CFG, s)
    assert not vote_reply(b, s, VoteRequest("a", "b", 4, 9, 2))
    assert vote_reply(b, s, VoteRequest("c", "b", 5, 2, 3))


def campaign(voters: tuple[str, ...]) -> tuple[Raft, MemoryStorage]:
    s = storage_with([(1, 1)], voters=voters, term=1)
    r = Raft("a", CFG, s)
    r.hup()
    drain(r, s)
    return r, s


def test_four_voters_need_three_pre_votes_and_three_votes() -> None:
    r, s = campaign(FOUR)
    r.step(PreVoteResponse("b", "a", 2, True))
    drain(r, s)
    assert role(r) == Role.PRE_CANDIDATE, "2 of 4 pre-votes is not a majority"
    r.step(PreVoteResponse("c", "a", 2, True))
    drain(r, s)
    assert role(r) == Role.CANDIDATE and r.term == 2
    r.step(VoteResponse("b", "a", 2, True))
    drain(r, s)
    assert role(r) == Role.CANDIDATE, "2 of 4 votes is not a majority"
    r.step(VoteResponse("c", "a", 2, True))
    drain(r, s)
    assert role(r) == Role.LEADER


def leader_of(voters: tuple[str, ...]) -> tuple[Raft, MemoryStorage]:
    r, s = campaign(voters)
    for v in voters[1:]:
        r.step(PreVoteResponse(v, "a", 2, True))
        drain(r, s)
    for v in voters[1:]:
        r.step(VoteResponse(v, "a", 2, True))
        drain(r, s)
    assert role(r) == Role.LEADER and r.term == 2
    return r, s


def test_four_voters_commit_on_three_copies_not_two() -> None:
    r, s = leader_of(FOUR)
    noop = r.log.last_index()
    r.step(AppendResponse("b", "a", 2, True, noop))
    drain(r, s)
    assert r.commit < noop, "committed on 2 of 4 copies"
    r.step(AppendResponse("c", "a", 2, True, noop))
    drain(r, s)
    assert r.commit == noop


def test_heartbeats_carry_no_commit_above_what_the_follower_matched() -> None:
    r, s = leader_of(("a", "b", "c"))
    noop = r.log.last_index()
    r.step(AppendResponse("b", "a", 2, True, noop))
    drain(r, s)
    assert r.commit == noop
    beats: dict[str, list[int]] = {}
    for _ in range(2 * CFG.heartbeat_ticks):  # b answered appends: its first beat may be skipped
        r.tick()
        for m in sent(drain(r, s), HeartbeatRequest):
            beats.setdefault(m.dst, []).append(m.commit)
    assert beats["b"] == [noop]
    assert beats["c"] and set(beats["c"]) == {0}, "told c a commit it may not hold"


def test_a_follower_never_commits_past_what_this_leader_matched() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 1)], term=1)
    b = Raft("b", CFG, s)
    b.step(AppendRequest("a", "b", 2, 1, 1, (), 0))  # matched only index 1 in term 2
    drain(b, s)
    b.step(HeartbeatRequest("a", "b", 2, 3))
    drain(b, s)
    assert b.commit == 1, "entries 2 and 3 may be a divergent tail of an older term"


def test_an_answer_claiming_more_than_the_leader_holds_is_refused_and_counts_nothing() -> None:
    """A success whose index is past the leader's last entry (a forged or confused follower):
    refused and reported; it neither counts toward a quorum nor stops the partition, and the
    follower's true answer counts after it."""
    r, s = leader_of(FOUR)
    noop = r.log.last_index()
    r.step(AppendResponse("b", "a", 2, True, noop))
    r.step(AppendResponse("c", "a", 2, True, noop + 5))
    rd = drain(r, s)
    assert r.commit < noop, "committed on a copy that does not exist"
    assert r.progress["c"].match == 0 and r.rejected["answer beyond the leader's log"] == 1
    reasons = [e.detail["reason"] for e in rd.events if e.kind == "message_rejected"]
    assert reasons == [f"index: {noop + 5} is beyond this leader's last index {noop}"]
    r.step(AppendResponse("c", "a", 2, True, noop))
    drain(r, s)
    assert r.progress["c"].match == noop and r.commit == noop


def test_no_vote_for_another_while_this_terms_leader_is_known() -> None:
    """A follower that heard term 2's leader and voted for nobody in term 2 (it learned the
    term from the leader's append) must not vote in term 2: a second leader of the term could
    be elected with it."""
    five = ("a", "b", "c", "d", "e")
    s = storage_with([(1, 1)], voters=five, term=1)
    b = Raft("b", CFG, s)
    b.step(AppendRequest("a", "b", 2, 1, 1, (), 1))
    drain(b, s)
    assert b.leader == "a" and s.hard_state.vote is None
    assert not vote_reply(b, s, VoteRequest("c", "b", 2, 5, 2))
