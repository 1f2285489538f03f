"""The state of one partition beside its core: the only code that touches its core and storage.

Everything that changes the core (peer messages, client proposals, ticks, admin operations) goes
into the inbox and is taken in the node's pass (`Node._drive`), between one `advance` and the
next `ready`, so the core stays single-threaded while the node awaits the disk. Proposals that
arrive while an fsync is in flight become one batch in the next Ready: that is the group commit,
and one pass writes every partition's Ready before one fsync covers them all.

Per Ready: install a received snapshot, write entries and hard state, send a leader's appends
and heartbeats (`begin`); once durable, send the other messages, apply committed entries (waking
the appenders and the readers), serve snapshot requests, advance (`finish`), then start a
snapshot when one is due: the table is copied in the loop, encoded and written in a worker
thread, and the log is compacted behind it in the loop once it is durable (at most one in flight
per partition).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import Compacted, NotLeader, ProposalRefused
from raftlog.node.core.messages import AppendRequest, HeartbeatRequest, InstallSnapshot, Message
from raftlog.node.core.raft import MembershipOp, Raft, Ready, Role
from raftlog.node.core.snapshot_source import rank_snapshot_sources
from raftlog.node.core.types import Entry, SnapshotMeta, SnapshotRequest
from raftlog.node.server.commit_signal import CommitSignal
from raftlog.node.server.compaction_pass import (
    CompactionPass,
    PendingSnapshot,
    begin_snapshot,
    compact_behind,
    snapshot_covering,
)
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import StorageFailed
from raftlog.node.storage.snapshots import SnapshotReceiver

if TYPE_CHECKING:
    from raftlog.node.server.node import Node

log = logging.getLogger("raftlog.node")

# How long a leader waits, idle (everything it holds committed), before it tells followers a new
# high-water mark by a commit-only append. Under load the next append carries it and no message
# is spent on it. Follower reads trail by about this much, or by one append round under load.
COMMIT_TELL_DELAY = 0.002
STUCK_TICKS = 2  # ticks the driver left untaken before the clock answers overdue appenders


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class NotCommitted(Exception):
    """The entry was replaced by another leader's, or never reached a quorum in time."""


class LeadershipLost(Exception):
    """This node stopped leading before the entry committed: a new leader may still commit it
    or drop it, so the outcome is unknown (answered at once rather than at the deadline)."""


class PartlyAppended(Exception):
    """A batch longer than one append message, cut by a leader change: the new leader had
    received its first records and committed them; the rest were replaced."""


class SequenceConflict(Exception):
    """An idempotent append whose sequence numbers do not follow the producer's last ones."""


class AlreadyAppended(SequenceConflict):
    """A retry of sequences the producer appended long ago: in the log, once, but too old for
    their indexes to be remembered (PRODUCER_MEMORY)."""


class SnapshotTooOld(Exception):
    """This member has not applied far enough to give a target the snapshot it needs."""


class ProducerBusy(Exception):
    """The producer's earlier append with these sequence numbers is still in flight: retry."""


@dataclass
class Appended:
    partition: int
    first_index: int
    last_index: int
    term: int
    duplicate: bool = False  # a retry of records already in the log, answered from memory


@dataclass
class _Proposal:
    records: list[bytes]
    done: asyncio.Future[Appended]
    deadline: float  # time.monotonic() after which the appender is told TimeoutError
    producer: str | None = None  # an idempotent producer's, with its first sequence
    first_seq: int = 0


@dataclass
class _Waiter:
    first: int
    term: int
    done: asyncio.Future[Appended]
    deadline: float


@dataclass
class PartitionCounters:
    elections: int = 0
    backfill_rounds: int = 0
    backfill_entries: int = 0
    backfill_largest_round: int = 0
    snapshots_sent: int = 0
    snapshots_from_followers: int = 0  # transfers this leader had a follower stream
    snapshots_installed: int = 0
    snapshot_bytes_sent: int = 0
    snapshots_taken: int = 0  # snapshots of the local table made durable
    compactions: int = 0
    events: dict[str, int] = field(default_factory=dict)


