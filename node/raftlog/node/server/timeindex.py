"""The first committed index at or after a time, per partition (as Kafka's time index).

Readers that start or end at a time (the Spark sources' `startingTimestamp`,
`startingOffsetsByTimestamp`, `endingOffsetsByTimestamp`) ask a replica for "the first record
whose `timestamp_ms` is at or after T". Producers' timestamps need not rise with the index, so
the log is cut into gaps of `SAMPLE_EVERY` indexes, each with the largest timestamp in it (16
bytes per gap): the first record at or after T is in the first gap whose largest timestamp
reaches T, and a lookup reads that gap's records. A gap that compaction cut is read from the
log's start; one it removed whole is dropped, its largest timestamp remembered, so that an
answer can say a record at or after T may have been compacted (`compacted`).

The index is built on the first lookup by one pass over the retained log, then extended from
where it ended on each later lookup: nothing is stored and the append path never sees it. A
record with no timestamp (0) is never at or after a time.
"""

from __future__ import annotations

import asyncio
import bisect
import weakref
from array import array
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from raftlog.node.core.errors import Compacted
from raftlog.node.record import Record
from raftlog.node.server import columnar
from raftlog.node.storage.segment import RawRange, Rows

if TYPE_CHECKING:
    from raftlog.node.server.partition import PartitionDriver

SAMPLE_EVERY = 1024  # indexes per gap: a lookup reads the records of about one gap
PASS_RECORDS = 20_000  # records read per step of a pass (one event-loop step, one thread job)
INT64_MAX = (1 << 63) - 1
_record = msgspec.msgpack.Decoder(Record)


def _stamped(raws: list[RawRange], tail: Rows) -> tuple[array[int], list[int]]:
    """In a worker thread: the indexes of the records read and their timestamps."""
    rows = columnar.rows_of(raws, tail)
    out: list[int] = []
    decode = _record.decode
    for raw in rows.data:
        try:
            ts = decode(raw).timestamp_ms
        except (msgspec.DecodeError, UnicodeDecodeError):  # not a record: no timestamp
            ts = 0
        # Past int64 (never written by this API): no timestamp, as its column page says.
        out.append(ts if 0 <= ts <= INT64_MAX else 0)
    return rows.index, out


def of(d: PartitionDriver) -> TimeIndex:
    """The time index of partition `d` (made on the first call)."""
    index = _indexes.get(d)
    if index is None:
        index = _indexes[d] = TimeIndex()
    return index


class Answer(NamedTuple):
    first: int | None  # the first retained record at or after the time; None: none
    compacted: bool  # a record at or after the time may have been compacted before `first`


class TimeIndex:
    def __init__(self) -> None:
        self.start = 0  # the first index covered (0: not built yet)
        self.end = 0  # the last index covered
        self._first = array("q")  # each gap's first record index, rising
        self._max = array("q")  # each gap's largest timestamp
        # The largest timestamp compacted away: -1 none; INT64_MAX when unknown (the index
        # began at a log start past 1, or started over after compaction passed its end).
        self._compacted_max = -1
        self._lock = asyncio.Lock()  # one pass at a time

    def _reset(self, start: int) -> None:
        self.start, self.end = start, start - 1
        del self._first[:], self._max[:]
        self._compacted_max = -1 if start <= 1 else INT64_MAX

    def _add(self, indexes: array[int], stamps: list[int], last: int) -> None:
        """Records at `indexes` with `stamps`, then the range covered up to `last`."""
        first, top = self._first, self._max
        for i, ts in zip(indexes, stamps, strict=True):
            if not first or i - first[-1] >= SAMPLE_EVERY:
                first.append(i)
                top.append(ts)
            elif ts > top[-1]:
                top[-1] = ts
        self.end = last

    def _drop_below(self, floor: int) -> None:
        """Forget the gaps compaction removed whole (each ends before the next one's first)."""
        whole = bisect.bisect_right(self._first, floor) - 1  # gaps before this one are gone
        if whole > 0:
            self._compacted_max = max(self._compacted_max, max(self._max[:whole]))
            del self._first[:whole], self._max[:whole]
            self.start = self._first[0]

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
        while self.end < d.high_water_mark:
            first = d.raft.log.first_index()
            if not self.start or self.end + 1 < first:
                self._reset(first)
            try:
                indexes, stamps, nxt = await self._read(d, self.end + 1, d.high_water_mark + 1)
            except Compacted:
                self._reset(d.raft.log.first_index())
                continue
            if nxt <= self.end + 1:
                return  # nothing more readable now
            self._add(indexes, stamps, nxt - 1)

    async def _first_at_or_after(
        self, d: PartitionDriver, t: int, start: int, stop: int
    ) -> int | None:
        """The first retained record of [start, stop) stamped at or after `t`."""
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

    async def lookup(self, d: PartitionDriver, t: int) -> Answer:
        """The first committed record stamped at or after `t` (ms) that this replica holds (up
        to its high-water mark), and whether one before it may have been compacted."""
        async with self._lock:
            await self._extend(d)
            self._drop_below(d.raft.log.first_index())
            compacted = self._compacted_max >= t
            for k, top in enumerate(self._max):
                if top < t:
                    continue
                floor = d.raft.log.first_index()
                stop = self._first[k + 1] if k + 1 < len(self._first) else self.end + 1
                found = await self._first_at_or_after(d, t, max(self._first[k], floor), stop)
                if found is not None:
                    return Answer(found, compacted)
                compacted = True  # the gap's record at or after `t` was compacted: go on
            return Answer(None, compacted)


_indexes: weakref.WeakKeyDictionary[PartitionDriver, TimeIndex] = weakref.WeakKeyDictionary()
