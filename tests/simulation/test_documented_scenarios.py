"""The scenarios of the source documents, scripted step by step on the simulated cluster.

Every step of these runs is also checked by the invariants (the cluster raises on a violation).
"""

from __future__ import annotations

from typing import Any

import pytest

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.messages import AppendRequest, HeartbeatRequest
from raftlog.node.core.progress import ProgressState
from raftlog.node.core.raft import Role
from raftlog.node.record import Record, encode_record
from raftlog.node.sim.cluster import Cluster, PeerMessage, SimNode
from raftlog.node.sim.network import Faults

pytestmark = pytest.mark.simulation


def make_cluster(n: int = 3, seed: int = 1, **config: Any) -> Cluster:
    cfg = RaftConfig(**{"election_ticks": 10, "heartbeat_ticks": 2, **config})
    c = Cluster([f"n{i}" for i in range(1, n + 1)], seed=seed, config=cfg, faults=Faults())
    c.run_until(lambda: c.leader() is not None, 200, "first leader")
    return c


def leader(c: Cluster) -> SimNode:
    node = c.leader()
    assert node is not None
    return node


def record(i: int) -> bytes:
    return encode_record(Record(key=b"k%d" % (i % 7), value=b"entry%d" % i))


def write(c: Cluster, count: int, start: int = 0) -> list[int]:
    """Proposes `count` records on the leader and waits until all are acknowledged."""
    indexes = []
    for i in range(start, start + count):
        index = c.propose(record(i))
        assert index is not None, "no leader accepted the proposal"
        indexes.append(index)
    c.run_until(lambda: all(i in c.acked[0] for i in indexes), 500, f"{count} appends committed")
    return indexes


def log_of(node: SimNode) -> list[tuple[int, int, bytes]]:
    s = node.storages[0]
    return [(e.index, e.term, e.data) for e in s.entries(s.first_index(), s.last_index() + 1)]


def record_sends(c: Cluster) -> list[tuple[int, str, str, object]]:
    sent: list[tuple[int, str, str, object]] = []
    original = c.network.send

    def send(now: int, src: str, dst: str, payload: object, extra_delay: int = 0) -> None:
        msg = payload.message if isinstance(payload, PeerMessage) else payload
        sent.append((now, src, dst, msg))
        original(now, src, dst, payload, extra_delay)

    c.network.send = send  # type: ignore[method-assign]
    return sent


def test_follower_with_1_to_3_catches_up_to_1_to_10_without_a_hole() -> None:
    c = make_cluster()
    lead = leader(c)
    follower = next(n for n in c.nodes.values() if n is not lead)
    base = write(c, 3)[-1]
    c.run_until(lambda: follower.storages[0].last_index() >= base, 50, "follower has 1..3")
    c.pause(follower.id)
    last = write(c, 7, start=3)[-1]
    assert follower.storages[0].last_index() == base
    c.resume(follower.id)
    c.run_until(lambda: follower.raft().commit >= last, 100, "follower caught up")
    # Contiguous, identical to the leader's log, and reached through live replication: the lag
    # of 7 never exceeded backfill_threshold=10.
    assert [i for i, _, _ in log_of(follower)] == list(range(1, last + 1))
    assert log_of(follower) == log_of(lead)[: len(log_of(follower))]
    assert lead.raft().status().followers[follower.id].backfill_rounds == 0


def test_follower_beyond_threshold_is_repaired_in_bounded_anchored_rounds() -> None:
    c = make_cluster()  # default backfill_threshold=10, max_backfill_entries_per_round=128
    lead = leader(c)
    lagger, other = [n for n in sorted(c.nodes.values(), key=lambda n: n.id) if n is not lead]
    write(c, 5)
    c.pause(lagger.id)
    for chunk in range(6):
        write(c, 100, start=5 + chunk * 100)
    behind = lead.raft().commit - lagger.raft().commit
    assert behind > 500
    sent = record_sends(c)
    c.resume(lagger.id)
    # Clients keep committing while the lagging follower is repaired.
    during = write(c, 20, start=1000)
    c.run_until(
        lambda: lagger.raft().commit >= lead.raft().commit, 400, "lagging follower converged"
    )
    rounds = [
        m
        for _, src, dst, m in sent
        if dst == lagger.id and isinstance(m, AppendRequest) and m.backfill
    ]
    assert len(rounds) >= behind // 128
    lead_log = {i: t for i, t, _ in log_of(lead)}
    for m in rounds:
        assert 0 < len(m.entries) <= 128
        # Anchored: (prev_index, prev_term) is the leader's own entry.
        assert lead_log.get(m.prev_index, m.prev_term) == m.prev_term
    first_round = min(t for t, _, dst, m in sent if isinstance(m, AppendRequest) and m.backfill)
    last_round = max(t for t, _, dst, m in sent if isinstance(m, AppendRequest) and m.backfill)
    heartbeats = {
        dst
        for t, _, dst, m in sent
        if isinstance(m, HeartbeatRequest) and first_round <= t <= last_round
    }
    assert heartbeats == {lagger.id, other.id}, "heartbeats stopped during backfill"
    assert all(i in c.acked[0] for i in during)
    c.run_until(
        lambda: lead.raft().follower_lag(lagger.id) == 0, 50, "leader sees the follower caught up"
    )
    status = lead.raft().status().followers[lagger.id]
    assert status.backfill_rounds == len(rounds)
    assert status.backfill_entries == sum(len(m.entries) for m in rounds)


