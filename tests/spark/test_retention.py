"""Retention holds and data loss: with `retentionHold`, compaction waits for what the stream has
not committed; without it, a stream whose next records were compacted fails with a clear error,
or with failOnDataLoss=false skips them and says so."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.query import StreamingQuery

from raftlog.harness.local import LocalCluster
from raftlog.spark import source
from raftlog.spark.nodes import ClusterView, PartitionView, Replica
from raftlog.spark.options import parse
from raftlog.spark.source import RaftlogStreamReader
from tests.spark.helpers import (
    Answer,
    FakeNode,
    Row,
    append,
    error,
    raftlog_df,
    records,
    rows_of,
    wait_replicated,
    wait_until,
)
from tests.steady import STEADY_RAFT

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path, request):
    """Small WAL segments; a snapshot-and-compaction every `request.param` entries applied
    (by default only when asked)."""
    every = getattr(request, "param", 10**6)
    with LocalCluster(
        tmp_path / "cluster", replicas=3, partitions=1, durable=False,
        # Holds and messages name the index after the last record: a no-op would move it.
        raft={"compact_every_operations": every, "compact_number_entries": 0, **STEADY_RAFT},
        env={"RAFTLOG_SEGMENT_BYTES": "4096"},
    ) as c:  # fmt: skip
        c.wait_ready()
        yield c


def start(spark: SparkSession, cluster: LocalCluster, path: Any, **options: str) -> StreamingQuery:
    return (
        raftlog_df(spark, cluster, {"startingOffsets": "earliest", **options}, stream=True)
        .writeStream.format("parquet")
        .option("path", str(path / "sink"))
        .option("checkpointLocation", str(path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def sink(spark: SparkSession, path: Any) -> list[Row]:
    try:
        return rows_of(spark.read.parquet(str(path / "sink")))
    except Exception:  # nothing written yet
        return []


def floors(cluster: LocalCluster) -> dict[str, int]:
    return {n: cluster.status(n)["partitions"][0]["compaction_floor"] for n in cluster.nodes}


def compact_everywhere(cluster: LocalCluster) -> None:
    for n in cluster.nodes:
        code, body = cluster.request(n, "POST", "/v1/admin/partitions/0/compact")
        assert code == 200, body


def holds(cluster: LocalCluster) -> list[dict[str, int]]:
    """Each node's retention holds on partition 0, holder -> min_index."""
    out = []
    for n in cluster.nodes:
        code, body = cluster.get(n, "/v1/admin/partitions/0/holds")
        assert code == 200, body
        out.append({h["holder"]: h["min_index"] for h in body["holds"]})
    return out


def run_until_sink_holds(
    spark, cluster, path, n: int, then: list[dict[str, Any]] | None = None, **options: str
) -> list[Row]:
    """Run the stream until the sink holds `n` records (plus `then`, appended once the query
    started, before compaction can run) and, with `retentionHold`, until every node's hold
    stands past them; returns the rows `then` appended."""
    query = start(spark, cluster, path, **options)
    try:
        # Its first micro-batch starts Spark's Python workers: over a minute once, on this
        # 2-core machine with other test runs beside it.
        wait_until("the query to start", lambda: bool(query.recentProgress), timeout=180)
        added = append(cluster, 0, then) if then else []
        n += len(added)
        wait_until(f"{n} records in the sink", lambda: len(sink(spark, path)) >= n)
        holder = options.get("retentionHold")
        if holder and added:
            # Spark tells a source a batch is done only when it plans the next one (the next
            # trigger), so the hold moves a little after the sink has the rows.
            want = {holder: added[-1][1] + 1}
            wait_until(f"every hold at {want}", lambda: all(h == want for h in holds(cluster)))
    finally:
        query.stop()
    return added


