"""A simulated network driven by a seeded RNG: drop, delay, duplicate, reorder, partition."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Faults:
    drop: float = 0.0  # probability a message is lost
    duplicate: float = 0.0  # probability a message is delivered twice
    min_delay: int = 1  # ticks
    max_delay: int = 1
    reorder: bool = True  # False: each link delivers in order, as one TCP connection does


@dataclass(order=True)
class _InFlight:
    deliver_at: int
    seq: int
    src: str = field(compare=False)
    dst: str = field(compare=False)
    payload: Any = field(compare=False)


class Network:
    def __init__(self, rng: random.Random, faults: Faults) -> None:
        self.rng = rng
        self.faults = faults
        self._queue: list[_InFlight] = []
        self._seq = 0
        # Node -> group number; messages cross only within a group. Empty: fully connected.
        self._groups: dict[str, int] = {}
        self._link_last: dict[tuple[str, str], int] = {}
        self.sent = 0
        self.dropped = 0
        self.duplicated = 0

    def send(self, now: int, src: str, dst: str, payload: Any, extra_delay: int = 0) -> None:
        self.sent += 1
        f = self.faults
        if f.drop and self.rng.random() < f.drop:
            self.dropped += 1
            return
        copies = 2 if f.duplicate and self.rng.random() < f.duplicate else 1
        if copies == 2:
            self.duplicated += 1
        for _ in range(copies):
            at = now + self.rng.randint(f.min_delay, f.max_delay) + extra_delay
            if not f.reorder:
                at = max(at, self._link_last.get((src, dst), 0))
                self._link_last[(src, dst)] = at
            self._seq += 1
            heapq.heappush(self._queue, _InFlight(at, self._seq, src, dst, payload))

    def due(self, now: int) -> list[tuple[str, str, Any]]:
        """Messages whose delivery time has come and whose path is not cut right now."""
        out = []
        while self._queue and self._queue[0].deliver_at <= now:
            m = heapq.heappop(self._queue)
            if self.connected(m.src, m.dst):
                out.append((m.src, m.dst, m.payload))
            else:
                self.dropped += 1
        return out

    def connected(self, a: str, b: str) -> bool:
        return self._groups.get(a, 0) == self._groups.get(b, 0)

    def partition(self, *groups: list[str]) -> None:
        self._groups = {n: i + 1 for i, g in enumerate(groups) for n in g}

    def heal(self) -> None:
        self._groups = {}

    @property
    def partitioned(self) -> bool:
        return bool(self._groups)

    def groups(self) -> list[list[str]]:
        by: dict[int, list[str]] = {}
        for n, g in self._groups.items():
            by.setdefault(g, []).append(n)
        return [sorted(v) for _, v in sorted(by.items())]
