"""A deterministic simulated cluster: real Raft cores, in-memory disks, a faulty network.

Everything that varies comes from one seed: the network's faults, the workload, and every core's
election timeouts. The same seed replays the same run exactly. After every step the invariants
of `invariants.py` are checked; a violation raises with the seed and the recent timeline.
"""

from __future__ import annotations

import os
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import (
    Compacted,
    MembershipError,
    NotLeader,
    ProposalRefused,
    SafetyViolation,
)
from raftlog.node.core.liveness import PeerLiveness
from raftlog.node.core.messages import InstallSnapshot, Message
from raftlog.node.core.partition_host import PartitionHost
from raftlog.node.core.raft import MembershipOp, Raft, Ready, Role
from raftlog.node.core.snapshot_source import rank_snapshot_sources
from raftlog.node.core.storage import WritableStorage
from raftlog.node.core.types import Membership, SnapshotMeta
from raftlog.node.server.compaction_pass import (
    PendingSnapshot,
    applied_snapshot_meta,
    begin_snapshot,
    compact_behind,
    snapshot_covering,
)
from raftlog.node.sim.invariants import ClusterChecker, InvariantViolation
from raftlog.node.sim.network import Faults, Network
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.memory import MemoryStorage

SnapshotPolicy = Literal["follower-first", "leader"]


@dataclass(frozen=True)
class PeerMessage:
    partition: int
    message: Message


@dataclass(frozen=True)
class NodePing:
    """A node's ping to a peer, once per heartbeat (the node pair's liveness, `liveness.py`)."""


@dataclass(frozen=True)
class SnapshotTransfer:
    """Snapshot bytes streamed by `source` on behalf of the leader (`leader`, `term`)."""

    partition: int
    leader: str
    term: int
    source: str
    meta: SnapshotMeta
    data: bytes


@dataclass
class SimNode:
    id: str
    storages: dict[int, WritableStorage]
    tables: dict[int, KeyedTable]
    host: PartitionHost | None = None  # None while crashed
    paused: bool = False
    held: list[tuple[str, object]] = field(default_factory=list)  # delivered while paused
    restarts: int = 0
    retired: bool = False  # removed from the cluster for good
    # partition -> snapshot index -> what was received (several may arrive in one batch)
    pending_snapshots: dict[int, dict[int, tuple[SnapshotMeta, bytes]]] = field(
        default_factory=dict
    )
    # partition -> (tick its file is durable, the capture): a snapshot being written, as the
    # node's worker thread does while the table goes on applying
    snapshotting: dict[int, tuple[int, PendingSnapshot]] = field(default_factory=dict)
    # (partition, ReadIndex request id) -> highest index acknowledged before it was asked
    reads: dict[tuple[int, int], int] = field(default_factory=dict)
    liveness: PeerLiveness = field(default_factory=lambda: PeerLiveness(0))

    @property
    def up(self) -> bool:
        return self.host is not None and not self.retired

    def raft(self, partition: int = 0) -> Raft:
        if self.host is None:
            raise RuntimeError(f"{self.id} is down")
        return self.host.partitions[partition]


@dataclass
class Stats:
    proposals: int = 0
    acked: int = 0
    reads: int = 0
    entries_read: int = 0
    linearizable_reads: int = 0
    crashes: int = 0
    pauses: int = 0
    partitions: int = 0
    snapshot_transfers: int = 0
    snapshot_from_follower: int = 0
    elections: int = 0
    backfill_rounds: int = 0
    promotions_refused: int = 0
    membership_changes: int = 0
    quiesced: int = 0  # a leader quiesced its partition
    wakes: int = 0  # a quiesced partition woken because a peer went silent
    steps: int = 0


