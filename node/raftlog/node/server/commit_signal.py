"""Readers waiting for a partition's high-water mark or applied index to pass a point.

`notify()` is called by the driver after each apply: it wakes the waiting readers' futures
directly, in the driver's turn, so an apply with nobody waiting costs nothing (no task per
commit, as notifying an `asyncio.Condition` needs, since notifying requires holding its lock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class CommitSignal:
    def __init__(self) -> None:
        self._waiting: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        waiting, self._waiting = self._waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    async def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> None:
        """Return once `ready()` holds (checked after each notify); TimeoutError after
        `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while not ready():
                fut = asyncio.get_running_loop().create_future()
                self._waiting.append(fut)
                try:
                    await fut
                finally:
                    if fut in self._waiting:  # timed out or cancelled: no notify took it
                        self._waiting.remove(fut)
