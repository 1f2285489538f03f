"""Group commit: concurrent writers share fsyncs, and none is told "durable" before its fsync.

Two ways in:
- `append(entries)`: the entries join the open batch; one flusher task writes the whole batch
  with one `write` and makes it durable with one fsync (in a worker thread, so the event loop
  keeps accepting the next batch meanwhile), then wakes every appender of that batch.
- `wrote()` + `durable()`: for a writer that wrote by itself (the node's Ready loop); one fsync
  covers every write made before it started (run by the caller itself when no flush is in flight).
With N writers in flight the disk sees about one fsync per fsync latency, not N.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from raftlog.node.core.types import Entry

SYNC_WINDOW = 64  # syncs looked back on before one runs in the event loop


class _Batch:
    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.entries: list[Entry] = []
        self.done = fut


class GroupCommit:
    def __init__(
        self,
        sync: Callable[[], None],
        write: Callable[[list[Entry]], None] | None = None,
        inline_below: float = 0.0005,
    ) -> None:
        self._sync = sync
        self._write = write
        self._written = 0  # generation of the latest write
        self._synced = 0  # every write up to this generation is durable
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._open: _Batch | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None
        self._inline = False  # a `durable` caller is running a sync itself
        # A `durable` caller with nothing in flight syncs in the event loop itself while every
        # one of the last SYNC_WINDOW syncs took less than `inline_below` (0: never) and no
        # sync is under way in the thread: handing a sync to the thread and
        # back costs two wakeups and two GIL handoffs on the append's path, which on a busy
        # machine cost more than a fast disk's sync. The whole node's loop waits for such a
        # sync, so one slow sync sends the next SYNC_WINDOW to the thread; what is left is a
        # disk that stalls without warning after a long fast run, which holds the node for
        # that one sync.
        self.inline_below = inline_below
        self._in_thread = 0  # syncs under way in the thread
        self._recent: deque[float] = deque(maxlen=SYNC_WINDOW)  # unknown: start in the thread
        self.fsyncs = 0  # how many syncs ran (for metrics and the benchmark)
        # One thread of its own: fsyncs of one log are sequential anyway, and a warm dedicated
        # thread hands back sooner than the shared default pool.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raftlog-fsync")

    def inline_now(self) -> bool:
        """Whether a sync would run in the event loop now (see `inline_below`)."""
        recent = self._recent
        return (
            not self._in_thread and len(recent) == SYNC_WINDOW and max(recent) < self.inline_below
        )

    async def write(self, write: Callable[[], bool]) -> bool:
        """`write`, a write(2) to the log's file without its sync, where a sync would run now:
        in the event loop while syncs run there (`inline_now`), else in the sync thread. A file
        system that hangs (frozen, a stalled device) blocks write(2) as it blocks fsync, and
        with `inline_below` 0 nothing of the log's may hold the loop."""
        if self.inline_now():
            return write()
        with self._thread_sync():
            return await asyncio.get_running_loop().run_in_executor(self._thread, write)

    def close(self) -> None:
        self._thread.shutdown(wait=True)

    @contextlib.contextmanager
    def _thread_sync(self) -> Iterator[None]:
        self._in_thread += 1
        try:
            yield
        finally:
            self._in_thread -= 1

    def wrote(self) -> int:
        """Call after each write of your own; returns the generation to wait for."""
        self._written += 1
        return self._written

    async def append(self, entries: list[Entry]) -> None:
        """Write `entries` with the next batch and return once they are durable."""
        if self._write is None:
            raise RuntimeError("GroupCommit.append needs the `write` function")
        if self.failed is not None:
            raise self.failed
        if self._open is None:
            self._open = _Batch(asyncio.get_running_loop().create_future())
        batch = self._open
        batch.entries.extend(entries)
        self._kick()
        await batch.done

    async def durable(self, generation: int | None = None) -> None:
        """Return once the write of `generation` (default: every write so far) is durable.

        Raises the sync's error (`StorageFailed`) if the fsync that would cover it failed.
        """
        gen = self._written if generation is None else generation
        if self.failed is not None:
            raise self.failed
        if gen <= self._synced:
            return
        if not self._inline and (self._flusher is None or self._flusher.done()):
            # Nothing in flight: sync here, without a flusher task in between (one thread
            # handoff and one wakeup of this task per sync, not two of each). Writers that
            # come meanwhile wait for the flusher, started once this sync is over.
            self._inline = True
            try:
                # One turn of the loop first: the other partitions' drivers woken with this one
                # write too, and this sync covers them (one fsync for the node's batch).
                await asyncio.sleep(0)
                target = self._written
                if self.inline_now():
                    self._timed()  # fast disk: cheaper than a thread handoff; see `inline_below`
                else:
                    with self._thread_sync():
                        await asyncio.get_running_loop().run_in_executor(self._thread, self._timed)
            except Exception as e:
                self._fail(e, None)
                raise
            else:
                self._synced_to(target)
            finally:
                self._inline = False
                if self.failed is None and (self._waiters or self._open is not None):
                    self._kick()  # for those who came meanwhile (also if this task is cancelled)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((gen, fut))
        if not self._inline:
            self._kick()
        await fut

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._waiters or self._open is not None:
            batch, self._open = self._open, None
            try:
                if batch is not None:
                    assert self._write is not None
                    self._write(batch.entries)
                    self._written += 1
                target = self._written
                with self._thread_sync():
                    await asyncio.get_running_loop().run_in_executor(self._thread, self._timed)
            except Exception as e:  # the storage has marked itself failed; tell every waiter
                self._fail(e, batch)
                return
            self._synced_to(target)
            if batch is not None:
                batch.done.set_result(None)

    def _timed(self) -> None:
        started = time.perf_counter()
        self._sync()
        self._recent.append(time.perf_counter() - started)

    def _synced_to(self, target: int) -> None:
        """A sync that started after write `target` finished: wake whoever it covers."""
        self.fsyncs += 1
        self._synced = max(self._synced, target)
        if not self._waiters:
            return
        still = []
        for gen, fut in self._waiters:
            if gen <= target:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((gen, fut))
        self._waiters = still

    def _fail(self, e: Exception, batch: _Batch | None) -> None:
        self.failed = e
        for b in (batch, self._open):
            if b is not None and not b.done.done():
                b.done.set_exception(e)
        self._open = None
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(e)
        self._waiters.clear()
