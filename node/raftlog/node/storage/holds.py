"""Retention holds: a reader's minimum index, with an expiry, that compaction never passes.

A stream reader (Spark, a lagging consumer) sets a hold at the lowest index it still needs and
renews it as it progresses; a hold that is not renewed expires, so a reader that went away does
not stop compaction forever. Holds are durable (a restart must not release them) and expire by
wall-clock time, which is what a reader's timeout means.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.node.storage.errors import CorruptFile
from raftlog.node.storage.fileio import FileOps, atomic_write

MAX_TTL_S = 366 * 24 * 3600  # a year: renewed by a live reader long before; never forever
MAX_HOLDER_CHARS = 200
MAX_INDEX = 2**62  # as the reads' indexes


def check_hold(holder: str, min_index: int, ttl_seconds: float) -> None:
    """ValueError `field: reason` for a hold that could not be meant (or not be expired). The
    Spark sources check a holder's name by the same rule (their `options`)."""
    if not 0 < len(holder) <= MAX_HOLDER_CHARS or not holder.isprintable():
        raise ValueError(f"holder: must be 1 to {MAX_HOLDER_CHARS} printable characters")
    if not 1 <= min_index <= MAX_INDEX:
        raise ValueError(f"min_index: must be from 1 to {MAX_INDEX}, got {min_index}")
    if not (math.isfinite(ttl_seconds) and 0 < ttl_seconds <= MAX_TTL_S):
        raise ValueError(
            f"ttl_seconds: must be above 0 and at most {MAX_TTL_S} (a year), got {ttl_seconds}"
        )


@dataclass(frozen=True, slots=True)
class Hold:
    holder: str
    min_index: int
    expires_at: float  # seconds since the epoch


class RetentionHolds:
    def __init__(
        self,
        path: str,
        *,
        durable: bool = True,
        ops: FileOps | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.durable = durable
        self.ops = ops or FileOps()
        self.clock = clock
        self._holds: dict[str, Hold] = {}
        if os.path.exists(path):
            with open(path, "rb") as f:
                raw = f.read()
            try:
                for h in json.loads(raw):
                    self._holds[h["holder"]] = Hold(h["holder"], h["min_index"], h["expires_at"])
            except (ValueError, TypeError, KeyError) as e:
                raise CorruptFile(path, f"not a list of holds ({e}); fix or delete it") from None

    def set(self, holder: str, min_index: int, ttl_seconds: float) -> Hold:
        check_hold(holder, min_index, ttl_seconds)
        hold = Hold(holder, min_index, self.clock() + ttl_seconds)
        self._holds[holder] = hold
        self._save()
        return hold

    def release(self, holder: str) -> bool:
        if self._holds.pop(holder, None) is None:
            return False
        self._save()
        return True

    def live(self) -> list[Hold]:
        now = self.clock()
        return sorted(
            (h for h in self._holds.values() if h.expires_at > now), key=lambda h: h.min_index
        )

    def floor(self) -> int | None:
        """The lowest index a live hold needs kept, or None."""
        live = self.live()
        return live[0].min_index if live else None

    def _save(self) -> None:
        now = self.clock()
        self._holds = {k: h for k, h in self._holds.items() if h.expires_at > now}
        body = json.dumps(
            [
                {"holder": h.holder, "min_index": h.min_index, "expires_at": h.expires_at}
                for h in self._holds.values()
            ]
        ).encode()
        atomic_write(self.path, body, self.ops, self.durable)
