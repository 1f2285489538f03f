"""Single-core behaviour, table style: a message or a call in, a Ready out."""

from __future__ import annotations

import pytest

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import InvalidMessage, MembershipError, NotLeader, ProposalRefused
from raftlog.node.core.messages import (
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InstallSnapshot,
    PreVoteRequest,
    PreVoteResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from raftlog.node.core.partition_host import PartitionHost
from raftlog.node.core.progress import ProgressState
from raftlog.node.core.raft import Raft, Ready, Role
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from raftlog.node.storage.memory import MemoryStorage
from tests.core.helpers import CFG, drain, sent, storage_with


def elect(raft: Raft, storage: MemoryStorage) -> None:
    """Make `raft` leader of a 3-voter group by answering its pre-vote and vote."""
    raft.hup()
    drain(raft, storage)
    raft.step(PreVoteResponse("b", raft.id, raft.term + 1, True))
    drain(raft, storage)
    raft.step(VoteResponse("b", raft.id, raft.term, True))
    drain(raft, storage)
    assert raft.role == Role.LEADER


def test_single_voter_elects_itself_and_commits_after_persisting() -> None:
    s = MemoryStorage(Membership.of(["a"]))
    r = Raft("a", CFG, s)
    for _ in range(2 * CFG.election_ticks):
        r.tick()
    rd = drain(r, s)
    assert r.role == Role.LEADER and r.term == 1
    index, term = r.propose(b"x")
    rd = drain(r, s)
    assert [(e.index, e.term, e.data) for e in rd.committed if e.kind == EntryKind.NORMAL] == [
        (index, term, b"x")
    ]
    assert s.hard_state.commit == index  # durable before it was handed out for apply


def test_pre_vote_does_not_raise_anyones_term() -> None:
    s = storage_with([(1, 1)])
    r = Raft("a", CFG, s)
    r.hup()
    rd = drain(r, s)
    assert r.role == Role.PRE_CANDIDATE and r.term == 1
    reqs = sent(rd, PreVoteRequest)
    assert {m.dst for m in reqs} == {"b", "c"} and all(m.term == 2 for m in reqs)
    # A voter answering a pre-vote keeps its own term too.
    s2 = storage_with([(1, 1)])
    voter = Raft("b", CFG, s2)
    voter.step(reqs[0])
    rd2 = drain(voter, s2)
    assert voter.term == 1 and sent(rd2, PreVoteResponse)[0].granted  # type: ignore[union-attr]


def test_answers_from_names_that_are_not_voters_are_kept_nowhere_and_count_for_nothing() -> None:
    """A campaign kept every answer's sender: a peer could send answers under a million names of
    its own and the partition held each until its next campaign."""
    s = storage_with([(1, 1)])
    r = Raft("a", CFG, s)
    r.hup()
    drain(r, s)
    for i in range(1000):
        r.step(PreVoteResponse(f"x{i}", r.id, r.term + 1, True))
    roles = [r.role]
    assert set(r._votes) <= {"a", "b", "c"}
    r.step(PreVoteResponse("b", r.id, r.term + 1, True))
    drain(r, s)
    roles.append(r.role)
    for i in range(1000):
        r.step(VoteResponse(f"x{i}", r.id, r.term, True))
    roles.append(r.role)
    assert set(r._votes) <= {"a", "b", "c"}
    r.step(VoteResponse("c", r.id, r.term, True))
    roles.append(r.role)
    assert roles == [Role.PRE_CANDIDATE, Role.CANDIDATE, Role.CANDIDATE, Role.LEADER]


def test_vote_is_persisted_before_the_vote_is_sent() -> None:
    s = storage_with([(1, 1)])
    r = Raft("b", CFG, s)
    r.step(VoteRequest("a", "b", 2, 1, 1))
    rd = r.ready()
    assert rd.hard_state is not None and rd.hard_state.vote == "a" and rd.hard_state.term == 2
    assert sent(rd, VoteResponse)[0].granted  # type: ignore[union-attr]
    r.advance(rd)


def test_leader_lease_ignores_votes_while_a_leader_is_heard_from() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", CFG, s)
    r.step(HeartbeatRequest("a", "b", 1, 0))
    drain(r, s)
    r.step(VoteRequest("c", "b", 5, 9, 1))
    rd = drain(r, s)
    assert r.term == 1 and not sent(rd, VoteResponse)
    # A leadership transfer is allowed through the lease.
    r.step(VoteRequest("c", "b", 5, 9, 1, transfer=True))
    rd = drain(r, s)
    assert r.term == 5 and sent(rd, VoteResponse)[0].granted  # type: ignore[union-attr]


def test_check_quorum_makes_an_isolated_leader_step_down() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    for _ in range(2 * CFG.election_ticks):
        r.tick()
    rd = drain(r, s)
    assert r.role == Role.FOLLOWER
    assert any(e.kind == "stepped_down" for e in rd.events)


def test_stale_term_messages_are_answered_with_the_current_term_and_ignored() -> None:
    s = storage_with([(1, 1)], term=3)
    r = Raft("b", CFG, s)
    r.step(AppendRequest("a", "b", 2, 1, 1, (Entry(2, 2),), 2))
    rd = drain(r, s)
    reply = sent(rd, AppendResponse)[0]
    assert reply.term == 3 and not reply.success  # type: ignore[union-attr]
    assert s.last_index() == 1 and r.rejected["stale term"] == 1


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (AppendRequest("a", "b", 3, 1, 1, (Entry(3, 3),), 0), "entries[0].index"),
        (AppendRequest("a", "b", 3, 1, 1, (Entry(2, 4),), 0), "entries[0].term"),
        (AppendRequest("a", "b", 3, -1, 0, (), 0), "prev_index"),
        (AppendRequest("a", "b", 3, 1, 5, (), 0), "prev_term"),
        (AppendRequest("a", "x", 3, 1, 1, (), 0), "dst"),
        (
            AppendRequest("a", "b", 3, 1, 1, (Entry(2, 3, EntryKind.CONFIG, b"{"),), 0),
            "entries[0].data",
        ),
        (AppendRequest("a", "b", 3, 1, 1, [Entry(2, 3)], 0), "entries"),  # type: ignore[arg-type]
        (VoteRequest("a", "b", 3, 1, 7), "last_term"),
        ("not a message", "type"),
        (AppendRequest("", "b", 3, 1, 1, (), 0), "src"),
        (AppendRequest("b", "b", 3, 1, 1, (), 0), "src"),  # from itself
        (AppendRequest("a", "b", 3, 1, 1, (Entry(2, 3), Entry(3, 2)), 0), "entries[1].term"),
        (InstallSnapshot("a", "b", 3, SnapshotMeta(5, 2, Membership())), "meta.membership"),
        (VoteRequest("a", "b", True, 0, 0), "term"),  # a bool is not a term
        (HeartbeatRequest("a", "b", 3, 0, 0, quiesce=1), "quiesce"),  # type: ignore[arg-type]
        (AppendResponse("a", "b", 3, False, 1, hint_index=-1), "hint_index"),
        # Each field of the answer that the plain-int test checks at once.
        (AppendResponse("a", "b", -1, True, 1), "term"),
        (AppendResponse("a", "b", 3, True, -1), "index"),
        (AppendResponse("a", "b", 3, True, True), "index"),  # a bool is not an index
        (AppendResponse("a", "b", 3, True, 1, commit=-2), "commit"),
        (AppendResponse("a", "b", 3, False, 1, hint_term=-1), "hint_term"),
        (AppendResponse("a", "b", 3, True, 1.0), "index"),  # type: ignore[arg-type]
        (AppendResponse("a", "b", 3.0, True, 1), "term"),  # type: ignore[arg-type]
        (AppendResponse("a", "b", 3, True, 1, commit=1.5), "commit"),  # type: ignore[arg-type]
        (AppendResponse("a", "b", 3, False, 1, hint_index=0.5), "hint_index"),  # type: ignore[arg-type]
        (AppendResponse("a", "b", 3, False, 1, hint_term=0.5), "hint_term"),  # type: ignore[arg-type]
        # Each test of the per-entry check, in an append of ordinary entries.
        (AppendRequest("a", "b", 3, 1, 1, (Entry(2, 3), Entry(4, 3)), 0), "entries[1].index"),
        (AppendRequest("a", "b", 3, 1, 1, (Entry(2, 3, data="s"),), 0), "entries[0].data"),  # type: ignore[arg-type]
        (AppendRequest("a", "b", 3, 1, 1, (Entry(2, 3, kind=7),), 0), "entries[0].kind"),  # type: ignore[arg-type]
        (AppendRequest("a", "b", 3, 1, 1, (Entry(2, 3), (3, 3)), 0), "entries[1]"),  # type: ignore[arg-type]
        (AppendRequest("a", "b", 3, 1, 1, (Entry(2, 0),), 0), "entries[0].term"),  # below prev
        # Past any term or index a cluster reaches (a term of 2**64 - 1 could never be raised).
        (HeartbeatRequest("a", "b", 2**64 - 1, 0), "term"),
        (VoteRequest("a", "b", 2**62 + 1, 0, 0), "term"),
        (AppendResponse("a", "b", 2**63, False, 1), "term"),
        (AppendResponse("a", "b", 3, True, 2**62 + 1), "index"),
        (
            InstallSnapshot("a", "b", 3, SnapshotMeta(2**63, 2, Membership(frozenset({"a"})))),
            "meta.index",
        ),
    ],
)
def test_malformed_messages_are_rejected_with_a_reason_and_change_nothing(
    message: object, field: str
) -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", CFG, s)
    r.step(message)
    rd = drain(r, s)
    assert not rd.messages and s.last_index() == 1 and r.term == 1
    rejected = [e for e in rd.events if e.kind == "message_rejected"]
    assert rejected and rejected[0].detail["reason"].startswith(field)


