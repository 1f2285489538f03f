"""The JVM reader (`raftlog-jvm`) against a real 3-node cluster: record for record what the
cluster acknowledged and what the Python source (`raftlog`) reads; what it refuses (table mode,
streams) names the source that does it; a replica that is down or behind is passed over."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from raftlog.harness.local import LocalCluster
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import Record, encode_record
from raftlog.node.server import columnar, walpage
from raftlog.node.storage.segment import ENTRY_FRAME, Rows, encode_commit, encode_entry
from tests.spark.helpers import (
    FakeNode,
    Row,
    append,
    column_page,
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
    only_1 = {"startingOffsets": json.dumps({"1": first[1] + 5})}
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
        only_1,
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
        if options is only_1:  # partitions left out of the JSON start at their earliest
            assert got == [r for r in acked if r[0] != 1 or r[1] >= first[1] + 5]
    assert rows_of(jvm(spark, cluster, startingOffsets="latest")) == []
    leader = cluster.leader(0)
    assert leader is not None
    df = (
        spark.read.format("raftlog-jvm")
        # one node has every partition; the trailing slash is not part of the paths asked
        .option("endpoints", cluster.nodes[leader].url + "/")
        .load()
    )
    assert rows_of(df) == acked


def test_table_mode_is_refused_naming_the_python_source(spark, cluster):
    with pytest.raises(Exception, match="raftlog option 'mode': table is read by format raftlog"):
        jvm(spark, cluster, mode="table").collect()


def follower_of(cluster: LocalCluster, partitions: int = 3) -> dict[str, object]:
    """A status as a follower of every partition at the leader's mark (it is read first)."""
    leader = cluster.leader(0)
    assert leader is not None
    status = cluster.status(leader)
    for p in status["partitions"][:partitions]:
        p["role"] = "follower"
    return status


def read_partition_0_through(
    spark: SparkSession, node: FakeNode, *more: str, timeout: str = "30"
) -> list[Row]:
    """Partition 0 read by `raftlog-jvm` with `node` as the first endpoint (then `more`), in
    pages of 20; the node is closed after."""
    try:
        df = (
            spark.read.format("raftlog-jvm")
            .option("endpoints", ",".join([node.url, *more]))
            .option("partitions", "0")
            .option("pageRecords", "20")
            .option("timeoutSeconds", timeout)
            .load()
        )
        return rows_of(df)
    finally:
        node.close()


def test_a_member_holding_fewer_partitions_is_read_and_another_clusters_member_refused(
    spark, cluster
):
    """A member not yet restarted by a raise holds fewer partitions: the survey took the
    different counts for nodes of two clusters and refused, so every query stopped for the
    raise. A member naming another cluster is what is refused now."""
    leader = cluster.leader(0)
    assert leader is not None
    fewer = follower_of(cluster, partitions=1)
    fewer["partitions"] = fewer["partitions"][:1]  # type: ignore[index]

    def answer_with(status: dict[str, object]) -> Callable[[str, int], tuple[int, str, bytes]]:
        body = json.dumps(status).encode()
        return lambda path, n: (200, "application/json", body) if path == "/v1/status" else (
            503, "application/json", b'{"error": "behind", "reason": "behind"}'
        )  # fmt: skip

    got = read_partition_0_through(spark, FakeNode(answer_with(fewer)), cluster.nodes[leader].url)
    assert got == [r for r in cluster.acked if r[0] == 0]
    other = {**fewer, "cluster": "ns/another"}
    with pytest.raises(Exception, match=r"members of different clusters \["):
        read_partition_0_through(spark, FakeNode(answer_with(other)), cluster.nodes[leader].url)


def test_a_replica_that_gave_no_answer_is_asked_last_for_the_rest_of_the_split(spark, cluster):
    """A replica that answered the survey, then takes each page's connection and never
    answers: every page cost its `timeoutSeconds` before the leader was asked (found by a
    review); after its first silence it is asked last."""
    leader = cluster.leader(0)
    assert leader is not None
    status = json.dumps(follower_of(cluster)).encode()
    thawed = threading.Event()

    def frozen(path: str, n: int) -> tuple[int, str, bytes] | None:
        if path == "/v1/status":
            return 200, "application/json", status
        thawed.wait(5)  # past the call's timeout
        return None

    node = FakeNode(frozen)
    try:
        got = read_partition_0_through(spark, node, cluster.nodes[leader].url, timeout="1")
    finally:
        thawed.set()
    assert got == [r for r in cluster.acked if r[0] == 0] and len(got) > 40  # several pages
    assert len([p for p in node.requests if "/columns?" in p]) == 1, node.requests


