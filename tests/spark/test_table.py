"""mode=table: the keyed table (latest value per key, tombstones removed), read as a snapshot
plus the log after it, equals what the acknowledged records make of it."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from raftlog.harness.local import LocalCluster
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import Record, encode_record
from raftlog.node.server import columnar
from raftlog.spark import arrow
from tests.spark.helpers import (
    Row,
    append,
    column_page,
    raftlog_df,
    records,
    rows_of,
    wait_replicated,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def expected_table(acked: list[Row]) -> list[Row]:
    """Latest value per (partition, key) in index order; a tombstone deletes the key."""
    latest: dict[tuple[int, bytes], Row] = {}
    for r in sorted(acked, key=lambda r: (r[0], r[1])):
        if r[3] is None:
            continue
        if r[4] is None:
            latest.pop((r[0], r[3]), None)
        else:
            latest[(r[0], r[3])] = r
    return sorted(latest.values(), key=lambda r: (r[0], r[3] or b""))


def table_rows(
    spark: SparkSession, cluster: LocalCluster
) -> list[tuple[int, bytes | None, bytes | None]]:
    df = raftlog_df(spark, cluster, {"mode": "table"})
    return sorted((r[0], r[3], r[4]) for r in rows_of(df))


def test_table_mode_is_the_latest_value_per_key_across_a_snapshot(spark, tmp_path):
    with LocalCluster(
        tmp_path, replicas=3, partitions=2, durable=False,
        raft={"compact_every_operations": 10**6, "compact_number_entries": 0},
        env={"RAFTLOG_SEGMENT_BYTES": "4096"},
    ) as cluster:  # fmt: skip
        cluster.wait_ready()
        acked: list[Row] = []
        for p in (0, 1):
            acked += append(cluster, p, records(60, f"old{p}", keys=12, pad=300))
            acked += append(
                cluster, p, [{"key": "k1", "value": None}, {"key": "k2", "value": None}]
            )
            acked += append(cluster, p, [{"value": "no key, not in the table"}])
        for p in (0, 1):
            wait_replicated(cluster, p, max(r[1] for r in acked if r[0] == p))
        # Before any snapshot: the table is the log alone.
        want = [(r[0], r[3], r[4]) for r in expected_table(acked)]
        assert table_rows(spark, cluster) == want
        # Snapshot and compact every replica, then write more: the table is snapshot plus tail.
        for name in cluster.nodes:
            for p in (0, 1):
                code, body = cluster.request(name, "POST", f"/v1/admin/partitions/{p}/compact")
                assert code == 200 and body["compaction_floor"] > 1, body
        for p in (0, 1):
            acked += append(cluster, p, records(20, f"new{p}", keys=5))  # overwrites k0..k4
            acked += append(cluster, p, [{"key": "k7", "value": None}])  # deletes a snapshot key
            acked += append(cluster, p, [{"key": "k1", "value": "back"}])  # a deleted key returns
        for p in (0, 1):
            wait_replicated(cluster, p, max(r[1] for r in acked if r[0] == p))
        want = [(r[0], r[3], r[4]) for r in expected_table(acked)]
        assert table_rows(spark, cluster) == want
        assert (0, b"k7", None) not in want and any(w[1] == b"k1" for w in want)


SNAPSHOT = {b"a": b"1", b"b": b"2", b"c": b"3", b"d": b"4"}  # partition 1 at index 5
TAIL = [
    Entry(6, 2, EntryKind.NORMAL, encode_record(Record(b"a", b"10"))),
    Entry(7, 2, EntryKind.NORMAL, encode_record(Record(None, b"no key, not in the table"))),
    Entry(8, 2, EntryKind.NORMAL, encode_record(Record(b"b", None))),  # deletes b
    Entry(9, 2, EntryKind.NORMAL, encode_record(Record(b"a", b"11"))),
    Entry(10, 2, EntryKind.NORMAL, encode_record(Record(b"e", b"5"))),
]


def merged(tail: list[Entry]) -> list[tuple[Any, ...]]:
    """(partition, index, key, value) of the table of SNAPSHOT and `tail`, by key."""
    snap = arrow.snapshot_to_table(msgspec.msgpack.decode(columnar.table_page(1, 5, 2, SNAPSHOT)))
    pages = [arrow.page_to_batch(msgspec.msgpack.decode(column_page(1, tail, 6, 11)))]
    table = arrow.latest_per_key(snap, pa.Table.from_batches(pages, arrow.ARROW_SCHEMA))
    rows = [(r["partition"], r["index"], r["key"], r["value"]) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: r[2])


def test_the_table_is_the_snapshot_overwritten_by_the_tails_latest_value_per_key():
    """Without Spark: a key's latest record in the tail replaces its snapshot row (with the
    record's index), a tombstone deletes it, a record without a key is not in the table, and
    snapshot rows have no index."""
    assert merged(TAIL) == [
        (1, 9, b"a", b"11"),
        (1, None, b"c", b"3"),
        (1, None, b"d", b"4"),
        (1, 10, b"e", b"5"),
    ]
    # A tail of a single record overwrites its key too.
    one = [Entry(6, 2, EntryKind.NORMAL, encode_record(Record(b"c", b"30")))]
    assert merged(one) == [
        (1, None, b"a", b"1"),
        (1, None, b"b", b"2"),
        (1, 6, b"c", b"30"),
        (1, None, b"d", b"4"),
    ]
