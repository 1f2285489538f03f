"""Group commit: shared fsyncs, no acknowledgement before the covering fsync, failures reach all."""

from __future__ import annotations

import asyncio
import errno
import threading

import pytest
from tests.storage.helpers import ents

from raftlog.node.core.types import Membership
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import StorageFailed
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.group_commit import GroupCommit


class SlowDisk(FileOps):
    """Records which writes each fsync covered; each fsync takes a little while."""

    def __init__(self) -> None:
        self.writes = 0
        self.covered: list[int] = []  # writes done when each fsync started
        self.lock = threading.Lock()
        self.fail_next = False

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        super().write(fd, data)
        with self.lock:
            self.writes += 1

    def fdatasync(self, fd: int) -> None:
        with self.lock:
            started_with = self.writes
        if self.fail_next:
            raise OSError(errno.EIO, "Input/output error")
        threading.Event().wait(0.01)
        super().fdatasync(fd)
        self.covered.append(started_with)


def test_concurrent_appenders_share_fsyncs_and_wait_for_theirs(tmp_path):
    disk = SlowDisk()
    s = DurableStorage(str(tmp_path), bootstrap=Membership.of(["a"]), ops=disk)
    gc = GroupCommit(s.sync)
    acked: list[tuple[int, int]] = []  # (entry index, writes covered by the latest fsync)
    next_index = [1]

    async def appender(n: int) -> None:
        for _ in range(n):
            i = next_index[0]
            next_index[0] += 1
            s.write(None, ents(i, i, 1))
            writes_so_far = disk.writes
            gen = gc.wrote()
            await gc.durable(gen)
            # Durable means an fsync that started after this write finished.
            assert disk.covered and disk.covered[-1] >= writes_so_far
            acked.append((i, disk.covered[-1]))

    async def main() -> None:
        await asyncio.gather(*(appender(10) for _ in range(32)))

    try:
        asyncio.run(main())
    finally:
        gc.close()
    assert len(acked) == 320
    assert gc.fsyncs < 320 / 4, f"{gc.fsyncs} fsyncs for 320 appends: not grouped"
    assert s.entries(1, 321) == ents(1, 320, 1)