@pytest.mark.parametrize("cluster", [25], indirect=True, ids=["compacting-every-25"])
def test_a_retention_hold_keeps_what_the_stream_has_not_committed(spark, cluster, tmp_path):
    # The hold is placed when the query starts, before anything can be compacted.
    acked = run_until_sink_holds(
        spark, cluster, tmp_path, 0, records(40, "first", pad=300), retentionHold="reader-1"
    )
    committed = acked[-1][1] + 1  # the stream's next index: where its hold now stands
    assert holds(cluster) == [{"reader-1": committed}] * len(cluster.nodes)
    # Much more is written and compacted while the stream is stopped.
    for i in range(4):
        acked += append(cluster, 0, records(40, f"more{i}", pad=300))
    wait_replicated(cluster, 0, acked[-1][1])
    compact_everywhere(cluster)
    assert all(1 < f <= committed for f in floors(cluster).values()), (floors(cluster), committed)
    assert max(r[1] for r in acked) > committed + 100
    # The restarted stream finds everything after its checkpoint: no gap, no duplicate.
    run_until_sink_holds(spark, cluster, tmp_path, len(acked), retentionHold="reader-1")
    got = sink(spark, tmp_path)
    assert got == acked


def test_a_stream_below_the_compaction_floor_fails_or_skips_and_says_so(
    spark, spark_stderr, cluster, tmp_path
):
    acked = run_until_sink_holds(spark, cluster, tmp_path, 0, records(40, "first", pad=300))
    committed = acked[-1][1] + 1
    for i in range(4):
        acked += append(cluster, 0, records(40, f"more{i}", pad=300))
    wait_replicated(cluster, 0, acked[-1][1])
    compact_everywhere(cluster)
    floor = min(floors(cluster).values())
    assert floor > committed, "compaction passed the stream's offset (no hold)"
    query = start(spark, cluster, tmp_path)
    with pytest.raises(Exception, match="below the compaction floor") as e:
        query.awaitTermination(60)
    query.stop()
    assert f"{committed} is below the compaction floor {floor}" in str(e.value)
    assert "failOnDataLoss=false" in str(e.value)
    # A batch read from below the floor fails the same way at planning.
    df = (
        spark.read.format("raftlog")
        .option("endpoints", ",".join(cluster.endpoints))
        .option("startingOffsets", json.dumps({"0": committed}))
        .load()
    )
    with pytest.raises(Exception, match="below the compaction floor"):
        df.collect()
    # failOnDataLoss=false: the stream skips what is gone, logs it, and reads on from the floor.
    logged = spark_stderr.stat().st_size
    run_until_sink_holds(
        spark, cluster, tmp_path, len([r for r in acked if r[1] < committed or r[1] >= floor]),
        failOnDataLoss="false",
    )  # fmt: skip
    got = sink(spark, tmp_path)
    assert got == [r for r in acked if r[1] < committed or r[1] >= floor]
    said = f"raftlog partition 0: skipped records [{committed}, {floor})"

    def logged_since() -> str:
        with spark_stderr.open() as f:
            f.seek(logged)
            return str(f.read())

    # A Python worker's stderr reaches the log through the JVM's own thread: wait for it.
    wait_until(f"{said!r} in Spark's log", lambda: said in logged_since(), timeout=30)


