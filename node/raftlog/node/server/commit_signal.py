"""Readers waiting for a partition's high-water mark or applied index to reach a point.

`notify()` is called by the driver after each apply: it wakes the waiting readers' futures
directly, in the driver's turn, so an apply with nobody waiting costs nothing (no task per
commit, as notifying an `asyncio.Condition` needs, since notifying requires holding its lock).

The waiters are kept in a heap by the point they wait for, so a notify wakes only those whose
point was reached: a hostile client's thousands of long polls for an index far ahead (each
connection reset after its request) cost nothing per commit, where a list of predicates
checked them all on every commit (338 ms appends at 8,000 of them, a lost leadership at
20,000). Those given up (timed out, cancelled) are left in the heap and swept out once they
are half of it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable


class CommitSignal:
    def __init__(self, value: Callable[[], int]) -> None:
        self._value = value  # the monotonic point waited on
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties by arrival; futures are not comparable
        self._waiting = 0  # calls of wait_at_least under way (the heap may hold more)

    def notify(self) -> None:
        heap = self._heap
        if not heap:
            return
        now = self._value()
        while heap and heap[0][0] <= now:
            fut = heapq.heappop(heap)[2]
            if not fut.done():  # else given up
                fut.set_result(None)

    async def wait_at_least(self, point: int, timeout: float | None = None) -> None:
        """Return once the value is at least `point`; TimeoutError after `timeout` seconds."""
        if self._value() >= point:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (point, next(self._order), fut))
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout):
                await fut
        finally:
            fut.cancel()  # given up, if no notify took it
            self._waiting -= 1
            if len(self._heap) > 2 * self._waiting + 64:
                self._heap = [w for w in self._heap if not w[2].done()]
                heapq.heapify(self._heap)

    def __len__(self) -> int:
        """The readers waiting."""
        return self._waiting
