"""`df.write.format("raftlog")` and `writeStream.format("raftlog")`: rows appended to a cluster,
exactly once across task and micro-batch retries.

Each write task appends its rows to each raftlog partition as an idempotent producer: the
producer id is made of the write (a batch write's id, fixed when it was planned; a stream's query
id and micro-batch id, which a restarted query replays unchanged) and the task's Spark
partition; sequences count the task's rows per raftlog partition, in chunks of `batchRecords`.
A retried task recomputes the same rows in the same order (a deterministic input, as Spark's
own retries assume), so every chunk it sends again is answered as a duplicate by the node and
lands once. Rows are visible to readers as soon as they are committed, before the write ends: a
failed batch write leaves what its tasks appended (as Kafka's sink does); run it again under the
same `writeId` to finish it without duplicates.

Input columns: `value` (string or binary, required, null for a tombstone), `key` (string or
binary), `partition` (int: the raftlog partition; else the key's partition, as the node's
`/v1/records` routes it, or partition 0 for rows without a key), `headers`
(map<string,string>, or Kafka's array<struct<key string, value binary>>), `timestamp`
(timestamp: the record's `timestamp_ms`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegralType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from raftlog.client import ClientError
from raftlog.node.record import epoch_ms
from raftlog.node.routing import partition_for
from raftlog.spark.nodes import client
from raftlog.spark.options import READ_OPTIONS, OptionError, Options, integer, parse

log = logging.getLogger("raftlog.spark.sink")
WRITE_OPTIONS = ("endpoints", "token", "tokenFile", "caFile", "timeoutSeconds")
_WRITE_ONLY = ("batchRecords", "writeId")
# Spark's local properties of a micro-batch's tasks (StreamExecution's QUERY_ID_KEY and
# MicroBatchExecution's BATCH_ID_KEY): the query id survives restarts (it is in the checkpoint).
QUERY_ID, BATCH_ID = "sql.streaming.queryId", "streaming.sql.batchId"


@dataclass(frozen=True)
class WriteOptions:
    nodes: Options
    batch_records: int
    write_id: str | None
    # The cluster's partition count, read once on the driver (`writer`, `stream_writer`): a
    # task that read it itself could route a key elsewhere on a retry after a raise, under
    # another producer id, so its rows landed twice.
    partitions: int = 0


def parse_write(raw: Mapping[str, str]) -> WriteOptions:
    opts = {str(k).lower(): v for k, v in raw.items()}
    known = {n.lower() for n in (*WRITE_OPTIONS, *_WRITE_ONLY)}
    unknown = sorted(set(opts) - known - {"path", "checkpointlocation"})  # (Spark's own)
    if unknown:
        # Spark hands options over lower-cased: named back as documented.
        names = {n.lower(): n for n in (*READ_OPTIONS, *WRITE_OPTIONS, *_WRITE_ONLY)}
        name = names.get(unknown[0], unknown[0])
        what = "a read option" if unknown[0] in names else "not an option"
        writes = ", ".join((*WRITE_OPTIONS, *_WRITE_ONLY))
        raise OptionError(name, f"is {what}; a write takes {writes}")
    batch = opts.pop("batchrecords", "500")
    try:
        batch_records = integer(str(batch))
    except ValueError:
        raise OptionError("batchRecords", f"must be an integer, got {batch!r}") from None
    if not 1 <= batch_records <= 10_000:
        raise OptionError("batchRecords", f"must be between 1 and 10000, got {batch_records}")
    write_id = opts.pop("writeid", None)
    if write_id is not None and not 0 < len(str(write_id)) <= 100:
        raise OptionError("writeId", "must be 1 to 100 characters")
    opts.pop("checkpointlocation", None)
    return WriteOptions(parse(opts, streaming=False), batch_records, write_id)


def _check_schema(schema: StructType) -> None:
    """The DataFrame's columns, refused naming the column and the reason."""
    names = {f.name: f for f in schema.fields}
    if "value" not in names:
        raise ValueError("raftlog write: the DataFrame needs a `value` column (string or binary)")
    for column in ("key", "value"):
        kind = names[column].dataType if column in names else None
        if kind is not None and not isinstance(kind, StringType | BinaryType):
            raise ValueError(
                f"raftlog write: column `{column}` must be string or binary, not "
                f"{kind.simpleString()}"
            )
    extra = set(names) - {"key", "value", "partition", "headers", "timestamp"}
    if extra:
        raise ValueError(
            f"raftlog write: column `{sorted(extra)[0]}` is not one a write takes (key, value, "
            "partition, headers, timestamp)"
        )
    # Checked here, on the driver, rather than row by row in the tasks: a task that met one
    # failed after some of its chunks were appended, leaving the write partial.
    kinds = {column: names[column].dataType for column in names}
    if "partition" in kinds and not isinstance(kinds["partition"], IntegralType):
        raise ValueError(_wrong("partition", "an integer", kinds["partition"]))
    if "timestamp" in kinds and not isinstance(
        kinds["timestamp"], TimestampType | TimestampNTZType
    ):
        raise ValueError(_wrong("timestamp", "a timestamp", kinds["timestamp"]))
    if "headers" in kinds and not _headers_type(kinds["headers"]):
        raise ValueError(
            _wrong(
                "headers",
                "map<string,string> or array<struct<key:string,value:binary or string>>",
                kinds["headers"],
            )
        )