def test_old_leaders_uncommitted_entry4_is_truncated_and_replaced_by_entry5() -> None:
    c = make_cluster()
    old = leader(c)
    write(c, 3)
    c.isolate(old.id)
    entry4 = c.propose(encode_record(Record(key=b"x", value=b"entry4")))
    assert entry4 is not None
    c.run_until(
        lambda: any(n.raft().role == Role.LEADER and n is not old for n in c._running()),
        200,
        "a new leader among the majority",
    )
    new = next(n for n in c._running() if n.raft().role == Role.LEADER and n is not old)
    entry5 = c.propose(encode_record(Record(key=b"x", value=b"entry5")), via=new.id)
    assert entry5 is not None
    c.run_until(lambda: entry5 in c.acked[0], 100, "entry5 committed")
    assert old.raft().log.term_or_none(entry4) != new.raft().log.term_or_none(entry4)
    c.heal()
    c.run_until(lambda: old.raft().commit >= entry5, 200, "old leader rejoined")
    datas = [d for _, _, d in log_of(old)]
    assert encode_record(Record(key=b"x", value=b"entry4")) not in datas
    assert encode_record(Record(key=b"x", value=b"entry5")) in datas
    assert log_of(old) == log_of(new)[: len(log_of(old))]
    assert old.tables[0].get(b"x") == b"entry5"
    assert any("truncated" in line and old.id in line for line in c.trace)


def test_follower_below_the_floor_is_reported_snapshot_required_then_installed() -> None:
    c = make_cluster(compact_every_operations=20, compact_number_entries=5)
    lead = leader(c)
    stopped = sorted((n for n in c.nodes.values() if n is not lead), key=lambda n: n.id)[0]
    write(c, 5)
    c.crash(stopped.id)
    write(c, 120, start=5)
    floor = lead.storages[0].first_index()
    assert floor > stopped.storages[0].last_index() + 1, "the leader compacted past the follower"
    c.restart(stopped.id)
    seen_required = []

    def check() -> bool:
        st = lead.raft().status().followers[stopped.id]
        if st.snapshot_required:
            seen_required.append(st.state)
        return stopped.raft().commit >= lead.raft().commit and not st.snapshot_required

    c.run_until(check, 300, "snapshot installed and follower caught up")
    assert seen_required and set(seen_required) == {ProgressState.SNAPSHOT}
    assert any("snapshot_required" in line and stopped.id in line for line in c.trace)
    assert c.stats.snapshot_transfers >= 1
    # follower-first: the other, responsive, caught-up follower streamed the snapshot.
    assert c.stats.snapshot_from_follower >= 1
    assert stopped.tables[0].rows == lead.tables[0].rows
    assert lead.raft().status().followers[stopped.id].snapshots_installed >= 1


def test_learner_promotion_refused_while_lagging_and_accepted_within_the_lag() -> None:
    c = make_cluster()
    write(c, 300)
    c.add_node("n4")
    assert c.change_membership("add_learner", "n4") is None
    lead = leader(c)
    c.run(3)
    c.pause("n4")  # a slow learner: it falls behind while the cluster keeps writing
    c.run_until(
        lambda: lead.raft().pending_conf_index <= lead.raft().log.applied, 50, "learner added"
    )
    write(c, 30, start=300)
    reason = c.change_membership("promote", "n4")
    assert reason is not None and "lags by" in reason, reason
    assert "learner_promotion_lag=10" in reason
    c.resume("n4")
    c.run_until(
        lambda: (lag := lead.raft().follower_lag("n4")) is not None and lag <= 10,
        300,
        "learner within the lag",
    )
    assert c.change_membership("promote", "n4") is None
    c.run_until(
        lambda: all("n4" in n.raft().membership.voters for n in c._running()),
        100,
        "n4 is a voter everywhere",
    )
    # Now a voter, n4 counts: with n2 down, 3 of the 4 voters (n4 among them) commit.
    down = next(n for n in ("n2", "n3") if n != lead.id)
    c.crash(down)
    write(c, 10, start=400)
    assert c.nodes["n4"].storages[0].last_index() >= lead.raft().commit
