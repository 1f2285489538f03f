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

Only NORMAL entries become rows (no-ops and membership changes are skipped, `next` says where
the page ended). An entry whose data is not a record (never written by this API) becomes a row
with a null key, its raw data as value and the header `raftlog.raw` = `true`.
"""

from __future__ import annotations

from array import array
from itertools import accumulate
from typing import Any

import msgspec

from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import Record, decode_record

CONTENT_TYPE = "application/vnd.raftlog.columns+msgpack"
_encoder = msgspec.msgpack.Encoder()
_records = msgspec.msgpack.Decoder(list[Record])


def _int64(values: list[int]) -> bytes:
    return array("q", values).tobytes()


def _binary(values: list[bytes | None]) -> tuple[bytes, bytes, bytes]:
    """(offsets int32, data, validity uint8) of nullable byte strings."""
    lengths = [0 if v is None else len(v) for v in values]
    offsets = array("i", [0])
    offsets.extend(accumulate(lengths))
    valid = bytes(v is not None for v in values)
    data = b"".join(v for v in values if v is not None)
    return offsets.tobytes(), data, valid


def _strings(values: list[str]) -> tuple[bytes, bytes]:
    encoded = [v.encode() for v in values]
    offsets = array("i", [0])
    offsets.extend(accumulate(len(v) for v in encoded))
    return offsets.tobytes(), b"".join(encoded)


def _decode(entries: list[Entry]) -> list[Record]:
    """Every entry's record, decoded in one call (a MessagePack array of the records' bytes);
    one at a time, with a raw row for what is not a record, only when that fails."""
    if not entries:
        return []
    n = len(entries)
    head = bytes([0xDC]) + n.to_bytes(2, "big") if n < 2**16 else b"\xdd" + n.to_bytes(4, "big")
    try:
        return _records.decode(head + b"".join(e.data for e in entries))
    except msgspec.DecodeError:
        out = []
        for e in entries:
            try:
                out.append(decode_record(e.data))
            except msgspec.DecodeError:
                out.append(Record(None, e.data, {"raftlog.raw": "true"}))
        return out


def record_page(
    partition: int, entries: list[Entry], *, high_water_mark: int, next_index: int, floor: int
) -> bytes:
    """The column page of `entries` (committed, in index order)."""
    normal = [e for e in entries if e.kind == EntryKind.NORMAL]
    records = _decode(normal)
    header_counts = [len(r.headers) for r in records]
    header_offsets = array("i", [0])
    header_offsets.extend(accumulate(header_counts))
    hk: list[str] = []
    hv: list[str] = []
    for r in records:
        if r.headers:
            hk.extend(r.headers.keys())
            hv.extend(r.headers.values())
    key_offsets, key_data, key_valid = _binary([r.key for r in records])
    value_offsets, value_data, value_valid = _binary([r.value for r in records])
    hk_offsets, hk_data = _strings(hk)
    hv_offsets, hv_data = _strings(hv)
    page: dict[str, Any] = {
        "partition": partition,
        "high_water_mark": high_water_mark,
        "compaction_floor": floor,
        "next": next_index,
        "count": len(records),
        "index": _int64([e.index for e in normal]),
        "term": _int64([e.term for e in normal]),
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
