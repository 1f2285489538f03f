"""Writing to raftlog from Spark: `df.write.format("raftlog")` and `writeStream.format("raftlog")`
land every row once, routed by key or by a `partition` column, across a task retried after it
had appended part of its rows and a micro-batch replayed after the query died in it."""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from raftlog.harness.local import LocalCluster
from raftlog.node.routing import partition_for
from raftlog.spark import nodes as spark_nodes
from raftlog.spark import sink
from raftlog.spark.options import OptionError
from tests.spark.helpers import JVM_ENV

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(
        tmp_path_factory.mktemp("sink"), replicas=3, partitions=3, durable=False
    ) as c:
        c.wait_ready()
        yield c


def log_of(c: LocalCluster, partition: int) -> list[dict[str, Any]]:
    out, start = [], 1
    # From the leader: it has committed everything acknowledged, where a follower may trail
    # by a commit.
    node = c.leader(partition) or "n1"
    while True:
        code, page = c.get(node, f"/v1/partitions/{partition}/records?from={start}&limit=10000")
        assert code == 200, page
        out += page["records"]
        if page["next"] > page["high_water_mark"]:
            return out
        start = page["next"]


def written(c: LocalCluster, tag: str) -> dict[int, list[dict[str, Any]]]:
    """The records whose value starts with `tag`, per partition."""
    return {
        p: [r for r in log_of(c, p) if str(r.get("value", "")).startswith(tag)] for p in range(3)
    }


def test_a_batch_write_routes_by_key_or_partition_and_lands_each_row_once(
    spark: SparkSession, cluster: LocalCluster
):
    eps = ",".join(cluster.endpoints)
    df = spark.range(0, 300, numPartitions=3).select(
        F.concat(F.lit("k"), (F.col("id") % 17).cast("string")).alias("key"),
        F.concat(F.lit("keyed-"), F.col("id").cast("string")).alias("value"),
    )
    df.write.format("raftlog").option("endpoints", eps).option("batchRecords", "40").mode(
        "append"
    ).save()
    got = written(cluster, "keyed-")
    values = collections.Counter(r["value"] for rs in got.values() for r in rs)
    assert values == collections.Counter(f"keyed-{i}" for i in range(300))
    for p, rs in got.items():  # as the node's /v1/records routes keys
        assert all(partition_for(r["key"].encode(), 3) == p for r in rs)

    by_column = spark.createDataFrame(
        [(2, None, b"\x00\xffbin"), (1, "a", None), (0, "b", b"zero")],
        "partition int, key string, value binary",
    )
    by_column.write.format("raftlog").option("endpoints", eps).mode("append").save()
    logs = {p: log_of(cluster, p) for p in range(3)}
    assert any(r.get("value_b64") == "AP9iaW4=" and r.get("key") is None for r in logs[2]), logs[2][
        -3:
    ]
    assert any(r.get("key") == "a" and r.get("value") is None for r in logs[1])  # tombstone
    assert any(r.get("key") == "b" and r.get("value") == "zero" for r in logs[0])


def test_a_write_refuses_what_it_cannot_do_naming_it(spark: SparkSession, cluster: LocalCluster):
    eps = ",".join(cluster.endpoints)
    ok = spark.createDataFrame([("k", "v")], "key string, value string")
    cases = [
        (
            ok.write.format("raftlog").option("endpoints", eps).mode("overwrite"),
            "never overwritten",
        ),
        (
            ok.write.format("raftlog")
            .option("endpoints", eps)
            .option("startingOffsets", "earliest")
            .mode("append"),
            "startingOffsets",
        ),
        (
            ok.write.format("raftlog")
            .option("endpoints", eps)
            .option("batchRecords", "0")
            .mode("append"),
            "batchRecords",
        ),
        (
            spark.createDataFrame([(1,)], "value int")
            .write.format("raftlog")
            .option("endpoints", eps)
            .mode("append"),
            "column `value` must be string or binary",
        ),
        (
            spark.createDataFrame([("v", 1)], "value string, other int")
            .write.format("raftlog")
            .option("endpoints", eps)
            .mode("append"),
            "column `other`",
        ),
        (
            spark.createDataFrame([(7, "v")], "partition int, value string")
            .write.format("raftlog")
            .option("endpoints", eps)
            .mode("append"),
            "7 is not a partition",
        ),
        (
            spark.createDataFrame(
                [("v", [("k", None)])],
                "value string, headers array<struct<key: string, value: binary>>",
            )
            .write.format("raftlog")
            .option("endpoints", eps)
            .mode("append"),
            "null key or value",
        ),
    ]
    for writer, reason in cases:
        with pytest.raises(Exception, match=reason):
            writer.save()