def test_a_failed_fsync_fails_every_waiter_and_later_writes(tmp_path):
    disk = SlowDisk()
    s = DurableStorage(str(tmp_path), bootstrap=Membership.of(["a"]), ops=disk)
    gc = GroupCommit(s.sync)
    disk.fail_next = True

    async def main() -> list[BaseException | None]:
        async def one(i: int) -> None:
            s.write(None, ents(i, i, 1))
            await gc.durable(gc.wrote())

        return await asyncio.gather(*(one(i) for i in range(1, 9)), return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        gc.close()
    assert all(isinstance(r, StorageFailed) for r in results), results
    with pytest.raises(StorageFailed):
        s.write(None, ents(9, 9, 1))


def test_append_batches_concurrent_appenders_into_one_write_and_fsync(tmp_path):
    disk = SlowDisk()
    s = DurableStorage(str(tmp_path), bootstrap=Membership.of(["a"]), ops=disk)
    gc = GroupCommit(s.sync, write=lambda entries: s.write(None, entries))
    next_index = [1]
    done: list[int] = []

    async def appender(n: int) -> None:
        for _ in range(n):
            i = next_index[0]
            next_index[0] += 1
            await gc.append(ents(i, i, 1))
            # Back from append: the entry is in the log and an fsync covered its write.
            assert s.last_index() >= i and disk.covered[-1] >= 1
            done.append(i)

    async def main() -> None:
        await asyncio.gather(*(appender(8) for _ in range(64)))

    try:
        asyncio.run(main())
    finally:
        gc.close()
    assert sorted(done) == list(range(1, 513))
    assert s.entries(1, 513) == ents(1, 512, 1)
    # One write and one fsync per batch: far fewer of each than appends.
    assert gc.fsyncs <= 512 / 16 and disk.writes <= 512 / 16 + 2, (gc.fsyncs, disk.writes)


def test_append_without_a_write_function_is_a_clear_error(tmp_path):
    s = DurableStorage(str(tmp_path), bootstrap=Membership.of(["a"]))
    gc = GroupCommit(s.sync)
    with pytest.raises(RuntimeError, match="needs the `write` function"):
        asyncio.run(gc.append(ents(1, 1, 1)))
    gc.close()


def test_a_lone_writer_syncs_once_and_a_cancelled_one_strands_nobody(tmp_path):
    disk = SlowDisk()
    s = DurableStorage(str(tmp_path), bootstrap=Membership.of(["a"]), ops=disk)
    gc = GroupCommit(s.sync)

    async def main() -> None:
        s.write(None, ents(1, 1, 1))
        await gc.durable(gc.wrote())
        assert gc.fsyncs == 1 and disk.covered == [disk.writes]
        # The first writer runs the sync itself and is cancelled while it runs; one that wrote
        # meanwhile must still get a sync that started after its write.
        s.write(None, ents(2, 2, 1))
        first = asyncio.get_running_loop().create_task(gc.durable(gc.wrote()))
        await asyncio.sleep(0.003)  # the first sync is running in the thread
        s.write(None, ents(3, 3, 1))
        third_write = disk.writes
        second = asyncio.get_running_loop().create_task(gc.durable(gc.wrote()))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.wait_for(second, 5)
        assert disk.covered[-1] >= third_write

    try:
        asyncio.run(main())
    finally:
        gc.close()


def test_a_sync_runs_in_the_loop_only_after_a_window_of_fast_ones_and_one_slow_one_ends_it():
    from raftlog.node.storage.group_commit import SYNC_WINDOW

    slow = threading.Event()
    where: list[bool] = []  # whether each sync ran on the event loop's thread

    def sync() -> None:
        where.append(threading.current_thread() is threading.main_thread())
        if slow.is_set():
            slow.clear()
            threading.Event().wait(0.2)  # far above the limit below

    async def run() -> None:
        gc = GroupCommit(sync, inline_below=0.05)
        try:
            for _ in range(SYNC_WINDOW):
                await gc.durable(gc.wrote())
            assert not any(where), "the thread until a whole window of syncs was fast"
            await gc.durable(gc.wrote())
            assert where[-1], "then in the loop"
            slow.set()
            await gc.durable(gc.wrote())  # slow, and in the loop: this is what it costs
            for _ in range(SYNC_WINDOW):
                await gc.durable(gc.wrote())
            assert not any(where[-SYNC_WINDOW:]), "one slow sync sends a window to the thread"
            await gc.durable(gc.wrote())
            assert where[-1]
            never = GroupCommit(sync, inline_below=0)
            for _ in range(SYNC_WINDOW + 1):
                await never.durable(never.wrote())
            assert not where[-1], "0: never in the loop"
            never.close()
        finally:
            gc.close()

    asyncio.run(run())


def test_a_write_without_its_sync_runs_where_a_sync_would():
    """Found by a fault helper: a commit index alone was written to the journal in the event
    loop even with `fsync_in_loop_below_ms` 0, and a frozen file system held the whole node in
    that write(2). It runs where a sync would run now: the thread unless syncs are fast."""
    from raftlog.node.storage.group_commit import SYNC_WINDOW

    def on_loop() -> bool:
        return threading.current_thread() is threading.main_thread()

    async def run() -> None:
        never, fast = (
            GroupCommit(lambda: None, inline_below=0),
            GroupCommit(lambda: None, inline_below=5.0),
        )
        try:
            for gc in (never, fast):
                for _ in range(SYNC_WINDOW):
                    await gc.durable(gc.wrote())
            assert await never.write(on_loop) is False, "0: never in the loop"
            assert await fast.write(on_loop) is True, "in the loop while syncs are fast there"
        finally:
            never.close()
            fast.close()

    asyncio.run(run())


class GatedSync:
    """A sync that waits for `gate` when it is shut, and fails while `fail` is set; counts the
    syncs that started."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self.started = 0

    def __call__(self) -> None:
        self.started += 1
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail:
            raise StorageFailed("journal", "fdatasync", OSError(errno.EIO, "Input/output error"))


async def started(sync: GatedSync, n: int) -> None:
    while sync.started < n:
        await asyncio.sleep(0.001)


def test_a_write_after_a_waiters_sync_gets_a_sync_of_its_own():
    # A sync run for the writers that waited on the flusher covers exactly the writes made
    # before it: the next write must not pass for durable without an fsync.
    sync = GatedSync()
    gc = GroupCommit(sync)

    async def run() -> None:
        sync.gate.clear()
        first = asyncio.get_running_loop().create_task(gc.durable(gc.wrote()))
        await started(sync, 1)  # the first writer's own sync, held in the thread
        second = asyncio.get_running_loop().create_task(gc.durable(gc.wrote()))
        await asyncio.sleep(0)  # it waits for the flusher, started once the first is over
        sync.gate.set()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert sync.started == 2
        await gc.durable(gc.wrote())
        assert sync.started == 3, "a write was told durable without an fsync after it"

    try:
        asyncio.run(run())
    finally:
        gc.close()


def test_after_a_failed_fsync_no_later_sync_acknowledges_anything():
    # After a failed fsync the page cache cannot be trusted: a retried fsync may succeed with
    # the data lost. Every later writer is refused, even when the disk's next fsync succeeds.
    sync = GatedSync()
    gc = GroupCommit(sync, write=lambda entries: None)

    async def run() -> None:
        sync.fail = True
        with pytest.raises(StorageFailed):
            await gc.durable(gc.wrote())
        sync.fail = False
        with pytest.raises(StorageFailed):
            await asyncio.wait_for(gc.durable(gc.wrote()), 10)
        with pytest.raises(StorageFailed):
            await asyncio.wait_for(gc.append(ents(1, 1, 1)), 10)
        assert sync.started == 1

    try:
        asyncio.run(run())
    finally:
        gc.close()


def test_appenders_that_joined_the_next_batch_during_a_failed_sync_are_failed_too():
    sync = GatedSync()
    gc = GroupCommit(sync, write=lambda entries: None)

    async def run() -> None:
        sync.gate.clear()
        sync.fail = True
        first = asyncio.get_running_loop().create_task(gc.append(ents(1, 1, 1)))
        await started(sync, 1)  # the first batch's sync, held in the thread
        second = asyncio.get_running_loop().create_task(gc.append(ents(2, 2, 1)))
        await asyncio.sleep(0)  # the next batch is open, with the second appender in it
        sync.gate.set()
        done = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 10)
        assert all(isinstance(r, StorageFailed) for r in done), done

    try:
        asyncio.run(run())
    finally:
        gc.close()
