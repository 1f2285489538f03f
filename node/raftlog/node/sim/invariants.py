"""The invariants checked after every step of a simulation.

- election safety: at most one leader per term;
- log matching: two logs holding an entry with the same index and term agree on it and on every
  entry before it (checked inductively: an (index, term) always has the same payload and the
  same previous term, for every entry any node ever persists);
- leader completeness: a newly elected leader holds every entry committed so far;
- state machine safety: no two nodes ever apply different entries at the same index;
- durability: no acknowledged entry is ever lost (it stays committed at its index, and every
  node that holds that index holds that entry);
- the high-water mark of each node never goes backwards, restarts included;
- readers never get an entry above the replica's high-water mark, nor an uncommitted one;
- linearizable reads: a ReadIndex read point covers every entry acknowledged before the read was
  asked, and is committed on the node that answers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from raftlog.node.core.raft import Raft, Role
from raftlog.node.core.storage import LogStorage
from raftlog.node.core.types import Entry, EntryKind

if TYPE_CHECKING:
    from raftlog.node.sim.cluster import Cluster

Payload = tuple[EntryKind, bytes]


class InvariantViolation(AssertionError):
    def __init__(self, invariant: str, detail: str, seed: int, tick: int, trace: list[str]):
        self.invariant = invariant
        self.detail = detail
        self.seed = seed
        self.tick = tick
        self.trace = trace
        super().__init__(self.render(tail=60))

    def render(self, tail: int = 60) -> str:
        lines = [
            f"invariant violated: {self.invariant}: {self.detail}",
            f"seed={self.seed} tick={self.tick} (re-run this seed to reproduce it exactly)",
            f"last {min(tail, len(self.trace))} events:",
            *self.trace[-tail:],
        ]
        return "\n".join(lines)


class PartitionChecker:
    def __init__(self, partition: int, fail: Callable[[str, str], None]) -> None:
        self.p = partition
        self.fail = fail
        self.leaders: dict[int, str] = {}
        self.ids: dict[tuple[int, int], tuple[Payload, int]] = {}
        self.committed: dict[int, tuple[int, Payload]] = {}
        self.max_committed = 0
        self.hwm: dict[str, int] = {}
        # index -> the lowest term in which a leader had it committed. Leader completeness
        # holds for leaders of later terms (a leader of an older term may be elected late).
        self.commit_term: dict[int, int] = {}
        self.acked: dict[int, tuple[int, Payload]] = {}

    def on_boot(self, node: str, raft: Raft) -> None:
        self._check_hwm(node, raft.commit, "restart")

    def on_apply(self, node: str, e: Entry) -> None:
        seen = self.committed.get(e.index)
        payload = (e.kind, e.data)
        if seen is None:
            self.committed[e.index] = (e.term, payload)
            self.max_committed = max(self.max_committed, e.index)
        elif seen != (e.term, payload):
            self.fail(
                "state machine safety",
                f"p{self.p} {node} applied index {e.index} term {e.term}, but term {seen[0]} "
                "was applied there before",
            )

    def on_ack(self, e: Entry) -> None:
        self.acked[e.index] = (e.term, (e.kind, e.data))

    def on_elected(self, node: str, raft: Raft, term: int) -> None:
        """`node` won the election of `term` (its event; the core may have moved on since, when
        its driver stepped more messages before taking the Ready)."""
        other = self.leaders.get(term)
        if other is not None and other != node:
            self.fail("election safety", f"p{self.p} {other} and {node} both lead term {term}")
        self.leaders[term] = node
        if raft.term != term or raft.role != Role.LEADER:
            return  # deposed in the same batch: its log now is not the one it was elected with
        floor = raft.log.first_index()
        for index in range(floor, self.max_committed + 1):
            seen = self.committed.get(index)
            if seen is None or self.commit_term.get(index, term) >= term:
                continue
            has = raft.log.term_or_none(index)
            if has != seen[0]:
                self.fail(
                    "leader completeness",
                    f"p{self.p} new leader {node} of term {term} lacks committed entry {index} "
                    f"(term {seen[0]}; its log has {has})",
                )

    def after_ready(self, node: str, raft: Raft, storage: LogStorage, written: int | None) -> None:
        self._check_hwm(node, raft.commit, "ready")
        if raft.role == Role.LEADER:
            for index in range(raft.commit, 0, -1):
                if self.commit_term.get(index, raft.term + 1) <= raft.term:
                    break
                self.commit_term[index] = raft.term
        if written is None:
            return
        lo = max(written, storage.first_index())
        hi = storage.last_index()
        if lo > hi:
            return
        prev_term = storage.term(lo - 1)
        for e in storage.entries(lo, hi + 1):
            key = (e.index, e.term)
            val = ((e.kind, e.data), prev_term)
            seen = self.ids.get(key)
            if seen is None:
                self.ids[key] = val
            elif seen != val:
                self.fail(
                    "log matching",
                    f"p{self.p} {node} holds entry {e.index} term {e.term} that differs from "
                    f"another node's entry {e.index} term {e.term} (or its predecessor's term "
                    f"{prev_term} vs {seen[1]})",
                )
            committed = self.committed.get(e.index)
            if committed is not None and e.index <= raft.commit and committed[0] != e.term:
                self.fail(
                    "durability",
                    f"p{self.p} {node} holds entry {e.index} term {e.term} below its high-water "
                    f"mark, but term {committed[0]} was committed there",
                )
            prev_term = e.term

    def on_read(self, node: str, raft: Raft, entries: list[Entry]) -> None:
        for e in entries:
            if e.index > raft.commit:
                self.fail(
                    "read above high-water mark",
                    f"p{self.p} {node} served entry {e.index} above its high-water mark "
                    f"{raft.commit}",
                )
            seen = self.committed.get(e.index)
            if seen is not None and seen != (e.term, (e.kind, e.data)):
                self.fail(
                    "uncommitted read",
                    f"p{self.p} {node} served entry {e.index} term {e.term}, committed was term "
                    f"{seen[0]}",
                )

    def on_read_index(self, node: str, raft: Raft, index: int, acked_before: int) -> None:
        if index < acked_before:
            self.fail(
                "linearizable read",
                f"p{self.p} {node} answered a read at index {index}, but entry {acked_before} "
                "was acknowledged before the read was asked (a stale read)",
            )
        if index > raft.commit:
            self.fail(
                "linearizable read",
                f"p{self.p} {node} answered a read at index {index} above its high-water mark "
                f"{raft.commit}",
            )

    def _check_hwm(self, node: str, commit: int, when: str) -> None:
        before = self.hwm.get(node, 0)
        if commit < before:
            self.fail(
                "high-water mark monotonic",
                f"p{self.p} {node} high-water mark went from {before} back to {commit} ({when})",
            )
        self.hwm[node] = commit

    def check_final(self, cluster: Cluster) -> None:
        """No acknowledged entry lost: every running node that still holds the index holds
        that entry, and its applied state includes it."""
        leader = cluster.leader(self.p)
        if leader is None:
            self.fail("liveness", f"p{self.p} has no leader at the final check")
            return
        members = leader.raft(self.p).membership.members
        for node_id, node in sorted(cluster.nodes.items()):
            # Only members of the current configuration: a node whose addition was lost with
            # its leader never joined and holds nothing.
            if not node.up or node_id not in members:
                continue
            raft = node.raft(self.p)
            floor = raft.log.first_index()
            for index, (term, _) in self.acked.items():
                if index < floor:
                    continue
                if node.tables[self.p].applied_index < index:
                    self.fail(
                        "durability",
                        f"p{self.p} {node_id} has not applied acknowledged entry {index} "
                        f"(applied {node.tables[self.p].applied_index}) after convergence",
                    )
                has = raft.log.term_or_none(index)
                if has != term:
                    self.fail(
                        "durability",
                        f"p{self.p} acknowledged entry {index} term {term} lost on {node_id} "
                        f"(holds {has})",
                    )


class ClusterChecker:
    def __init__(self, partitions: int, fail: Callable[[str, str], None]) -> None:
        self.partitions = [PartitionChecker(p, fail) for p in range(partitions)]
        self.fail = fail

    def on_boot(self, p: int, node: str, raft: Raft) -> None:
        self.partitions[p].on_boot(node, raft)

    def on_apply(self, p: int, node: str, e: Entry) -> None:
        self.partitions[p].on_apply(node, e)

    def on_ack(self, p: int, e: Entry) -> None:
        self.partitions[p].on_ack(e)

    def on_elected(self, p: int, node: str, raft: Raft, term: int) -> None:
        self.partitions[p].on_elected(node, raft, term)

    def after_ready(
        self, p: int, node: str, raft: Raft, storage: LogStorage, written: int | None
    ) -> None:
        self.partitions[p].after_ready(node, raft, storage, written)

    def on_read(self, p: int, node: str, raft: Raft, entries: list[Entry]) -> None:
        self.partitions[p].on_read(node, raft, entries)

    def on_read_index(self, p: int, node: str, raft: Raft, index: int, acked_before: int) -> None:
        self.partitions[p].on_read_index(node, raft, index, acked_before)

    def after_step(self, cluster: Cluster) -> None:
        # Election safety also for leaders observed between events (e.g. after a restart).
        for node in cluster._running():
            for p, checker in enumerate(self.partitions):
                raft = node.raft(p)
                if raft.role == "leader":
                    other = checker.leaders.get(raft.term)
                    if other is not None and other != node.id:
                        self.fail(
                            "election safety",
                            f"p{p} {other} and {node.id} both lead term {raft.term}",
                        )
                    checker.leaders[raft.term] = node.id

    def check_final(self, cluster: Cluster) -> None:
        for checker in self.partitions:
            checker.check_final(cluster)