def python_workers(root: int) -> list[int]:
    """The Python workers of the Spark under process `root`: the processes pyspark's daemon
    forked (the daemon itself stays, and starts new ones)."""
    cmd, parent = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd[int(d.name)] = (d / "cmdline").read_bytes()
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue

    def under(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 1)
        return False

    daemon = b"pyspark.daemon"
    return [
        pid for pid, c in cmd.items()
        if daemon in c and daemon in cmd.get(parent.get(pid, 1), b"") and under(pid)
    ]  # fmt: skip


def count(c: LocalCluster, prefix: str) -> int:
    return sum(len(rs) for rs in written(c, prefix).values())


def kill_workers_midway(c: LocalCluster, root: int, prefix: str, at: int, total: int) -> int:
    """Once `at` of the write's `total` records are in the log (and not all), SIGKILL the
    Python workers writing them: the task dies after appending part of its rows."""
    deadline = time.monotonic() + 120
    while (done := count(c, prefix)) < at:
        assert time.monotonic() < deadline, f"{done} of {at} records of {prefix} appended"
        time.sleep(0.02)
    workers = python_workers(root)
    assert workers, "no Python worker to kill"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert done < total, "the write finished before its workers were killed"
    return done


# A batch write in a Spark of its own that retries failed tasks (local[2,3]): one task, small
# appends, so that it is killed with part of its rows appended; its retry sends the same rows
# under the same producer ids.
RETRY = """
import sys
from pyspark.sql import SparkSession, functions as F
from raftlog.spark import register
spark = (SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
register(spark)
df = spark.range(0, 3000, numPartitions=1).select(
    F.lit(0).alias("partition"), F.concat(F.lit("retried-"), F.col("id")).alias("value"))
df.write.format("raftlog").option("endpoints", sys.argv[1]).option("batchRecords", "5") \\
    .mode("append").save()
spark.stop()
"""


