"""The append path's per-request costs that are not speed: no task per commit, and readers
waiting for the high-water mark woken without one."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

import pytest

from raftlog.node.core.raft import Role
from raftlog.node.server.commit_signal import CommitSignal
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings


def _count_tasks(loop: asyncio.AbstractEventLoop) -> list[str]:
    """Record the coroutine name of every task created on `loop` from now on."""
    names: list[str] = []

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
        **kwargs: Any,
    ) -> asyncio.Task[Any]:
        names.append(getattr(coro, "__qualname__", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    return names


def test_sequential_appends_create_no_task_per_commit(tmp_path):
    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True,
                node_id="n1",
                peers={"n1": "http://127.0.0.1:10"},
                data_dir=tmp_path,
                tick_ms=5,
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            for _ in range(1000):
                if d.raft.role == Role.LEADER and d.table.applied_index >= d.raft.log.last_index():
                    break
                await asyncio.sleep(0.01)
            names = _count_tasks(asyncio.get_running_loop())
            for i in range(50):
                await d.propose([b"r%d" % i])
            assert len(names) < 10, f"tasks per append: {names[:12]}"
        finally:
            await node.close()

    asyncio.run(run())


def test_readers_wake_on_the_notify_that_makes_them_ready_and_time_out_cleanly():
    async def run() -> None:
        mark = [0]
        signal = CommitSignal(lambda: mark[0])
        reader = asyncio.ensure_future(signal.wait_at_least(2))
        far = asyncio.ensure_future(signal.wait_at_least(10**9))
        await asyncio.sleep(0)
        mark[0] = 1
        signal.notify()
        await asyncio.sleep(0)
        assert not reader.done() and len(signal) == 2  # not there yet: still waiting
        mark[0] = 2
        signal.notify()
        await asyncio.wait_for(reader, 1)
        assert not far.done() and len(signal) == 1  # only the one whose point was reached
        with pytest.raises(TimeoutError):
            await signal.wait_at_least(10**9, timeout=0.01)
        far.cancel()
        with pytest.raises(asyncio.CancelledError):
            await far
        assert len(signal) == 0  # the timed-out and the cancelled readers count no more
        await signal.wait_at_least(1)  # reached already: at once

    asyncio.run(run())


def test_readers_given_up_are_swept_out_and_cost_a_notify_nothing():
    """Found by a hostile client: 8,000 long polls for an index far ahead, each connection
    reset, were each checked on every commit (338 ms appends; a lost leadership at 20,000)."""

    async def run() -> None:
        mark = [0]
        signal = CommitSignal(lambda: mark[0])
        far = [asyncio.ensure_future(signal.wait_at_least(10**9 + i)) for i in range(1000)]
        near = asyncio.ensure_future(signal.wait_at_least(5))
        await asyncio.sleep(0)
        for f in far[:900]:
            f.cancel()
        await asyncio.gather(*far[:900], return_exceptions=True)
        assert len(signal) == 101
        assert len(signal._heap) <= 2 * 101 + 64, "swept once most of it was given up"
        mark[0] = 5
        signal.notify()
        await asyncio.wait_for(near, 1)
        assert len(signal) == 100 and not any(f.done() for f in far[900:])
        for f in far[900:]:
            f.cancel()
        await asyncio.gather(*far[900:], return_exceptions=True)
        assert len(signal) == 0

    asyncio.run(run())
