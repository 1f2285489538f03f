"""Reads that start or end at a time (Kafka's `startingTimestamp`, `startingOffsetsByTimestamp`,
`endingTimestamp`, `endingOffsetsByTimestamp`, `startingOffsetsByTimestampStrategy`) with both
formats against a real 3-node cluster: the rows are those of a plain filter of what the cluster
acknowledged, with timestamps that go back and forth and records with none."""

from __future__ import annotations

import json
import random
import urllib.parse
import urllib.request
from datetime import UTC

import pytest
from pyspark.sql import DataFrame, SparkSession

from raftlog.harness.local import LocalCluster
from raftlog.spark.nodes import PartitionView, Replica, client, index_for_time
from raftlog.spark.options import parse
from tests.spark.helpers import (
    Answer,
    FakeNode,
    Row,
    append,
    error,
    raftlog_df,
    rows_of,
    wait_replicated,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BASE = 1_800_000_000_000
FORMATS = pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])


def stamped(n: int, tag: str, rng: random.Random, start: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(n):
        r: dict[str, object] = {"value": f"{tag}-{i}"}
        roll = rng.random()
        if roll < 0.1:
            pass  # no timestamp: never at or after a time
        elif roll < 0.25:
            r["timestamp_ms"] = start + 1000 * i - rng.randrange(5_000)  # late
        else:
            r["timestamp_ms"] = start + 1000 * i
        out.append(r)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    rng = random.Random(3)
    d = tmp_path_factory.mktemp("spark-by-time")
    with LocalCluster(d, replicas=3, partitions=2, durable=False) as c:
        c.wait_ready()
        acked: list[Row] = []
        for p in range(2):
            for batch in range(4):
                acked += append(c, p, stamped(30, f"p{p}b{batch}", rng, BASE + 30_000 * batch))
        for p in range(2):
            wait_replicated(c, p, max(r[1] for r in acked if r[0] == p))
        c.acked = sorted(acked, key=lambda r: (r[0], r[1]))  # type: ignore[attr-defined]
        yield c


def ms(row: Row) -> int | None:
    ts = row[6]
    return None if ts is None else round(ts.replace(tzinfo=UTC).timestamp() * 1000)


def first_at(acked: list[Row], p: int, t: int) -> int | None:
    return next((r[1] for r in acked if r[0] == p and (ms(r) or 0) >= t), None)


def between(acked: list[Row], starts: dict[int, int], ends: dict[int, int | None]) -> list[Row]:
    """The rows of each partition from its start index up to (not with) its end index."""
    out: list[Row] = []
    for r in acked:
        end = ends.get(r[0])
        if r[0] in starts and starts[r[0]] <= r[1] and (end is None or r[1] < end):
            out.append(r)
    return out


def read(spark: SparkSession, cluster: LocalCluster, fmt: str, **options: str) -> DataFrame:
    return raftlog_df(spark, cluster, options, fmt=fmt)


@FORMATS
def test_a_batch_between_two_times_reads_from_the_first_record_at_the_start_to_the_end(
    spark, cluster, fmt
):
    acked: list[Row] = cluster.acked
    for start_t, end_t in [(BASE + 17_500, BASE + 75_000), (BASE, BASE + 1), (BASE + 3, None)]:
        starts = {p: first_at(acked, p, start_t) for p in (0, 1)}
        ends = {p: None if end_t is None else first_at(acked, p, end_t) for p in (0, 1)}
        options = {"startingTimestamp": str(start_t)}
        if end_t is not None:
            options["endingTimestamp"] = str(end_t)
        want = between(acked, {p: i for p, i in starts.items() if i is not None}, ends)
        assert rows_of(read(spark, cluster, fmt, **options)) == want, options


@FORMATS
def test_times_per_partition_and_a_time_no_record_reaches(spark, cluster, fmt):
    acked: list[Row] = cluster.acked
    late = BASE + 10**9  # after every record
    per = {"0": BASE + 40_000, "1": BASE + 95_000}
    starts = {p: first_at(acked, p, t) for p, t in ((0, per["0"]), (1, per["1"]))}
    ends = {0: first_at(acked, 0, BASE + 100_000), 1: None}
    got = read(
        spark,
        cluster,
        fmt,
        startingOffsetsByTimestamp=json.dumps(per),
        endingOffsetsByTimestamp=json.dumps({"0": BASE + 100_000, "1": late}),
    )
    assert rows_of(got) == between(acked, {p: i for p, i in starts.items() if i}, ends)
    # A start no record reaches fails naming the option, unless told to start at the latest.
    with pytest.raises(Exception, match="raftlog option 'startingTimestamp': partition 0 has no"):
        read(spark, cluster, fmt, startingTimestamp=str(late)).collect()
    empty = read(
        spark,
        cluster,
        fmt,
        startingTimestamp=str(late),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert rows_of(empty) == []


@FORMATS
def test_a_stream_starts_at_a_time_and_goes_on_with_new_records(spark, cluster, tmp_path, fmt):
    acked: list[Row] = cluster.acked
    t = BASE + 70_000
    df = raftlog_df(
        spark, cluster, {"startingOffsetsByTimestamp": json.dumps({"1": t})}, stream=True, fmt=fmt
    )
    name = f"by_time_{fmt.replace('-', '_')}"
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        first = first_at(acked, 1, t)
        assert first is not None
        # Partition 1 from its first record at or after t; partition 0 from the latest (the
        # default of a stream), so only what comes once the query has started.
        from_time = [r for r in acked if r[0] == 1 and r[1] >= first]
        wait_until(
            "the rows from the time", lambda: len(spark.table(name).collect()) >= len(from_time)
        )
        more = append(cluster, 0, [{"value": "after-start", "timestamp_ms": BASE}])
        cluster.acked = sorted(acked + more, key=lambda r: (r[0], r[1]))
        want = from_time + more
        wait_until("the new row", lambda: len(spark.table(name).collect()) >= len(want))
    finally:
        query.stop()
    assert rows_of(spark.table(name)) == sorted(want, key=lambda r: (r[0], r[1]))


def finds(index: int | None, hwm: int, compacted: bool = False) -> Answer:
    """A replica whose mark is `hwm` that finds `index` for any time (503 `behind` when asked
    for a mark above its own, as a node answers)."""

    def answer(path: str, n: int) -> tuple[int, str, bytes]:
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))
        if int(q["min_index"]) > hwm:
            return error(503, "behind", high_water_mark=hwm)
        body = json.dumps({"index": index, "compacted": compacted}).encode()
        return 200, "application/json", body

    return answer


