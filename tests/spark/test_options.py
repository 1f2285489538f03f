"""Bad options fail at planning, naming the option and the reason: the same options with the
same messages for the JVM reader (`raftlog-jvm`) as for the Python source, where both read."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from raftlog.harness.local import LocalCluster, free_ports
from raftlog.node.storage.archive_manifest import ArchivedSegment
from raftlog.spark.archived import Tier
from raftlog.spark.nodes import PartitionView, Replica, client, survey
from raftlog.spark.options import OptionError, parse
from raftlog.spark.source import LogSplit, log_splits, spread
from tests.spark.helpers import FakeNode, append, records

pytestmark = [pytest.mark.spark]

EP = {"endpoints": "http://127.0.0.1:1"}


BAD = [
    ({}, False, "endpoints", "is required"),
    ({"endpoints": "127.0.0.1:7001"}, False, "endpoints", "is not an http(s) URL"),
    ({**EP, "mode": "tail"}, False, "mode", "must be log or table, got 'tail'"),
    ({**EP, "mode": "table"}, True, "mode", "table is a batch read"),
    ({**EP, "startingOffsets": '{"0": 5'}, False, "startingOffsets", "JSON object like"),
    ({**EP, "startingOffsets": "[1, 2]"}, False, "startingOffsets", "non-empty JSON object"),
    ({**EP, "startingOffsets": '{"x": 5}'}, False, "startingOffsets", "'x' is not an integer"),
    ({**EP, "startingOffsets": '{"0": 0}'}, False, "startingOffsets", "log index >= 1"),
    ({**EP, "startingOffsets": '{"0": "5"}'}, False, "startingOffsets", "must be an integer"),
    ({**EP, "endingOffsets": "earliest"}, False, "endingOffsets", "cannot be earliest"),
    ({**EP, "endingOffsets": '{"0": -2}'}, False, "endingOffsets", "cannot be -2"),
    ({**EP, "endingOffsets": "latest"}, True, "endingOffsets", "a stream has no end"),
    ({**EP, "maxRecordsPerSplit": "0"}, False, "maxRecordsPerSplit", "between 1 and"),
    ({**EP, "maxRecordsPerSplit": "lots"}, False, "maxRecordsPerSplit", "an integer"),
    ({**EP, "maxOffsetsPerTrigger": "10"}, False, "maxOffsetsPerTrigger", "for streams"),
    ({**EP, "maxRecordsPerTrigger": "10"}, True, "maxRecordsPerTrigger", "maxOffsetsPerTrigger"),
    ({**EP, "minOffsetsPerTrigger": "10"}, False, "minOffsetsPerTrigger", "for streams"),
    ({**EP, "maxTriggerDelay": "1m"}, True, "maxTriggerDelay", "set both"),
    (
        {**EP, "minOffsetsPerTrigger": "1", "maxTriggerDelay": "soon"},
        True,
        "maxTriggerDelay",
        "a duration",
    ),
    (
        {**EP, "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "8"},
        True,
        "minOffsetsPerTrigger",
        "more than maxOffsetsPerTrigger",
    ),
    ({**EP, "minPartitions": "0"}, False, "minPartitions", "between 1 and"),
    ({**EP, "startingTimestamp": "soon"}, False, "startingTimestamp", "milliseconds since the"),
    # A digit to str.isdigit, not to int (it was a ValueError, not the option named).
    ({**EP, "startingTimestamp": "\u00b2"}, False, "startingTimestamp", "milliseconds since the"),
    # Numbers as both readers read them (Python's int took "1_0" and any size, Java's
    # parseDouble "1d" and hexadecimal).
    ({**EP, "startingTimestamp": "9" * 20}, False, "startingTimestamp", "milliseconds since the"),
    ({**EP, "maxRecordsPerSplit": "200_000"}, False, "maxRecordsPerSplit", "an integer"),
    ({**EP, "partitions": "1_0"}, False, "partitions", "comma-separated"),
    ({**EP, "timeoutSeconds": "1d"}, False, "timeoutSeconds", "a number"),
    ({**EP, "timeoutSeconds": "0x1p3"}, False, "timeoutSeconds", "a number"),
    ({**EP, "startingOffsets": '{"1_0": 5}'}, False, "startingOffsets", "not an integer"),
    (
        {**EP, "startingTimestamp": "1", "startingOffsets": "earliest"},
        False,
        "startingTimestamp",
        "give one of startingOffsets, startingTimestamp, not both",
    ),
    (
        {**EP, "startingOffsetsByTimestamp": '{"0": -5}'},
        False,
        "startingOffsetsByTimestamp",
        "milliseconds since the epoch",
    ),
    (
        {**EP, "endingOffsetsByTimestamp": "[]"},
        False,
        "endingOffsetsByTimestamp",
        "non-empty JSON object",
    ),
    ({**EP, "endingTimestamp": "5"}, True, "endingTimestamp", "a stream has no end"),
    (
        {**EP, "startingOffsetsByTimestampStrategy": "skip"},
        False,
        "startingOffsetsByTimestampStrategy",
        "must be error or latest",
    ),
    ({**EP, "preferFollowers": "maybe"}, False, "preferFollowers", "true or false"),
    ({**EP, "partitions": "0,x"}, False, "partitions", "comma-separated"),
    ({**EP, "retentionHold": "a/b"}, True, "retentionHold", "without '/'"),
    # What the node refuses is refused here, where the option is named.
    ({**EP, "retentionHold": "a\tb"}, True, "retentionHold", "printable characters"),
    ({**EP, "retentionHold": "a\u00a0b"}, True, "retentionHold", "printable characters"),
    ({**EP, "retentionHold": "r"}, False, "retentionHold", "holds are for streams"),
    ({**EP, "tokenFile": "/nonexistent/token"}, False, "tokenFile", "cannot be read"),
    ({**EP, "mode": "table", "startingOffsets": "latest"}, False, "startingOffsets", "table"),
    ({**EP, "colour": "blue"}, False, "colour", "unknown option"),
]


@pytest.mark.parametrize(("options", "streaming", "option", "reason"), BAD)
def test_bad_options_name_the_option_and_the_reason(options, streaming, option, reason):
    with pytest.raises(OptionError) as e:
        parse(options, streaming=streaming)
    assert e.value.option == option
    assert reason in e.value.reason, e.value.reason


def test_good_options_parse():
    o = parse(
        {
            "ENDPOINTS": "http://a:1/, https://b:2",
            "startingOffsets": '{"0": 5, "1": -2}',
            "maxOffsetsPerTrigger": "100",
            "retentionHold": "archive",
        },
        streaming=True,
    )
    assert o.endpoints == ("http://a:1", "https://b:2")
    # Each once: named twice, a replica was counted twice (data loss was then never found).
    twice = parse({"endpoints": "http://a:1,http://a:1/, https://b:2"}, streaming=False)
    assert twice.endpoints == ("http://a:1", "https://b:2")
    assert o.starting == {0: 5, 1: -2}
    assert o.max_offsets_per_trigger == 100
    assert o.min_offsets_per_trigger is None and o.max_trigger_delay_s == 15 * 60
    timed = parse({**EP, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "90s"}, streaming=True)
    assert (timed.min_offsets_per_trigger, timed.max_trigger_delay_s) == (5, 90.0)
    assert parse({**EP, "minPartitions": "12"}, streaming=False).min_partitions == 12
    assert o.retention_hold == "archive"
    assert o.mode == "log" and o.prefer_followers and o.fail_on_data_loss
    assert parse(EP, streaming=False).starting == "earliest"
    assert parse(EP, streaming=True).starting == "latest"


def test_a_split_is_read_first_from_the_replicas_that_hold_all_of_it():
    """Followers first (`preferFollowers`), but one whose mark is below the split's last index
    goes after those that hold it (the leader included), and one exactly at it before."""
    opts = parse({**EP, "preferFollowers": "true"}, streaming=False)
    view = PartitionView(0, [
        Replica("http://lagging:1", False, 99, 1),
        Replica("http://even:1", False, 100, 1),  # the split's last index exactly
        Replica("http://leader:1", True, 120, 1),
    ])  # fmt: skip
    (split,) = log_splits(opts, view, 1, 101)
    assert split.replicas == ["http://even:1", "http://leader:1", "http://lagging:1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("opts"), replicas=1, partitions=2) as c:
        c.wait_ready()
        append(c, 0, records(5, "x"))
        yield c


def load(spark: SparkSession, fmt: str = "raftlog", **options: str) -> DataFrame:
    r = spark.read.format(fmt)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "snapshot"}, "raftlog option 'mode': must be log or table, got 'snapshot'"),
        ({"startingOffsets": "{0: 1}"}, "raftlog option 'startingOffsets': must be earliest"),
        ({"endingOffsets": '{"0": 999999}'}, "past the high-water mark"),
        ({"startingOffsets": '{"7": 1}'}, "'startingOffsets': partition 7 is not read"),
        ({"endingOffsets": '{"7": 1}'}, "'endingOffsets': partition 7 is not read"),
        ({"partitions": "5"}, "'partitions': [5] do not exist (the cluster has 0..1)"),
    ],
)
@pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])
def test_bad_options_fail_at_planning_with_a_clear_message(spark, cluster, options, message, fmt):
    df = load(spark, fmt, endpoints=cluster.endpoints[0], **options)
    with pytest.raises(Exception, match="raftlog option") as e:
        df.collect()
    assert message in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])
def test_an_end_one_past_the_mark_plus_one_fails_at_planning(spark, cluster, fmt):
    """`endingOffsets` is exclusive: the mark + 1 reads everything committed, one more is an
    uncommitted index and refused at once (not waited for)."""
    hwm = cluster.status("n1")["partitions"][0]["high_water_mark"]
    df = load(spark, fmt, endpoints=cluster.endpoints[0], endingOffsets=f'{{"0": {hwm + 1}}}')
    assert df.where("partition = 0").count() == 5
    df = load(spark, fmt, endpoints=cluster.endpoints[0], endingOffsets=f'{{"0": {hwm + 2}}}')
    with pytest.raises(Exception, match="past the high-water mark"):
        df.collect()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])
def test_unreachable_endpoints_fail_at_planning_naming_them(spark, fmt):
    ports = free_ports(2)
    endpoints = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    df = load(spark, fmt, endpoints=endpoints, timeoutSeconds="2")
    with pytest.raises(Exception, match="raftlog option 'endpoints': no node answered") as e:
        df.count()
    for p in ports:  # each named once, with why
        url = f"http://127.0.0.1:{p}"
        assert f"{url}: no answer" in str(e.value) or f"{url}/v1/status: no answer" in str(e.value)
        assert f"{url}: {url}" not in str(e.value)


# Reads of the log, batch and streaming: the JVM reader refuses each of these as the Python
# source does.
JVM_BAD = [case for case in BAD if case[0].get("mode") != "table"]


@pytest.mark.slow
@pytest.mark.parametrize(("options", "streaming", "option", "reason"), JVM_BAD)
def test_the_jvm_reader_refuses_the_same_options_with_the_same_reason_at_planning(
    spark, tmp_path, options, streaming, option, reason
):
    with pytest.raises(Exception, match="raftlog option") as e:
        if not streaming:
            load(spark, "raftlog-jvm", **options).collect()
        else:
            r = spark.readStream.format("raftlog-jvm")
            for k, v in options.items():
                r = r.option(k, v)
            q = r.load().writeStream.format("noop")
            q = q.option("checkpointLocation", str(tmp_path / "checkpoint")).start()
            try:
                q.processAllAvailable()
            finally:
                q.stop()
    assert f"raftlog option '{option}': " in str(e.value)
    assert reason in str(e.value)


def test_min_partitions_halves_the_largest_splits_and_covers_the_same_indexes():
    splits = [LogSplit(0, 1, 101, ["a"]), LogSplit(1, 5, 8, ["b"])]
    out = spread(splits, 9)
    assert len(out) == 9
    assert [(s.partition, s.start, s.stop) for s in out if s.partition == 1] == [(1, 5, 8)]
    zero = [(s.start, s.stop) for s in out if s.partition == 0]
    assert zero[0][0] == 1 and zero[-1][1] == 101
    assert all(a[1] == b[0] for a, b in itertools.pairwise(zero))  # no gap, no overlap
    assert spread([], 5) == []
    assert len(spread([LogSplit(0, 1, 4, ["a"])], 10)) == 3  # one index each at most


def status_of(*partitions: dict[str, Any], cluster: str | None = "ns/c") -> FakeNode:
    body = json.dumps({"cluster": cluster, "partitions": list(partitions)}).encode()
    return FakeNode(lambda path, n: (200, "application/json", body))


def part(
    p: int, role: str, hwm: int, floor: int, readable_from: int | None = None
) -> dict[str, Any]:
    return {"partition": p, "role": role, "high_water_mark": hwm, "compaction_floor": floor,
            "readable_from": readable_from}  # fmt: skip


def test_the_survey_makes_each_partitions_view_of_what_its_replicas_answer():
    """Without Spark: a partition's mark is the highest a replica answered, its floor the
    lowest, what it serves from the lowest a replica serves (below its floor with tiered
    reads); followers are read first, the leader last; a node down is named; `partitions`
    keeps those asked for; a member that holds fewer partitions (a raise not yet rolled to
    it) leaves the others' partitions read from those that hold them; nodes of two clusters
    are refused."""
    a = status_of(part(0, "leader", 50, 10, 3), part(1, "follower", 7, 1))
    b = status_of(part(0, "follower", 48, 20), part(1, "leader", 9, 2, 0))
    odd = status_of(part(0, "leader", 50, 10), cluster="ns/other")
    fewer = status_of(part(0, "follower", 49, 10), cluster=None)
    down = "http://127.0.0.1:1"
    try:
        for extra, want in [({}, [0, 1]), ({"partitions": "1"}, [1])]:
            opts = parse({"endpoints": f"{a.url},{b.url},{down}", **extra}, streaming=False)
            nodes = client(opts)
            try:
                view = survey(nodes, opts)
            finally:
                nodes.close()
            assert sorted(view.partitions) == want and list(view.unreachable) == [down]
        p1 = view.partitions[1]
        assert (p1.high_water_mark, p1.floor, p1.readable_from, p1.earliest) == (9, 1, 1, 1)
        assert p1.read_order(prefer_followers=True) == [a.url, b.url]
        assert p1.read_order(prefer_followers=False) == [b.url, a.url]
        opts = parse({"endpoints": f"{a.url},{b.url}"}, streaming=False)
        nodes = client(opts)
        try:
            p0 = survey(nodes, opts).partitions[0]
        finally:
            nodes.close()
        assert (p0.high_water_mark, p0.floor, p0.readable_from, p0.earliest) == (50, 10, 3, 3)
        # With archiveUrl: the earliest is the archive's first index, or the floor without one.
        p0.tier = Tier("s3://b/p", "p/0/manifest.json", True, (ArchivedSegment(1, 9, "s", 9, ""),))
        assert p0.earliest == 1
        p0.tier = Tier("s3://b/p", "p/0/manifest.json", False, ())
        assert p0.earliest == 10
        opts = parse({"endpoints": f"{fewer.url},{a.url}"}, streaming=False)
        nodes = client(opts)
        try:
            raising = survey(nodes, opts).partitions
        finally:
            nodes.close()
        assert sorted(raising) == [0, 1] and len(raising[0].replicas) == 2
        assert [r.url for r in raising[1].replicas] == [a.url]
        opts = parse({"endpoints": f"{a.url},{odd.url}"}, streaming=False)
        nodes = client(opts)
        try:
            with pytest.raises(OptionError, match=r"members of different clusters \['ns/c', "):
                survey(nodes, opts)
        finally:
            nodes.close()
    finally:
        for n in (a, b, odd, fewer):
            n.close()
