"""Group commit: concurrent writers share fsyncs, and none is told "durable" before its fsync.

Each writer writes (to the page cache, cheap) and then awaits `durable()`. One flusher task runs
the fsync in a worker thread; every write made before an fsync started is covered by it, and the
writes that arrive while it runs are covered together by the next one. So with N writers in flight
the disk sees about one fsync per fsync latency, not N, which is where the throughput comes from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class GroupCommit:
    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync
        self._written = 0  # generation of the latest write
        self._synced = 0  # every write up to this generation is durable
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None
        self.fsyncs = 0  # how many syncs ran (for metrics and the benchmark)

    def wrote(self) -> int:
        """Call after each write; returns the generation to wait for."""
        self._written += 1
        return self._written

    async def durable(self, generation: int | None = None) -> None:
        """Return once the write of `generation` (default: every write so far) is durable.

        Raises the sync's error (`StorageFailed`) if the fsync that would cover it failed.
        """
        gen = self._written if generation is None else generation
        if self.failed is not None:
            raise self.failed
        if gen <= self._synced:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((gen, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await fut

    async def _flush(self) -> None:
        while self._waiters:
            target = self._written
            try:
                await asyncio.to_thread(self._sync)
            except Exception as e:  # the storage has marked itself failed; tell every waiter
                self.failed = e
                for _, fut in self._waiters:
                    if not fut.done():
                        fut.set_exception(e)
                self._waiters.clear()
                return
            self.fsyncs += 1
            self._synced = max(self._synced, target)
            still = []
            for gen, fut in self._waiters:
                if gen <= target:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((gen, fut))
            self._waiters = still