@pytest.mark.parametrize("how", ["behind", "unknown_partition", "down"])
def test_a_replica_that_is_behind_or_down_is_passed_over(spark, cluster, how):
    """A replica that answered the survey but, when a page is asked of it, is behind the
    planned range (503 `behind`), no longer holds the partition (404 `unknown_partition`: a
    member recreated with an empty disk) or gone (the connection closes unanswered): a page is
    asked of it first (it is a follower) and read from the leader instead; one that answers is
    asked first for every page (it may catch up), one gone only until its first silence, after
    which it is asked last."""
    leader = cluster.leader(0)
    assert leader is not None
    status = json.dumps(follower_of(cluster)).encode()
    last = max(r[1] for r in cluster.acked if r[0] == 0)

    def answer(path: str, n: int) -> tuple[int, str, bytes] | None:
        if path == "/v1/status":
            return 200, "application/json", status
        if how == "behind":
            return error(503, "behind", high_water_mark=1)
        return error(404, how) if how == "unknown_partition" else None

    node = FakeNode(answer)
    got = read_partition_0_through(spark, node, cluster.nodes[leader].url)
    assert got == [r for r in cluster.acked if r[0] == 0]
    pages = [p for p in node.requests if "/columns?" in p]
    if how != "down":
        assert len(pages) >= 7, "each page is asked of the follower first"
    else:
        # One page's call (HttpURLConnection sends a GET once more on a connection closed
        # unanswered), then asked last.
        assert len(pages) <= 2, "asked last after its first silence"
    assert all(f"min_index={last}" in p for p in pages), "the planned end is the mark asked for"


@pytest.mark.parametrize("named", ["once", "twice"])
def test_a_range_compacted_after_planning_fails_as_data_loss_or_is_skipped(spark, cluster, named):
    """Every replica answers 410 with a floor past the read: data loss, or with
    failOnDataLoss=false, the records below the floor skipped and the rest read. A replica
    named twice in `endpoints` is one replica (found by a review: counted twice, "every
    replica" was never met, and the read waited out timeoutSeconds)."""
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
            .option("endpoints", node.url if named == "once" else f"{node.url},{node.url}/")
            .option("partitions", "0")
            .option("pageRecords", "10")
            .option("timeoutSeconds", "5")
        )
        with pytest.raises(Exception, match=f"below the compaction floor {floor} on every"):
            reader.load().collect()
        got = rows_of(reader.option("failOnDataLoss", "false").load())
    finally:
        node.close()
    assert got == [r for r in acked0 if r[1] >= floor]


