"""Batch reads (mode=log) against a real 3-node cluster: record for record what it acknowledged."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from raftlog.harness.local import LocalCluster
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import Record, encode_record
from raftlog.spark import arrow
from raftlog.spark.options import parse
from raftlog.spark.source import LogSplit, read_log
from tests.spark.helpers import (
    FakeNode,
    append,
    column_page,
    raftlog_df,
    records,
    rows_of,
    wait_replicated,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("spark-batch")
    with LocalCluster(d, replicas=3, partitions=3, durable=False) as c:
        c.wait_ready()
        acked = []
        for p in range(3):
            for batch in range(3):
                acked += append(c, p, records(40 + 7 * p, f"p{p}b{batch}", keys=5 if p else 0))
        acked += append(c, 0, [{"key": "gone", "value": None}])  # a tombstone is a record too
        for p in range(3):
            wait_replicated(c, p, max(r[1] for r in acked if r[0] == p))
        c.acked = sorted(acked, key=lambda r: (r[0], r[1]))  # type: ignore[attr-defined]
        yield c


def reader(spark: SparkSession, cluster: LocalCluster, **options: str) -> DataFrame:
    return raftlog_df(spark, cluster, options)


def test_batch_read_equals_what_the_cluster_acknowledged_across_partitions_and_splits(
    spark, cluster
):
    for per_split in ("1000000", "17"):
        df = reader(spark, cluster, maxRecordsPerSplit=per_split, pageRecords="25")
        assert rows_of(df) == cluster.acked, f"maxRecordsPerSplit={per_split}"
    # 17 indexes per split: every partition is cut into several Spark partitions.
    assert reader(spark, cluster, maxRecordsPerSplit="17").rdd.getNumPartitions() >= 3 * 8


@pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])
def test_min_partitions_cuts_the_ranges_into_at_least_that_many_spark_partitions(
    spark, cluster, fmt
):
    """Kafka's minPartitions: 3 raftlog partitions read by at least 50 tasks, every record once."""
    df = raftlog_df(spark, cluster, {"minPartitions": "50"}, fmt=fmt)
    assert df.rdd.getNumPartitions() >= 50
    assert rows_of(df) == cluster.acked


def test_min_partitions_cuts_the_same_ranges_in_both_readers(spark, cluster):
    """The README says the JVM reader plans the same ranges: equal-sized splits are halved in
    one order in both (ties are many once the largest are halved)."""

    def ranges(fmt: str, n: str) -> list[tuple[int, int, int]]:
        df = raftlog_df(spark, cluster, {"minPartitions": n}, fmt=fmt)
        by_task = df.groupBy(F.spark_partition_id().alias("task"), "partition").agg(
            F.min("index").alias("lo"), F.max("index").alias("hi")
        )
        return sorted((r["partition"], r["lo"], r["hi"]) for r in by_task.collect())

    for n in ("7", "9", "13", "50"):  # 9 differed before
        python, jvm = ranges("raftlog", n), ranges("raftlog-jvm", n)
        assert len(python) >= int(n)
        assert python == jvm, f"minPartitions={n}"


def test_schema_is_the_documented_one(spark, cluster):
    df = reader(spark, cluster)
    assert df.schema.simpleString() == (
        "struct<partition:int,index:bigint,term:bigint,key:binary,value:binary,"
        "headers:map<string,string>,timestamp:timestamp>"
    )


def test_offsets_and_partitions_select_ranges(spark, cluster):
    acked = cluster.acked
    first = {p: min(r[1] for r in acked if r[0] == p) for p in range(3)}
    starting = {"0": first[0] + 10, "2": -2}
    ending = {"0": first[0] + 30, "1": -1}
    df = reader(
        spark,
        cluster,
        partitions="0,2",
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps({"0": first[0] + 30}),
    )
    want = [r for r in acked if (r[0] == 0 and first[0] + 10 <= r[1] < first[0] + 30) or r[0] == 2]
    assert rows_of(df) == want
    # Partitions missing from the JSON read from earliest to latest.
    df = reader(spark, cluster, endingOffsets=json.dumps(ending))
    assert rows_of(df) == [r for r in acked if r[0] != 0 or r[1] < first[0] + 30]


