"""Quiesced partitions in the simulator: idle groups stop ticking, and the failure of a quiesced
leader is noticed from node-level silence alone, with every invariant checked after every step
and the liveness check (a leader, a new commit, applied everywhere) at the end of each seed."""

from __future__ import annotations

import pytest

from raftlog.node.core.config import RaftConfig
from raftlog.node.sim.cluster import Cluster
from raftlog.node.sim.scenarios import run_scenario

pytestmark = [pytest.mark.simulation]


def test_the_quiet_scenario_quiesces_and_wakes_on_silence() -> None:
    quiesced = wakes = crashes = 0
    for seed in range(12):
        r = run_scenario("quiet", seed)
        quiesced += r.stats.quiesced
        wakes += r.stats.wakes
        crashes += r.stats.crashes
        assert r.acked > 0
    assert quiesced > 50, "partitions quiesced while idle"
    assert wakes > 0 and crashes > 0, "silent members woke quiesced partitions"


def leader_of(c: Cluster, p: int = 0) -> str | None:
    leaders = [n.id for n in c.nodes.values() if n.up and n.raft(p).role.value == "leader"]
    return leaders[0] if len(leaders) == 1 else None


def test_an_idle_cluster_stops_ticking_and_elects_again_when_its_leader_dies() -> None:
    config = RaftConfig(election_ticks=10, heartbeat_ticks=2)
    c = Cluster(["a", "b", "c"], seed=3, config=config, partitions=2)
    c.run_until(lambda: all(leader_of(c, p) for p in range(2)), 200, "first leaders")
    c.run_until(
        lambda: all(n.raft(p).quiesced for n in c.nodes.values() for p in range(2)),
        200,
        "every partition quiesced on every member",
    )
    sent = c.network.sent
    c.run(100)
    # Only the node pairs' pings went out: 3 nodes x 2 peers every 2 ticks.
    assert c.network.sent - sent <= 3 * 2 * 50
    old = leader_of(c, 0)
    assert old is not None
    c.crash(old)
    elapsed = c.run_until(
        lambda: leader_of(c, 0) not in (None, old), 20 * config.election_ticks, "failover"
    )
    # Silence is noticed after an election timeout; the election takes up to two more.
    assert elapsed <= 4 * config.election_ticks
