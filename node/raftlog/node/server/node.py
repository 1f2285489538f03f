"""A node: every partition's core, storage and driver, the transport, and the clock."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time

from raftlog.node.core.liveness import PeerLiveness
from raftlog.node.core.raft import Raft
from raftlog.node.core.types import Membership
from raftlog.node.server.answers import AnswerBudget, BodyBudget
from raftlog.node.server.archive import make_archiver
from raftlog.node.server.metrics import NodeMetrics
from raftlog.node.server.partition import COMMIT_TELL_DELAY, PartitionDriver
from raftlog.node.settings import NodeSettings
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import LostFile
from raftlog.node.storage.fileio import FileOps, atomic_write
from raftlog.node.storage.group_commit import GroupCommit
from raftlog.node.storage.journal import Journal, lost_partitions
from raftlog.node.transport.codec import Item, Ping
from raftlog.node.transport.frames import foreign_cluster
from raftlog.node.transport.lograte import OncePer
from raftlog.node.transport.peers import Transport

# A checkpoint that failed without failing the journal (a segment not created, on a full
# disk; old ones not deleted) is tried again after this, not on every tick.
CHECKPOINT_RETRY_S = 5.0

log = logging.getLogger("raftlog.node")


def next_tick(last: float, now: float, period: float) -> float:
    """When the tick after the one due at `last` is due: a period later, or, when the loop was
    held up past that (a long fsync, a GIL-bound snapshot encode), a period from now. Missed
    ticks are dropped, as Go's time.Ticker (etcd's clock) drops them: taken in a burst, they
    would run out a follower's election timeout before it read the heartbeats that arrived
    during the stall, and it would campaign against a live leader."""
    due = last + period
    return due if due > now - period else now + period


def refuse_fewer_partitions(data_dir: str, partitions: int) -> None:
    """A count below the partitions this node holds (`p<N>` directories) is refused before
    anything is opened: started so, the node left those partitions out, and its journal's
    checkpoint dropped their records the WALs did not hold yet, so a start with the right
    count gave back a partition with its vote and without the entries it acknowledged."""
    held = sorted(
        int(name[1:])
        for name in (os.listdir(data_dir) if os.path.isdir(data_dir) else [])
        if name[:1] == "p"
        and name[1:].isdigit()
        and int(name[1:]) >= partitions
        and os.path.isdir(os.path.join(data_dir, name))
    )
    if held:
        named = ", ".join(f"{p} (p{p})" for p in held)
        raise ValueError(
            f"--partitions {partitions}: {data_dir} holds partition{'s' if len(held) > 1 else ''}"
            f" {named}: the partition count may be raised, never lowered; start it with "
            f"--partitions {held[-1] + 1} or more"
        )


CLUSTER_FILE = "cluster"


def claim_cluster(data_dir: str, cluster: str | None) -> None:
    """The data directory keeps the cluster it was made for (`settings.cluster`); a start naming
    another is refused before anything is opened: a volume mounted on the wrong member's pod,
    or a directory of another local cluster, would otherwise join its log to this cluster's."""
    if cluster is None:
        return
    path = os.path.join(data_dir, CLUSTER_FILE)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            kept = f.read().strip()
    except FileNotFoundError:
        os.makedirs(data_dir, exist_ok=True)
        atomic_write(path, (cluster + "\n").encode(), FileOps(), durable=True)
        return
    if kept != cluster:
        raise ValueError(
            f"--cluster {cluster}: {data_dir} belongs to cluster {kept!r} (its {CLUSTER_FILE} "
            f"file); give this member its own data directory, or start it with --cluster {kept}"
        )