def test_oversized_append_is_rejected() -> None:
    cfg = RaftConfig(max_message_entries=2)
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", cfg, s)
    r.step(AppendRequest("a", "b", 1, 1, 1, tuple(Entry(i, 1) for i in (2, 3, 4)), 0))
    rd = drain(r, s)
    assert s.last_index() == 1
    assert "max_message_entries=2" in rd.events[0].detail["reason"]


def test_an_append_a_byte_over_its_limit_is_refused() -> None:
    cfg = RaftConfig(max_message_entries=2, max_message_bytes=1024, max_append_bytes=1024)
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", cfg, s)
    over = (Entry(2, 1, data=b"x" * 488), Entry(3, 1, data=b"y" * 489))  # 1,025 bytes
    r.step(AppendRequest("a", "b", 1, 1, 1, over, 0))
    rd = drain(r, s)
    assert s.last_index() == 1
    assert "1025 bytes exceed max_message_bytes=1024" in rd.events[0].detail["reason"]


def test_an_append_with_a_noop_and_a_membership_is_taken() -> None:
    """Entries other than records are checked one by one (a membership decoded) and taken."""
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", CFG, s)
    config = Membership(frozenset({"a", "b", "c"})).encode()
    entries = (Entry(2, 2, EntryKind.NOOP), Entry(3, 2, EntryKind.CONFIG, config), Entry(4, 2))
    r.step(AppendRequest("a", "b", 2, 1, 1, entries, 0))
    drain(r, s)
    assert s.last_index() == 4 and r.membership.voters == {"a", "b", "c"}


