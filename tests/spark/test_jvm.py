"""The JVM reader (`raftlog-jvm`) against a real 3-node cluster: record for record what the
cluster acknowledged and what the Python source (`raftlog`) reads; what it refuses (table mode,
streams) names the source that does it; a replica that is down or behind is passed over."""

from __future__ import annotations

import json
import urllib.request

import pytest
from pyspark.sql import DataFrame, SparkSession

from raftlog.node.local import LocalCluster
from tests.spark.helpers import (
    FakeNode,
    Row,
    append,
    error,
    raftlog_df,
    records,
    rows_of,
    wait_replicated,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("spark-jvm")
    with LocalCluster(d, replicas=3, partitions=3, durable=False) as c:
        c.wait_ready()
        acked: list[Row] = []
        for p in range(3):
            for batch in range(3):
                # partition 0 without keys (null keys), the others keyed; headers on every
                # third record, timestamps on every second (the others read as null)
                acked += append(c, p, records(40 + 7 * p, f"p{p}b{batch}", keys=5 if p else 0))
        acked += append(
            c,
            1,
            [
                {"key": "gone", "value": None},  # a tombstone: a null value
                # empty, not null; UTF-8 headers
                {"key": "", "value": "", "headers": {"ключ": "значение", "": ""}},
                {"value": "after"},
            ],
        )
        for p in range(3):
            wait_replicated(c, p, max(r[1] for r in acked if r[0] == p))
        c.acked = sorted(acked, key=lambda r: (r[0], r[1]))  # type: ignore[attr-defined]
        yield c


def jvm(spark: SparkSession, cluster: LocalCluster, **options: str) -> DataFrame:
    return raftlog_df(spark, cluster, options, fmt="raftlog-jvm")


def test_the_jvm_read_equals_what_was_acknowledged_and_what_the_python_source_reads(spark, cluster):
    assert any(r[4] is None for r in cluster.acked) and any(r[3] is None for r in cluster.acked)
    for per_split in ("1000000", "17"):
        options = {"maxRecordsPerSplit": per_split, "pageRecords": "25"}
        got = rows_of(jvm(spark, cluster, **options))
        assert got == cluster.acked, f"maxRecordsPerSplit={per_split}"
        assert got == rows_of(raftlog_df(spark, cluster, options)), per_split
    # 17 indexes per split: every partition is cut into several Spark partitions.
    assert jvm(spark, cluster, maxRecordsPerSplit="17").rdd.getNumPartitions() >= 3 * 8


def test_the_schema_is_the_python_sources(spark, cluster):
    assert jvm(spark, cluster).schema == raftlog_df(spark, cluster).schema


def test_offsets_partitions_and_replicas_select_the_same_records_as_the_python_source(
    spark, cluster
):
    acked = cluster.acked
    first = {p: min(r[1] for r in acked if r[0] == p) for p in range(3)}
    cases = [
        {
            "partitions": "0,2",
            "startingOffsets": json.dumps({"0": first[0] + 10, "2": -2}),
            "endingOffsets": json.dumps({"0": first[0] + 30}),
            "maxRecordsPerSplit": "6",
        },
        {"endingOffsets": json.dumps({"0": first[0] + 30, "1": -1}), "pageRecords": "7"},
        {"startingOffsets": "latest"},
        {"preferFollowers": "false", "maxRecordsPerSplit": "9"},
    ]
    for options in cases:
        got = rows_of(jvm(spark, cluster, **options))
        assert got == rows_of(raftlog_df(spark, cluster, options)), options
        if options.get("partitions"):
            want = [
                r
                for r in acked
                if (r[0] == 0 and first[0] + 10 <= r[1] < first[0] + 30) or r[0] == 2
            ]
            assert got == want
    assert rows_of(jvm(spark, cluster, startingOffsets="latest")) == []
    leader = cluster.leader(0)
    assert leader is not None
    df = (
        spark.read.format("raftlog-jvm")
        .option("endpoints", cluster.nodes[leader].url)  # one node has every partition
        .load()
    )
    assert rows_of(df) == acked


def test_table_mode_and_streams_are_refused_naming_the_python_source(spark, cluster, tmp_path):
    with pytest.raises(Exception, match="raftlog option 'mode': table is read by format raftlog"):
        jvm(spark, cluster, mode="table").collect()
    stream = raftlog_df(spark, cluster, stream=True, fmt="raftlog-jvm")
    with pytest.raises(Exception, match="for a stream use format raftlog"):
        q = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            q.processAllAvailable()
        finally:
            q.stop()


def follower_of(cluster: LocalCluster, partitions: int = 3) -> dict[str, object]:
    """A status as a follower of every partition at the leader's mark (it is read first)."""
    leader = cluster.leader(0)
    assert leader is not None
    status = cluster.status(leader)
    for p in status["partitions"][:partitions]:
        p["role"] = "follower"
    return status


@pytest.mark.parametrize("how", ["behind", "down"])
def test_a_replica_that_is_behind_or_down_is_passed_over(spark, cluster, how):
    """A replica that answered the survey but, when a page is asked of it, is behind the
    planned range (503 `behind`) or gone (the connection closes unanswered): every page is
    asked of it first (it is a follower) and read from the leader instead."""
    leader = cluster.leader(0)
    assert leader is not None
    status = json.dumps(follower_of(cluster)).encode()
    last = max(r[1] for r in cluster.acked if r[0] == 0)

    def answer(path: str, n: int) -> tuple[int, str, bytes] | None:
        if path == "/v1/status":
            return 200, "application/json", status
        return error(503, "behind", high_water_mark=1) if how == "behind" else None

    node = FakeNode(answer)
    try:
        df = (
            spark.read.format("raftlog-jvm")
            .option("endpoints", f"{node.url},{cluster.nodes[leader].url}")
            .option("partitions", "0")
            .option("pageRecords", "20")
            .load()
        )
        got = rows_of(df)
    finally:
        node.close()
    assert got == [r for r in cluster.acked if r[0] == 0]
    pages = [p for p in node.requests if "/columns?" in p]
    assert len(pages) >= 7, "each page is asked of the follower first"
    assert all(f"min_index={last}" in p for p in pages), "the planned end is the mark asked for"


def test_a_range_compacted_after_planning_fails_as_data_loss_or_is_skipped(spark, cluster):
    """Every replica answers 410 with a floor past the read: data loss, or with
    failOnDataLoss=false, the records below the floor skipped and the rest read."""
    leader = cluster.leader(0)
    assert leader is not None
    real = cluster.nodes[leader].url
    acked0 = [r for r in cluster.acked if r[0] == 0]
    floor = acked0[20][1]
    status = json.dumps(follower_of(cluster)).encode()

    def compacted_below_floor(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", status
        start = int(path.split("from=")[1].split("&")[0])
        if start < floor:
            return error(410, "compacted", compaction_floor=floor)
        with urllib.request.urlopen(real + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()

    node = FakeNode(compacted_below_floor)
    try:
        reader = (
            spark.read.format("raftlog-jvm")
            .option("endpoints", node.url)
            .option("partitions", "0")
            .option("pageRecords", "10")
        )
        with pytest.raises(Exception, match=f"below the compaction floor {floor} on every"):
            reader.load().collect()
        got = rows_of(reader.option("failOnDataLoss", "false").load())
    finally:
        node.close()
    assert got == [r for r in acked0 if r[1] >= floor]
