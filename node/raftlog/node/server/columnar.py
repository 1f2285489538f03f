"""Column pages: committed records, or a snapshot's table, as flat little-endian buffers.

The JSON read API builds a Python object per record on both ends. A bulk reader (the Spark
source) asks for a *column page* instead: one MessagePack map whose values are the columns of a
range of records as raw buffers, laid out as Arrow lays out its arrays, so the reader wraps them
in Arrow arrays without touching a row:

| field | buffer |
|---|---|
| `index`, `term`, `timestamp_ms` | int64 per row |
| `key_offsets`, `value_offsets` | int32, rows + 1 (Arrow binary offsets) |
| `key_data`, `value_data` | the bytes, concatenated |
| `key_valid`, `value_valid` | uint8 per row, 0 for null (a tombstone's value, no key) |
| `header_offsets` | int32, rows + 1: the row's headers are pairs [o[i], o[i+1]) |
| `header_key_offsets`, `header_key_data`, `header_value_offsets`, `header_value_data` | the pairs |

A record's header pairs are in its order: keys UTF-8, values the bytes it gave (UTF-8 for a map
of text; any bytes, keys repeated, for Kafka's headers).

Only NORMAL entries become rows (no-ops and membership changes are skipped, `next` says where
the page ended). An entry whose data is not a record (never written by this API) becomes a row
with a null key, its raw data as value and the header `raftlog.raw` = `true`.

A page is built from the records' bytes as the WAL holds them (`Wal.read_raw`: one pread, each
record checked against its checksum, no `Entry` per record), each record decoded by msgspec, each
column made in one pass at C speed where the common case allows (no nulls, no headers). The
building runs in a worker thread, at most `BUILDERS` at a time per node, so a big read never
holds the event loop (Raft's ticks and heartbeats) for more than the pread; the pages' size is
bounded by the request (`limit`, `max_bytes`, at most MAX_PAGE_BYTES), the core's
committed-but-unpersisted entries included.

A reader that checks and decodes records itself (the JVM Spark reader) asks for a WAL page
instead (`format=wal`, `walpage`): the same range's records as the WAL frames them, which spares
the node this page's per-record work. `committed_range` fixes the range for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from array import array
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import is_not
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec

from raftlog.node.core.errors import Compacted
from raftlog.node.core.types import Entry
from raftlog.node.record import Record
from raftlog.node.server.api_common import ApiError
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.errors import SnapshotCorruption, WalCorruption
from raftlog.node.storage.segment import RawRange, Rows

if TYPE_CHECKING:
    from raftlog.node.server.partition import PartitionDriver

log = logging.getLogger("raftlog.server.columnar")
T = TypeVar("T")

CONTENT_TYPE = "application/vnd.raftlog.columns+msgpack"
BUILDERS = 2  # pages built at once per node (each in a worker thread)
GATE_WAIT_S = 10.0  # the longest a request waits for its turn
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_PAGE_BYTES = 16 << 20  # a page's records at most (building one takes a few times that)
_encoder = msgspec.msgpack.Encoder()
_record = msgspec.msgpack.Decoder(Record)
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


class _Turn:
    """A turn to build a page. Work handed to a thread keeps the turn until the thread ends,
    even when the request is cancelled meanwhile (the thread cannot be stopped)."""

    def __init__(self) -> None:
        self.thread: asyncio.Future[Any] | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        self.thread = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        return await asyncio.shield(self.thread)


@contextlib.asynccontextmanager
async def read_turn() -> AsyncIterator[_Turn]:
    """A turn to build a page: at most BUILDERS at once on this event loop (a node runs one
    loop; tests, several), waiting at most GATE_WAIT_S (then 503 `busy`, which readers retry
    elsewhere or later; shorter than a reader's own timeout, so a reader that gave up does not
    find its abandoned request ahead of its retry for long)."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(BUILDERS)
    try:
        if gate.locked():
            await asyncio.wait_for(gate.acquire(), GATE_WAIT_S)
        else:
            await gate.acquire()  # at once, without a turn of the loop in between
    except TimeoutError:
        raise ApiError(
            503, "busy", f"{BUILDERS} pages in the making for {GATE_WAIT_S:.0f} s; retry"
        ) from None
    turn = _Turn()
    try:
        yield turn
    finally:
        if turn.thread is None or turn.thread.done():
            gate.release()
        else:

            def release(thread: asyncio.Future[Any]) -> None:
                gate.release()
                if not thread.cancelled():
                    thread.exception()  # retrieved: nobody awaits it any more

            turn.thread.add_done_callback(release)


