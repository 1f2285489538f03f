"""`make demo`: a simulated five-node cluster under faults, told as a timeline.

Until the node server exists this is the product's demo: real Raft cores, in-memory disks and a
lossy network in one process, with every safety invariant checked after every step.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time

from raftlog.node.core.config import RaftConfig
from raftlog.node.record import Record, encode_record
from raftlog.node.sim.cluster import Cluster, SimNode
from raftlog.node.sim.invariants import InvariantViolation
from raftlog.node.sim.network import Faults
from raftlog.node.storage.recovery import analyze_wal
from raftlog.node.storage.wal_report import wal_report

SHOWN = (
    "elected",
    "stepped_down",
    "backfill_round",
    "snapshot_required",
    "snapshot_caught_up",
    "snapshot_installed",
    "membership_changed",
    "truncated",
    "refused",
    "proposed on",
    "CRASHED",
    "restarted",
    "PAUSED",
    "resumed",
    "PARTITIONED",
    "healed",
    "snapshot of",
    "compacted",
)


class Story:
    def __init__(self, seed: int, data_dir: str) -> None:
        self.data_dir = data_dir
        self.started = time.monotonic()
        config = RaftConfig(
            election_ticks=10,
            heartbeat_ticks=2,
            compact_every_operations=500,
            compact_number_entries=500,
        )
        self.c = Cluster(
            [f"n{i}" for i in range(1, 6)],
            seed=seed,
            config=config,
            # Loss and duplicates, but in-order links as over TCP (the tests also reorder).
            faults=Faults(drop=0.01, duplicate=0.01, min_delay=1, max_delay=3, reorder=False),
            on_trace=self.show,
            data_dir=data_dir,
            segment_bytes=4096,  # small segments, so whole-segment compaction shows here
        )
        self.written = 0

    def show(self, line: str) -> None:
        if any(k in line for k in SHOWN) and "snapshot_not_needed" not in line:
            print("   ", line)

    def chapter(self, title: str) -> None:
        print(f"\n== {title}")

    def leader(self) -> SimNode:
        self.c.run_until(lambda: self.c.leader() is not None, 300, "a leader")
        node = self.c.leader()
        assert node is not None
        return node

    def write(self, n: int) -> None:
        """Appends n records and waits for every one to be acknowledged (committed)."""
        pending: list[int] = []
        while len(pending) < n:
            index = self.c.propose(
                encode_record(
                    Record(key=b"user-%d" % (self.written % 40), value=b"v%d" % self.written)
                )
            )
            if index is None:
                self.c.step()
                continue
            pending.append(index)
            self.written += 1
            if len(pending) % 20 == 0:
                self.c.step()
        self.c.run_until(
            lambda: all(i in self.c.acked[0] or self._lost(i) for i in pending), 600, "commit"
        )
        for node in self.c._running():  # readers on every replica, checked against the HWM
            hwm = node.raft().commit
            self.c.read(node.id, 0, max(node.raft().log.first_index(), hwm - 100), hwm + 50)

    def _lost(self, index: int) -> bool:
        leader = self.c.leader()
        return leader is not None and leader.raft().commit >= index and index not in self.c.acked[0]

    def follower(self, k: int = 0) -> SimNode:
        lead = self.leader()
        return [n for _, n in sorted(self.c.nodes.items()) if n is not lead and n.up][k]

    def run(self) -> None:
        c = self.c
        self.chapter("1. Five nodes boot and elect a leader (pre-vote, randomized timeouts)")
        lead = self.leader()
        self.write(50)
        print(
            f"    leader {lead.id}, 50 records acknowledged, high-water mark {lead.raft().commit}"
        )

        self.chapter("2. A follower pauses; 400 writes later it is repaired by bounded backfill")
        slow = self.follower(0)
        c.pause(slow.id)
        self.write(400)
        lag = self.leader().raft().commit - slow.raft().commit
        cfg = c.config
        print(
            f"    {slow.id} is {lag} entries behind (backfill_threshold={cfg.backfill_threshold}, "
            f"rounds of <= {cfg.max_backfill_entries_per_round})"
        )
        c.resume(slow.id)
        self.write(20)
        c.run_until(lambda: slow.raft().commit >= self.leader().raft().commit, 300, "catch-up")
        st = self.leader().raft().status().followers[slow.id]
        print(
            f"    {slow.id} caught up in {st.backfill_rounds} backfill rounds "
            f"({st.backfill_entries} entries), then merged into live replication; "
            "writes never stopped"
        )

        self.chapter("3. A follower stops; the others compact past it: SnapshotRequired")
        stopped = self.follower(1)
        c.crash(stopped.id)
        self.write(1200)
        floor = self.leader().storages[0].first_index()
        print(
            f"    {stopped.id} stopped at {stopped.storages[0].last_index()}, "
            f"leader floor is {floor}"
        )
        c.restart(stopped.id)
        c.run_until(
            lambda: stopped.up and stopped.raft().commit >= self.leader().raft().commit - 5,
            400,
            "snapshot install",
        )
        if c.stats.snapshot_transfers:
            print(
                f"    {stopped.id} installed a snapshot (from a follower when one is eligible, "
                f"RATIS-2428) and caught up: {c.stats.snapshot_from_follower} of "
                f"{c.stats.snapshot_transfers} transfers came from a follower"
            )
        else:
            print(f"    {stopped.id} caught up by backfill alone: the log still held its entries")

        self.chapter("4. A learner joins; promotion is refused while it lags, then accepted")
        c.add_node("n6")
        c.change_membership("add_learner", "n6")
        c.run(2)
        c.pause("n6")
        c.run_until(
            lambda: self.leader().raft().pending_conf_index <= self.leader().raft().log.applied,
            100,
            "learner added",
        )
        self.write(40)
        refusal = c.change_membership("promote", "n6")
        print(f"    promotion refused: {refusal}")
        c.resume("n6")
        c.run_until(
            lambda: (lag := self.leader().raft().follower_lag("n6")) is not None and lag <= 10,
            300,
            "learner within the lag",
        )
        c.run(10)
        c.change_membership("promote", "n6")
        c.run_until(
            lambda: (
                "n6" in self.leader().raft().membership.voters
                and self.leader().raft().pending_conf_index <= self.leader().raft().log.applied
            ),
            100,
            "promotion committed",
        )
        print(f"    n6 promoted: voters are {sorted(self.leader().raft().membership.voters)}")

        self.chapter("5. The leader is cut off: it steps down (check-quorum), its tail is replaced")
        old = self.leader()
        c.isolate(old.id)
        orphan = c.propose(encode_record(Record(key=b"orphan", value=b"never-committed")))
        c.run_until(
            lambda: (n := c.leader()) is not None and n is not old and old.raft().role != "leader",
            300,
            "new leader",
        )
        self.write(10)
        c.heal()
        c.run_until(lambda: old.raft().commit >= self.leader().raft().commit, 300, "rejoin")
        kept = old.tables[0].get(b"orphan")
        print(
            f"    old leader {old.id} rejoined as follower; its uncommitted entry {orphan} was "
            f"{'KEPT (bug!)' if kept else 'truncated and replaced'}"
        )

        self.chapter("6. Summary")
        s = c.stats
        print(
            f"    {s.steps} steps, every invariant checked after each: election safety, log "
            "matching, leader completeness, state machine safety, durability of acknowledged "
            "entries, monotonic high-water marks, no read above the high-water mark"
        )
        print(
            f"    {s.acked} acknowledged appends, {s.elections} elections, {s.backfill_rounds} "
            f"backfill rounds, {s.snapshot_transfers} snapshot transfers, {s.reads} checked reads, "
            f"{c.network.dropped} messages dropped, {c.network.duplicated} duplicated"
        )
        for line in c.describe():
            print(line.split(" voters=")[0])

        self.chapter("7. On disk")
        print(
            "    every node kept its partition in a WAL directory (crashes above closed the files; "
            "restarts recovered from them). `raftctl wal check` on the leader's:"
        )
        c.close()
        leader_dir = os.path.join(self.data_dir, self.leader().id, "p0", "wal")
        for line in wal_report(analyze_wal(leader_dir)):
            print("   ", line.replace(self.data_dir, "<data>"))
        print(f"    ({time.monotonic() - self.started:.1f} s)")


def main() -> int:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print(f"raftlog demo: a simulated 5-node cluster under faults (seed {seed})")
    # Simulated crashes are process crashes, so the WALs run without fsync (logged once here).
    logging.getLogger("raftlog.storage").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="raftlog-demo-") as data_dir:
        try:
            Story(seed, data_dir).run()
        except InvariantViolation as exc:
            print(exc.render(), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
