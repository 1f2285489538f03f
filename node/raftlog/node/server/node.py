"""A node: every partition's core, storage and driver, the transport, and the clock."""

from __future__ import annotations

import asyncio
import logging
import os
import random

from raftlog.node.core.messages import Message
from raftlog.node.core.raft import Raft
from raftlog.node.core.types import Membership
from raftlog.node.server.answers import AnswerBudget
from raftlog.node.server.metrics import NodeMetrics
from raftlog.node.server.partition import PartitionDriver
from raftlog.node.settings import NodeSettings
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.group_commit import SyncGate
from raftlog.node.transport.peers import Transport

log = logging.getLogger("raftlog.node")


def next_tick(last: float, now: float, period: float) -> float:
    """When the tick after the one due at `last` is due: a period later, or, when the loop was
    held up past that (a long fsync, a GIL-bound snapshot encode), a period from now. Missed
    ticks are dropped, as Go's time.Ticker (etcd's clock) drops them: taken in a burst, they
    would run out a follower's election timeout before it read the heartbeats that arrived
    during the stall, and it would campaign against a live leader."""
    due = last + period
    return due if due > now - period else now + period


class Node:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.id = settings.node_id
        self.token = settings.token()
        self.transport = Transport(
            self.id,
            dict(settings.peers),
            self.token,
            settings.client_ssl(),
            settings.peer_frames,
            settings.frame_budget,
        )
        self.metrics = NodeMetrics()
        self.answers = AnswerBudget(
            settings.max_answer_buffer_bytes, settings.answer_send_timeout_s
        )
        self.sync_gate = SyncGate()  # the partitions' fsyncs: in the loop only one at a time
        bootstrap = None if settings.join else Membership(frozenset(settings.peers))
        self.drivers: dict[int, PartitionDriver] = {}
        config = settings.raft_config()
        for p in range(settings.partitions):
            storage = DurableStorage(
                os.path.join(settings.data_dir, f"p{p}"),
                bootstrap=bootstrap,
                durable=settings.durable,
                segment_bytes=settings.segment_bytes,
            )
            for msg in storage.recovery:
                log.warning("p%d recovery: %s", p, msg)
            raft = Raft(self.id, config, storage, seed=random.randrange(1 << 30))
            self.drivers[p] = PartitionDriver(self, p, raft, storage, config)
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics.attach(self)

    async def start(self) -> None:
        await self.transport.start()
        loop = asyncio.get_running_loop()
        for d in self.drivers.values():
            self._tasks.append(loop.create_task(d.run()))
        self._tasks.append(loop.create_task(self._clock()))

    async def _clock(self) -> None:
        loop = asyncio.get_running_loop()
        period = self.settings.tick_ms / 1000
        next_at = loop.time()
        while True:
            next_at = next_tick(next_at, loop.time(), period)
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            for d in self.drivers.values():
                d.tick()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.transport.close()
        for d in self.drivers.values():
            await d.settle()
            d.group.close()
            d.storage.close()

    def driver(self, partition: int) -> PartitionDriver | None:
        return self.drivers.get(partition)

    def step_streamed(self, items: list[tuple[int, Message]], source: str) -> None:
        """Step a peer stream's messages into their partitions' drivers, in order; one for a
        partition this node does not have is dropped and logged (`POST /peer/v1/messages`
        answers it with 404 instead)."""
        for p, m in items:
            d = self.drivers.get(p)
            if d is None:
                log.warning("%s: a message for unknown partition %d dropped", source, p)
                continue
            d.step(m)