def _int64(values: list[int]) -> bytes:
    return array("q", values).tobytes()


def _binary(values: list[bytes | None]) -> tuple[bytes, bytes, bytes]:
    """(offsets int32, data, validity uint8) of nullable byte strings."""
    n = len(values)
    nulls = values.count(None)
    if nulls == n:
        return bytes(4 * (n + 1)), b"", bytes(n)
    if nulls:
        present: list[bytes] = [b"" if v is None else v for v in values]
        valid = bytes(map(is_not, values, repeat(None)))
    else:
        present, valid = cast(list[bytes], values), b"\x01" * n
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, present)))
    return offsets.tobytes(), b"".join(present), valid


def _strings(values: list[str]) -> tuple[bytes, bytes]:
    encoded = [v.encode() for v in values]
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, encoded)))
    return offsets.tobytes(), b"".join(encoded)


def _decode(data: list[bytes]) -> list[Record]:
    """Every record, each decoded on its own (so a malformed one can never shift the others'
    boundaries); what is not a record becomes a raw row."""
    out: list[Record] = []
    decode = _record.decode
    for raw in data:
        try:
            r = decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError):  # bad UTF-8 in a str is the latter
            r = None
        # A timestamp past int64 (msgpack's uint64; never written by this API) has no column.
        if r is None or not INT64_MIN <= r.timestamp_ms <= INT64_MAX:
            r = Record(None, raw, {"raftlog.raw": "true"})
        out.append(r)
    return out


def record_page(
    partition: int, rows: Rows, *, high_water_mark: int, next_index: int, floor: int
) -> bytes:
    """The column page of `rows` (committed NORMAL entries, in index order)."""
    records = _decode(rows.data)
    header_counts = [len(r.headers) for r in records]
    header_offsets = array("i", [0])
    hk: list[str] = []
    hv: list[bytes] = []
    if any(header_counts):
        header_offsets.extend(accumulate(header_counts))
        for r in records:
            if isinstance(r.headers, dict):
                hk.extend(r.headers.keys())
                hv.extend(v.encode() for v in r.headers.values())
            else:
                for k, v in r.headers:
                    hk.append(k)
                    hv.append(v)
    else:
        header_offsets.extend(repeat(0, len(records)))
    key_offsets, key_data, key_valid = _binary([r.key for r in records])
    value_offsets, value_data, value_valid = _binary([r.value for r in records])
    hk_offsets, hk_data = _strings(hk)
    hv_offsets, hv_data, _ = _binary(cast(list[bytes | None], hv))
    page: dict[str, Any] = {
        "partition": partition,
        "high_water_mark": high_water_mark,
        "compaction_floor": floor,
        "next": next_index,
        "count": len(records),
        "index": rows.index.tobytes(),
        "term": rows.term.tobytes(),
        "timestamp_ms": _int64([r.timestamp_ms for r in records]),
        "key_offsets": key_offsets,
        "key_data": key_data,
        "key_valid": key_valid,
        "value_offsets": value_offsets,
        "value_data": value_data,
        "value_valid": value_valid,
        "header_offsets": header_offsets.tobytes(),
        "header_key_offsets": hk_offsets,
        "header_key_data": hk_data,
        "header_value_offsets": hv_offsets,
        "header_value_data": hv_data,
    }
    return _encoder.encode(page)


def rows_of(raws: list[RawRange], tail: Rows) -> Rows:
    """In a worker thread: the records of `raws`, each checked, then those of `tail`."""
    whole = Rows()
    for raw in raws:
        whole.add_raw(raw)
    whole.index.extend(tail.index)
    whole.term.extend(tail.term)
    whole.data.extend(tail.data)
    return whole


def _build_record_page(
    partition: int, raws: list[RawRange], rows: Rows, hwm: int, next_index: int, floor: int
) -> bytes:
    """In a worker thread: check and decode the records read, then the page."""
    whole = rows_of(raws, rows)
    return record_page(partition, whole, high_water_mark=hwm, next_index=next_index, floor=floor)