def _wrong(column: str, wanted: str, kind: DataType) -> str:
    return f"raftlog write: column `{column}` must be {wanted}, not {kind.simpleString()}"


def _headers_type(kind: DataType) -> bool:
    if isinstance(kind, MapType):
        return isinstance(kind.keyType, StringType) and isinstance(kind.valueType, StringType)
    if isinstance(kind, ArrayType) and isinstance(kind.elementType, StructType):
        fields = {f.name: f.dataType for f in kind.elementType.fields}
        return (
            set(fields) == {"key", "value"}
            and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], BinaryType | StringType)
        )
    return False


@dataclass
class Written(WriterCommitMessage):
    records: int
    duplicates: int  # chunks a retry sent again, answered with their first indexes


def _field(record: dict[str, Any], name: str, v: Any) -> None:
    if v is None:
        record[name] = None
    elif isinstance(v, bytes | bytearray):
        record[f"{name}_b64"] = base64.b64encode(bytes(v)).decode()
    else:
        record[name] = str(v)


def _record(row: Any, fields: set[str]) -> dict[str, Any]:
    r: dict[str, Any] = {}
    if "key" in fields and row["key"] is not None:
        _field(r, "key", row["key"])
    _field(r, "value", row["value"])
    if "headers" in fields and row["headers"]:
        headers = row["headers"]
        if isinstance(headers, dict):  # a map of strings
            if any(v is None for v in headers.values()):
                raise ValueError(
                    "raftlog write: a header in column `headers` has a null value "
                    "(a record's headers are keys with values)"
                )
            r["headers"] = {str(k): str(v) for k, v in headers.items()}
        else:  # Kafka's headers: pairs in order, keys may repeat, values bytes
            r["headers"] = []
            for pair in headers:
                if pair["key"] is None or pair["value"] is None:
                    raise ValueError(
                        "raftlog write: a header in column `headers` has a null key or value "
                        "(a record's headers are keys with values)"
                    )
                h: dict[str, Any] = {"key": str(pair["key"])}
                _field(h, "value", pair["value"])
                r["headers"].append(h)
    if "timestamp" in fields and row["timestamp"] is not None:
        ts: dt.datetime = row["timestamp"]
        r["timestamp_ms"] = epoch_ms(ts)
    return r


def _key_bytes(v: Any) -> bytes:
    return bytes(v) if isinstance(v, bytes | bytearray) else str(v).encode()


# Most JSON bytes of one append, whatever `batchRecords` says: half the node's default
# `max_request_bytes` (8 MiB), so that rows of a few KB each do not make a chunk the node
# refuses (413) with the defaults. A row larger than this goes alone.
CHUNK_BYTES = 4 * 1024 * 1024


def _json_size(record: dict[str, Any]) -> int:
    return len(json.dumps(record, separators=(",", ":"))) + 1