class Node:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.id = settings.node_id
        self.started_at = time.time()  # this process's start: `/v1/status` says it
        self.token = settings.token()
        self.transport = Transport(
            self.id,
            dict(settings.peers),
            self.token,
            settings.client_ssl(),
            settings.frame_budget,
            settings.cluster,
        )
        self.metrics = NodeMetrics()
        self.answers = AnswerBudget(
            settings.max_answer_buffer_bytes, settings.answer_send_timeout_s
        )
        self.bodies = BodyBudget(settings.max_body_buffer_bytes)
        refuse_fewer_partitions(str(settings.data_dir), settings.partitions)
        claim_cluster(str(settings.data_dir), settings.cluster)
        self._foreign_logged = OncePer(60.0, keys=16)  # once a minute per cluster named
        # One journal and one group commit for every partition: one fsync per batch of the
        # whole node, however the appends are spread (`journal.py`).
        self.journal = Journal(
            os.path.join(settings.data_dir, "journal"),
            durable=settings.durable,
            checkpoint_bytes=settings.journal_checkpoint_bytes,
        )
        self.group = GroupCommit(
            self._timed_sync, inline_below=settings.fsync_in_loop_below_ms / 1000
        )
        self.drivers: dict[int, PartitionDriver] = {}
        config = settings.raft_config()
        paths = {p: os.path.join(settings.data_dir, f"p{p}") for p in range(settings.partitions)}
        for p, had in lost_partitions(str(settings.data_dir), self.journal.found).items():
            # Started empty, this member would vote as one that never held anything, and could
            # elect a leader without entries it acknowledged.
            when = f"up to {had} at its last checkpoint" if had else "since its last checkpoint"
            raise LostFile(
                paths.get(p, os.path.join(settings.data_dir, f"p{p}")),
                f"is missing, while this node's journal says partition {p} held entries "
                f"({when}): its log and its vote are lost. Restore the directory, or remove "
                "this member and add it back with an empty data directory and --join (the "
                "operator replaces a member whose volume is lost so)",
            )
        storages = {p: self._open(p, None) for p, path in paths.items() if os.path.isdir(path)}
        # Partitions with no directory yet start with the members this node is given: all of
        # them at a cluster's first start, and those added since (the partition count raised)
        # on every member alike. A member that joined an existing cluster and holds nothing yet
        # waits instead to be added to each partition by its leader.
        member = any(s.last_index() > 0 for s in storages.values())
        bootstrap = Membership(frozenset(settings.peers)) if member or not settings.join else None
        for p in paths:
            storage = storages.get(p) or self._open(p, bootstrap)
            for msg in storage.recovery:
                log.warning("p%d recovery: %s", p, msg)
            raft = Raft(self.id, config, storage, seed=random.randrange(1 << 30))
            self.drivers[p] = PartitionDriver(self, p, raft, storage, config)
        self.journal.start({p: d.storage.wal for p, d in self.drivers.items()})
        self.ticks = 0  # the clock's ticks, for the peers' liveness
        self.liveness = PeerLiveness(config.election_ticks)
        self._heartbeat_ticks = config.heartbeat_ticks
        self._checkpoint: asyncio.Task[None] | None = None
        self._checkpoint_retry_at = 0.0  # after a checkpoint that failed and may be retried
        self._tasks: list[asyncio.Task[None]] = []
        # Partitions with work for the next pass, in the order they asked (`schedule`).
        self._busy: dict[int, PartitionDriver] = {}
        self._work = asyncio.Event()
        self._untold: set[PartitionDriver] = set()  # leaders with a commit followers lack
        self._tell_timer: asyncio.TimerHandle | None = None
        # Messages for a partition this node lacks: each counted, logged once a minute per
        # sender and partition (each was logged: a flood of them was a flood of lines).
        self._unknown_logged = OncePer(60.0)
        self.archiver = make_archiver(self)  # None unless archive_url is set
        self.metrics.attach(self)

    def _open(self, p: int, bootstrap: Membership | None) -> DurableStorage:
        return DurableStorage(
            os.path.join(self.settings.data_dir, f"p{p}"),
            bootstrap=bootstrap,
            durable=self.settings.durable,
            segment_bytes=self.settings.segment_bytes,
            journal=self.journal.partition(p),
        )

    def _timed_sync(self) -> None:
        """The journal's sync, timed for `raftlog_fsync_seconds` (runs in the fsync thread)."""
        started = time.perf_counter()
        self.journal.sync()
        self.metrics.fsync.observe(time.perf_counter() - started)

    async def _durable(self) -> None:
        await self.group.durable(self.group.wrote())

    def _maybe_checkpoint(self) -> None:
        """Start a journal checkpoint once it holds `journal_checkpoint_bytes` (at most one)."""
        if not self.journal.due() or (self._checkpoint is not None and not self._checkpoint.done()):
            return
        loop = asyncio.get_running_loop()
        if self.journal.failed is not None or loop.time() < self._checkpoint_retry_at:
            return  # failed: every partition was stopped (a restart reopens the journal)

        async def run() -> None:
            try:
                await self.journal.checkpoint(
                    lambda: {p: d.storage.wal for p, d in self.drivers.items()}, self._durable
                )
            except Exception as e:
                if not self._stop_all_if_journal_failed():
                    # Nothing lost (a new segment not created, or old ones not deleted).
                    self._checkpoint_retry_at = loop.time() + CHECKPOINT_RETRY_S
                    log.error(
                        "journal checkpoint failed, tried again in %g s: %s", CHECKPOINT_RETRY_S, e
                    )

        self._checkpoint = loop.create_task(run())

    def _stop_all_if_journal_failed(self) -> bool:
        """Once the journal failed, stop every partition: it is all of theirs and takes no write
        now, and an idle one would otherwise go on leading (and look live) until its next."""
        failed = self.journal.failed
        if failed is None:
            return False
        for d in self.drivers.values():
            d.stop(failed)
        return True

    def foreign_caller(self, theirs: str | None, what: str, source: object) -> str | None:
        """Why `what` (a peer call) from `source`, naming cluster `theirs`, is refused (421), or
        None; logged once a minute per cluster named. The frame stream's handshake and the peer
        routes over HTTP both ask here."""
        reason = foreign_cluster(self.settings.cluster, theirs)
        if reason is not None and self._foreign_logged(theirs):
            log.warning("refused %s from %s: %s", what, source, reason)
        return reason

    async def start(self) -> None:
        await self.transport.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._drive()))
        self._tasks.append(loop.create_task(self._clock()))
        if self.archiver is not None:
            self.archiver.start()

    def schedule(self, d: PartitionDriver) -> None:
        """Have the next pass take `d`'s inbox and Ready."""
        if d.p not in self._busy:
            self._busy[d.p] = d
            self._work.set()

    async def _drive(self) -> None:
        """The node's Ready loop: one pass over every partition with work, one fsync per pass.

        Per partition, a turn costs a few task switches and an fsync wait of its own when each
        runs its own loop; at 16 partitions under load that was most of a leader's CPU per
        append (bench/partitions.py, bench/RESULTS.md).
        """
        while True:
            if not self._busy:
                self._work.clear()
                await self._work.wait()
            # One more turn of the loop first: the work that woke it came from one socket, and
            # the turn reads the others ready by then (clients' appends, the other peer's
            # frame), so the pass takes them too: larger batches per partition, fewer messages.
            # 16 partitions: 35-36 appends per fsync instead of 24-25, +15-30 % appends/s; a
            # second turn gave nothing more (bench/partitions.py, bench/RESULTS.md).
            await asyncio.sleep(0)
            await self._pass()

    async def _pass(self) -> None:
        drivers = list(self._busy.values())
        self._busy.clear()
        begun = []
        for d in drivers:
            if d.failed is not None:
                continue
            try:
                rd = d.begin()
            except Exception as e:
                d.stop(e)
                continue
            if rd is not None:
                begun.append((d, rd))
        if any(rd.entries for _, rd in begun):
            if any(d.early_unwritten for d, _ in begun) and self.group.inline_now():
                # One turn of the loop for the peer senders to write what a frame stream did
                # not take at once: a fast disk's sync runs in the loop
                # (`GroupCommit.inline_below`) and would hold them back. A sync in the
                # fsync thread gives them that turn anyway.
                await asyncio.sleep(0)
            try:
                await self._durable()
            except Exception as e:  # the storage failed: whoever wrote entries stops
                for d, rd in begun:
                    if rd.entries:
                        d.stop(e)
                self._stop_all_if_journal_failed()
                begun = [(d, rd) for d, rd in begun if not rd.entries and d.failed is None]
        elif begun:
            # A commit index alone (and no sync to carry it): in the file before readers see
            # it, so a restarted node's high-water mark never steps back (`write_out`).
            try:
                if not await self.group.write(self.journal.write_out):
                    await self._durable()
            except Exception as e:
                for d, rd in begun:
                    if rd.hard_state is not None:
                        d.stop(e)
                self._stop_all_if_journal_failed()
                begun = [(d, rd) for d, rd in begun if rd.hard_state is None and d.failed is None]
        for d, rd in begun:
            if d.failed is not None:  # stopped while the sync ran (a checkpoint failed the journal)
                continue
            try:
                d.finish(rd)
            except Exception as e:
                d.stop(e)
                continue
            if d.has_work():
                self.schedule(d)
            elif d.raft.commit_untold() and d.raft.log.last_index() == d.raft.commit:
                # Followers learn a new high-water mark from the next append. While entries are
                # still in flight, their commit brings one more (or this, once they are all
                # committed); when everything is committed and no append comes within
                # COMMIT_TELL_DELAY, followers are told by a commit-only append. Telling on
                # every commit under load cost a commit-only append (and its answer) per two
                # appends at 16 partitions.
                self._untold.add(d)
                if self._tell_timer is None:
                    self._tell_timer = asyncio.get_running_loop().call_later(
                        COMMIT_TELL_DELAY, self._tell_untold
                    )

    def _tell_untold(self) -> None:
        self._tell_timer = None
        untold, self._untold = self._untold, set()
        for d in untold:
            if d.failed is None and d.raft.commit_untold():
                d.tell_commit_due()

    async def _clock(self) -> None:
        loop = asyncio.get_running_loop()
        period = self.settings.tick_ms / 1000
        next_at = loop.time()
        while True:
            next_at = next_tick(next_at, loop.time(), period)
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self.ticks += 1
            quiet = []
            for d in self.drivers.values():
                if d.raft.quiesced:  # no work for it until something wakes it
                    quiet.append(d)
                else:
                    d.tick()
            if quiet:
                self._watch_peers(quiet)
            self._maybe_checkpoint()

    async def close(self) -> None:
        if self._tell_timer is not None:
            self._tell_timer.cancel()
        tasks = self._tasks + ([self._checkpoint] if self._checkpoint is not None else [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.archiver is not None:
            await self.archiver.close()
        await self.transport.close()
        for d in self.drivers.values():
            await d.settle()
        self.group.close()
        for d in self.drivers.values():
            d.storage.close()
        self.journal.close()

    def _watch_peers(self, quiet: list[PartitionDriver]) -> None:
        """While partitions are quiesced: ping the peers every heartbeat, and wake those that
        rely on a peer gone silent (`core/liveness.py`)."""
        # The members of those partitions only: a peer being added (its pod not up yet) is
        # never looked up early, which would have the cluster DNS deny its name for a while.
        peers = set().union(*(d.raft.membership.members for d in quiet)) - {self.id}
        if self.ticks % self._heartbeat_ticks == 0:
            self.transport.ping(peers)
        silent = self.liveness.silent(peers, self.ticks)
        if not silent:
            return
        for d in quiet:
            d.call(functools.partial(d.raft.wake_if_silent, silent))

    def heard(self, items: list[Item]) -> None:
        """Messages and pings from peers: each says its sender is alive. Only the names of this
        node's peers are kept (a member it cannot reach is no use to hear from): every name a
        frame carried was, and a million pings with names of their own held about 100 MB."""
        peers = self.transport.peers
        for _, m in items:
            if m.src in peers:
                self.liveness.heard(m.src, self.ticks)

    def not_live(self) -> str | None:
        """Why this node should be restarted (`/healthz`): a partition stopped writing, by a
        storage failure or a bug, never writes again in this process; a restart reopens its
        storage (and refuses to start, saying why, if the fault is still there)."""
        failed = {p: d.failed for p, d in self.drivers.items() if d.failed is not None}
        if failed:
            p, e = next(iter(failed.items()))
            return f"partitions {sorted(failed)} stopped writing (p{p}: {e})"
        return None

    def not_ready(self) -> str | None:
        """Why this node should get no traffic (`/readyz`): a partition stopped writing
        (`not_live`), or one with no known leader; None when it is ready."""
        stopped = self.not_live()
        if stopped is not None:
            return stopped
        missing = [p for p, d in self.drivers.items() if d.raft.leader is None]
        if missing:
            return f"no known leader for partitions {missing}"
        return None

    def driver(self, partition: int) -> PartitionDriver | None:
        return self.drivers.get(partition)

    def step_streamed(self, items: list[Item], source: str) -> None:
        """Step a peer stream's messages into their partitions' drivers, in order; one for a
        partition this node does not have is dropped and logged."""
        self.heard(items)
        for p, m in items:
            if isinstance(m, Ping):
                continue
            d = self.drivers.get(p)
            if d is None:
                self._drop_unknown(p, m.src, source)
                continue
            d.step(m)

    def _drop_unknown(self, p: int, src: str, source: str) -> None:
        """Count a message for partition `p`, which this node does not have; log it now and then."""
        self.metrics.peer_messages_dropped.inc()
        if self._unknown_logged((src, p)):
            log.warning(
                "%s: a message for unknown partition %d dropped (from %s; said once a minute per "
                "sender and partition, all counted in raftlog_peer_messages_dropped)",
                source,
                p,
                src,
            )