@dataclass
class CommittedRange:
    """What a page of committed records [start, next_index) is made of: the WAL's bytes of the
    persisted entries, then the core's committed entries the driver has not persisted yet."""

    hwm: int
    raws: list[RawRange]
    tail: list[Entry]  # entries of every kind
    next_index: int


def committed_range(
    d: PartitionDriver, start: int, stop: int, limit: int, max_bytes: int
) -> CommittedRange:
    """Committed records [start, stop), at most `limit` entries and about `max_bytes` of
    records, never above this replica's high-water mark (taken now: the mark only grows, so the
    caller's check of `min_index` still holds). One event-loop step. Raises Compacted below
    the floor, ApiError 503 when the WAL cannot be read."""
    hwm = d.high_water_mark
    end = min(stop, start + limit, hwm + 1)
    raft_log = d.raft.log
    if start < raft_log.first_index():
        raise Compacted(f"index {start} is below the compaction floor")
    # Committed entries the driver has not persisted yet (the core's unstable entries, from
    # `offset`) come from the core; the rest from the WAL's bytes.
    stable = max(start, min(end, raft_log.offset))
    try:
        raws = d.storage.read_raw(start, stable, max_bytes) if start < stable else []
    except OSError as e:
        raise ApiError(503, "storage_failed", f"{e}; read from another replica") from None
    at = raws[-1].first + len(raws[-1].offsets) if raws else start
    used = sum(len(r.buf) for r in raws)
    tail: list[Entry] = []
    if at == stable and stable < end:
        for entry in d.read_committed(stable, end):
            if used >= max_bytes and (raws or tail):
                break  # the byte budget holds for the core's entries too
            tail.append(entry)
            used += len(entry.data)
        at = tail[-1].index + 1 if tail else at
    return CommittedRange(hwm, raws, tail, at)


async def read_records(
    d: PartitionDriver, start: int, stop: int, limit: int, max_bytes: int
) -> bytes:
    """The column page of committed records [start, stop): at most `limit` entries and about
    `max_bytes` of records, never above this replica's high-water mark. Raises Compacted
    below the floor, WalCorruption when a record read fails its checksum."""
    max_bytes = min(max_bytes, MAX_PAGE_BYTES)
    async with read_turn() as turn:
        # Taken once the page may be built; everything below, up to the thread, is one
        # event-loop step.
        r = committed_range(d, start, stop, limit, max_bytes)
        rows = Rows()
        rows.add_entries(r.tail)
        floor = d.storage.compaction_floor()
        try:
            return await turn.run(_build_record_page, d.p, r.raws, rows, r.hwm, r.next_index, floor)
        except WalCorruption as e:
            log.error(
                "partition %d: a bulk read of [%d, %d) failed: %s", d.p, start, r.next_index, e
            )
            raise


def table_page(partition: int, index: int, term: int, rows: dict[bytes, bytes]) -> bytes:
    """The keyed table of a snapshot at (`index`, `term`) as key and value columns."""
    keys = list(rows)
    key_offsets, key_data, _ = _binary(list(keys))
    value_offsets, value_data, _ = _binary(list(rows.values()))
    page: dict[str, Any] = {
        "partition": partition,
        "snapshot_index": index,
        "snapshot_term": term,
        "count": len(keys),
        "key_offsets": key_offsets,
        "key_data": key_data,
        "value_offsets": value_offsets,
        "value_data": value_data,
    }
    return _encoder.encode(page)


def _build_table_page(d: PartitionDriver) -> bytes:
    """In a worker thread: the latest snapshot, read, verified and decoded, as a page."""
    meta, data = d.storage.snapshots.read_latest()
    if meta is None or not meta.index:
        return table_page(d.p, 0, 0, {})
    return table_page(d.p, meta.index, meta.term, KeyedTable.restore(data).rows)


async def read_table(d: PartitionDriver) -> bytes:
    """The keyed table of this replica's latest stored snapshot as a column page (index 0 and
    no rows when there is none), built off the event loop."""
    async with read_turn() as turn:
        try:
            return await turn.run(_build_table_page, d)
        except (SnapshotCorruption, OSError) as e:
            log.error("partition %d: reading the latest snapshot failed: %s", d.p, e)
            raise ApiError(
                503, "storage_corrupt", f"{e}; read the table from another replica"
            ) from None