class PartitionDriver:
    def __init__(
        self, node: Node, partition: int, raft: Raft, storage: DurableStorage, config: RaftConfig
    ) -> None:
        self.node = node
        self.p = partition
        self.raft = raft
        self.storage = storage
        self.config = config
        self.table = KeyedTable.restore(storage.snapshot_data())
        self.group = node.group  # the node's: one fsync for every partition's writes
        # The high-water mark readers are shown: the commit index of the last hard state in the
        # file (synced, or written out), so that a node killed after a read never comes back
        # with a lower one. The core's may be ahead of it until the next pass writes it: a
        # leader's commit moves when its own fsync returns, a follower's when an append arrives.
        self.high_water_mark = raft.commit
        self.marked = CommitSignal(lambda: self.high_water_mark)  # readers waiting for it
        self.applied = CommitSignal(lambda: self.table.applied_index)  # linearizable reads
        # Why the partition stopped writing: a disk fault, or a bug caught by the loop. Reads of
        # what it holds go on; appends get 503 with this reason.
        self.failed: Exception | None = storage.failed
        self.counters = PartitionCounters()
        self._calls: list[Callable[[], None]] = []
        self._proposals: list[_Proposal] = []
        self._waiters: dict[int, _Waiter] = {}  # last index of a batch -> its appender
        self._ticks = 0
        self._tell = False  # COMMIT_TELL_DELAY passed with a commit untold: tell it now
        self._unsent: list[Message] = []  # a Ready's messages that wait for its fsync
        self.early_unwritten = False  # appends `begin` sent that no peer link took at once
        # Snapshots received and offered to the core, by index (several may be offered before the
        # next Ready; it installs at most one, the others are dropped).
        self._offered: dict[int, tuple[SnapshotReceiver, SnapshotMeta, bytes]] = {}
        self._serving: set[str] = set()  # targets a snapshot is being streamed to
        # Producer -> the last sequence proposed in `_inflight_term` and not yet applied.
        self._inflight_seq: dict[str, int] = {}
        # Producer -> the call of `propose_idempotent` whose proposal set its mark: only that
        # call gives the mark back when it fails (a failure given back at once by the driver,
        # then again by its call a turn later, undid a retry's mark: records in twice).
        self._inflight_owner: dict[str, object] = {}
        self._inflight_term = 0
        self._read_ids = 0
        self._reads: dict[int, asyncio.Future[int]] = {}  # ReadIndex requests in flight
        self._snapshotting: asyncio.Task[CompactionPass | None] | None = None  # at most one
        self._snapshot_file: asyncio.Future[str] | None = None  # its write in the worker thread
        self._snapshot_error: Exception | None = None  # its write failed: stop the driver
        # Futures answered by the driver loop: failed with the driver's error if it stops first.
        self._on_core: set[asyncio.Future[Any]] = set()
        # With the continuous archive on (`server/archive.py`): the first index not known to be
        # archived, which compaction never passes; None: archiving is off.
        self.archive_floor: int | None = None

    # ================================================================== the inbox
    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the core in the driver loop (peer messages, admin operations); dropped
        once the partition stopped, whose inbox is never taken again (its peers go on sending)."""
        if self.failed is not None:
            return
        self._calls.append(fn)
        self.wake()

    def step(self, m: Message) -> None:
        self.call(lambda: self.raft.step(m))

    def tick(self) -> None:
        self._ticks += 1
        self.wake()
        if self._ticks > STUCK_TICKS:
            # The driver has not taken its ticks for a while (a hung fsync holds it): the
            # appenders past their deadline are answered from here, without it.
            now = time.monotonic()
            self._expire_waiters(now)
            for prop in self._proposals:
                if prop.deadline <= now and not prop.done.done():
                    # Never proposed now (`_take_inbox` drops it): it did not happen.
                    self._unproposed(prop, NotCommitted("not proposed in time: the disk stalled"))

    async def propose(
        self,
        records: list[bytes],
        timeout: float = float("inf"),
        producer: str | None = None,
        first_seq: int = 0,
    ) -> Appended:
        """Append records as one batch; returns once they are committed (durable on a quorum).

        Raises TimeoutError when they are not committed within about `timeout` seconds (checked
        on each tick, so up to one tick later, or STUCK_TICKS later while the driver is stuck:
        no timer per append); they may still commit. `producer` and `first_seq`: the records'
        sequences (`propose_idempotent`).
        """
        if self.failed is not None:
            raise self.failed
        fut: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + timeout
        self._proposals.append(_Proposal(records, fut, deadline, producer, first_seq))
        self.wake()
        return await fut

    def _unproposed(self, prop: _Proposal, e: Exception) -> None:
        """`prop` fails without reaching the log. A producer's later proposals still queued
        fail with it, and its mark goes back to before it, at once: proposed after it, they
        would put sequences in the log past a gap (a stalled disk expired one append of a
        producer and the next one, from another connection, went in)."""
        prop.done.set_exception(e)
        if prop.producer is None:
            return
        self._give_back(prop.producer, prop.first_seq)
        gap = NotCommitted(
            f"the append of {prop.producer}'s sequence {prop.first_seq} before it did not "
            "happen, and this one would leave a gap"
        )
        for later in self._proposals:
            if (
                later.producer == prop.producer
                and later.first_seq > prop.first_seq
                and not later.done.done()
            ):
                later.done.set_exception(gap)

    def _give_back(self, producer: str, first_seq: int) -> None:
        """Sequences from `first_seq` of `producer` are not in the log: a retry may propose
        them again (and none past them goes first)."""
        if self._inflight_seq.get(producer, -1) >= first_seq:
            self._inflight_seq[producer] = first_seq - 1
        self._inflight_owner.pop(producer, None)

    async def propose_idempotent(
        self, producer: str, first_seq: int, records: list[bytes], timeout: float = float("inf")
    ) -> Appended:
        """Append a producer's records exactly once, however often the same call is retried.

        The leader admits sequence `last + 1` only, where `last` covers what it applied and what
        it has in flight; a batch entirely at or below what was applied is answered with the
        indexes it got the first time. A new leader first applies its whole log (its no-op
        included), so every earlier record of the producer is in its table before it decides.
        """
        if self.raft.role != Role.LEADER:
            raise NotLeader(self.raft.leader)
        if self.raft.log.term(self.table.applied_index) != self.raft.term:
            raise ProducerBusy("a new leader is still applying its log; retry")
        if self._inflight_term != self.raft.term:
            self._inflight_seq, self._inflight_term = {}, self.raft.term
            self._inflight_owner = {}
        end = first_seq + len(records) - 1
        applied = self.table.last_sequence(producer)
        if first_seq <= applied:
            self._same_as_logged(producer, first_seq, records, min(end, applied))
        if end <= applied:
            first, last = self.table.placed(producer, first_seq), self.table.placed(producer, end)
            if first is None or last is None:
                raise AlreadyAppended(
                    f"sequences {first_seq}..{end} of {producer} were appended long ago "
                    f"(last is {applied}); too old to report their indexes"
                )
            return Appended(self.p, first[0], last[0], last[1], duplicate=True)
        last_known = max(applied, self._inflight_seq.get(producer, -1))
        if end <= last_known:
            raise ProducerBusy(f"sequences up to {last_known} of {producer} are in flight; retry")
        head: tuple[int, int] | None = None
        if first_seq <= applied == last_known:
            # A retry of a batch whose first records are in the log (`PartlyAppended`): only
            # the rest is proposed. Its answer spans both parts, other entries between them.
            head = self.table.placed(producer, first_seq)
            records, first_seq = records[applied - first_seq + 1 :], applied + 1
        if first_seq != last_known + 1:
            raise SequenceConflict(
                f"{producer} sent sequence {first_seq}, expected {last_known + 1}"
            )
        self._inflight_seq[producer] = end
        mine = self._inflight_owner[producer] = object()
        try:
            done = await self.propose(records, timeout, producer, first_seq)
        except (NotLeader, ProposalRefused, NotCommitted, StorageFailed):
            # Not in the log (refused, or replaced by another leader's entry): a retry may
            # propose the same sequences again. A timeout keeps the mark: the entries may still
            # commit, and until they are applied a retry is told to wait.
            if self._inflight_owner.get(producer) is mine:
                self._give_back(producer, first_seq)
            raise
        # Applied now (the table is ahead of the mark): the mark is no longer needed, and every
        # client's producer ids would otherwise pile up here for the whole term.
        if self._inflight_owner.get(producer) is mine:
            del self._inflight_seq[producer], self._inflight_owner[producer]
        if head is not None:  # where the first part went (if forgotten, the rest's first)
            done.first_index = head[0]
        return done

    def _same_as_logged(
        self, producer: str, first_seq: int, records: list[bytes], upto: int
    ) -> None:
        """A retry's records `first_seq..upto` against the producer's in the log: other
        content under the same sequences is another write under a producer id used before (a
        Spark `writeId` reused for other rows), a conflict rather than a duplicate whose rows
        would be dropped. What the table still places (the producer's last PRODUCER_MEMORY
        runs) and the log still holds is compared, a run at a time."""
        for seq, index, count in self.table.spans(producer, first_seq, upto):
            try:
                logged = self.raft.read_committed(index, index + count)
            except Compacted:
                continue
            for i, e in enumerate(logged):
                if e.data != records[seq - first_seq + i]:
                    raise SequenceConflict(
                        f"sequence {seq + i} of {producer} is in the log (index {e.index}) "
                        "with other content: another write under the same producer id"
                    )

    async def linearizable_point(self) -> int:
        """A ReadIndex read point, once applied: reading the table now is linearizable."""
        if self.failed is not None:
            raise self.failed
        self._read_ids += 1
        rid = self._read_ids
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reads[rid] = fut

        def ask() -> None:
            try:
                self.raft.read_index(rid)
            except NotLeader as e:
                self._reads.pop(rid, None)
                if not fut.done():
                    fut.set_exception(e)

        self.call(ask)
        index = await fut
        await self.applied.wait_at_least(index)
        return index

    def _answered_by_core(self) -> asyncio.Future[Any]:
        """A future the driver loop answers; raises at once if the driver has stopped."""
        if self.failed is not None:
            raise self.failed
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._on_core.add(fut)
        fut.add_done_callback(self._on_core.discard)
        return fut

    async def propose_membership(
        self, op: MembershipOp, member: str, timeout: float = float("inf")
    ) -> Appended:
        """A membership change, answered as an append is: once committed; `NotCommitted` when
        another leader's entry took its index; `LeadershipLost` as soon as this node stops
        leading first (the outcome is then unknown); TimeoutError past `timeout`. The core's
        refusals (`NotLeader`, `MembershipError`, `ProposalRefused`) are raised as they are."""
        done: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()

        def propose() -> None:
            # Watched from the pass that proposes it: a later one may already commit it.
            index, term = self.raft.propose_membership(op, member)
            self._waiters[index] = _Waiter(index, term, done, time.monotonic() + timeout)

        await self.run_on_core(propose)
        return await done

    async def run_on_core(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` in the driver loop and return its result (or raise its error, or the
        driver's if it stops first)."""
        fut = self._answered_by_core()

        def call() -> None:
            try:
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)

        self.call(call)
        return await fut

    # ================================================================== the node's pass
    # The node runs one pass over every partition with work (`Node._drive`): `begin` each (take
    # the inbox, the next Ready, write it), one fsync for all of them, then `finish` each (send,
    # apply, advance). A partition is never between `begin` and `finish` twice.

    def wake(self) -> None:
        """Have the node's next pass take this partition's inbox and Ready."""
        self.node.schedule(self)

    def has_work(self) -> bool:
        return bool(
            self._calls
            or self._ticks
            or self._tell
            or self._proposals
            or self._snapshot_error is not None
            or self.raft.has_ready()
        )

    def begin(self) -> Ready | None:
        """Take the inbox and, when the core has one, the next Ready: install its snapshot,
        write its entries and hard state, and send a leader's appends and heartbeats (which need
        not wait for this node's fsync). Returns the Ready for `finish`, after the fsync."""
        if self._snapshot_error is not None:
            raise self._snapshot_error
        self._take_inbox()
        if not self.raft.has_ready():
            return None
        rd = self.raft.ready()
        if rd.snapshot is not None:  # first: installing resets the log behind the snapshot
            self._install(rd.snapshot)
        for receiver, _, _ in self._offered.values():
            receiver.abort()  # offered but not wanted (stale, or superseded in the same batch)
        self._offered.clear()
        self.storage.write(rd.hard_state, rd.entries)
        # Entries wait for their fsync; term and vote were synced by their own atomic write;
        # a commit index alone rides with the next sync (after a power loss it may step back
        # to the last synced value, which Raft allows: the leader tells it again).
        self._unsent = rd.messages
        if rd.entries:
            # A leader's appends and heartbeats go out while its own fsync runs (Raft
            # dissertation 10.2.1; etcd does the same): they claim nothing about this node's
            # disk, and the core counts the leader in a quorum only once `advance` marks its
            # entries stable, after the fsync. Every other message (an AppendResponse says
            # "durable here", a vote relies on the term and vote written above) waits for it.
            early: list[Message] = [
                m for m in rd.messages if isinstance(m, AppendRequest | HeartbeatRequest)
            ]
            if early:
                self.early_unwritten = not self.node.transport.send(self.p, early)
                self._unsent = [
                    m for m in rd.messages if not isinstance(m, AppendRequest | HeartbeatRequest)
                ]
        return rd

    def finish(self, rd: Ready) -> None:
        """After the fsync covering `rd`'s entries (and its hard state, or the write of that
        alone): show readers its commit, send the rest, apply what committed, answer appenders
        and readers, advance the core, then start a snapshot when one is due."""
        self.early_unwritten = False
        written = rd.hard_state.commit if rd.hard_state is not None else 0
        shown = written > self.high_water_mark
        if shown:
            self.high_water_mark = written
        messages, self._unsent = self._unsent, []
        if messages:
            self.node.transport.send(self.p, messages)
        if rd.committed:
            self._apply(rd)  # wakes the readers waiting for the mark too
        elif shown or rd.snapshot is not None:  # a mark with nothing to apply: wake them
            self._notify()
        for req in rd.snapshot_requests:
            self._serve_snapshot(req)
        for ev in rd.events:
            self._count_event(ev.kind, ev.detail)
        for rs in rd.read_states:
            fut = self._reads.pop(rs.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(rs.index)
        if self._waiters and self.raft.role != Role.LEADER:
            lost, self._waiters = self._waiters, {}
            for index, w in lost.items():
                if not w.done.done():
                    w.done.set_exception(
                        LeadershipLost(f"{self.node.id} stopped leading before index {index}")
                    )
        if self._reads and self.raft.role != Role.LEADER:
            for fut in self._reads.values():  # the core dropped them when it stepped down
                if not fut.done():
                    fut.set_exception(NotLeader(self.raft.leader))
            self._reads.clear()
        self.raft.advance(rd)
        self._after_advance()

    def tell_commit_due(self) -> None:
        """COMMIT_TELL_DELAY passed since a commit followers have not heard of: tell them on the
        next pass, unless an append carried it meanwhile (checked there by the core)."""
        self._tell = True
        self.wake()

    def stop(self, e: Exception) -> None:
        """The partition stops accepting writes; reads of what it holds go on."""
        if self.failed is not None:
            return
        self.failed = e
        # Its peers elect without it (a leader hands over at once): it must not report itself
        # the leader (nor a leader it no longer hears) in status, readiness and hints.
        handoff = self.raft.step_down("the partition stopped writing")
        if handoff:
            self.node.transport.send(self.p, handoff)
        if isinstance(e, StorageFailed):
            log.error("p%d: %s", self.p, e)
        else:  # a bug: stop this partition loudly rather than go on in an unknown state
            log.error("p%d: the partition driver failed; writes are stopped", self.p, exc_info=e)
        for w in self._waiters.values():
            if not w.done.done():
                w.done.set_exception(e)
        for prop in self._proposals:
            if not prop.done.done():
                prop.done.set_exception(e)
        for fut in list(self._on_core):  # admin calls and a snapshot's adoption
            if not fut.done():
                fut.set_exception(e)
        for fut in self._reads.values():  # ReadIndex reads: never confirmed now
            if not fut.done():
                fut.set_exception(e)
        self._reads.clear()

    def _take_inbox(self) -> None:
        calls, self._calls = self._calls, []
        for fn in calls:
            fn()
        ticks, self._ticks = self._ticks, 0
        for _ in range(ticks):
            self.raft.tick()
        if ticks and self._waiters:
            self._expire_waiters(time.monotonic())
        props, self._proposals = self._proposals, []
        props = [p for p in props if not p.done.done()]  # not those told they were too late
        if props:
            self._propose(props)
        if self._tell:  # after the proposals: their appends carry the mark, if any came
            self._tell = False
            self.raft.tell_commit()

    def _propose(self, props: list[_Proposal]) -> None:
        records = [r for prop in props for r in prop.records]
        try:
            placed = self.raft.propose_batch(records)
        except (NotLeader, ProposalRefused) as e:
            for prop in props:
                if not prop.done.done():  # it may have been told its deadline passed
                    self._unproposed(prop, e)
            return
        i = 0
        for prop in props:
            first, term = placed[i]
            last = placed[i + len(prop.records) - 1][0]
            self._waiters[last] = _Waiter(first, term, prop.done, prop.deadline)
            i += len(prop.records)

    def _expire_waiters(self, now: float) -> None:
        """Tell appenders whose deadline passed that the outcome is unknown (TimeoutError)."""
        late = [i for i, w in self._waiters.items() if w.deadline <= now or w.done.done()]
        for i in late:
            w = self._waiters.pop(i)
            if not w.done.done():
                w.done.set_exception(TimeoutError(f"index {i} not committed in time"))

    def _install(self, wanted: SnapshotMeta) -> None:
        offered = self._offered.pop(wanted.index, None)
        assert offered is not None, "the core installed a snapshot never received"
        receiver, meta, data = offered
        assert meta == wanted, "the core installed another snapshot than the one received"
        index = meta.index
        self.storage.install_received(receiver, meta)
        self.table = KeyedTable.restore(data)
        # Committed and durable: readers of the table see its index, so the mark is there too.
        self.high_water_mark = max(self.high_water_mark, index)
        self.counters.snapshots_installed += 1
        log.info("p%d installed a snapshot at index %d", self.p, index)

    def _apply(self, rd: Ready) -> None:
        for e in rd.committed:
            self.table.apply(e)
            w = self._waiters.pop(e.index, None)
            if w is None or w.done.done():
                continue
            if e.term == w.term:
                w.done.set_result(Appended(self.p, w.first, e.index, e.term))
            else:
                w.done.set_exception(self._replaced(w, e))
        # Appenders whose entries were cut by a new leader's log and never come back.
        top = rd.committed[-1].index
        for index in [i for i in self._waiters if i < top]:
            w = self._waiters.pop(index)
            if not w.done.done():
                w.done.set_exception(NotCommitted(f"index {index} was replaced"))
        self._notify()

    def _notify(self) -> None:
        self.marked.notify()
        self.applied.notify()

    # ================================================================== local snapshots
    def _replaced(self, w: _Waiter, e: Entry) -> Exception:
        """What the appender of a batch whose last entry went to another term is told: the new
        leader may have had (and so committed) its first records, which are then in the log."""
        kept = w.first
        try:
            while kept < e.index and self.raft.log.term(kept) == w.term:
                kept += 1
        except Compacted:
            return LeadershipLost(f"index {e.index} was taken by term {e.term}'s leader")
        if kept == w.first:
            return NotCommitted(f"index {e.index} was taken by term {e.term}'s leader")
        return PartlyAppended(
            f"the first {kept - w.first} records of the batch were committed at indexes "
            f"{w.first}..{kept - 1} by term {e.term}'s leader, the rest were replaced"
        )

    def _after_advance(self) -> None:
        """Start a snapshot when one is due. Its bytes are encoded, written and fsynced in a
        worker thread (tens of ms for a large table, and two fsyncs); the log is compacted
        behind it only once it is durable, in the driver loop (`_finish_snapshot`)."""
        if self._snapshotting is None:
            self._start_snapshot(force=False)

    def _start_snapshot(self, force: bool) -> asyncio.Task[CompactionPass | None] | None:
        """Capture the table and start writing it; None when no snapshot is due (or, unless
        `force`d, while another is in flight: at most one at a time per partition)."""
        if self._snapshotting is not None:
            return None
        pending = begin_snapshot(self.storage, self.raft, self.table, self.config, force)
        if pending is None:
            return None
        task = asyncio.get_running_loop().create_task(self._write_snapshot(pending))
        task.add_done_callback(_retrieve)  # a failure is the driver's to report, not the task's
        self._snapshotting = task
        return task

    async def _write_snapshot(self, pending: PendingSnapshot) -> CompactionPass | None:
        def write() -> str:  # in a worker thread: touches only the capture and its own file
            return self.storage.write_snapshot_file(pending.meta, pending.capture.encode())

        self._snapshot_file = asyncio.ensure_future(asyncio.to_thread(write))
        try:
            path = await self._snapshot_file
        except Exception as e:
            # Any failure stops the driver on its next turn: a write's as any failed write, any
            # other (a bug, no memory to encode) loudly. Left alone, no snapshot would ever
            # start again and the log would grow without bound.
            error = self.storage.snapshot_write_failed(e) if isinstance(e, OSError) else e
            self._snapshot_error = error
            self._snapshotting = None
            self.wake()
            raise
        done: asyncio.Future[CompactionPass | None] = self._answered_by_core()

        def finish() -> None:  # in the driver loop, between two Readies
            self._snapshotting = None
            try:
                done.set_result(self._finish_snapshot(pending, path))
            except Exception as e:
                done.set_exception(e)
                raise  # and the partition stops, as when the pass ran in the loop

        self.call(finish)
        return await done

    def _finish_snapshot(self, pending: PendingSnapshot, path: str) -> CompactionPass | None:
        """The file is durable: make it the latest snapshot, then compact the log behind it."""
        if not self.storage.adopt_snapshot(pending.meta, path):
            return None  # a newer snapshot was installed from the leader meanwhile
        self.counters.snapshots_taken += 1
        done = compact_behind(
            self.storage,
            pending.meta.index,
            self.table.applied_index,
            self.config,
            self._retention_floor(),
        )
        if done.dropped:
            self.counters.compactions += 1
            log.info(
                "p%d snapshot at %d, compacted %d entries, floor %d",
                self.p,
                done.snapshot_index,
                done.dropped,
                done.floor,
            )
        return done

    def _retention_floor(self) -> int | None:
        """The lowest index compaction must keep: the retention holds', the archive's, and
        what followers a snapshot is bringing back still need (`Raft.catch_up_floor`)."""
        holds = (self.storage.holds.floor(), self.archive_floor, self.raft.catch_up_floor())
        floors = [f for f in holds if f is not None]
        return min(floors) if floors else None

    async def compact_now(self) -> CompactionPass | None:
        """An operator's snapshot-and-compaction pass of the table as applied now: waits for a
        snapshot in flight, then takes a new one; None when nothing is new since the last."""
        while True:
            if self.failed is not None:
                raise self.failed
            if self._snapshotting is not None:
                await asyncio.wait({self._snapshotting})
                continue
            started: asyncio.Task[CompactionPass | None] | None = await self.run_on_core(
                lambda: self._start_snapshot(force=True)
            )
            if started is not None:
                return await started
            if self._snapshotting is None:
                return None  # nothing applied since the latest snapshot

    async def settle(self) -> None:
        """Before the storage closes: let a snapshot file being written finish (it stays on
        disk, not adopted, which a restart handles like a crash right after its rename)."""
        task = self._snapshotting
        if task is None:
            return
        if self._snapshot_file is not None:
            await asyncio.wait({self._snapshot_file})
        task.cancel()
        await asyncio.wait({task})

    def read_committed(self, lo: int, hi: int) -> list[Entry]:
        """Entries in [lo, hi) at or below the mark readers are shown (`high_water_mark`)."""
        return self.raft.read_committed(lo, min(hi, self.high_water_mark + 1))

    def _count_event(self, kind: str, detail: dict[str, Any]) -> None:
        c = self.counters
        c.events[kind] = c.events.get(kind, 0) + 1
        if kind == "elected":
            c.elections += 1
        elif kind == "backfill_round":
            size = int(detail.get("last", 0)) - int(detail.get("first", 0)) + 1
            c.backfill_rounds += 1
            c.backfill_entries += size
            c.backfill_largest_round = max(c.backfill_largest_round, size)

    # ================================================================== snapshots
    def _serve_snapshot(self, req: SnapshotRequest) -> None:
        if self.node.settings.snapshot_install == "operator":
            return  # SnapshotRequired stays visible until the operator calls snapshot-install
        if req.target in self._serving:
            return
        self._start_serving(req.target)
        asyncio.get_running_loop().create_task(self._stream_snapshot(req))

    def _start_serving(self, target: str) -> None:
        """A snapshot stream to `target` begins: one at a time, and the core keeps what the
        target will need after it until `report_snapshot` (`Raft.snapshot_transfer`)."""
        self._serving.add(target)
        self.raft.snapshot_transfer(target)

    def _end_serving(self, target: str, ok: bool) -> None:
        """The stream `_start_serving` began has ended, `ok` if `target` has the snapshot."""
        self._serving.discard(target)
        self.call(lambda: self.raft.report_snapshot(target, ok))

    async def _stream_snapshot(self, req: SnapshotRequest) -> None:
        """Have the snapshot streamed: by an eligible follower first (per policy), else by us."""
        ok = False
        try:
            sources = self._follower_sources(req.target, req.required_index)
            for source in sources:
                if await self._ask_follower(source, req):
                    self.counters.snapshots_from_followers += 1
                    ok = True
                    break
            if not ok:
                await self.stream_own_snapshot(req.target, req.term, req.required_index)
                ok = True
        except Exception as e:  # the leader retries with back-off
            log.warning("p%d snapshot to %s failed: %s", self.p, req.target, e)
        finally:
            self._end_serving(req.target, ok)

    async def install_on(self, target: str, source: str) -> dict[str, Any]:
        """An operator's install of a snapshot on `target` from `source` (a follower or
        "leader"); an ineligible or failing follower falls back to the leader."""
        if self.raft.role != Role.LEADER:
            raise NotLeader(self.raft.leader)
        st = self.raft.status().followers.get(target)
        if st is None:
            raise ProposalRefused(f"{target} is not a member of partition {self.p}")
        if not st.snapshot_required:
            return {"status": "already_installed", "target": target, "state": str(st.state),
                    "lag": st.lag}  # fmt: skip
        if target in self._serving:
            raise ProposalRefused(f"a snapshot is already being streamed to {target}")
        required = self.storage.compaction_floor() - 1
        self._start_serving(target)
        ok, used, note = False, "leader", ""
        try:
            if source != "leader":
                eligible = self._follower_sources(target, required, always=True)
                if source not in eligible:
                    note = (
                        f"{source} is not eligible (unresponsive, or its match is below {required})"
                    )
                else:
                    req = SnapshotRequest(target, required, self.raft.term, 0)
                    if await self._ask_follower(source, req):
                        ok, used = True, source
                        self.counters.snapshots_from_followers += 1
                    else:
                        note = f"{source} could not stream it"
            if not ok:
                await self.stream_own_snapshot(target, self.raft.term, required)
                ok = True
        finally:
            self._end_serving(target, ok)
        result: dict[str, Any] = {"status": "installed", "target": target, "source": used}
        if note:
            result["fell_back_to_leader"] = note
        return result

    def _follower_sources(self, target: str, required: int, always: bool = False) -> list[str]:
        if self.node.settings.snapshot_source != "follower-first" and not always:
            return []
        return rank_snapshot_sources(
            self.raft.status().followers.values(),
            target=target,
            required_index=required,
            leader_last_index=self.raft.log.last_index(),
            now_tick=self.raft.ticks,
            responsive_within=self.config.election_ticks,
        )

    async def _ask_follower(self, source: str, req: SnapshotRequest) -> bool:
        """Ask `source` to stream its snapshot to the target; False when it declines or fails."""
        try:
            await self.node.transport.request_snapshot_send(
                source, self.p, req.target, self.node.id, req.term, req.required_index
            )
        except Exception as e:
            log.info("p%d %s did not stream to %s (%s); trying next", self.p, source, req.target, e)
            return False
        log.info("p%d snapshot for %s streamed by follower %s", self.p, req.target, source)
        return True

    async def stream_own_snapshot(self, target: str, term: int, required: int) -> int:
        """Stream this node's snapshot (covering `required`) to `target`; returns its bytes."""
        meta, data = snapshot_covering(self.storage, self.raft, self.table, required)
        if meta.index < required:
            raise SnapshotTooOld(f"{self.node.id} has applied only up to {meta.index} < {required}")
        leader = self.raft.leader or self.node.id
        sent = await self.node.transport.send_snapshot(target, self.p, leader, term, meta, data)
        self.counters.snapshots_sent += 1
        self.counters.snapshot_bytes_sent += sent
        return sent

    def snapshot_received(
        self, leader: str, term: int, receiver: SnapshotReceiver, meta: SnapshotMeta, data: bytes
    ) -> None:
        """A whole, verified snapshot arrived: offer it to the core."""

        def offer() -> None:
            if meta.index in self._offered:
                return  # the same snapshot again (a retransmitted last chunk): one offer is enough
            self._offered[meta.index] = (receiver, meta, data)
            self.raft.step(InstallSnapshot(leader, self.node.id, term, meta))

        self.call(offer)