def test_leader_first_or_a_subset_of_endpoints_reads_the_same_records(spark, cluster):
    """preferFollowers=false reads from each partition's leader first; any subset of the nodes
    that includes a replica of every partition serves the whole log."""
    leader = cluster.leader(0)
    assert leader is not None
    for endpoints in (cluster.endpoints, [cluster.nodes[leader].url]):
        df = (
            spark.read.format("raftlog")
            .option("endpoints", ",".join(endpoints))
            .option("preferFollowers", "false")
            .load()
        )
        assert rows_of(df) == cluster.acked


def at_ms(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def entry(index: int, term: int, record: Record) -> Entry:
    return Entry(index, term, EntryKind.NORMAL, encode_record(record))


PAGE = [
    entry(10, 7, Record(b"k", b"v", {"h": "1", "g": "2"}, 1_700_000_000_123)),
    Entry(11, 7, EntryKind.NOOP, b""),  # not a record: no row
    entry(12, 8, Record(None, b"no key", {}, 0)),  # no timestamp: null
    entry(13, 8, Record(b"gone", None, {}, -5)),  # a tombstone, stamped before 1970
    entry(14, 8, Record(b"", b"", [("t", b"a"), ("b", b"\x00x"), ("t", b"b")], 1)),
]


@pytest.mark.parametrize("include_headers", [False, True], ids=["map", "kafka"])
def test_a_page_reads_as_its_records_with_nulls_times_and_headers(include_headers: bool) -> None:
    """A column page as a node makes it (records of partition 2 in two terms, a no-op entry
    between), read as the tasks read it (no Spark): every column as written, a missing key or
    value null, a missing time null and one before 1970 kept, headers in their order."""
    page = msgspec.msgpack.decode(column_page(2, PAGE, 10, 15))
    batch = arrow.page_to_batch(page, include_headers)
    batch.validate(full=True)
    assert batch.schema == (arrow.KAFKA_ARROW_SCHEMA if include_headers else arrow.ARROW_SCHEMA)

    def headers(pairs: list[tuple[str, bytes]]) -> list[Any]:
        if include_headers:
            return [{"key": k, "value": v} for k, v in pairs]
        return [(k, v.decode()) for k, v in pairs]

    assert batch.to_pylist() == [
        {"partition": 2, "index": 10, "term": 7, "key": b"k", "value": b"v",
         "headers": headers([("h", b"1"), ("g", b"2")]), "timestamp": at_ms(1_700_000_000_123)},
        {"partition": 2, "index": 12, "term": 8, "key": None, "value": b"no key",
         "headers": [], "timestamp": None},
        {"partition": 2, "index": 13, "term": 8, "key": b"gone", "value": None,
         "headers": [], "timestamp": at_ms(-5)},
        {"partition": 2, "index": 14, "term": 8, "key": b"", "value": b"",
         "headers": headers([("t", b"a"), ("b", b"\x00x"), ("t", b"b")]), "timestamp": at_ms(1)},
    ]  # fmt: skip
    assert (batch["key"].null_count, batch["value"].null_count) == (1, 1)
    # A page whose every key is null (records without keys only).
    unkeyed = arrow.page_to_batch(msgspec.msgpack.decode(column_page(2, PAGE, 12, 13)))
    assert unkeyed["key"].to_pylist() == [None]


def test_a_replica_that_gave_no_answer_is_asked_last_for_the_rest_of_the_split(cluster):
    """Without Spark (a split read as a task reads it): a replica that takes the connection
    and never answers cost every page of the split its `timeoutSeconds` before the next
    replica was asked (found by a review); it is asked after the others once it gave none."""
    frozen_until = threading.Event()

    def frozen(path: str, n: int) -> None:
        frozen_until.wait(5)  # past the call's timeout
        return None

    node = FakeNode(frozen)
    leader = cluster.leader(0)
    assert leader is not None
    p0 = [r for r in cluster.acked if r[0] == 0]
    try:
        opts = parse(
            {"endpoints": f"{node.url},{cluster.nodes[leader].url}", "timeoutSeconds": "1",
             "pageRecords": "10"},
            streaming=False,
        )  # fmt: skip
        split = LogSplit(0, 1, p0[-1][1] + 1, [node.url, cluster.nodes[leader].url])
        read = sum(b.num_rows for b in read_log(opts, split))
    finally:
        frozen_until.set()
        node.close()
    assert read == len(p0) and len(p0) > 30  # several pages
    assert len(node.requests) == 1, node.requests
