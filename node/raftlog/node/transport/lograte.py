"""Log lines about what peers send, rate-limited per key: the keys (sender names, partition
numbers) are the sender's to choose, so a flood of messages must not be a flood of lines."""

from __future__ import annotations

import time
from collections.abc import Hashable


class OncePer:
    """Whether to log about `key` now: once per `interval_s` per key, for at most `keys` keys at
    once (past that, nothing more is logged until some age out: the counters say the rest)."""

    def __init__(self, interval_s: float = 60.0, keys: int = 256) -> None:
        self.interval_s = interval_s
        self.keys = keys
        self._last: dict[Hashable, float] = {}

    def __call__(self, key: Hashable) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        if last is None and len(self._last) >= self.keys:
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
            if len(self._last) >= self.keys:
                return False
        self._last[key] = now
        return True
