"""Randomized scenarios: a fault schedule and a workload, all drawn from one seed.

Each run has a fault phase (the scenario's faults and workload), then a healing phase: the
network heals, crashed nodes restart, paused ones resume, and within a bounded number of ticks a
leader must be elected, a new proposal must commit, and every member must apply it (liveness).
Then no acknowledged entry may be missing anywhere (durability).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import SafetyViolation
from raftlog.node.core.raft import Raft, Role
from raftlog.node.record import Record, encode_record
from raftlog.node.sim.cluster import Cluster, SnapshotPolicy, Stats
from raftlog.node.sim.network import Faults


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    voters: int = 3
    partitions: int = 1
    ticks: int = 400
    faults: Faults = field(
        default_factory=lambda: Faults(drop=0.02, duplicate=0.02, min_delay=1, max_delay=3)
    )
    propose_rate: float = 0.6  # proposals per tick
    read_rate: float = 0.3
    crash_rate: float = 0.0  # per tick: a running node crashes
    pause_rate: float = 0.0
    partition_rate: float = 0.0
    membership_rate: float = 0.0
    max_down: int = 1  # crashed + paused at once
    liveness_ticks: int = 400
    snapshot_policy: SnapshotPolicy = "follower-first"
    config: RaftConfig = field(
        default_factory=lambda: RaftConfig(
            election_ticks=10,
            heartbeat_ticks=2,
            backfill_threshold=10,
            max_backfill_entries_per_round=16,
            max_entries_per_append=8,
            max_inflight_appends=4,
            compact_every_operations=40,
            compact_number_entries=10,
            max_entries_per_compaction=200,
            learner_promotion_lag=10,
            snapshot_retry_ticks=10,
            snapshot_retry_max_ticks=40,
        )
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "chaos",
            "5 voters; drops, duplicates, reordering, crashes, pauses and partitions at once",
            voters=5,
            faults=Faults(drop=0.05, duplicate=0.03, min_delay=1, max_delay=5),
            crash_rate=0.01,
            pause_rate=0.01,
            partition_rate=0.01,
            max_down=2,
        ),
        Scenario(
            "figure8",
            "5 voters, leaders crashing mid-replication, one entry per append: the schedules of "
            "the Raft paper's figure 8, where counting replicas of an old term's entry is unsafe",
            voters=5,
            propose_rate=0.3,
            crash_rate=0.06,
            partition_rate=0.02,
            max_down=2,
            faults=Faults(drop=0.03, duplicate=0.01, min_delay=1, max_delay=4),
            config=RaftConfig(
                election_ticks=8,
                heartbeat_ticks=2,
                backfill_threshold=4,
                max_backfill_entries_per_round=2,
                max_entries_per_append=1,
                max_inflight_appends=2,
                compact_every_operations=30,
                compact_number_entries=5,
                snapshot_retry_ticks=8,
                snapshot_retry_max_ticks=32,
                # The paper's schedules need leaders to change often; a quiesced leader that
                # nobody proposes to would be left alone ("quiet" covers quiescence).
                quiesce=False,
            ),
        ),
        Scenario(
            "quiet",
            "5 voters hosting 4 partitions, mostly idle so that they quiesce; leaders crash, "
            "pause and are cut off while quiesced, and only node-level silence wakes the rest",
            voters=5,
            partitions=4,
            propose_rate=0.08,
            read_rate=0.05,
            crash_rate=0.01,
            pause_rate=0.01,
            partition_rate=0.01,
            max_down=2,
            faults=Faults(drop=0.02, duplicate=0.01, min_delay=1, max_delay=3),
        ),
        Scenario(
            "crash",
            "3 voters crashing and restarting often (durable state kept, volatile lost)",
            crash_rate=0.03,
            max_down=2,
            liveness_ticks=500,
        ),
        Scenario(
            "partition",
            "5 voters under repeated network partitions; leaders cut off step down (check-quorum)",
            voters=5,
            partition_rate=0.03,
            faults=Faults(drop=0.01, duplicate=0.01, min_delay=1, max_delay=3),
        ),
        Scenario(
            "lagging",
            "3 voters; followers paused long past the backfill threshold and the compaction floor",
            pause_rate=0.02,
            propose_rate=1.0,
            max_down=1,
            snapshot_policy="leader",
        ),
        Scenario(
            "membership",
            "learners added, promoted (or refused while lagging) and members removed, under faults",
            voters=3,
            membership_rate=0.05,
            crash_rate=0.005,
            pause_rate=0.01,
            max_down=1,
            liveness_ticks=600,
        ),
        Scenario(
            "even",
            "4 voters (a majority is 3) split 2|2 and 1|3 by partitions, with crashes: a quorum "
            "of half the voters would elect two leaders",
            voters=4,
            partition_rate=0.04,
            crash_rate=0.01,
            max_down=1,
            faults=Faults(drop=0.02, duplicate=0.02, min_delay=1, max_delay=4),
        ),
        Scenario(
            "multi",
            "3 nodes hosting 3 partitions, each its own Raft group, under faults",
            voters=3,
            partitions=3,
            ticks=300,
            crash_rate=0.01,
            pause_rate=0.01,
            partition_rate=0.01,
        ),
    ]
}


@dataclass
class RunResult:
    scenario: str
    seed: int
    steps: int
    stats: Stats
    acked: int
    commit: list[int]


class _Workload:
    """Draws faults, proposals, reads and membership changes from the cluster's RNG."""

    def __init__(self, cluster: Cluster, scenario: Scenario) -> None:
        self.c = cluster
        self.s = scenario
        self.rng = cluster.rng
        self.restart_at: dict[str, int] = {}
        self.resume_at: dict[str, int] = {}
        self.heal_at = -1
        self.seq = 0
        self.next_spare = scenario.voters + 1
        self.retire_after_apply: list[str] = []

    def down(self) -> int:
        return len(self.restart_at) + len(self.resume_at)

    def tick(self) -> None:
        c, s, rng, now = self.c, self.s, self.rng, self.c.now
        for node, at in sorted(self.restart_at.items()):
            if now >= at:
                del self.restart_at[node]
                c.restart(node)
        for node, at in sorted(self.resume_at.items()):
            if now >= at:
                del self.resume_at[node]
                c.resume(node)
        if self.heal_at >= 0 and now >= self.heal_at:
            self.heal_at = -1
            c.heal()
        live = [n.id for n in c._running()]
        if s.crash_rate and rng.random() < s.crash_rate and self.down() < s.max_down and live:
            victim = rng.choice(live)
            c.crash(victim)
            self.restart_at[victim] = now + rng.randint(5, 60)
        if s.pause_rate and rng.random() < s.pause_rate and self.down() < s.max_down and live:
            victim = rng.choice(live)
            c.pause(victim)
            self.resume_at[victim] = now + rng.randint(10, 90)
        if s.partition_rate and rng.random() < s.partition_rate and self.heal_at < 0:
            nodes = sorted(n for n, node in c.nodes.items() if not node.retired)
            rng.shuffle(nodes)
            cut = rng.randint(1, len(nodes) - 1)
            c.partition(sorted(nodes[:cut]), sorted(nodes[cut:]))
            self.heal_at = now + rng.randint(10, 80)
        if s.membership_rate and rng.random() < s.membership_rate:
            self.membership_change()
        for p in range(s.partitions):
            if rng.random() < s.propose_rate:
                self.propose(p)
            running = [n.id for n in c._running()]
            if rng.random() < s.read_rate and running:
                node = rng.choice(running)
                raft = c.nodes[node].raft(p)
                lo = rng.randint(raft.log.first_index(), max(raft.log.first_index(), raft.commit))
                c.read(node, p, lo, lo + rng.randint(1, 20))
            # Linearizable reads go to whoever believes it leads, a deposed leader included.
            leading = [n for n in running if c.nodes[n].raft(p).role == Role.LEADER]
            if rng.random() < s.read_rate and leading:
                c.read_index(rng.choice(leading), p)

    def propose(self, p: int) -> None:
        self.seq += 1
        key = b"k%d" % self.rng.randrange(16)
        value = None if self.rng.random() < 0.1 else b"v%d" % self.seq
        self.c.propose(encode_record(Record(key=key, value=value)), partition=p)

    def membership_change(self) -> None:
        c, rng = self.c, self.rng
        leader = c.leader(0)
        if leader is None:
            return
        m = leader.raft(0).membership
        choice = rng.random()
        if choice < 0.1 and len(m.voters) > 1:
            target = rng.choice(sorted(m.voters - {leader.id}))
            c.transfer_leadership(target)
        elif choice < 0.4 and len(m.members) < 7:
            spare = f"n{self.next_spare}"
            self.next_spare += 1
            c.add_node(spare)
            if c.change_membership("add_learner", spare) is not None:
                c.retire(spare)
        elif choice < 0.7 and m.learners:
            c.change_membership("promote", rng.choice(sorted(m.learners)))
        elif len(m.voters) > 2 or m.learners:
            # Down to 2 voters and up through 4 and 6: even counts are where a quorum of
            # "half" differs from a majority.
            pool = sorted(m.learners) if m.learners and rng.random() < 0.5 else sorted(m.voters)
            if pool == sorted(m.voters) and len(m.voters) <= 2:
                return
            victim = rng.choice(pool)
            if c.change_membership("remove", victim) is None:
                self.retire_after_apply.append(victim)

    def settle_membership(self) -> None:
        """Like an operator: delete a removed member's pod once its removal is in effect."""
        pending = self.retire_after_apply
        if not pending:
            return
        leader = self.c.leader(0)
        if leader is None:
            return
        raft = leader.raft(0)
        if raft.pending_conf_index > raft.log.applied:
            return
        for victim in list(pending):
            if victim not in raft.membership.members:
                pending.remove(victim)
                self.c.retire(victim)
                self.restart_at.pop(victim, None)
                self.resume_at.pop(victim, None)

    def heal_all(self) -> None:
        c = self.c
        c.network.faults = Faults(min_delay=1, max_delay=2)
        c.heal()
        self.heal_at = -1
        for node in sorted(self.restart_at):
            c.restart(node)
        for node in sorted(self.resume_at):
            c.resume(node)
        self.restart_at.clear()
        self.resume_at.clear()