def holding(refuse: bool) -> Answer:
    """A replica of one partition that takes retention holds (or answers 410 `compacted`)."""
    status = {"partitions": [{"partition": 0, "role": "leader", "high_water_mark": 30,
                              "compaction_floor": 1}]}  # fmt: skip

    def answer(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", json.dumps(status).encode()
        assert "/holds/" in path, path
        if refuse:
            return error(410, "compacted", compaction_floor=25)
        return 200, "application/json", b"{}"

    return answer


class Clock:
    """`time` as the stream reader's module sees it, with a monotonic clock the test moves (a
    real one let a loaded machine pass a quarter of the TTL between two commits: a renewal
    the test did not ask for)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleep = time.sleep

    def monotonic(self) -> float:
        return self.now


def test_the_hold_is_the_next_index_to_read_moves_only_up_and_is_renewed(monkeypatch):
    """Without Spark (the stream reader's commits called directly): the hold is placed at the
    committed offset (the next index the stream reads), never moved down, renewed once a
    quarter of its TTL has passed; a replica that answers 410 is logged, not a failure."""
    clock = Clock()
    monkeypatch.setattr(source, "time", clock)
    keeps, compacted = FakeNode(holding(refuse=False)), FakeNode(holding(refuse=True))
    try:
        opts = parse(
            {"endpoints": f"{keeps.url},{compacted.url}", "retentionHold": "job",
             "retentionHoldTtlSeconds": "1"},
            streaming=True,
        )  # fmt: skip
        reader = RaftlogStreamReader(opts)
        reader.stop()  # no renewal between the commits (its own test is below)
        placed = []  # holds placed after each commit, 0.1 s apart
        for offset in (10, 20, 15, 20, 20):
            reader.commit({"0": offset})
            placed.append(len(keeps.puts))
            clock.now += 0.1
        # 15 is not a move, nor 20 again before a quarter of the TTL (0.25 s); 0.3 s after
        # 20 was placed, it is renewed.
        assert placed == [1, 2, 2, 2, 3], placed
    finally:
        keeps.close()
        compacted.close()
    held = [(path, json.loads(body)) for path, body in keeps.puts]
    assert [b["min_index"] for _, b in held] == [10, 20, 20]
    assert all(p == "/v1/admin/partitions/0/holds/job" for p, _ in held)
    assert len(compacted.puts) == 3


def test_the_hold_is_renewed_during_a_micro_batch_longer_than_a_quarter_of_its_ttl():
    """Found by a review: the hold was renewed only when Spark called the reader (a trigger,
    a commit), so a micro-batch longer than its TTL let compaction pass what it had not read.
    The driver renews it every quarter of the TTL until the reader stops."""
    keeps = FakeNode(holding(refuse=False))
    try:
        opts = parse({"endpoints": keeps.url, "retentionHold": "long",
                      "retentionHoldTtlSeconds": "1"}, streaming=True)  # fmt: skip
        reader = RaftlogStreamReader(opts)
        reader.commit({"0": 12})  # the last call from Spark for a while: a long batch runs
        deadline = time.monotonic() + 10
        while len(keeps.puts) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(keeps.puts) >= 4, keeps.puts
        reader.stop()
        time.sleep(0.3)  # a renewal under way ends
        after = len(keeps.puts)
        time.sleep(0.6)
        assert len(keeps.puts) == after, "renewed after stop"
        assert {json.loads(body)["min_index"] for _, body in keeps.puts} == {12}
    finally:
        keeps.close()


def test_a_refused_hold_fails_every_call_until_it_is_placed(monkeypatch):
    """Found by a review: the hold was recorded as placed before it was asked, so a refusal
    (a token changed, say) raised once, and the next trigger, or the renewal thread's log
    line, let the stream run on without its hold."""

    def refusing(path: str, n: int) -> tuple[int, str, bytes] | None:
        if path == "/v1/status":
            return holding(refuse=False)(path, n)
        return error(401, "unauthorized", reason="a wrong token")

    monkeypatch.setattr(source, "time", Clock())
    node = FakeNode(refusing)
    try:
        opts = parse({"endpoints": node.url, "retentionHold": "job"}, streaming=True)
        reader = RaftlogStreamReader(opts)
        reader.stop()
        for _ in range(3):  # the same offsets again, well within a quarter of the TTL
            with pytest.raises(RuntimeError, match="'job' on partition 0 was refused"):
                reader.commit({"0": 10})
        assert len(node.puts) == 3, "asked again each time"
    finally:
        node.close()


def test_a_partition_the_survey_missed_keeps_its_offset_and_is_not_read_again():
    """Found by a review: a partition whose only members missed one survey was left out of the
    end offset, and the next trigger took it for new: read again from its earliest record."""
    both = {0: PartitionView(0, [Replica("http://a:1", True, 12, 1)]),
            1: PartitionView(1, [Replica("http://c:1", True, 20, 1)])}  # fmt: skip
    views = iter([{0: both[0]}, both])  # c (the only member with partition 1) silent, back
    reader = RaftlogStreamReader(parse({"endpoints": "http://a:1,http://c:1"}, streaming=True))

    def survey() -> ClusterView:
        reader._view = ClusterView(next(views), {})
        return reader._view

    reader._survey = survey  # type: ignore[method-assign]
    end = reader.latestOffset({"0": 11, "1": 21}, ReadAllAvailable())
    assert end == {"0": 13, "1": 21}
    assert reader.partitions({"0": 11, "1": 21}, end)  # partition 0's new records only
    again = reader.latestOffset(end, ReadAllAvailable())
    assert again == {"0": 13, "1": 21}, "partition 1 read again from its earliest"
