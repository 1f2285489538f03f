"""Streaming reads: new records arrive in later micro-batches, and a query stopped and restarted
from its checkpoint leaves every record in the sink exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from raftlog.harness.local import LocalCluster
from tests.spark.helpers import Row, append, raftlog_df, records, rows_of, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(
        tmp_path_factory.mktemp("stream"), replicas=3, partitions=2, durable=False
    ) as c:
        c.wait_ready()
        yield c


def stream(
    spark: SparkSession, cluster: LocalCluster, fmt: str = "raftlog", **options: str
) -> DataFrame:
    return raftlog_df(spark, cluster, options, stream=True, fmt=fmt)


FORMATS = pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])


def starting_at(acked: list[Row]) -> str:
    """startingOffsets at the first of `acked` in each partition: the records the test appended
    (a follower's status may not know yet of the module's latest commits)."""
    first: dict[str, int] = {}
    for p, index, *_ in acked:
        first[str(p)] = min(index, first.get(str(p), index))
    return json.dumps(first)


def batches_with_rows(query: StreamingQuery, rows: int) -> int:
    """How many of the query's micro-batches read records, once its progress counts `rows`:
    Spark reports a batch after the sink has committed its files, so the sink can hold a
    batch's records before `recentProgress` has it."""
    wait_until(
        f"the query's progress to count {rows} records",
        lambda: sum(p["numInputRows"] for p in query.recentProgress) >= rows,
    )
    return len([p for p in query.recentProgress if p["numInputRows"]])


def until_caught_up(df: DataFrame, sink: Path, checkpoint: Path) -> StreamingQuery:
    """Run `df` into a Parquet sink with an availableNow trigger until it has read everything
    there was when it started; the finished query (for its progress)."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish"
    finally:
        query.stop()
    return query


def test_new_records_in_later_batches_and_exactly_once_across_a_restart(spark, cluster, tmp_path):
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    acked = append(cluster, 0, records(25, "before-start", keys=3))
    acked += append(cluster, 1, records(10, "before-start"))

    def start() -> StreamingQuery:
        df = stream(spark, cluster, startingOffsets="earliest", maxRecordsPerSplit="9")
        return (
            df.writeStream.format("parquet")
            .option("path", sink)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def in_sink() -> list[Row]:
        try:
            return rows_of(spark.read.parquet(sink))
        except Exception:  # no file written yet
            return []

    def sink_holds(n: int) -> Callable[[], bool]:
        return lambda: len(in_sink()) >= n

    query = start()
    try:
        wait_until("the records from before the start", sink_holds(len(acked)))
        batches_before = batches_with_rows(query, len(acked))
        acked += append(cluster, 0, records(12, "while-running", keys=3))
        acked += append(cluster, 1, records(8, "while-running"))
        wait_until("the records appended while running", sink_holds(len(acked)))
        later = batches_with_rows(query, len(acked))
        assert later > batches_before, "the new records came in a later micro-batch"
    finally:
        query.stop()
    acked += append(cluster, 0, records(15, "while-stopped", keys=3))
    acked += append(cluster, 1, records(5, "while-stopped"))
    query = start()
    try:
        wait_until("the records appended while stopped", sink_holds(len(acked)))
        acked += append(cluster, 1, records(6, "after-restart"))
        wait_until("the records appended after the restart", sink_holds(len(acked)))
    finally:
        query.stop()
    got = in_sink()
    assert len(got) == len(acked), "a record was lost or duplicated"
    assert got == sorted(acked, key=lambda r: (r[0], r[1]))


@FORMATS
def test_max_offsets_per_trigger_bounds_each_micro_batch(spark, cluster, tmp_path, fmt):
    acked = append(cluster, 0, records(30, "bounded")) + append(cluster, 1, records(20, "bounded"))
    df = stream(spark, cluster, fmt, startingOffsets=starting_at(acked), maxOffsetsPerTrigger="12")
    query = until_caught_up(df, tmp_path / "sink", tmp_path / "checkpoint")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 50 and max(sizes) <= 12 and len(sizes) >= 5, sizes
    assert rows_of(spark.read.parquet(str(tmp_path / "sink"))) == acked


def test_a_query_switches_between_the_python_and_the_jvm_source_on_one_checkpoint(
    spark, cluster, tmp_path
):
    """Both formats write the same offsets: a query restarted from its checkpoint with the other
    format goes on where the first stopped, every record in the sink once. The JVM source's
    progress shows Kafka's offsets-behind-latest metrics and a readable description."""
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    acked = append(cluster, 0, records(9, "py")) + append(cluster, 1, records(4, "py"))
    starting = starting_at(acked)
    seen: list[StreamingQuery] = []
    for i, fmt in enumerate(["raftlog", "raftlog-jvm", "raftlog", "raftlog-jvm"]):
        if i:
            acked += append(cluster, i % 2, records(6, f"{fmt}-{i}"))
        df = stream(spark, cluster, fmt, startingOffsets=starting, maxOffsetsPerTrigger="5")
        seen.append(until_caught_up(df, sink, checkpoint))
        got = rows_of(spark.read.parquet(str(sink)))
        assert got == sorted(acked, key=lambda r: (r[0], r[1])), f"after leg {i} ({fmt})"
    jvm_progress = [p for p in seen[1].recentProgress if p["numInputRows"]]
    assert jvm_progress, "the JVM leg read its records"
    source = jvm_progress[0]["sources"][0]
    assert source["description"].startswith("raftlog-jvm["), source["description"]
    metrics = source["metrics"]
    assert int(metrics["maxOffsetsBehindLatest"]) >= int(metrics["minOffsetsBehindLatest"]) >= 0
    assert float(metrics["avgOffsetsBehindLatest"]) >= 0
    # The last batch read up to the latest offset: nothing behind it.
    assert jvm_progress[-1]["sources"][0]["metrics"]["maxOffsetsBehindLatest"] == "0"