def run_scenario(
    scenario: Scenario | str,
    seed: int,
    *,
    raft_cls: type[Raft] = Raft,
    on_trace: Callable[[str], None] | None = None,
    ticks: int | None = None,
    data_dir: str | None = None,
) -> RunResult:
    """Run one seed. `data_dir` puts every node on the durable WAL storage in that directory."""
    s = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    if ticks is not None:
        s = replace(s, ticks=ticks)
    voters = [f"n{i}" for i in range(1, s.voters + 1)]
    c = Cluster(
        voters,
        seed=seed,
        config=s.config,
        partitions=s.partitions,
        faults=s.faults,
        snapshot_policy=s.snapshot_policy,
        raft_cls=raft_cls,
        on_trace=on_trace,
        data_dir=data_dir,
    )
    try:
        return _run(c, s, seed)
    finally:
        c.close()


def _run(c: Cluster, s: Scenario, seed: int) -> RunResult:
    w = _Workload(c, s)
    c.log(f"scenario {s.name} seed {seed}: {s.description}")
    try:
        for _ in range(s.ticks):
            w.tick()
            w.settle_membership()
            c.step()
        c.log("fault phase over: healing the network, restarting and resuming every node")
        w.heal_all()
        for p in range(s.partitions):
            _check_liveness(c, w, p, s.liveness_ticks)
    except SafetyViolation as e:  # the core's own checks: reported with the seed, as any other
        c.fail_from(e)
    c.checker.check_final(c)
    return RunResult(
        s.name,
        seed,
        c.stats.steps,
        c.stats,
        sum(len(a) for a in c.acked),
        [c.leader(p).raft(p).commit for p in range(s.partitions)],  # type: ignore[union-attr]
    )


def _check_liveness(c: Cluster, w: _Workload, p: int, bound: int) -> None:
    """After healing: a leader, a new committed proposal, and every member applying it."""

    def has_leader() -> bool:
        return c.leader(p) is not None

    c.run_until(has_leader, bound, f"p{p} leader elected")
    probe: list[int] = []  # [index, term] of the probe proposal in flight

    def probe_committed() -> bool:
        leader = c.leader(p)
        if not probe:
            index = c.propose(encode_record(Record(key=b"probe", value=b"%d" % p)), p)
            if index is not None and leader is not None:
                probe[:] = [index, leader.raft(p).term]
            return False
        if probe[0] in c.acked[p]:
            return True
        if leader is None or leader.raft(p).term != probe[1]:
            probe.clear()  # lost with its leader: propose again to the new one
        return False

    c.run_until(probe_committed, bound, f"p{p} new proposal committed")
    w.settle_membership()

    def applied_everywhere() -> bool:
        return c.applied_everywhere(p, probe[0])

    c.run_until(applied_everywhere, bound, f"p{p} every member applied the probe")