def test_an_append_exactly_at_its_limits_is_taken() -> None:
    """As many entries as `max_message_entries`, as many bytes as `max_message_bytes` (an
    entry's size is its data and 24 bytes): both limits are inclusive."""
    cfg = RaftConfig(max_message_entries=2, max_message_bytes=1024, max_append_bytes=1024)
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", cfg, s)
    full = (Entry(2, 1, data=b"x" * 488), Entry(3, 1, data=b"y" * 488))  # 2 x 512 bytes
    r.step(AppendRequest("a", "b", 1, 1, 1, full, 0))
    rd = drain(r, s)
    assert s.last_index() == 3, [e.detail for e in rd.events]


def test_follower_learns_the_high_water_mark_but_never_above_its_matching_entries() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", CFG, s)
    r.step(HeartbeatRequest("a", "b", 2, 1))
    drain(r, s)
    assert r.commit == 0  # nothing is known to match the leader of term 2 yet
    r.step(AppendRequest("a", "b", 2, 1, 1, (Entry(2, 2),), 5))
    drain(r, s)
    assert r.commit == 2
    assert r.read_committed(1, 100) == s.entries(1, 3)


def test_a_leader_counts_only_its_own_entries_already_written() -> None:
    """A follower's answer can come before the leader's own write of the entry is done (its
    driver writes while the network goes on): the leader's vote for the entry is its stable
    index, not its last one, or one follower and an unwritten entry make a majority of 3."""
    s = storage_with([], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    r.step(AppendResponse("b", "a", r.term, True, 1))
    drain(r, s)
    assert r.commit == 1
    index, _ = r.propose(b"x")
    r.step(AppendResponse("b", "a", r.term, True, index))
    assert r.commit == 1, "committed on b alone"
    drain(r, s)
    assert r.commit == index


def test_a_follower_reads_only_up_to_its_high_water_mark() -> None:
    s = storage_with([(1, 1), (2, 1), (3, 1)], term=1, commit=1)
    r = Raft("b", CFG, s)
    assert [e.index for e in r.read_committed(1, 10)] == [1]


def test_a_learner_told_to_campaign_does_not() -> None:
    s = storage_with([(1, 1)], voters=("a", "b", "c"), term=1)
    s.save(s.hard_state, [])
    r = Raft("d", CFG, s)  # not among the voters: a learner
    r.step(TimeoutNow("a", "d", 1))
    drain(r, s)
    assert r.term == 1 and r.role == Role.FOLLOWER


def test_leader_commits_only_entries_of_its_own_term_by_counting() -> None:
    s = storage_with([(1, 1), (2, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)  # term 2, no-op at index 3
    r.step(AppendResponse("b", "a", r.term, True, 2))
    drain(r, s)
    assert r.commit == 0  # index 2 is on a majority but of term 1: not committed by counting
    assert r.follower_lag("b") == 0  # ahead of the commit is not a negative lag
    r.step(AppendResponse("b", "a", r.term, True, 3))
    drain(r, s)
    assert r.commit == 3


def appends(rd: Ready) -> list[tuple[str, int, int]]:
    """(destination, commit, number of entries) of each AppendRequest sent."""
    return sorted(
        (m.dst, m.commit, len(m.entries)) for m in rd.messages if isinstance(m, AppendRequest)
    )


def test_a_commit_is_told_by_the_next_append_or_by_tell_commit_never_by_itself() -> None:
    s = storage_with([], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)  # term 2, no-op at index 1
    for f in ("b", "c"):
        r.step(AppendResponse(f, "a", r.term, True, 1))
    rd = drain(r, s)
    assert r.commit == 1
    assert appends(rd) == []  # no commit-only round of its own
    assert r.commit_untold()
    # The next proposal's appends carry the new mark; nothing is left to tell.
    r.propose(b"x")
    assert appends(drain(r, s)) == [("b", 1, 1), ("c", 1, 1)]
    assert not r.commit_untold()
    r.tell_commit()
    assert appends(drain(r, s)) == []
    # b acknowledges index 2: committed, and c (its append in flight) has not heard of it.
    r.step(AppendResponse("b", "a", r.term, True, 2))
    rd = drain(r, s)
    assert r.commit == 2 and appends(rd) == []
    assert r.commit_untold()
    r.tell_commit()
    assert appends(drain(r, s)) == [("b", 2, 0), ("c", 2, 0)]
    assert not r.commit_untold()
    r.tell_commit()  # told once: nothing again
    assert appends(drain(r, s)) == []


def heartbeats(rd: Ready) -> list[tuple[str, int]]:
    """(destination, commit) of each HeartbeatRequest sent."""
    return sorted((m.dst, m.commit) for m in rd.messages if isinstance(m, HeartbeatRequest))


@pytest.mark.parametrize("heartbeat_ticks", [1, 3])
def test_a_leader_tick_tells_an_untold_commit_once(heartbeat_ticks: int) -> None:
    """One message per follower carries the new mark: a heartbeat when one goes to it, else a
    commit-only append; never both, and nothing again on the next tick."""
    cfg = CFG.model_copy(update={"heartbeat_ticks": heartbeat_ticks})
    s = storage_with([], term=1)
    r = Raft("a", cfg, s)
    elect(r, s)
    r.tick()  # a heartbeat round: b and c have not answered anything yet
    drain(r, s)
    for f in ("b", "c"):
        r.step(AppendResponse(f, "a", r.term, True, 1))
    drain(r, s)
    assert r.commit_untold()
    for _ in range(heartbeat_ticks):
        r.tick()
        rd = drain(r, s)
        told = [(d, c) for d, c, _ in appends(rd)] + heartbeats(rd)
        if told:
            break
    assert sorted(told) == [("b", 1), ("c", 1)]
    assert not r.commit_untold()
    r.tick()
    assert appends(drain(r, s)) == []  # told once


def test_heartbeats_skip_followers_that_answer_appends() -> None:
    """A heartbeat goes only to a follower that got no append since the last round, or did
    not answer in that time, or while a read waits for its confirmation."""
    s = storage_with([], term=1)
    r = Raft("a", CFG, s)  # a heartbeat every tick
    elect(r, s)  # the no-op's appends went to b and c
    for f in ("b", "c"):
        r.step(AppendResponse(f, "a", r.term, True, 1))
    drain(r, s)
    r.tick()
    assert heartbeats(drain(r, s)) == []  # both got appends and answered
    r.tick()
    assert heartbeats(drain(r, s)) == [("b", 1), ("c", 1)]  # nothing went to them since
    r.propose(b"x")
    assert appends(drain(r, s)) == [("b", 1, 1), ("c", 1, 1)]
    r.step(AppendResponse("b", "a", r.term, True, 2))  # c does not answer
    drain(r, s)
    r.tick()
    assert heartbeats(drain(r, s)) == [("c", 1)]
    r.propose(b"y")
    drain(r, s)
    r.step(AppendResponse("b", "a", r.term, True, 3))
    r.read_index(7)
    drain(r, s)
    r.tick()
    assert [d for d, _ in heartbeats(drain(r, s))] == ["b", "c"]  # a read waits: both


def test_follower_lag_is_unknown_until_the_follower_answers() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    assert r.follower_lag("c") is None
    r.step(AppendResponse("b", "a", r.term, True, 2))
    drain(r, s)
    r.step(AppendResponse("c", "a", r.term, True, 1))
    drain(r, s)
    assert r.follower_lag("b") == 0 and r.follower_lag("c") == 1
    assert r.follower_lag("zz") is None


def test_log_mismatch_backs_up_in_few_round_trips() -> None:
    s = storage_with([(i, 1) for i in range(1, 51)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    # Follower b has only 1..20 of term 1: the hint sends the leader straight to 21.
    r.step(AppendResponse("b", "a", r.term, False, 50, hint_index=20, hint_term=1))
    rd = drain(r, s)
    retry = [m for m in sent(rd, AppendRequest) if m.dst == "b"]
    assert retry and retry[0].prev_index == 20  # type: ignore[union-attr]


def compacted_leader(cfg: RaftConfig = CFG) -> tuple[Raft, MemoryStorage]:
    """A leader of 100 entries, its log compacted up to 90 behind a snapshot at 100."""
    s = storage_with([(i, 1) for i in range(1, 101)], term=1, commit=100)
    s.create_snapshot(SnapshotMeta(100, 1, Membership.of(["a", "b", "c"])), b"")
    s.compact(91)
    r = Raft("a", cfg, s)
    elect(r, s)
    return r, s


def b_silent(r: Raft, s: MemoryStorage) -> None:
    """Two election timeouts in which c answers the leader's heartbeats and b does not."""
    for _ in range(2 * CFG.election_ticks):
        r.tick()
        r.step(HeartbeatResponse("c", "a", r.term))
        drain(r, s)


def test_follower_below_the_floor_goes_to_snapshot_state() -> None:
    r, s = compacted_leader()
    r.step(AppendResponse("b", "a", r.term, False, 100, hint_index=40, hint_term=1))
    rd = drain(r, s)
    st = r.status().followers["b"]
    assert st.state == ProgressState.SNAPSHOT and st.snapshot_required
    assert [(q.target, q.required_index) for q in rd.snapshot_requests] == [("b", 90)]
    # Not answered: asked again after the back-off, with a bounded number of requests.
    requests = []
    for _ in range(CFG.snapshot_retry_ticks):
        r.tick()
        r.step(HeartbeatResponse("c", "a", r.term))  # c keeps the leader in power
        requests += drain(r, s).snapshot_requests
    assert [q.attempt for q in requests] == [2]
    r.step(AppendResponse("b", "a", r.term, True, 100))
    drain(r, s)
    st = r.status().followers["b"]
    assert not st.snapshot_required and st.state == ProgressState.REPLICATE


def test_compaction_keeps_what_a_follower_a_snapshot_brings_back_needs() -> None:
    """While b needs a snapshot (index 90 and the entries after it), then while it catches up
    from where the snapshot left it, the leader's compaction keeps those entries; they went
    under a steady load, and each install ended in a new SnapshotRequired."""
    r, s = compacted_leader()
    assert r.catch_up_floor() is None  # nobody needs anything kept
    r.step(AppendResponse("b", "a", r.term, False, 100, hint_index=40, hint_term=1))
    drain(r, s)
    assert r.status().followers["b"].snapshot_required
    assert r.catch_up_floor() == 91  # the floor stays: b needs 91 on after the snapshot
    r.propose_batch([b"x%d" % i for i in range(30)])
    r.step(AppendResponse("c", "a", r.term, True, r.log.last_index()))
    drain(r, s)
    assert r.log.committed == r.log.last_index() > 120
    # Installed (at 100): b is behind by more than backfill_threshold, its match point held.
    r.step(AppendResponse("b", "a", r.term, True, 100))
    drain(r, s)
    assert not r.status().followers["b"].snapshot_required
    assert r.catch_up_floor() == 101
    r.step(AppendResponse("b", "a", r.term, True, 110))
    drain(r, s)
    assert r.catch_up_floor() == 111  # the hold follows it
    # Within backfill_threshold: an ordinary follower again, nothing held for it.
    r.step(AppendResponse("b", "a", r.term, True, r.log.committed - CFG.backfill_threshold))
    drain(r, s)
    assert r.catch_up_floor() is None
    r.step(AppendResponse("b", "a", r.term, True, r.log.committed))
    drain(r, s)
    assert r.catch_up_floor() is None


def test_no_follower_holds_more_than_max_entries_per_compaction() -> None:
    """A follower that answers but never installs (its disk full) must not fill the leader's
    disk as well: past `max_entries_per_compaction` entries, compaction goes on."""
    r, s = compacted_leader(CFG.model_copy(update={"max_entries_per_compaction": 40}))
    r.step(AppendResponse("b", "a", r.term, False, 100, hint_index=40, hint_term=1))
    drain(r, s)
    r.propose_batch([b"x%d" % i for i in range(29)])
    drain(r, s)
    assert r.log.last_index() == 130 and r.catch_up_floor() == 91  # 91..130: 40 entries held
    r.propose(b"one more")
    drain(r, s)
    assert r.catch_up_floor() is None


def test_a_follower_needing_a_snapshot_that_goes_silent_holds_nothing() -> None:
    r, s = compacted_leader()
    r.step(AppendResponse("b", "a", r.term, False, 100, hint_index=40, hint_term=1))
    drain(r, s)
    assert r.catch_up_floor() == 91
    b_silent(r, s)
    assert r.status().followers["b"].snapshot_required and r.catch_up_floor() is None
    # Streamed a snapshot before it answers again (back from a long stop): held meanwhile.
    r.snapshot_transfer("b")
    assert r.catch_up_floor() == 91
    r.report_snapshot("b", False)
    assert r.catch_up_floor() is None
    r.step(HeartbeatResponse("b", "a", r.term))  # back: it holds the floor again
    drain(r, s)
    assert r.catch_up_floor() == 91


def test_a_catching_up_follower_that_goes_silent_holds_nothing() -> None:
    # As one that needs a snapshot: a follower that stopped answering must not hold the
    # leader's compaction from where its snapshot left it.
    r, s = compacted_leader()
    r.step(AppendResponse("b", "a", r.term, False, 100, hint_index=40, hint_term=1))
    r.propose_batch([b"x%d" % i for i in range(30)])
    r.step(AppendResponse("c", "a", r.term, True, r.log.last_index()))
    drain(r, s)
    r.step(AppendResponse("b", "a", r.term, True, 100))  # installed: catching up from 100
    drain(r, s)
    assert r.catch_up_floor() == 101
    b_silent(r, s)
    assert r.catch_up_floor() is None


def test_the_catch_up_floor_is_the_lowest_any_follower_needs() -> None:
    """Five voters: b needs a snapshot (91 on), c installed one and catches up from 101, d and
    e keep committing. Compaction must keep what b needs, the lower of the two."""
    members = ["a", "b", "c", "d", "e"]
    s = storage_with([(i, 1) for i in range(1, 101)], voters=tuple(members), term=1, commit=100)
    s.create_snapshot(SnapshotMeta(100, 1, Membership.of(members)), b"")
    s.compact(91)
    r = Raft("a", CFG, s)
    r.hup()
    drain(r, s)
    for voter in ("b", "c"):
        r.step(PreVoteResponse(voter, "a", r.term + 1, True))
    drain(r, s)
    for voter in ("b", "c"):
        r.step(VoteResponse(voter, "a", r.term, True))
    drain(r, s)
    assert r.role == Role.LEADER
    for follower in ("b", "c"):
        r.step(AppendResponse(follower, "a", r.term, False, 100, hint_index=40, hint_term=1))
    r.propose_batch([b"x%d" % i for i in range(30)])
    for follower in ("d", "e"):
        r.step(AppendResponse(follower, "a", r.term, True, r.log.last_index()))
    drain(r, s)
    r.step(AppendResponse("c", "a", r.term, True, 100))  # c installed; b has not yet
    drain(r, s)
    assert r.status().followers["b"].snapshot_required
    assert r.catch_up_floor() == 91


def test_a_failed_snapshot_transfer_is_retried_after_the_back_off_from_its_failure() -> None:
    # The driver reports a transfer that failed: the leader says so (an event the node
    # counts) and asks again only after the back-off, counted from the failure, so a
    # target that cannot take a snapshot is not sent one in a tight loop.
    r, s = compacted_leader()
    r.step(AppendResponse("b", "a", r.term, False, 100, hint_index=40, hint_term=1))
    drain(r, s)
    r.snapshot_transfer("b")
    for _ in range(CFG.snapshot_retry_ticks - 1):  # the transfer takes a while...
        r.tick()
        r.step(HeartbeatResponse("c", "a", r.term))
        drain(r, s)
    r.report_snapshot("b", False)  # ...and fails
    rd = drain(r, s)
    assert [e.kind for e in rd.events if e.kind == "snapshot_failed"] == ["snapshot_failed"]
    requests = []
    for _ in range(CFG.snapshot_retry_ticks - 1):
        r.tick()
        r.step(HeartbeatResponse("c", "a", r.term))
        requests += drain(r, s).snapshot_requests
    assert requests == []
    r.tick()
    assert [q.attempt for q in drain(r, s).snapshot_requests] == [2]


class TestMembership:
    def leader(self) -> tuple[Raft, MemoryStorage]:
        s = storage_with([(1, 1)], term=1)
        r = Raft("a", CFG, s)
        elect(r, s)
        r.step(AppendResponse("b", "a", r.term, True, 2))
        drain(r, s)  # the no-op committed: changes are allowed now
        return r, s

    def test_one_change_at_a_time(self) -> None:
        r, s = self.leader()
        r.propose_membership("add_learner", "d")
        drain(r, s)
        with pytest.raises(MembershipError, match="one at a time"):
            r.propose_membership("add_learner", "e")

    @pytest.mark.parametrize(
        ("op", "node", "reason"),
        [
            ("add_learner", "b", "already a voter"),
            ("promote", "b", "already a voter"),
            ("promote", "z", "not a learner"),
            ("remove", "z", "not a member"),
            ("merge", "b", "unknown membership operation"),
        ],
    )
    def test_refusals_say_why(self, op: str, node: str, reason: str) -> None:
        r, _ = self.leader()
        with pytest.raises(MembershipError, match=reason):
            r.propose_membership(op, node)  # type: ignore[arg-type]

    def test_learner_does_not_count_for_commit_and_promotion_checks_lag(self) -> None:
        r, s = self.leader()
        index, _ = r.propose_membership("add_learner", "d")
        drain(r, s)
        assert r.membership.learners == {"d"}
        r.step(AppendResponse("d", "a", r.term, True, index))
        drain(r, s)
        assert r.commit < index  # the learner's ack alone is not a quorum
        r.step(AppendResponse("b", "a", r.term, True, index))
        drain(r, s)
        assert r.commit == index
        r.propose_batch([b"x"] * 30)
        drain(r, s)
        r.step(AppendResponse("b", "a", r.term, True, r.log.last_index()))
        drain(r, s)
        with pytest.raises(MembershipError, match="lags by 30 entries"):
            r.propose_membership("promote", "d")
        r.step(AppendResponse("d", "a", r.term, True, r.log.last_index() - 5))
        drain(r, s)
        r.propose_membership("promote", "d")
        assert r.membership.voters == {"a", "b", "c", "d"}

    def test_a_new_leader_takes_no_change_before_its_no_op_commits(self) -> None:
        """The single-server change fix: a change proposed before the new term's no-op
        commits could overlap an uncommitted change of an earlier leader."""
        s = storage_with([(1, 1)], term=1)
        r = Raft("a", CFG, s)
        elect(r, s)
        with pytest.raises(MembershipError, match="one at a time"):
            r.propose_membership("add_learner", "d")
        r.step(AppendResponse("b", "a", r.term, True, 2))
        drain(r, s)
        r.propose_membership("add_learner", "d")

    def test_the_last_voter_cannot_be_removed(self) -> None:
        s = storage_with([], voters=("a",), term=1)
        r = Raft("a", CFG, s)
        r.hup()
        drain(r, s)
        assert r.role == Role.LEADER and r.commit == 1
        with pytest.raises(MembershipError, match="last voter"):
            r.propose_membership("remove", "a")

    def test_a_learner_is_promoted_at_the_lag_allowed_and_not_one_entry_more(self) -> None:
        r, s = self.leader()
        index, _ = r.propose_membership("add_learner", "d")
        r.step(AppendResponse("b", "a", r.term, True, index))
        drain(r, s)
        allowed = CFG.learner_promotion_lag
        r.propose_batch([b"x"] * (allowed + 1))
        drain(r, s)
        r.step(AppendResponse("b", "a", r.term, True, r.log.last_index()))
        drain(r, s)
        r.step(AppendResponse("d", "a", r.term, True, r.commit - allowed - 1))
        drain(r, s)
        with pytest.raises(MembershipError, match=f"lags by {allowed + 1} entries"):
            r.propose_membership("promote", "d")
        r.step(AppendResponse("d", "a", r.term, True, r.commit - allowed))
        drain(r, s)
        r.propose_membership("promote", "d")

    def test_leadership_is_not_handed_to_a_learner(self) -> None:
        r, s = self.leader()
        index, _ = r.propose_membership("add_learner", "d")
        r.step(AppendResponse("b", "a", r.term, True, index))
        r.step(AppendResponse("d", "a", r.term, True, index))
        drain(r, s)
        with pytest.raises(ProposalRefused, match="not a voter"):
            r.transfer_leadership("d")

    def test_a_membership_entry_a_later_leader_overwrote_is_undone(self) -> None:
        """A follower takes a change at index 3 (term 2) that never committed; the leader of
        term 3 writes another entry at 3: the members are again those before the change."""
        s = storage_with([(1, 1), (2, 2)], term=2)
        r = Raft("b", CFG, s)
        change = Membership.of(["a", "b", "c"], ("d",))
        r.step(
            AppendRequest("a", "b", 2, 2, 2, (Entry(3, 2, EntryKind.CONFIG, change.encode()),), 2)
        )
        drain(r, s)
        assert r.membership.learners == {"d"}
        r.step(AppendRequest("c", "b", 3, 2, 2, (Entry(3, 3, EntryKind.NORMAL, b"x"),), 2))
        drain(r, s)
        assert r.membership == Membership.of(["a", "b", "c"])

    def test_an_installed_snapshot_brings_its_members(self) -> None:
        s = storage_with([(1, 1)], term=1)
        r = Raft("b", CFG, s)
        meta = SnapshotMeta(10, 2, Membership.of(["a", "b", "c"], ("d",)))
        r.step(InstallSnapshot("a", "b", 2, meta))
        drain(r, s)
        assert r.membership == meta.membership

    def test_removed_leader_steps_down_once_the_removal_commits(self) -> None:
        r, s = self.leader()
        index, _ = r.propose_membership("remove", "a")
        drain(r, s)
        assert r.role == Role.LEADER  # still leading until the change commits
        r.step(AppendResponse("b", "a", r.term, True, index))
        r.step(AppendResponse("c", "a", r.term, True, index))
        rd = drain(r, s)
        assert r.status().role == Role.FOLLOWER
        assert any(e.kind == "stepped_down" for e in rd.events)
        for _ in range(5 * CFG.election_ticks):
            r.tick()
        assert r.status().role == Role.FOLLOWER  # no longer a voter: never campaigns


def test_leadership_transfer_catches_the_target_up_then_sends_timeout_now() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    r.transfer_leadership("b")
    with pytest.raises(ProposalRefused, match="transfer to b"):
        r.propose(b"x")
    r.step(AppendResponse("b", "a", r.term, True, r.log.last_index()))
    rd = drain(r, s)
    assert [m.dst for m in sent(rd, TimeoutNow)] == ["b"]
    # The target campaigns at once, skipping pre-vote, and voters let it through the lease.
    s2 = storage_with([(1, 1), (2, 2)], term=2)
    b = Raft("b", CFG, s2)
    b.step(TimeoutNow("a", "b", 2))
    rd = drain(b, s2)
    votes = sent(rd, VoteRequest)
    assert b.role == Role.CANDIDATE and b.term == 3 and all(v.transfer for v in votes)  # type: ignore[union-attr]


def test_not_leader_errors_carry_the_leader_hint() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", CFG, s)
    r.step(HeartbeatRequest("a", "b", 1, 0))
    drain(r, s)
    with pytest.raises(NotLeader) as info:
        r.propose(b"x")
    assert info.value.leader_hint == "a" and "the leader is a" in str(info.value)


def test_heartbeat_response_reprobes_a_follower() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    r.step(HeartbeatResponse("b", "a", r.term))
    rd = drain(r, s)
    assert [m.dst for m in sent(rd, AppendRequest)] == ["b"]


@pytest.mark.parametrize("quiesce", [False, True])
def test_a_restarted_follower_learns_the_commit_from_a_heartbeat_of_its_last_entrys_term(
    quiesce: bool,
) -> None:
    """Restarted (its match with the leader forgotten) holding the leader's entries 1-3 of term
    2 with commit 2 on disk: an idle leader sends it heartbeats only, and they commit index 3."""
    s = storage_with([(1, 1), (2, 2), (3, 2)], commit=2, term=2)
    r = Raft("b", CFG, s)
    r.step(HeartbeatRequest("a", "b", 2, 3, quiesce=quiesce))
    drain(r, s)
    assert r.commit == 3 and r.quiesced is quiesce


def test_a_heartbeat_of_a_later_term_commits_nothing_past_the_known_match() -> None:
    """The last entry is of term 1: the leader of term 2 may hold other entries at 2-3 (they
    were never committed), so its commit index 3 says nothing of this log until an append
    matches it."""
    s = storage_with([(1, 1), (2, 1), (3, 1)], commit=1, term=2)
    r = Raft("b", CFG, s)
    r.step(HeartbeatRequest("a", "b", 2, 3, quiesce=True))
    drain(r, s)
    assert r.commit == 1 and not r.quiesced


def test_partition_host_runs_independent_groups_and_rejects_unknown_partitions() -> None:
    storages = {p: MemoryStorage(Membership.of(["a"])) for p in range(3)}
    host = PartitionHost("a", CFG, 3, storage_for=lambda p: storages[p])

    def drive() -> None:
        while readies := host.ready():
            for p, rd in readies.items():
                storages[p].save(rd.hard_state, rd.entries)
            host.advance(readies)

    for _ in range(2 * CFG.election_ticks):
        host.tick()
    drive()
    assert all(r.role == Role.LEADER for r in host.partitions.values())
    host.partitions[1].propose(b"only-in-1")
    drive()
    assert storages[1].last_index() == 2 and storages[0].last_index() == 1
    with pytest.raises(InvalidMessage, match="unknown partition 7"):
        host.step(7, HeartbeatRequest("b", "a", 1, 0))


def test_a_peer_claiming_leadership_in_the_leaders_own_term_is_refused_not_fatal() -> None:
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    last = s.last_index()
    r.step(AppendRequest("b", "a", r.term, last, r.term, (Entry(last + 1, r.term),), 0))
    rd = drain(r, s)
    assert r.role == Role.LEADER and s.last_index() == last
    assert [e.kind for e in rd.events] == ["conflicting_leader"]


def test_a_leader_that_removes_itself_tells_the_followers_the_removal_committed():
    """No append will carry the commit once it steps down: it tells them on its way out, or
    they would learn it only from the next leader's first commit."""
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    r.step(AppendResponse("b", "a", r.term, True, 2))
    drain(r, s)
    index, _ = r.propose_membership("remove", "a")
    drain(r, s)
    r.step(AppendResponse("b", "a", r.term, True, index))
    r.step(AppendResponse("c", "a", r.term, True, index))
    rd = drain(r, s)
    assert r.role == Role.FOLLOWER and r.commit == index
    told = {m.dst: m.commit for m in rd.messages if isinstance(m, AppendRequest)}
    assert told == {"b": index, "c": index}


@pytest.mark.parametrize("threshold", [1_000_000, 0], ids=["live", "backfill"])
def test_appends_are_bounded_in_bytes_and_a_larger_entry_goes_alone(threshold: int) -> None:
    """Large records must not make an append its follower refuses (peer frames have a size
    limit): each append carries at most `max_append_bytes` of entries, or one entry alone."""
    cfg = CFG.model_copy(update={"max_append_bytes": 2048, "backfill_threshold": threshold})
    sizes = [500] * 7 + [5000] + [500] * 5 + [10] * 40
    s = MemoryStorage(Membership.of(["a", "b", "c"]))
    s.save(
        HardState(term=1), [Entry(i, 1, EntryKind.NORMAL, b"x" * n) for i, n in enumerate(sizes, 1)]
    )
    r = Raft("a", cfg, s)
    elect(r, s)
    last = r.log.last_index()  # the new leader's no-op too
    r.step(AppendResponse("c", "a", r.term, True, last))  # c holds all: everything commits
    # b holds nothing: it refuses the append after the election (prev = the entry before the
    # no-op) with a hint that sends the leader back to index 1.
    r.step(AppendResponse("b", "a", r.term, False, last - 1, hint_index=0, hint_term=0))
    got: list[Entry] = []
    for _ in range(100):
        appends = [m for m in sent(drain(r, s), AppendRequest) if m.dst == "b"]
        appends = [m for m in appends if m.entries]  # type: ignore[union-attr]
        if not appends:
            break
        for m in appends:
            assert isinstance(m, AppendRequest) and m.prev_index == len(got)
            total = sum(e.size for e in m.entries)
            assert total <= 2048 or len(m.entries) == 1, [e.size for e in m.entries]
            got += m.entries
            r.step(AppendResponse("b", "a", r.term, True, m.entries[-1].index))
    assert [e.index for e in got] == list(range(1, last + 1))
    assert [len(e.data) for e in got[: len(sizes)]] == sizes
    assert r.status().followers["b"].match == last


def test_a_leader_that_steps_down_hands_over_to_its_most_caught_up_voter() -> None:
    """Its storage failed: the followers of a quiesced partition run no timer, so it tells the
    voter that holds the most to campaign at once."""
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", CFG, s)
    elect(r, s)
    last = s.last_index()
    r.step(AppendResponse("c", "a", r.term, True, last))
    drain(r, s)
    handoff = r.step_down("storage failed")
    assert [(m.dst, type(m).__name__) for m in handoff] == [("c", "TimeoutNow")]
    assert r.role == Role.FOLLOWER and r.leader is None and r.term == handoff[0].term
    assert r.step_down("again") == []  # a follower hands nothing over


def test_a_follower_that_installs_a_snapshot_commits_up_to_it_and_says_so() -> None:
    """Its mark is the snapshot's index at once (not at the next heartbeat), and its answer
    tells the leader so (the leader ranks snapshot sources by it)."""
    s = storage_with([(1, 1)], term=1)
    r = Raft("b", CFG, s)
    r.step(InstallSnapshot("a", "b", 2, SnapshotMeta(10, 2, Membership.of(["a", "b", "c"]))))
    rd = drain(r, s)
    assert r.commit == 10
    (answer,) = [m for m in rd.messages if isinstance(m, AppendResponse)]
    assert answer.success and answer.index == 10 and answer.commit == 10, answer


def role(r: Raft) -> Role:
    """Its role now (read through a call: mypy would keep an earlier assert's narrowing)."""
    return r.role


def test_a_quiesced_leader_woken_by_its_silent_voters_steps_down_unless_they_answer() -> None:
    """Its node stops hearing from the other voters (their links to it cut one way: its own
    messages still reach them) and wakes it: the leader must hear from a quorum again before
    it quiesces, and steps down at its check-quorum when it does not. It quiesced again at
    its next heartbeat on what its followers had answered before it slept, and kept leading a
    partition nobody could commit on, its followers asleep behind it (real nodes: not
    replaced after 25 s, against 2 s without quiescence)."""
    cfg = RaftConfig(election_ticks=10, heartbeat_ticks=2)
    s = storage_with([(1, 1)], term=1)
    r = Raft("a", cfg, s)
    elect(r, s)
    last = s.last_index()
    for _ in range(cfg.election_ticks):  # answered while all is well: it quiesces
        for f in ("b", "c"):
            r.step(AppendResponse(f, "a", r.term, True, last))
        r.tick()
        drain(r, s)
    assert r.quiesced and role(r) == Role.LEADER
    r.wake_if_silent({"b", "c"})  # then nothing more from them
    for _ in range(2 * cfg.election_ticks):
        r.tick()
        drain(r, s)
    assert role(r) == Role.FOLLOWER and not r.quiesced
    # Voters that answer the wake-up heartbeat: it leads on and quiesces again.
    elect(r, s)
    last = s.last_index()
    for _ in range(cfg.election_ticks):
        for f in ("b", "c"):
            r.step(AppendResponse(f, "a", r.term, True, last))
        r.tick()
        drain(r, s)
    assert r.quiesced
    r.wake_if_silent({"b"})
    for _ in range(2 * cfg.election_ticks):
        rd = drain(r, s)
        for m in sent(rd, HeartbeatRequest):
            r.step(HeartbeatResponse(m.dst, "a", r.term))
        r.tick()
    drain(r, s)
    assert role(r) == Role.LEADER and r.quiesced