def numbers_read(query: StreamingQuery) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


@FORMATS
def test_min_offsets_per_trigger_waits_for_enough_records_or_for_max_trigger_delay(
    spark, cluster, fmt
):
    """Kafka's minOffsetsPerTrigger: after the first batch (which never waits), a trigger with
    fewer new records than the minimum reads nothing until enough have come; maxTriggerDelay
    bounds the wait. The query's progress shows the latest offset of each partition."""
    acked = append(cluster, 1, records(5, "first"))

    def run(name: str, **options: str) -> StreamingQuery:
        df = stream(spark, cluster, fmt, startingOffsets=starting_at(acked), **options)
        return (
            df.writeStream.format("memory")
            .queryName(f"{name}_{fmt.replace('-', '_')}")
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    query = run("least", minOffsetsPerTrigger="20", maxTriggerDelay="1h")
    try:
        wait_until("the first batch", lambda: numbers_read(query) == [5])
        append(cluster, 1, records(8, "too-few"))
        time.sleep(3)  # about 30 triggers (Spark reports no progress for those that read nothing)
        assert numbers_read(query) == [5], "8 records are fewer than minOffsetsPerTrigger=20"
        more = append(cluster, 1, records(12, "enough"))
        wait_until("a batch of 20", lambda: numbers_read(query) == [5, 20])
        last = query.lastProgress
        assert last is not None
        latest = last["sources"][0]["latestOffset"]
        assert json.loads(latest if isinstance(latest, str) else json.dumps(latest))["1"] == (
            more[-1][1] + 1
        )
    finally:
        query.stop()
    query = run("delayed", minOffsetsPerTrigger="1000", maxTriggerDelay="2s")
    try:
        wait_until("the first batch", lambda: numbers_read(query) == [25])
        append(cluster, 1, records(3, "late"))
        wait_until("the 3 records after maxTriggerDelay", lambda: numbers_read(query) == [25, 3])
    finally:
        query.stop()


@pytest.mark.parametrize("sink_logged", [True, False], ids=["sink-logged", "sink-not-logged"])
def test_a_crash_between_the_offset_log_and_the_commit_log_replays_the_same_batch(
    spark, cluster, tmp_path, sink_logged
):
    """The checkpoint of a query that died after logging batch N's offsets but before its commit
    (with or without the sink's own log of batch N): the restart runs batch N again over the
    logged offsets, though more records came meanwhile, and the sink ends exactly once."""
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    acked = append(cluster, 0, records(20, "crash")) + append(cluster, 1, records(14, "crash"))
    starting = starting_at(acked)

    def run() -> None:
        df = stream(spark, cluster, startingOffsets=starting, maxOffsetsPerTrigger="10")
        until_caught_up(df, sink, checkpoint)

    run()
    last = max(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())
    logged = json.loads((checkpoint / "offsets" / str(last)).read_text().splitlines()[-1])

    def never_written(log: Path, batch: int) -> None:
        (log / str(batch)).unlink()
        (log / f".{batch}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the file

    never_written(checkpoint / "commits", last)  # the crash: batch `last` never committed
    if not sink_logged:
        never_written(sink / "_spark_metadata", last)  # nor did the sink log its files
    acked += append(cluster, 0, records(7, "after-crash")) + append(cluster, 1, records(3, "x"))
    run()
    # The replayed batch ended where its offsets said, not at the newer records.
    assert json.loads((checkpoint / "offsets" / str(last)).read_text().splitlines()[-1]) == logged
    assert (checkpoint / "commits" / str(last)).exists()
    assert (checkpoint / "offsets" / str(last + 1)).exists(), "the new records: a later batch"
    got = rows_of(spark.read.parquet(str(sink)))
    assert len(got) == len(acked), "a record was lost or duplicated"
    assert got == sorted(acked, key=lambda r: (r[0], r[1]))