def test_a_410_whose_floor_is_not_past_the_read_is_retried_not_data_loss(spark, cluster):
    """The only replica answers the first two page requests with 410 and a floor at the index
    asked for (a snapshot install under way, the floor not moved past the read): the reader
    retries it, as the Python source does, and reads every record; no data loss is reported."""
    leader = cluster.leader(0)
    assert leader is not None
    real = cluster.nodes[leader].url
    status = json.dumps(follower_of(cluster)).encode()
    installing = [2]

    def install_under_way(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", status
        if installing[0] > 0:
            installing[0] -= 1
            return error(410, "compacted", compaction_floor=int(query(path)["from"]))
        with urllib.request.urlopen(real + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()

    node = FakeNode(install_under_way)
    got = read_partition_0_through(spark, node)
    assert got == [r for r in cluster.acked if r[0] == 0]
    assert installing == [0]


def test_a_replica_whose_pages_make_no_progress_is_passed_over(spark, cluster):
    """A follower that answers every page with no records and `next` at the index asked for
    (it serves nothing from there): the reader takes each page from the next replica instead
    of asking the same one again, and the read is exact."""
    leader = cluster.leader(0)
    assert leader is not None
    status = json.dumps(follower_of(cluster)).encode()

    def empty(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", status
        start = int(query(path)["from"])
        return 200, columnar.CONTENT_TYPE, column_page(0, [], start, start)

    node = FakeNode(empty)
    got = read_partition_0_through(spark, node, cluster.nodes[leader].url)
    assert got == [r for r in cluster.acked if r[0] == 0]
    pages = [p for p in node.requests if "/columns?" in p]
    assert len(pages) >= 6 and len(set(pages)) == len(pages), "each page asked of it once"


def test_a_replica_behind_the_others_neither_shortens_the_read_nor_is_asked_first(spark, cluster):
    """A follower that answered the survey with a floor above the others' and a mark below
    theirs: the read plans from the lowest floor to the highest mark (each replica's mark is
    committed), and pages are asked first of the replica that has them (the leader), not of the
    follower that would answer 503 `behind`."""
    leader = cluster.leader(0)
    assert leader is not None
    acked0 = [r for r in cluster.acked if r[0] == 0]
    lagging = follower_of(cluster, partitions=1)
    partitions = cast(list[dict[str, Any]], lagging["partitions"])
    partitions[0].update(
        high_water_mark=acked0[-10][1], compaction_floor=acked0[10][1], readable_from=acked0[10][1]
    )
    body = json.dumps(lagging).encode()

    def behind(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", body
        return error(503, "behind", high_water_mark=acked0[-10][1])

    node = FakeNode(behind)
    got = read_partition_0_through(spark, node, cluster.nodes[leader].url)
    assert got == acked0
    assert [p for p in node.requests if "/columns?" in p] == []


def test_a_replica_compacted_past_the_read_is_not_data_loss_while_another_may_serve_it(
    spark, cluster
):
    """Of two replicas, one answers every page with 410 and a floor past the read, the other
    is busy (503) the first time it is asked for each page: the busy one is asked again (the
    compacted one is not), and the read is exact; the records are not reported lost."""
    leader = cluster.leader(0)
    assert leader is not None
    real = cluster.nodes[leader].url
    status = json.dumps(follower_of(cluster)).encode()
    far = max(r[1] for r in cluster.acked) + 1000
    asked: set[str] = set()

    def compacted(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", status
        return error(410, "compacted", compaction_floor=far)

    def busy_once(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", status
        if path not in asked:
            asked.add(path)
            return error(503, "busy")
        with urllib.request.urlopen(real + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()

    gone, busy = FakeNode(compacted), FakeNode(busy_once)
    try:
        got = read_partition_0_through(spark, gone, busy.url)
    finally:
        busy.close()
    assert got == [r for r in cluster.acked if r[0] == 0]
    pages = [p for p in gone.requests if "/columns?" in p]
    assert len(pages) == len(set(pages)) >= 6, "the compacted replica asked once per page"


def wal_page(partition: int, entries: list[Entry], first: int, nxt: int, hwm: int) -> bytes:
    """A WAL page (`walpage`) of `entries` [first, nxt), a COMMIT record after every third."""
    records = b""
    for e in entries:
        if first <= e.index < nxt:
            records += encode_entry(e) + (encode_commit(e.index) if e.index % 3 == 0 else b"")
    page = {
        "partition": partition,
        "high_water_mark": hwm,
        "compaction_floor": 1,
        "next": nxt,
        "first": first,
        "records": records,
    }
    return msgspec.msgpack.encode(page)


def query(path: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))


ODD_DATA = [
    Entry(1, 3, EntryKind.NOOP, b""),
    Entry(2, 3, EntryKind.NORMAL, encode_record(Record(b"k", b"v", {"h": "1"}, 1_700_000_000_000))),
    Entry(3, 3, EntryKind.NORMAL, b"not a record"),
    Entry(4, 3, EntryKind.NORMAL, encode_record(Record(None, b"no key"))),
    Entry(5, 3, EntryKind.NORMAL, encode_record(Record(b"gone", None))),  # a tombstone
    Entry(6, 3, EntryKind.CONFIG, b"\x92\x91\xa2n1\x90"),
    Entry(7, 3, EntryKind.NORMAL, msgspec.msgpack.encode([b"fewer fields"])),
    Entry(8, 3, EntryKind.NORMAL, msgspec.msgpack.encode([b"k", b"v", {}, 5, None, -1, "x", [1]])),
    Entry(9, 3, EntryKind.NORMAL, b"\x93\xc4\x01k\xc4\x01v\x81\xa2\xff\xfe\xa1x"),  # bad UTF-8
    Entry(10, 3, EntryKind.NORMAL, b"\x92\xa1k\xc4\x01v"),  # a str key: not a record
    Entry(11, 3, EntryKind.NORMAL, encode_record(Record(b"k", b"v")) + b"\x00"),  # trailing
    Entry(12, 3, EntryKind.NORMAL, b""),
    Entry(
        13,
        3,
        EntryKind.NORMAL,
        encode_record(Record(b"p", b"", {"ключ": "значение", "": ""}, 42, "producer", 3)),
    ),
    Entry(14, 3, EntryKind.NORMAL, msgspec.msgpack.encode({"key": b"k"})),  # a map
    Entry(15, 4, EntryKind.NORMAL, encode_record(Record(b"k", b"v" * 300, {}, -5))),
    Entry(16, 4, EntryKind.NORMAL, msgspec.msgpack.encode([b"k", b"v", {}, 1 << 63])),  # > int64
    Entry(  # more headers than the reader keeps room for between records
        17,
        4,
        EntryKind.NORMAL,
        encode_record(Record(b"many", b"v", {f"h{i}": f"{i}" for i in range(2000)})),
    ),
    Entry(
        18, 4, EntryKind.NORMAL, b"\x93\xc0\xc0\xdf\x00\xf4\x24\x00\xa0\xa0"
    ),  # 16M pairs claimed
    Entry(19, 4, EntryKind.NORMAL, encode_record(Record(b"after", b"v", {"h": "x"}))),
    Entry(20, 4, EntryKind.NORMAL, b"\x93\xc4\x01k\xc4\x01v\x81\xa3\xed\xa0\x80\xa1x"),  # surrogate
    # a header key cut short: the first byte of a two-byte character (the next byte, a
    # continuation byte, is the header of the value)
    Entry(21, 4, EntryKind.NORMAL, b"\x93\xc4\x01k\xc4\x01v\x81\xa1\xc3\xa1x"),
    Entry(22, 4, EntryKind.NORMAL, encode_record(Record(b"k", b"v", {"k" * 40: "v" * 300}))),
    Entry(23, 4, EntryKind.NORMAL, encode_record(Record(b"k", b"v", {}, -100_000))),  # int32
    Entry(24, 4, EntryKind.NORMAL, encode_record(Record(b"k", b"v", {}, -1000))),  # int16
    Entry(25, 4, EntryKind.NORMAL, msgspec.msgpack.encode([b"k", b"v", {}, 7, None, 0, 1.5, 2.5])),
    Entry(26, 4, EntryKind.NORMAL, msgspec.msgpack.encode([b"k", b"v", {"h": "3 fields"}])),
    Entry(27, 4, EntryKind.NORMAL, msgspec.msgpack.encode([b"k", b"v", {}, 1_700_000_000_004])),
    Entry(28, 4, EntryKind.NORMAL, encode_record(Record(b"k", b"v", [("a", b"1"), ("a", b"2")]))),
]


Answer = Callable[[str, int], tuple[int, str, bytes]]


def leader_of(cluster: LocalCluster, entries: list[Entry], alone: int | None = None) -> Answer:
    """A fake leader of partition 0 holding `entries`, all committed: a real follower's status
    made the leader's, and WAL and column pages of the entries. With `alone`, a member holding
    that partition only."""
    hwm = entries[-1].index
    status = follower_of(cluster, partitions=1)
    partitions = cast(list[dict[str, Any]], status["partitions"])
    partitions[0].update(role="leader", high_water_mark=hwm, compaction_floor=1)
    partition = 0 if alone is None else alone
    if alone is not None:
        partitions[:] = [{**partitions[0], "partition": alone}]
    body = json.dumps(status).encode()

    def answer(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", body
        q = query(path)
        start = int(q["from"])
        nxt = min(int(q["to"]), start + int(q["limit"]), hwm + 1)
        if q.get("format") == "wal":
            return 200, walpage.CONTENT_TYPE, wal_page(partition, entries, start, nxt, hwm)
        rows = Rows()
        rows.add_entries([e for e in entries if start <= e.index < nxt])
        page = columnar.record_page(partition, rows, high_water_mark=hwm, next_index=nxt, floor=1)
        return 200, columnar.CONTENT_TYPE, page

    return answer


def test_odd_data_reads_as_the_python_source_reads_it(spark, cluster):
    """A node serving entries the API never writes (data that is not a record, records with
    fewer or more fields, a str key, bad UTF-8 (a surrogate, a character cut short), trailing
    bytes, no-op and membership entries, commit records between) and records with long header
    strings, negative times of each integer width and floats in extra fields: the JVM reader's
    WAL decoding gives the rows of the node's own column page, as the Python source reads it."""
    node = FakeNode(leader_of(cluster, ODD_DATA))
    try:
        options = {"partitions": "0", "pageRecords": "4"}
        reader = spark.read.option("endpoints", node.url).options(**options)
        got = rows_of(reader.format("raftlog-jvm").load())
        want = rows_of(reader.format("raftlog").load())
    finally:
        node.close()
    assert [r[1] for r in got] == [e.index for e in ODD_DATA if e.kind == EntryKind.NORMAL]
    assert got == want
    assert sum(r[5] == {"raftlog.raw": "true"} for r in got) == 10
    assert any("format=wal" in p for p in node.requests)


def test_times_past_the_planned_mark_or_reached_by_no_record_end_the_batch_at_the_mark(
    spark, cluster
):
    """A replica answers a time with an index past the high-water mark the survey saw (a
    record committed since), or with none (no record stamped at or after it): as an ending
    time, either ends the batch at the planned mark (every record read, not an error); as a
    starting time past the mark, the batch is empty."""
    answer = leader_of(cluster, VARIED)
    hwm = VARIED[-1].index

    def times(path: str, n: int) -> tuple[int, str, bytes]:
        if "/index-for-time?" not in path:
            return answer(path, n)
        t = int(query(path)["timestamp_ms"])
        index = {1: 2, 2: hwm + 10, 3: None}[t]
        body = {"partition": 0, "timestamp_ms": t, "index": index, "compacted": False}
        return 200, "application/json", json.dumps(body).encode()

    node = FakeNode(times)
    read: dict[tuple[str, str], list[int]] = {}
    try:
        for start, end in [("1", "2"), ("1", "3"), ("2", "3")]:
            df = (
                spark.read.format("raftlog-jvm")
                .option("endpoints", node.url)
                .option("partitions", "0")
                .option("startingTimestamp", start)
                .option("endingTimestamp", end)
                .load()
            )
            read[start, end] = [r[1] for r in rows_of(df)]
    finally:
        node.close()
    every = list(range(2, hwm + 1))
    assert read == {("1", "2"): every, ("1", "3"): every, ("2", "3"): []}


def varied_value(i: int) -> bytes:
    return bytes([i % 251]) * (i * 7919 % 20_000)


def varied(i: int) -> Entry:
    """Entry i: a record of 0 to 20,000 bytes, headers on every fourth, a time on every other."""
    headers = {"h": str(i)} if i % 4 == 0 else {}
    millis = 1_700_000_000_000 + i if i % 2 else 0
    record = Record(b"k%d" % i, varied_value(i), headers, millis)
    return Entry(i, 2, EntryKind.NORMAL, encode_record(record))


VARIED = [varied(i) for i in range(1, 61)]


@pytest.mark.parametrize("chunked", [False, True], ids=["with a length", "chunked"])
def test_pages_of_varied_size_read_whole_with_or_without_a_length(spark, cluster, chunked):
    """Pages of 16 records of up to 20,000 bytes (about 160 KiB, each a different size), sent
    in pieces of 1,000 bytes with a Content-Length or chunked: the reader takes each body whole
    (many socket reads into the buffer it keeps from page to page, grown as a chunked body
    comes), and reads what the Python source reads, also when Spark caches the rows."""
    node = FakeNode(leader_of(cluster, VARIED), piece=1000, chunked=chunked)
    try:
        options = {"partitions": "0", "pageRecords": "16", "timeoutSeconds": "5"}
        reader = spark.read.option("endpoints", node.url).options(**options)
        got = rows_of(reader.format("raftlog-jvm").load())
        cached = reader.format("raftlog-jvm").load().cache()
        got_cached = rows_of(cached)
        cached.unpersist()
        want = rows_of(reader.format("raftlog").load())
    finally:
        node.close()
    assert [(r[1], r[4]) for r in got] == [(e.index, varied_value(e.index)) for e in VARIED]
    assert got == want and got_cached == want
    assert sum("format=wal" in p for p in node.requests) == 2 * 4  # 4 pages, 2 reads


@pytest.mark.parametrize("damage", ["a flipped byte", "next short of the entries", "a gap"])
def test_a_replica_serving_a_damaged_record_is_passed_over(spark, cluster, damage):
    """A replica whose WAL pages carry a flipped byte (in an entry's term: only the checksum
    tells), say `next` is the index of their last entry (one entry more than they claim), or
    leave out their second entry (and say `next` one lower, so that the count agrees), is
    asked first for every page; the reader takes each page from the next replica and the read
    is exact."""
    leader = cluster.leader(0)
    assert leader is not None
    real = cluster.nodes[leader].url
    status = json.dumps(follower_of(cluster)).encode()

    def damaged(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", status
        with urllib.request.urlopen(real + path, timeout=10) as r:
            ctype, raw = r.headers["Content-Type"], r.read()
        page = msgspec.msgpack.decode(raw)
        if damage != "a flipped byte":
            page["next"] -= 1
        records, pos = bytearray(page["records"]), 0
        while damage == "a gap" and pos < len(records):  # the second entry's frame cut out
            length, rtype = int.from_bytes(records[pos : pos + 4], "little"), records[pos + 8]
            if rtype == 1 and ENTRY_FRAME.unpack_from(records, pos)[3] == page["first"] + 1:
                del records[pos : pos + 8 + length]
                break
            pos += 8 + length
        while damage == "a flipped byte" and pos < len(records):  # the first NORMAL's term
            length, _, rtype, _, _, kind = ENTRY_FRAME.unpack_from(records, pos)
            if rtype == 1 and kind == EntryKind.NORMAL:
                records[pos + 8 + 9] ^= 0x01
                break
            pos += 8 + length
        page["records"] = bytes(records)
        return 200, ctype, msgspec.msgpack.encode(page)

    node = FakeNode(damaged)
    got = read_partition_0_through(spark, node, real)
    assert got == [r for r in cluster.acked if r[0] == 0]
    pages = [p for p in node.requests if "/columns?" in p]
    assert len(pages) >= 7 and all("format=wal" in p for p in pages)


@pytest.mark.parametrize("refusal", [400, 404])
def test_a_node_that_refuses_format_wal_is_read_by_column_pages(spark, cluster, tmp_path, refusal):
    """An older node answers `format=wal` with a 400 (or a 404): the reader asks it for
    column pages from then on, and the read is exact. The token is given in a file that ends
    with a newline: every request carries the token without it."""
    leader = cluster.leader(0)
    assert leader is not None
    real = cluster.nodes[leader].url
    status = json.dumps(follower_of(cluster)).encode()

    def older(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            return 200, "application/json", status
        if "format=wal" in path:
            return error(refusal, "bad_request")
        with urllib.request.urlopen(real + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()

    node = FakeNode(older)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    try:
        df = (
            spark.read.format("raftlog-jvm")
            .option("endpoints", node.url)
            .option("tokenFile", str(token))
            .option("partitions", "0")
            .option("pageRecords", "20")
            .load()
        )
        got = rows_of(df)
    finally:
        node.close()
    assert got == [r for r in cluster.acked if r[0] == 0]
    pages = [p for p in node.requests if "/columns?" in p]
    assert sum("format=wal" in p for p in pages) == 1 and len(pages) >= 8
    assert set(node.authorizations) == {"Bearer s3cret"}


def holding_leader(cluster: LocalCluster) -> FakeNode:
    """The leader of partition 0 serving VARIED, taking every retention hold put on it."""
    answer = leader_of(cluster, VARIED)

    def with_holds(path: str, n: int) -> tuple[int, str, bytes]:
        if "/holds/" in path:
            return 200, "application/json", b"{}"
        return answer(path, n)

    return FakeNode(with_holds)


def test_a_streams_retention_hold_is_placed_at_its_start_and_moved_to_each_committed_end(
    spark, cluster, tmp_path
):
    """A `raftlog-jvm` stream with retentionHold, in batches of at most 25 records: the hold is
    put on the replica at the stream's first offset before anything is read, then at the end
    of each batch committed (the next index to read), never below what was read; each batch's
    progress tells how many records it trails the latest offset by."""
    node = holding_leader(cluster)
    try:
        q = (
            spark.readStream.format("raftlog-jvm")
            .option("endpoints", node.url)
            .option("partitions", "0")
            .option("startingOffsets", "earliest")
            .option("retentionHold", "jvm job")
            .option("maxOffsetsPerTrigger", "25")
            .load()
            .writeStream.format("memory")
            .queryName("jvm_hold")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            q.processAllAvailable()
            progress = [p for p in q.recentProgress if p["numInputRows"]]
        finally:
            q.stop()
    finally:
        node.close()
    assert spark.table("jvm_hold").count() == len(VARIED) == 60
    behind = [p["sources"][0]["metrics"]["maxOffsetsBehindLatest"] for p in progress]
    assert behind == ["35", "10", "0"]
    assert {p for p, _ in node.puts} == {"/v1/admin/partitions/0/holds/jvm%20job"}
    held = [json.loads(body)["min_index"] for _, body in node.puts]
    assert held == [1, 26, 51, 61]


def held_stream(
    spark: SparkSession, node: FakeNode, holder: str, every: str, tmp_path: Path
) -> StreamingQuery:
    """A `raftlog-jvm` stream of partition 0 from `node` with retentionHold `holder` (a 1 s TTL)
    and a trigger `every`, once its first batch has read something."""
    q = (
        spark.readStream.format("raftlog-jvm")
        .option("endpoints", node.url)
        .option("partitions", "0")
        .option("startingOffsets", "earliest")
        .option("retentionHold", holder)
        .option("retentionHoldTtlSeconds", "1")
        .load()
        .writeStream.format("noop")
        .trigger(processingTime=every)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    deadline = time.monotonic() + 60
    while not any(p["numInputRows"] for p in q.recentProgress):  # the first batch
        if time.monotonic() > deadline:
            q.stop()
            raise AssertionError("no first batch")
        time.sleep(0.1)
    return q


def test_a_streams_hold_is_renewed_between_triggers_until_the_query_stops(spark, cluster, tmp_path):
    """Found by a review: the hold was renewed only when Spark called the stream (a trigger, a
    commit), so a batch or a trigger interval longer than the TTL let compaction pass what the
    query had not read. The driver renews it every quarter of the TTL until the stream stops."""
    node = holding_leader(cluster)
    try:
        q = held_stream(spark, node, "renewed", "1 hour", tmp_path)
        try:
            before = len(node.puts)  # the next trigger is an hour away
            deadline = time.monotonic() + 15
            while len(node.puts) < before + 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(node.puts) >= before + 3, node.puts
        finally:
            q.stop()
        time.sleep(0.6)  # a renewal under way ends
        stopped = len(node.puts)
        time.sleep(0.8)
        assert len(node.puts) == stopped, "renewed after the query stopped"
    finally:
        node.close()
    # Where a restart would read from: the first batch is told committed to the source only
    # when the next is planned (an hour away).
    assert {json.loads(body)["min_index"] for _, body in node.puts[before:]} == {1}


def test_a_hold_refused_at_a_renewal_fails_the_stream_at_its_next_trigger(spark, cluster, tmp_path):
    """Found by a review: the hold was recorded as placed before it was asked, so a refusal met
    by the renewal thread (which can only log it) left the next trigger's hold "fresh", and
    the stream ran on without its hold. Once the stream has read everything, the holds are
    refused (a token changed): the renewal meets it first, and the stream fails."""
    answer = leader_of(cluster, VARIED)
    refuse = threading.Event()

    def refused_later(path: str, n: int) -> tuple[int, str, bytes] | None:
        if "/holds/" in path:
            if refuse.is_set():
                return error(401, "unauthorized", reason="a wrong token")
            return 200, "application/json", b"{}"
        return answer(path, n)

    node = FakeNode(refused_later)
    try:
        q = held_stream(spark, node, "refused", "2 seconds", tmp_path)
        try:
            refuse.set()
            with pytest.raises(
                Exception,
                # The node's reason, worded as the Python client words it.
                match=r"'refused' on partition 0 was refused: .*HTTP 401 unauthorized: a wrong",
            ):
                q.awaitTermination(15)  # False (no raise) while it runs on without its hold
        finally:
            q.stop()
    finally:
        node.close()


def test_a_partition_a_survey_missed_is_not_read_again_from_its_earliest(spark, cluster, tmp_path):
    """Found by a review: a partition whose only members missed one survey was left out of the
    end offset, and the next trigger took it for new: read again from its earliest record
    (every one of its rows twice). Partition 1's only member fails its fourth status."""
    asked = []
    one = leader_of(cluster, VARIED, alone=1)

    def misses_a_survey(path: str, n: int) -> tuple[int, str, bytes] | None:
        if path == "/v1/status":
            asked.append(path)
            if len(asked) == 4:  # after the batch that read partition 1
                return error(503, "busy")
        return one(path, n)

    zero, other = FakeNode(leader_of(cluster, VARIED, alone=0)), FakeNode(misses_a_survey)
    try:
        q = (
            spark.readStream.format("raftlog-jvm")
            .option("endpoints", f"{zero.url},{other.url}")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("memory")
            .queryName("jvm_missed")
            .trigger(processingTime="500 milliseconds")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
        try:
            deadline = time.monotonic() + 60
            while len(asked) < 7:  # surveys past the one that missed it
                assert time.monotonic() < deadline, (asked, q.exception())
                time.sleep(0.1)
            q.processAllAvailable()
        finally:
            q.stop()
    finally:
        zero.close()
        other.close()
    counts = spark.sql("SELECT partition, count(*) AS n FROM jvm_missed GROUP BY partition")
    assert sorted((r["partition"], r["n"]) for r in counts.collect()) == [(0, 60), (1, 60)]


def run_available_now(reader: Any, checkpoint: str) -> list[int]:
    """Runs `reader` (a readStream) with Trigger.AvailableNow on `checkpoint`; how many records
    each of its batches read."""
    q = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(60)
        return [int(p["numInputRows"]) for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()


def test_available_now_reads_what_was_committed_when_the_query_started(spark, cluster, tmp_path):
    """Trigger.AvailableNow: a stream ends at the high-water mark the replicas reported when the
    query started (30), not at records committed while it runs (the mark is 60 after)."""
    answer = leader_of(cluster, VARIED)
    statuses = [0]

    def growing(path: str, n: int) -> tuple[int, str, bytes]:
        if path == "/v1/status":
            statuses[0] += 1
            if statuses[0] == 1:  # the survey of the query's start
                status = follower_of(cluster, partitions=1)
                partitions = cast(list[dict[str, Any]], status["partitions"])
                partitions[0].update(role="leader", high_water_mark=30, compaction_floor=1)
                return 200, "application/json", json.dumps(status).encode()
        return answer(path, n)

    node = FakeNode(growing)
    try:
        reader = (
            spark.readStream.format("raftlog-jvm")
            .option("endpoints", node.url)
            .option("partitions", "0")
            .option("startingOffsets", "earliest")
        )
        read = run_available_now(reader, str(tmp_path / "checkpoint"))
    finally:
        node.close()
    assert sum(read) == 30
    assert statuses[0] >= 2


def test_a_partition_new_to_a_streams_checkpoint_is_read_from_its_earliest_record(
    spark, cluster, tmp_path
):
    """A stream of partition 0 is run, then started again on its checkpoint reading partitions
    0 and 1, at most 20 records a batch: partition 1, absent from the checkpoint, is read from
    its earliest record (as Kafka's source reads a new partition) within that limit, partition
    0 from where the checkpoint ended. (Without startingOffsets a stream starts at the latest
    offset: it reads nothing already committed.)"""
    checkpoint = str(tmp_path / "checkpoint")
    acked = {p: [r for r in cluster.acked if r[0] == p] for p in (0, 1)}

    def reader(partitions: str) -> Any:
        r = spark.readStream.format("raftlog-jvm").option("partitions", partitions)
        return r.option("endpoints", ",".join(cluster.endpoints))

    assert run_available_now(reader("0"), str(tmp_path / "latest")) == []
    first = reader("0").option("startingOffsets", "earliest")
    assert sum(run_available_now(first, checkpoint)) == len(acked[0])
    second = run_available_now(reader("0,1").option("maxOffsetsPerTrigger", "20"), checkpoint)
    assert sum(second) == len(acked[1]) and max(second) == 20


def test_a_streams_limit_is_shared_without_reaching_past_a_partitions_mark(
    spark, cluster, tmp_path
):
    """maxOffsetsPerTrigger=5 over the last 10 records of partitions 1 and 2, partition 0 at
    its latest offset (nothing to read): each batch takes at most 5 records, shared in
    proportion to what each partition has, and never asks partition 0 for an index past its
    high-water mark; the stream reads the 20 records."""
    last = {p: max(r[1] for r in cluster.acked if r[0] == p) for p in range(3)}
    starting = {"0": last[0] + 1, "1": last[1] - 9, "2": last[2] - 9}
    reader = (
        spark.readStream.format("raftlog-jvm")
        .option("endpoints", ",".join(cluster.endpoints))
        .option("startingOffsets", json.dumps(starting))
        .option("maxOffsetsPerTrigger", "5")
        .option("timeoutSeconds", "3")
    )
    batches = run_available_now(reader, str(tmp_path / "checkpoint"))
    assert sum(batches) == 20 and max(batches) == 5