class _Appender:
    """One task's appends: per raftlog partition, chunks under the producer id and the next
    sequence; to the partition's leader (the client finds it and retries for up to
    `timeoutSeconds`)."""

    def __init__(self, opts: WriteOptions, producer: str) -> None:
        self.opts = opts
        self.nodes = client(opts.nodes)
        self.producer = producer
        self.partitions = opts.partitions
        self.pending: dict[int, list[dict[str, Any]]] = {}
        self.pending_bytes: dict[int, int] = {}
        self.sequence: dict[int, int] = {}
        self.written = self.duplicates = 0

    def add(self, row: Any, fields: set[str]) -> None:
        if "partition" in fields and row["partition"] is not None:
            p = int(row["partition"])
            if not 0 <= p < self.partitions:
                raise ValueError(
                    f"column partition: {p} is not a partition of the cluster "
                    f"(0..{self.partitions - 1})"
                )
        elif "key" in fields and row["key"] is not None:
            p = partition_for(_key_bytes(row["key"]), self.partitions)
        else:
            p = 0
        record = _record(row, fields)
        size = _json_size(record)
        if self.pending.get(p) and self.pending_bytes[p] + size > CHUNK_BYTES:
            self.flush(p)
        chunk = self.pending.setdefault(p, [])
        chunk.append(record)
        self.pending_bytes[p] = self.pending_bytes.get(p, 0) + size
        if len(chunk) >= self.opts.batch_records:
            self.flush(p)

    def flush(self, p: int) -> None:
        chunk = self.pending.pop(p, [])
        self.pending_bytes.pop(p, None)
        if not chunk:
            return
        seq = self.sequence.get(p, 0)
        self.duplicates += self._append(p, chunk, seq)
        self.sequence[p] = seq + len(chunk)
        self.written += len(chunk)

    def _append(self, p: int, chunk: list[dict[str, Any]], seq: int) -> bool:
        """Whether the chunk was in the log already (sent again by a retried task)."""
        try:
            result = self.nodes.append(p, chunk, producer_id=f"{self.producer}-r{p}", sequence=seq)
        except ClientError as e:
            if e.status == 409 and e.error == "already_appended":
                return True  # one of a retried task's early chunks
            if e.retryable:
                raise RuntimeError(
                    f"raftlog write to partition {p}: not appended within timeoutSeconds "
                    f"({self.opts.nodes.timeout_s} s): {e}"
                ) from None
            raise RuntimeError(f"raftlog write to partition {p}: {e}") from None
        return result.duplicate

    def finish(self) -> Written:
        try:
            for p in sorted(self.pending):
                self.flush(p)
        finally:
            self.nodes.close()
        return Written(self.written, self.duplicates)


def _write(opts: WriteOptions, producer: str, fields: set[str], rows: Iterator[Any]) -> Written:
    appender = _Appender(opts, producer)
    for row in rows:
        appender.add(row, fields)
    return appender.finish()


def _report(what: str, messages: list[WriterCommitMessage | None]) -> None:
    done = [m for m in messages if isinstance(m, Written)]
    log.info(
        "%s: %d records appended by %d tasks, %d chunks of them answered as duplicates (sent "
        "again by retried tasks, appended once)",
        what,
        sum(m.records for m in done),
        len(done),
        sum(m.duplicates for m in done),
    )


def _task() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("a raftlog write runs in a Spark task")
    return ctx


class RaftlogWriter(DataSourceWriter):
    """A batch write: `writeId` (a fresh one unless given) and the task's partition make each
    task's producer id, the same on every attempt of the task."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.fields = {f.name for f in schema.fields}
        self.write_id = opts.write_id or f"spark-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Any]) -> Written:
        producer = f"{self.write_id}-t{_task().partitionId()}"
        return _write(self.opts, producer, self.fields, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report(f"raftlog write {self.write_id}", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _report(f"raftlog write {self.write_id} failed (run it again with this writeId)", messages)


class RaftlogStreamWriter(DataSourceStreamWriter):
    """A micro-batch's write: the query id (kept in the checkpoint), the batch id (replayed
    unchanged after a restart) and the task's partition make each task's producer id."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.fields = {f.name for f in schema.fields}

    def write(self, iterator: Iterator[Any]) -> Written:
        ctx = _task()
        query, batch = ctx.getLocalProperty(QUERY_ID), ctx.getLocalProperty(BATCH_ID)
        if not query or batch is None:
            raise RuntimeError(f"a raftlog stream write needs Spark's {QUERY_ID} and {BATCH_ID}")
        producer = f"{self.opts.write_id or query}-b{batch}-t{ctx.partitionId()}"
        return _write(self.opts, producer, self.fields, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Every record is in the log once its append was answered: nothing more to do.
        _report(f"raftlog stream write, micro-batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # what was appended stays; the batch's retry lands the rest, once


def _with_partition_count(opts: WriteOptions) -> WriteOptions:
    """The options with the cluster's partition count: the fewest partitions a member
    answering holds, those every member serves (during a raise, the partitions not every
    member holds yet have no leader). A stream keeps it for its run: a raise reaches its keys
    when the query is started again."""
    nodes = client(opts.nodes)
    counts, last = [], None
    try:
        for base in opts.nodes.endpoints:
            try:
                counts.append(len(nodes.status(base)["partitions"]))
            except ClientError as e:
                last = e
    finally:
        nodes.close()
    if not counts:
        raise OptionError("endpoints", f"no node answered /v1/status ({last})")
    return replace(opts, partitions=min(counts))


def writer(options: Mapping[str, str], schema: StructType) -> RaftlogWriter:
    _check_schema(schema)
    return RaftlogWriter(_with_partition_count(parse_write(options)), schema)


def stream_writer(options: Mapping[str, str], schema: StructType) -> RaftlogStreamWriter:
    _check_schema(schema)
    return RaftlogStreamWriter(_with_partition_count(parse_write(options)), schema)
