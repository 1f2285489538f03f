"""The source's schema, and column pages (see `raftlog.node.server.columnar`) as Arrow batches.

A page's buffers become Arrow arrays as they are (`Array.from_buffers`): no Python object is
made per record. Table mode's "latest value per key" is Arrow compute (group by key, max index).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), False),
        StructField("index", LongType()),
        StructField("term", LongType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("headers", MapType(StringType(), StringType(), False)),
        StructField("timestamp", TimestampType()),
    ]
)
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type
# includeHeaders=true: Kafka's type, every pair in the record's order, values as bytes.
KAFKA_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
KAFKA_SCHEMA = StructType(
    [StructField("headers", KAFKA_HEADERS) if f.name == "headers" else f for f in SCHEMA.fields]
)
KAFKA_ARROW_SCHEMA: pa.Schema = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")
_KAFKA_HEADERS_TYPE = KAFKA_ARROW_SCHEMA.field("headers").type


def schema(include_headers: bool) -> StructType:
    return KAFKA_SCHEMA if include_headers else SCHEMA


_TS_TYPE = ARROW_SCHEMA.field("timestamp").type


def _validity(valid: bytes, n: int) -> tuple[pa.Buffer | None, int]:
    """An Arrow validity bitmap from one byte per row (0: null), and the null count."""
    if not n:
        return None, 0
    mask = pc.not_equal(pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(valid)]), 0)
    nulls = n - pc.sum(mask).as_py()
    if not nulls:
        return None, 0
    bitmap = mask.buffers()[1]
    assert mask.offset == 0
    return bitmap, nulls


def _binary(page: dict[str, Any], name: str, n: int, nullable: bool = True) -> pa.Array:
    offsets = pa.py_buffer(page[f"{name}_offsets"])
    data = pa.py_buffer(page[f"{name}_data"])
    bitmap, nulls = _validity(page[f"{name}_valid"], n) if nullable else (None, 0)
    return pa.Array.from_buffers(pa.binary(), n, [bitmap, offsets, data], null_count=nulls)


def _int64(raw: bytes, n: int) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(raw)])


def page_to_batch(page: dict[str, Any], include_headers: bool = False) -> pa.RecordBatch:
    """A `/columns` page as a batch of ARROW_SCHEMA (KAFKA_ARROW_SCHEMA with
    `include_headers`)."""
    n = int(page["count"])
    ts_ms = _int64(page["timestamp_ms"], n)
    # A record without a timestamp (0) reads as null.
    ts_valid = pc.not_equal(ts_ms, 0)
    ts = pc.if_else(ts_valid, pc.multiply(ts_ms, 1000), pa.scalar(None, pa.int64())).cast(_TS_TYPE)
    pairs = int(len(page["header_key_offsets"]) // 4) - 1
    header_keys = pa.Array.from_buffers(
        pa.string(), pairs, [None, pa.py_buffer(page["header_key_offsets"]),
                             pa.py_buffer(page["header_key_data"])],
    )  # fmt: skip
    value_buffers = [None, pa.py_buffer(page["header_value_offsets"]),
                     pa.py_buffer(page["header_value_data"])]  # fmt: skip
    header_offsets = pa.Array.from_buffers(
        pa.int32(), n + 1, [None, pa.py_buffer(page["header_offsets"])]
    )
    headers: pa.Array
    if include_headers:
        kafka = pa.StructArray.from_arrays(
            [header_keys, pa.Array.from_buffers(pa.binary(), pairs, value_buffers)],
            fields=list(_KAFKA_HEADERS_TYPE.value_type),
        )
        headers = pa.ListArray.from_arrays(header_offsets, kafka, type=_KAFKA_HEADERS_TYPE)
    else:
        # A value that is not UTF-8 (Kafka's headers) keeps its bytes, as Spark's strings do.
        header_values = pa.Array.from_buffers(pa.string(), pairs, value_buffers)
        headers = pa.MapArray.from_arrays(
            header_offsets, header_keys, header_values, type=_HEADERS_TYPE
        )
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(int(page["partition"]), pa.int32()), n),
            _int64(page["index"], n),
            _int64(page["term"], n),
            _binary(page, "key", n),
            _binary(page, "value", n),
            headers,
            ts,
        ],
        schema=KAFKA_ARROW_SCHEMA if include_headers else ARROW_SCHEMA,
    )


def snapshot_to_table(page: dict[str, Any]) -> pa.Table:
    """A `/snapshot/table` page as rows of ARROW_SCHEMA: index, term and timestamp are null
    (the snapshot keeps each key's value, not the record that set it), headers empty."""
    n = int(page["count"])
    keys = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(page["key_offsets"]), pa.py_buffer(page["key_data"])]
    )
    values = pa.Array.from_buffers(
        pa.binary(), n,
        [None, pa.py_buffer(page["value_offsets"]), pa.py_buffer(page["value_data"])],
    )  # fmt: skip
    empty = pa.MapArray.from_arrays(
        pa.repeat(pa.scalar(0, pa.int32()), n + 1),
        pa.array([], pa.string()),
        pa.array([], pa.string()),
        type=_HEADERS_TYPE,
    )
    return pa.Table.from_arrays(
        [
            pa.repeat(pa.scalar(int(page["partition"]), pa.int32()), n),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.int64()),
            keys,
            values,
            empty,
            pa.nulls(n, _TS_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )


def latest_per_key(snapshot: pa.Table, tail: pa.Table) -> pa.Table:
    """The keyed table: the snapshot's rows overwritten by the tail's records in index order;
    a tombstone (null value) deletes its key; records without a key are not part of it."""
    keyed = tail.filter(pc.is_valid(tail["key"]))
    if keyed.num_rows:
        last = keyed.group_by("key", use_threads=False).aggregate([("index", "max")])
        keyed = keyed.filter(pc.is_in(keyed["index"], value_set=last["index_max"]))
        snapshot = snapshot.filter(pc.invert(pc.is_in(snapshot["key"], value_set=keyed["key"])))
    merged = pa.concat_tables([snapshot, keyed])
    return merged.filter(pc.is_valid(merged["value"]))