def test_the_index_for_a_time_is_asked_of_the_replica_holding_most_and_not_of_one_behind():
    """Without Spark: a replica that compacted past the time's first record would answer a
    later index, one behind the planned mark would find no record (its log ends before the
    one sought): the answer is the replica's with the lowest floor among those at the mark."""
    nodes = [FakeNode(finds(None, 40)), FakeNode(finds(30, 50, True)), FakeNode(finds(12, 50))]
    try:
        view = PartitionView(0, [
            Replica(nodes[0].url, False, 40, 1),  # behind
            Replica(nodes[1].url, True, 50, 20),  # compacted up to 20
            Replica(nodes[2].url, False, 50, 5),
        ])  # fmt: skip
        reader = client(parse({"endpoints": nodes[0].url}, streaming=False))
        try:
            assert index_for_time(reader, view, BASE) == (12, False)
            # Only the compacted replica left: its answer says records may be gone.
            alone = PartitionView(0, [Replica(nodes[1].url, True, 50, 20)])
            assert index_for_time(reader, alone, BASE) == (30, True)
        finally:
            reader.close()
    finally:
        for n in nodes:
            n.close()
    assert all("min_index=50" in p for p in nodes[0].requests)


def replica_of(cluster: LocalCluster, floor: int, index: int, compacted: bool) -> Answer:
    """A replica of partition 0 in front of the leader: its status says the compaction floor
    `floor` (the archive serves from 1), its index for any time is `index`; pages are the
    leader's."""
    leader = cluster.leader(0)
    assert leader is not None
    real = cluster.nodes[leader].url
    status = cluster.status(leader)
    for part in status["partitions"]:
        part["role"] = "follower"
    status["partitions"] = [p for p in status["partitions"] if p["partition"] == 0]
    status["partitions"][0].update(compaction_floor=floor, readable_from=1)
    body = json.dumps(status).encode()

    def answer(path: str, n: int) -> tuple[int, str, bytes] | None:
        if path == "/v1/status":
            return 200, "application/json", body
        if "/index-for-time" in path:
            found = json.dumps({"index": index, "compacted": compacted}).encode()
            return 200, "application/json", found
        with urllib.request.urlopen(real + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()

    return answer


@FORMATS
def test_the_index_for_a_time_is_asked_first_of_the_replica_whose_own_log_holds_most(
    spark, cluster, fmt
):
    """Found by a review: with the nodes archiving, every replica is readable from 1, and the
    JVM reader ordered them by that: it asked a replica that compacted past the time (here
    named first), whose answer is a later index. Both ask the lowest compaction floor first."""
    first = first_at(cluster.acked, 0, BASE)
    assert first is not None
    later = first + 7
    nodes = [
        FakeNode(replica_of(cluster, 40, later, True)),
        FakeNode(replica_of(cluster, 1, first, False)),
    ]
    try:
        df = (
            spark.read.format(fmt)
            .option("endpoints", ",".join(n.url for n in nodes))
            .option("partitions", "0")
            .option("startingTimestamp", str(BASE))
            .load()
        )
        got = rows_of(df)
    finally:
        for n in nodes:
            n.close()
    assert min(r[1] for r in got) == first