class Cluster:
    def __init__(
        self,
        voters: list[str],
        *,
        seed: int,
        config: RaftConfig | None = None,
        partitions: int = 1,
        faults: Faults | None = None,
        snapshot_policy: SnapshotPolicy = "follower-first",
        raft_cls: type[Raft] = Raft,
        trace_limit: int = 300,
        on_trace: Callable[[str], None] | None = None,
        compaction: bool = True,
        data_dir: str | None = None,
        segment_bytes: int = 4096,
    ) -> None:
        """`data_dir` runs every node on the durable WAL storage in that directory (a crash
        closes it and a restart recovers it from disk) instead of the in-memory storage."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config or RaftConfig()
        self.partitions = partitions
        self.network = Network(random.Random(seed * 7919 + 1), faults or Faults())
        self._batch_rng = random.Random(seed * 104729 + 7)
        self._disk_rng = random.Random(seed * 15485863 + 3)  # how long snapshot writes take
        self._read_ids = 0
        self.snapshot_policy = snapshot_policy
        self.raft_cls = raft_cls
        self.compaction = compaction
        self.data_dir = data_dir
        self.segment_bytes = segment_bytes
        self.now = 0
        self.trace: deque[str] = deque(maxlen=trace_limit)
        self.on_trace = on_trace
        self.stats = Stats()
        self.checker = ClusterChecker(partitions, self._violation)
        self.nodes: dict[str, SimNode] = {}
        bootstrap = Membership(frozenset(voters))
        for node_id in voters:
            self._create_node(node_id, bootstrap)
        # (partition, leader) -> index -> (term, payload) awaiting commit
        self._pending: dict[tuple[int, str], dict[int, tuple[int, bytes]]] = {}
        self.acked: list[dict[int, tuple[int, bytes]]] = [{} for _ in range(partitions)]

    # ================================================================== lifecycle
    def _create_node(self, node_id: str, bootstrap: Membership) -> SimNode:
        storages = {p: self._open_storage(node_id, p, bootstrap) for p in range(self.partitions)}
        tables = {p: KeyedTable() for p in range(self.partitions)}
        node = SimNode(node_id, storages, tables)
        self.nodes[node_id] = node
        self._boot(node)
        return node

    def _open_storage(self, node_id: str, p: int, bootstrap: Membership) -> WritableStorage:
        if self.data_dir is None:
            return MemoryStorage(bootstrap)
        # A simulated crash is a process crash: what was written is in the page cache and
        # survives it, so fsync is not needed for the model to hold (and is slow).
        return DurableStorage(
            os.path.join(self.data_dir, node_id, f"p{p}"),
            bootstrap=bootstrap,
            durable=False,
            segment_bytes=self.segment_bytes,
        )

    def _boot(self, node: SimNode) -> None:
        node.liveness = PeerLiveness(self.config.election_ticks, self.now)
        node.host = PartitionHost(
            node.id,
            self.config,
            self.partitions,
            storage_for=lambda p: node.storages[p],
            seed=self.seed * 31 + node.restarts,
            raft_cls=self.raft_cls,
        )
        for p in range(self.partitions):
            node.tables[p] = KeyedTable.restore(node.storages[p].snapshot_data())
            self.checker.on_boot(p, node.id, node.raft(p))

    def add_node(self, node_id: str) -> SimNode:
        """A brand-new, empty node (it knows no members until a leader adds it)."""
        if node_id in self.nodes:
            raise ValueError(f"{node_id} exists")
        self.log(f"{node_id} started empty")
        return self._create_node(node_id, Membership())

    def crash(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.host is None:
            return
        node.host = None
        if self.data_dir is not None:
            # Drop every open file and recover each partition from its directory, as a restarted
            # process will (done now, so the checks can keep reading a down node's disk).
            for p, storage in node.storages.items():
                assert isinstance(storage, DurableStorage)
                storage.close()
                node.storages[p] = self._open_storage(node.id, p, Membership())
        node.paused = False
        node.held.clear()
        node.pending_snapshots.clear()
        node.snapshotting.clear()
        node.reads.clear()
        self.stats.crashes += 1
        for key in [k for k in self._pending if k[1] == node_id]:
            del self._pending[key]
        self.log(f"{node_id} CRASHED (volatile state lost)")

    def restart(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.host is not None or node.retired:
            return
        node.restarts += 1
        self._boot(node)
        self.log(f"{node_id} restarted from its disk (restart #{node.restarts})")

    def close(self) -> None:
        """Release the files of durable storages (the directory stays for inspection)."""
        for node in self.nodes.values():
            for storage in node.storages.values():
                if isinstance(storage, DurableStorage):
                    storage.close()

    def retire(self, node_id: str) -> None:
        self.crash(node_id)
        self.nodes[node_id].retired = True
        self.log(f"{node_id} retired (removed from the cluster)")

    def pause(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if node.up and not node.paused:
            node.paused = True
            self.stats.pauses += 1
            self.log(f"{node_id} PAUSED")

    def resume(self, node_id: str) -> None:
        node = self.nodes[node_id]
        if not node.paused:
            return
        node.paused = False
        self.log(f"{node_id} resumed with {len(node.held)} held messages")
        held, node.held = node.held, []
        for src, payload in held:  # all stepped, then one Ready: a driver catching up
            self._deliver(src, node, payload, process=False)
        self._process(node)

    def isolate(self, node_id: str) -> None:
        others = [n for n in self.nodes if n != node_id]
        self.partition([node_id], others)

    def partition(self, *groups: list[str]) -> None:
        self.network.partition(*groups)
        self.stats.partitions += 1
        self.log(f"network PARTITIONED {' | '.join(','.join(g) for g in groups)}")

    def heal(self) -> None:
        if self.network.partitioned:
            self.log("network healed")
        self.network.heal()

    # ================================================================== time
    def step(self) -> None:
        """One tick: deliver due messages, tick every running core, handle their Ready."""
        self.now += 1
        self.stats.steps += 1
        # A node's driver may step several messages before it takes the next Ready (the node
        # server's inbox does): half the deliveries are processed at once, the rest together
        # at the end of the tick, so Readies that combine messages are exercised too.
        batched: dict[str, SimNode] = {}
        for src, dst, payload in self.network.due(self.now):
            node = self.nodes.get(dst)
            if node is None or not node.up:
                continue
            if node.paused:
                node.held.append((src, payload))
                continue
            self._deliver(src, node, payload, process=False)
            if self._batch_rng.random() < 0.5:
                self._process(node)
            else:
                batched[node.id] = node
        for node in batched.values():
            self._process(node)
        for node in self._running():
            assert node.host is not None
            node.host.tick()
            self._wake_silent(node)
            self._process(node)
        self.checker.after_step(self)

    def _wake_silent(self, node: SimNode) -> None:
        """As the node's clock does: while any of its partitions is quiesced, ping every peer
        each heartbeat, and wake the quiesced partitions that rely on a peer gone silent."""
        assert node.host is not None
        quiet = [(p, r) for p, r in node.host.partitions.items() if r.quiesced]
        if not quiet:
            return
        peers = set().union(*(r.membership.members for _, r in quiet)) - {node.id}
        if self.now % self.config.heartbeat_ticks == 0:
            for peer in sorted(peers):
                self.network.send(self.now, node.id, peer, NodePing())
        silent = node.liveness.silent(peers, self.now)
        if silent:
            for p, raft in quiet:
                if raft.quiesced:
                    raft.wake_if_silent(silent)
                    if not raft.quiesced:
                        self.stats.wakes += 1
                        self.log(f"{node.id} p{p} woken: {sorted(silent)} silent")

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step()

    def run_until(self, predicate: Callable[[], bool], max_ticks: int, what: str) -> int:
        for i in range(max_ticks):
            if predicate():
                return i
            self.step()
        if predicate():
            return max_ticks
        self._violation("liveness", f"{what} did not happen within {max_ticks} ticks")
        raise AssertionError("unreachable")

    def _running(self) -> list[SimNode]:
        return [n for _, n in sorted(self.nodes.items()) if n.up and not n.paused]

    # ================================================================== message handling
    def _deliver(self, src: str, node: SimNode, payload: object, process: bool = True) -> None:
        if node.host is None:
            return
        node.liveness.heard(src, self.now)
        if isinstance(payload, PeerMessage):
            node.raft(payload.partition).step(payload.message)
        elif isinstance(payload, SnapshotTransfer):
            self._receive_snapshot(node, payload)
        if process:
            self._process(node)

    def _process(self, node: SimNode) -> None:
        host = node.host
        if host is None:
            return
        for p, raft in host.partitions.items():
            while raft.has_ready():
                rd = raft.ready()
                written = self._handle_ready(node, p, raft, rd)
                raft.advance(rd)
                self.checker.after_ready(p, node.id, raft, node.storages[p], written)
            if self.compaction:
                self._maybe_compact(node, p, raft)

    def _handle_ready(self, node: SimNode, p: int, raft: Raft, rd: Ready) -> int | None:
        """Carry out a Ready; returns the lowest index written to storage, if any."""
        storage = node.storages[p]
        written: int | None = None
        if rd.snapshot is not None:  # first: installing resets the log behind the snapshot
            received = node.pending_snapshots.pop(p, {})
            assert rd.snapshot.index in received, "the core installs a snapshot never received"
            meta, data = received[rd.snapshot.index]
            assert meta == rd.snapshot, "installed snapshot differs from the received one"
            storage.install_snapshot(meta, data)
            written = meta.index + 1
            node.tables[p] = KeyedTable.restore(data)
            self.log(f"{node.id} p{p} installed snapshot at {meta.index}")
        else:
            node.pending_snapshots.pop(p, None)
        storage.save(rd.hard_state, rd.entries)  # durable before anything is sent
        if rd.entries:
            written = min(written or rd.entries[0].index, rd.entries[0].index)
        for m in rd.messages:
            self.network.send(self.now, node.id, m.dst, PeerMessage(p, m))
        pending = self._pending.get((p, node.id))
        for e in rd.committed:
            node.tables[p].apply(e)
            self.checker.on_apply(p, node.id, e)
            if pending and e.index in pending:
                term, payload = pending.pop(e.index)
                if term == e.term:
                    self.acked[p][e.index] = (e.term, payload)
                    self.stats.acked += 1
                    self.checker.on_ack(p, e)
        for rs in rd.read_states:
            asked = node.reads.pop((p, rs.request_id), None)
            if asked is not None:
                self.stats.linearizable_reads += 1
                self.checker.on_read_index(p, node.id, raft, rs.index, asked)
        for ev in rd.events:
            if ev.kind == "elected":
                self.stats.elections += 1
                self.checker.on_elected(p, node.id, raft, ev.term)
            elif ev.kind == "backfill_round":
                self.stats.backfill_rounds += 1
            elif ev.kind == "quiesced":
                self.stats.quiesced += 1
            self.log(f"p{p} {ev}")
        for req in rd.snapshot_requests:
            self._serve_snapshot(node, p, raft, req.target, req.required_index)
        return written

    # ================================================================== snapshots
    def _maybe_compact(self, node: SimNode, p: int, raft: Raft) -> None:
        """As the node's driver: capture the table when a snapshot is due, write it over a few
        ticks while the table goes on applying, then adopt it and compact behind the applied
        index of that moment (so the snapshot index, not `compact_number_entries`, may bound
        the floor)."""
        storage, table = node.storages[p], node.tables[p]
        writing = node.snapshotting.get(p)
        if writing is None:
            pending = begin_snapshot(storage, raft, table, self.config)
            if pending is not None:
                node.snapshotting[p] = (self.now + self._disk_rng.randint(0, 4), pending)
            return
        durable_at, pending = writing
        if self.now < durable_at:
            return
        del node.snapshotting[p]
        storage.create_snapshot(pending.meta, pending.capture.encode())
        if storage.snapshot_meta().index != pending.meta.index:
            return  # a newer snapshot was installed from the leader meanwhile
        done = compact_behind(
            storage, pending.meta.index, table.applied_index, self.config, raft.catch_up_floor()
        )
        if done.dropped:
            self.log(
                f"{node.id} p{p} snapshot at {done.snapshot_index}, compacted {done.dropped} "
                f"entries, floor {done.floor}"
            )

    def _serve_snapshot(
        self, leader: SimNode, p: int, raft: Raft, target: str, required: int
    ) -> None:
        source = leader
        if self.snapshot_policy == "follower-first":
            ranked = rank_snapshot_sources(
                raft.status().followers.values(),
                target=target,
                required_index=required,
                leader_last_index=raft.log.last_index(),
                now_tick=raft.ticks,
                responsive_within=self.config.election_ticks,
            )
            for cand in ranked:
                c = self.nodes[cand]
                # The follower declines (and the leader falls back) when it is unreachable
                # or has not applied far enough to cover what the target needs.
                if c.up and not c.paused and c.tables[p].applied_index >= required:
                    source = c
                    break
        table = source.tables[p]
        if source is not leader:  # a follower source sends its table as applied now
            meta, data = applied_snapshot_meta(source.raft(p), table), table.snapshot()
        else:
            meta, data = snapshot_covering(source.storages[p], source.raft(p), table, required)
        self.stats.snapshot_transfers += 1
        if source is not leader:
            self.stats.snapshot_from_follower += 1
        self.log(
            f"p{p} snapshot of {source.id} at {meta.index} sent to {target} "
            f"({'follower' if source is not leader else 'leader'} source, needs >= {required})"
        )
        transfer = SnapshotTransfer(p, leader.id, raft.term, source.id, meta, data)
        self.network.send(self.now, source.id, target, transfer, extra_delay=2)

    def _receive_snapshot(self, node: SimNode, t: SnapshotTransfer) -> None:
        node.pending_snapshots.setdefault(t.partition, {})[t.meta.index] = (t.meta, t.data)
        node.raft(t.partition).step(InstallSnapshot(t.leader, node.id, t.term, t.meta))

    # ================================================================== client side
    def leader(self, partition: int = 0) -> SimNode | None:
        best: SimNode | None = None
        for node in self._running():
            r = node.raft(partition)
            if r.role == Role.LEADER and (best is None or r.term > best.raft(partition).term):
                best = node
        return best

    def propose(self, payload: bytes, partition: int = 0, via: str | None = None) -> int | None:
        node = self.nodes[via] if via else self.leader(partition)
        if node is None or not node.up or node.paused:
            return None
        try:
            index, term = node.raft(partition).propose(payload)
        except (NotLeader, ProposalRefused):
            return None
        self.stats.proposals += 1
        self._pending.setdefault((partition, node.id), {})[index] = (term, payload)
        self._process(node)
        return index

    def change_membership(self, op: MembershipOp, member: str, partition: int = 0) -> str | None:
        """Proposes a change on the leader. Returns None, or the refusal reason."""
        refusal = self._ask_leader(
            partition, f"{op} {member}", "proposed", lambda r: r.propose_membership(op, member)
        )
        if refusal is None:
            self.stats.membership_changes += 1
        elif op == "promote":
            self.stats.promotions_refused += 1
        return refusal

    def transfer_leadership(self, target: str, partition: int = 0) -> str | None:
        """Asks the leader to hand over to `target`. Returns None, or the refusal reason."""
        return self._ask_leader(
            partition, f"transfer to {target}", "requested", lambda r: r.transfer_leadership(target)
        )

    def _ask_leader(
        self, partition: int, subject: str, verb: str, call: Callable[[Raft], object]
    ) -> str | None:
        """Runs an operation on the partition's leader, logging the outcome."""
        node = self.leader(partition)
        if node is None:
            return "no leader"
        try:
            call(node.raft(partition))
        except (MembershipError, NotLeader, ProposalRefused) as exc:
            self.log(f"p{partition} {subject} refused: {exc}")
            return str(exc)
        self.log(f"p{partition} {subject} {verb} on {node.id}")
        self._process(node)
        return None

    def read(self, node_id: str, partition: int, lo: int, hi: int) -> None:
        """A reader on any replica: checks it never gets an entry above the high-water mark."""
        node = self.nodes[node_id]
        if not node.up or node.paused:
            return
        raft = node.raft(partition)
        try:
            entries = raft.read_committed(lo, hi)
        except Compacted:
            return
        self.stats.reads += 1
        self.stats.entries_read += len(entries)
        self.checker.on_read(partition, node_id, raft, entries)

    def read_index(self, node_id: str, partition: int) -> None:
        """A linearizable read through `node_id` (ReadIndex): its read point must cover every
        entry acknowledged before it was asked."""
        node = self.nodes[node_id]
        if not node.up or node.paused:
            return
        self._read_ids += 1
        acked = max(self.acked[partition], default=0)
        try:
            node.raft(partition).read_index(self._read_ids)
        except NotLeader:
            return
        node.reads[(partition, self._read_ids)] = acked
        self._process(node)

    def applied_everywhere(self, partition: int, index: int) -> bool:
        """Every running member of the leader's configuration applied `index`."""
        leader = self.leader(partition)
        if leader is None:
            return False
        members = leader.raft(partition).membership.members
        for m in members:
            node = self.nodes.get(m)
            if node is None or not node.up or node.paused:
                return False
            if node.tables[partition].applied_index < index:
                return False
        return True

    # ================================================================== reporting
    def log(self, text: str) -> None:
        line = f"[t{self.now:05d}] {text}"
        self.trace.append(line)
        if self.on_trace:
            self.on_trace(line)

    def describe(self) -> list[str]:
        """One line per node and partition: the state at this instant."""
        lines = []
        for node_id, node in sorted(self.nodes.items()):
            if not node.up:
                lines.append(f"  {node_id}: {'retired' if node.retired else 'crashed'}")
                continue
            for p in range(self.partitions):
                st = node.raft(p).status()
                followers = " ".join(
                    f"{f.node}:{f.state}/m{f.match}/n{f.next}/lag{f.lag}/if{f.inflight}"
                    for f in st.followers.values()
                )
                lines.append(
                    f"  {node_id} p{p}{' PAUSED' if node.paused else ''}: {st.role} t{st.term} "
                    f"leader={st.leader} hwm={st.high_water_mark} applied={st.applied} "
                    f"last={st.last_index} floor={st.compaction_floor} "
                    f"{st.membership.describe()} {followers}".rstrip()
                )
        return lines

    def fail_from(self, error: SafetyViolation) -> None:
        """A core refused to break a rule (it raised): a violation with the seed and trace."""
        try:
            self._violation("core safety check", str(error))
        except InvariantViolation as v:
            raise v from error

    def _violation(self, invariant: str, detail: str) -> None:
        trace = [*self.trace, "state at the violation:", *self.describe()]
        raise InvariantViolation(invariant, detail, self.seed, self.now, trace)