def test_a_task_killed_after_appending_part_of_its_rows_is_retried_and_lands_each_once(
    cluster: LocalCluster, tmp_path: Path
):
    env = {**os.environ, **JVM_ENV, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}  # fmt: skip
    job = subprocess.Popen(
        [sys.executable, "-c", RETRY, ",".join(cluster.endpoints)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        killed_at = kill_workers_midway(cluster, job.pid, "retried-", 300, 3000)
        out, _ = job.communicate(timeout=300)
    finally:
        job.kill()
    assert job.returncode == 0, out.decode()[-3000:]
    got = collections.Counter(r["value"] for r in written(cluster, "retried-")[0])
    assert got == collections.Counter(f"retried-{i}" for i in range(3000)), (
        killed_at,
        [v for v, n in got.items() if n > 1][:5],
    )


def test_a_stream_replays_the_batch_it_died_in_and_lands_each_row_once(
    spark: SparkSession, cluster: LocalCluster, tmp_path: Path
):
    """The query's Python workers are killed while its second micro-batch is being written
    (this Spark does not retry tasks: the query dies); started again from its checkpoint, it
    replays that micro-batch (the same batch id: the same producer ids), then the rest.
    3,000 rows a micro-batch: the kill must land while the batch is still being written, and
    counting what is written takes a while on a loaded machine (with 1,000, a CI run once saw
    the batch finish first, and the query lived)."""
    rows_per_batch = 3000
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    for n in range(3):  # three files: three micro-batches
        rows = [{"key": f"s{n}-{i}", "value": f"streamed-{n}-{i}"} for i in range(rows_per_batch)]
        (source / f"part-{n}.json").write_text("\n".join(json.dumps(r) for r in rows))

    def start() -> Any:
        stream = (
            spark.readStream.schema("key string, value string")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        return (
            stream.writeStream.format("raftlog")
            .option("endpoints", ",".join(cluster.endpoints))
            .option("batchRecords", "5")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    query = start()
    killed_at = kill_workers_midway(cluster, os.getpid(), "streamed-1-", 100, rows_per_batch)
    with pytest.raises(StreamingQueryException):  # its workers died
        query.awaitTermination(120)
    start().awaitTermination(300)  # from the checkpoint: micro-batch 1 again, then 2
    got = collections.Counter(
        r["value"] for rs in written(cluster, "streamed-").values() for r in rs
    )
    expected = collections.Counter(
        f"streamed-{n}-{i}" for n in range(3) for i in range(rows_per_batch)
    )
    assert got == expected, (killed_at, sorted(v for v, c in got.items() if c > 1)[:5])


class OneTask:
    """Spark's TaskContext of a write task, for calling a writer without Spark."""

    @staticmethod
    def get() -> OneTask:
        return OneTask()

    def partitionId(self) -> int:
        return 0


SCHEMA = StructType(
    [
        StructField("partition", IntegerType()),
        StructField("key", BinaryType()),
        StructField("value", StringType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("timestamp", TimestampType()),
    ]
)


def test_a_writers_rows_land_with_their_columns_routed_as_the_node_routes(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Spark (the task's context faked): binary keys route as the node routes their
    bytes, a null key or a null partition is no route (partition 0, or the key's), chunks of
    `batchRecords` follow each other, and headers and timestamps are the records'."""
    monkeypatch.setattr(sink, "TaskContext", OneTask)
    eps = ",".join(cluster.endpoints)
    key = b"\x00\xffkey"
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    rows: list[dict[str, Any]] = [
        {"partition": None, "key": key, "value": f"sunk-{i}", "headers": {"h": str(i)},
         "timestamp": at}
        for i in range(5)
    ] + [{"partition": None, "key": None, "value": "sunk-nokey", "headers": None,
          "timestamp": None}]  # fmt: skip
    writer = sink.writer({"endpoints": eps, "batchRecords": "2", "writeId": "sunk"}, SCHEMA)
    done = writer.write(iter(rows))
    assert done.records == 6
    got = written(cluster, "sunk-")
    p = partition_for(key, 3)
    assert [r["value"] for r in got[p]] == [f"sunk-{i}" for i in range(5)]
    assert all(r["key_b64"] == "AP9rZXk=" for r in got[p])
    assert [r.get("headers") for r in got[p]] == [{"h": str(i)} for i in range(5)]
    assert all(r.get("timestamp_ms") == int(at.timestamp() * 1000) for r in got[p])
    assert any(r["value"] == "sunk-nokey" and r.get("key") is None for r in got[0])
    refused: list[tuple[dict[str, Any], str]] = [
        ({"partition": 3, "key": None, "value": "v"}, "3 is not a partition of the cluster"),
        ({"partition": None, "key": None, "value": "v", "headers": {"a": "1", "b": None}},
         "has a null value"),
    ]  # fmt: skip
    for bad, reason in refused:
        with pytest.raises(ValueError, match=reason):
            writer.write(iter([{"headers": None, "timestamp": None, **bad}]))


def test_write_options_take_their_bounds_and_name_a_read_option_as_such(cluster: LocalCluster):
    """Without Spark: batchRecords 1..10000 and writeId of 1..100 characters are taken, one
    past is refused; a read option given to a write is named as one; every column a write
    takes is taken; a write whose endpoints do not answer fails on the driver, naming them
    (the partition count is read there)."""
    ep = {"endpoints": "http://127.0.0.1:1"}
    assert sink.parse_write({**ep, "batchRecords": "10000"}).batch_records == 10_000
    assert sink.parse_write({**ep, "writeId": "w" * 100}).write_id == "w" * 100
    with pytest.raises(OptionError, match="between 1 and 10000, got 10001"):
        sink.parse_write({**ep, "batchRecords": "10001"})
    with pytest.raises(OptionError, match="must be an integer, got '1_0'"):
        sink.parse_write({**ep, "batchRecords": "1_0"})  # int() read it as 10
    with pytest.raises(OptionError, match="1 to 100 characters"):
        sink.parse_write({**ep, "writeId": "w" * 101})
    with pytest.raises(OptionError, match="is a read option; a write takes"):
        sink.parse_write({**ep, "startingoffsets": "earliest"})
    with pytest.raises(OptionError, match="is not an option; a write takes"):
        sink.parse_write({**ep, "nosuch": "1"})
    for make in (sink.writer, sink.stream_writer):
        with pytest.raises(OptionError, match="'endpoints': no node answered /v1/status"):
            make(ep, SCHEMA)
        assert make({"endpoints": ",".join(cluster.endpoints)}, SCHEMA).opts.partitions == 3


def test_a_rerun_under_a_write_id_with_other_chunks_fails_rather_than_dropping_rows(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Spark: a write run again under its `writeId` lands what its first run did not,
    once, even where its chunks no longer line up with the first run's (another
    `batchRecords`); with other rows under the sequences in the log, the node's sequence
    conflict fails the write: no row is dropped as if it were a duplicate."""
    monkeypatch.setattr(sink, "TaskContext", OneTask)
    eps = ",".join(cluster.endpoints)

    def rows(n: int) -> Iterator[dict[str, Any]]:
        return iter({"partition": 1, "value": f"rerun-{i}"} for i in range(n))

    fields = StructType(
        [StructField("partition", IntegerType()), StructField("value", StringType())]
    )
    options = {"endpoints": eps, "batchRecords": "2", "writeId": "rerun"}
    sink.writer(options, fields).write(rows(3))
    sink.writer(options, fields).write(rows(3))  # all of it again: duplicates
    assert [r["value"] for r in written(cluster, "rerun-")[1]] == [f"rerun-{i}" for i in range(3)]
    sink.writer(options, fields).write(rows(5))  # chunks [0, 1], [2, 3], [4]: 2 is in the log
    assert [r["value"] for r in written(cluster, "rerun-")[1]] == [f"rerun-{i}" for i in range(5)]
    with pytest.raises(RuntimeError, match="sequence_conflict"):
        sink.writer(options, fields).write(
            iter({"partition": 1, "value": f"other-{i}"} for i in range(6))
        )
    assert not written(cluster, "other-")[1], "none of the other rows landed"


def test_a_timestamp_lands_at_its_exact_millisecond(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Spark: a row's timestamp is the record's `timestamp_ms` to the millisecond
    (what a read gives back as the `timestamp` column)."""
    monkeypatch.setattr(sink, "TaskContext", OneTask)
    ms = 547_641_621_915
    at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    fields = StructType(
        [StructField("partition", IntegerType()), StructField("value", StringType()),
         StructField("timestamp", TimestampType())]
    )  # fmt: skip
    options = {"endpoints": ",".join(cluster.endpoints), "writeId": "exact-ms"}
    sink.writer(options, fields).write(
        iter([{"partition": 2, "value": "exact-ms", "timestamp": at}])
    )
    (record,) = written(cluster, "exact-ms")[2]
    assert record["timestamp_ms"] == ms


def test_rows_too_large_together_for_one_append_go_in_several(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Spark: 600 rows of 20 KB with the default `batchRecords` (500) made a 10 MB
    append, which the node refused (413, its `max_request_bytes` is 8 MiB) whatever the retry;
    chunks are cut by their JSON size too (`CHUNK_BYTES`)."""
    monkeypatch.setattr(sink, "TaskContext", OneTask)
    fields = StructType(
        [StructField("partition", IntegerType()), StructField("value", StringType())]
    )
    pad = "x" * 20_000
    rows = iter({"partition": 2, "value": f"big-{i:03d}-{pad}"} for i in range(600))
    options = {"endpoints": ",".join(cluster.endpoints), "writeId": "big"}
    done = sink.writer(options, fields).write(rows)
    got = [r["value"][:7] for r in written(cluster, "big-")[2]]
    assert got == [f"big-{i:03d}" for i in range(600)]
    assert (done.records, done.duplicates) == (600, 0)


def test_the_partition_count_is_read_once_on_the_driver_not_by_each_task(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Spark: a task that read the count itself could route a key elsewhere on a
    retry after a raise, under another producer id, so its rows landed twice. The writer
    carries the count the driver read (the fewest any member holds, during a raise)."""
    monkeypatch.setattr(sink, "TaskContext", OneTask)
    fields = StructType([StructField("key", StringType()), StructField("value", StringType())])
    w = sink.writer({"endpoints": ",".join(cluster.endpoints), "writeId": "count"}, fields)
    assert w.opts.partitions == 3
    real = spark_nodes.client

    def no_status(opts: Any) -> Any:
        nodes = real(opts)

        def refused(*_: Any, **__: Any) -> Any:
            raise AssertionError("a task asked a node for the partition count")

        nodes.status = refused  # type: ignore[method-assign]
        return nodes

    monkeypatch.setattr(sink, "client", no_status)
    done = w.write(iter({"key": f"k{i}", "value": f"count-{i}"} for i in range(30)))
    assert (done.records, done.duplicates) == (30, 0)
    got = written(cluster, "count-")
    assert sorted(r["value"] for p in got.values() for r in p) == sorted(
        f"count-{i}" for i in range(30)
    )
    assert all(partition_for(f"k{i}".encode(), 3) == p for p, rs in got.items() for r in rs
               for i in [int(r["value"].split("-")[1])])  # fmt: skip


def _schema(**columns: DataType) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns.items()])


STRING_STRUCT = StructType([StructField("key", StringType()), StructField("val", BinaryType())])
KAFKA_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"partition": StringType()}, "column `partition` must be an integer, not string"),
        ({"timestamp": StringType()}, "column `timestamp` must be a timestamp, not string"),
        ({"timestamp": LongType()}, "column `timestamp` must be a timestamp, not bigint"),
        ({"headers": MapType(StringType(), IntegerType())}, "column `headers` must be map<"),
        ({"headers": ArrayType(StringType())}, "column `headers` must be map<string,string>"),
        ({"headers": ArrayType(STRING_STRUCT)}, "or array<struct<key:string,value:binary"),
    ],
)
def test_a_column_of_the_wrong_type_is_refused_when_the_write_is_planned(columns, message):
    """Without Spark: a wrong type was met row by row in the tasks (a string `timestamp` was an
    AttributeError) after some chunks had been appended; it is refused on the driver, naming
    the column, before anything is written."""
    schema = _schema(value=StringType(), **columns)
    with pytest.raises(ValueError, match=re.escape(message)):
        sink.writer({"endpoints": "http://127.0.0.1:1"}, schema)


def test_every_column_type_a_write_takes_passes_the_check():
    sink._check_schema(
        _schema(value=StringType(), partition=LongType(), timestamp=TimestampNTZType(),
                headers=MapType(StringType(), StringType()))
    )  # fmt: skip
    sink._check_schema(
        _schema(value=BinaryType(), key=BinaryType(), partition=ShortType(),
                timestamp=TimestampType(), headers=KAFKA_HEADERS)
    )  # fmt: skip
