"""The first committed index at or after a time, per partition (as Kafka's time index).

Readers that start or end at a time (the Spark sources' `startingTimestamp`,
`startingOffsetsByTimestamp`, `endingOffsetsByTimestamp`) ask a replica for "the first record
whose `timestamp_ms` is at or after T". Producers' timestamps need not rise with the index, so
the index keeps the running maximum of the timestamps, which does: the first record at or after
T is exactly where the running maximum first reaches T. The running maximum is sampled every
`SAMPLE_EVERY` indexes (16 bytes per sample), and a lookup reads the records of one sample gap.

The index is built on the first lookup by one pass over the retained log, then extended from
where it ended on each later lookup: nothing is stored and the append path never sees it. A
record with no timestamp (0) is never at or after a time. Compaction and snapshot installs move
the log's start: a pass that finds its next record compacted starts over from the new start; a
lookup whose answer was compacted reads on from the floor for the first retained record at or
after T (the same answer as when the timestamps rise, which is the common case).
"""

from __future__ import annotations

import asyncio
import bisect
import weakref
from array import array
from typing import TYPE_CHECKING

import msgspec

from raftlog.node.core.errors import Compacted
from raftlog.node.record import Record
from raftlog.node.server import columnar
from raftlog.node.storage.segment import RawRange, Rows

if TYPE_CHECKING:
    from raftlog.node.server.partition import PartitionDriver

SAMPLE_EVERY = 1024  # indexes between samples: a lookup reads at most this many records
PASS_RECORDS = 20_000  # records read per step of a pass (one event-loop step, one thread job)
_record = msgspec.msgpack.Decoder(Record)


def _stamped(raws: list[RawRange], tail: Rows) -> tuple[array[int], list[int]]:
    """In a worker thread: the indexes of the records read and their timestamps."""
    rows = columnar.rows_of(raws, tail)
    out: list[int] = []
    decode = _record.decode
    for raw in rows.data:
        try:
            out.append(decode(raw).timestamp_ms)
        except (msgspec.DecodeError, UnicodeDecodeError):  # not a record: no timestamp
            out.append(0)
    return rows.index, out


def of(d: PartitionDriver) -> TimeIndex:
    """The time index of partition `d` (made on the first call)."""
    index = _indexes.get(d)
    if index is None:
        index = _indexes[d] = TimeIndex()
    return index


class TimeIndex:
    def __init__(self) -> None:
        self.start = 0  # the first index covered (0: not built yet)
        self.end = 0  # the last index covered
        self.running_max = 0  # of the timestamps in [start, end]
        self._sample_max = array("q")  # the running maximum at ...
        self._sample_index = array("q")  # ... these indexes (both rising)
        self._lock = asyncio.Lock()  # one pass at a time

    def _reset(self, start: int) -> None:
        self.start, self.end, self.running_max = start, start - 1, 0
        del self._sample_max[:], self._sample_index[:]

    def _add(self, indexes: array[int], stamps: list[int], last: int) -> None:
        """Records at `indexes` with `stamps`, then the range covered up to `last`."""
        top = self.running_max
        for i, ts in zip(indexes, stamps, strict=True):
            if ts > top:
                top = ts
            if not self._sample_index or i - self._sample_index[-1] >= SAMPLE_EVERY:
                self._sample_index.append(i)
                self._sample_max.append(top)
        self.running_max, self.end = top, last

    async def _read(
        self, d: PartitionDriver, start: int, stop: int
    ) -> tuple[array[int], list[int], int]:
        """The indexes and timestamps of the records of [start, stop) (at most PASS_RECORDS),
        and where the read ended."""
        async with columnar.read_turn() as turn:
            r = columnar.committed_range(d, start, stop, PASS_RECORDS, columnar.MAX_PAGE_BYTES)
            tail = Rows()
            tail.add_entries(r.tail)
            indexes, stamps = await turn.run(_stamped, r.raws, tail)
        return indexes, stamps, r.next_index

    async def _extend(self, d: PartitionDriver) -> None:
        """Cover the log up to this replica's high-water mark."""
        while self.end < d.raft.commit:
            first = d.raft.log.first_index()
            if not self.start or self.end + 1 < first:
                self._reset(first)
            try:
                indexes, stamps, nxt = await self._read(d, self.end + 1, d.raft.commit + 1)
            except Compacted:
                self._reset(d.raft.log.first_index())
                continue
            if nxt <= self.end + 1:
                return  # nothing more readable now
            self._add(indexes, stamps, nxt - 1)

    async def _first_at_or_after(
        self, d: PartitionDriver, t: int, start: int, stop: int
    ) -> int | None:
        """The first record of [start, stop) stamped at or after `t`."""
        while start < stop:
            try:
                indexes, stamps, nxt = await self._read(d, start, stop)
            except Compacted:
                start = d.raft.log.first_index()
                continue
            for i, ts in zip(indexes, stamps, strict=True):
                if ts >= t:
                    return i
            if nxt <= start:
                return None
            start = nxt
        return None

    async def lookup(self, d: PartitionDriver, t: int) -> int | None:
        """The first committed index of a record stamped at or after `t` (ms) that this
        replica holds, or None when there is none up to its high-water mark."""
        async with self._lock:
            await self._extend(d)
            if self.running_max < t:
                return None
            k = bisect.bisect_left(self._sample_max, t)
            lo = self._sample_index[k - 1] + 1 if k else self.start
            hi = self._sample_index[k] if k < len(self._sample_index) else self.end
            found = await self._first_at_or_after(d, t, max(lo, d.raft.log.first_index()), hi + 1)
            if found is not None or lo >= d.raft.log.first_index():
                return found
            # The first record at or after `t` was compacted: the first retained one after it.
            return await self._first_at_or_after(d, t, hi + 1, self.end + 1)


_indexes: weakref.WeakKeyDictionary[PartitionDriver, TimeIndex] = weakref.WeakKeyDictionary()
