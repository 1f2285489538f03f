"""Spark benchmark (issue 7): reading committed records through the `raftlog` source, against
reading the same records from a local Parquet file in the same Spark session; and the archive
job's rate.

A local 3-node cluster (fsync off: this measures reading, not appending) is loaded with
1,000,000 records of 100 B in one partition. Each read is `write.format("noop")`, which
materialises every column of every row; best of 3, the sources interleaved. A third source,
`arrow-ceiling`, is a Python data source whose tasks yield ready-made Arrow batches of the same
shape from memory: what any Python data source costs in Spark with no work of its own, the
ceiling of the `raftlog` source. A fourth, `raftlog-jvm`, reads the log in the JVM (the jar
`make jvm` builds) from WAL pages (`format=wal`: the records' bytes, checked and decoded by the
reader); a fifth is `raftlog-jvm` reading from `PageReplay`, which answers each
request with the bytes a node gave for it the first time: the JVM reader's rate when the nodes'
pread costs nothing. Run alone with `python -m bench.spark` (`RECORDS=...` to
change the count).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster
from raftlog.spark import arrow
from raftlog.spark.jobs import archive
from raftlog.spark.session import local_session

VALUE = "x" * 100
BATCH = 2_000


async def load(endpoints: list[str], total: int, clients: int = 4) -> None:
    async with AsyncClient(endpoints, timeout_s=60) as c:
        queue = list(range(0, total, BATCH))

        async def worker() -> None:
            while queue:
                start = queue.pop()
                n = min(BATCH, total - start)
                await c.append(0, [{"value": VALUE} for _ in range(n)])

        await asyncio.gather(*(worker() for _ in range(clients)))


class _Rows(InputPartition):
    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop


class _CeilingReader(DataSourceReader):
    def __init__(self, records: int, per_split: int, page: int) -> None:
        self.records, self.per_split, self.page = records, per_split, page

    def partitions(self) -> list[InputPartition]:
        n, k = self.records, self.per_split
        return [_Rows(lo, min(n, lo + k)) for lo in range(0, n, k)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Rows)
        n = self.page
        values = pa.array([VALUE.encode()] * n, pa.binary())
        empty = pa.MapArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), n + 1),
            pa.array([], pa.string()),
            pa.array([], pa.string()),
            type=arrow.ARROW_SCHEMA.field("headers").type,
        )
        for lo in range(partition.start, partition.stop, n):
            m = min(n, partition.stop - lo)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(0, pa.int32()), m),
                    pa.array(range(lo + 1, lo + m + 1), pa.int64()),
                    pa.repeat(pa.scalar(1, pa.int64()), m),
                    pa.nulls(m, pa.binary()),
                    values.slice(0, m),
                    empty.slice(0, m),
                    pa.nulls(m, arrow.ARROW_SCHEMA.field("timestamp").type),
                ],
                schema=arrow.ARROW_SCHEMA,
            )


class ArrowCeiling(DataSource):
    """Ready-made Arrow batches of the `raftlog` schema (no I/O, no decoding)."""

    @classmethod
    def name(cls) -> str:
        return "arrow-ceiling"

    def schema(self) -> StructType:
        return arrow.SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        o = self.options
        return _CeilingReader(int(o["records"]), int(o["perSplit"]), int(o["page"]))


class PageReplay:
    """An endpoint that answers each path with what `upstream` answered it the first time."""

    def __init__(self, upstream: str) -> None:
        cache: dict[str, tuple[str, bytes]] = {}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept-alive connections, as a node's

            def do_GET(self) -> None:
                got = cache.get(self.path)
                if got is None:
                    with urllib.request.urlopen(upstream + self.path, timeout=60) as r:
                        got = cache[self.path] = (r.headers["Content-Type"], r.read())
                self.send_response(200)
                self.send_header("Content-Type", got[0])
                self.send_header("Content-Length", str(len(got[1])))
                self.end_headers()
                self.wfile.write(got[1])

            def log_message(self, *args: object) -> None:
                """Silent: a benchmark's requests are not news."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def timed_noop(df: DataFrame) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def timed_aggregate(df: DataFrame) -> float:
    """A full aggregate over every row (as a report would run): per partition, the count, the
    bytes of the values and the last index."""
    started = time.perf_counter()
    rows = (
        df.groupBy("partition")
        .agg(F.count("*"), F.sum(F.length("value")), F.max("index"))
        .collect()
    )
    assert rows
    return time.perf_counter() - started


def sink_rate(spark: SparkSession, records: int, tmp: Path) -> tuple[float, float]:
    """Rows/s of `df.write.format("raftlog")` into a 3-node cluster of 3 partitions with
    fsync on, rows routed by key (100 B values), and the seconds it took."""
    with LocalCluster(tmp / "sink", replicas=3, partitions=3) as cluster:
        cluster.wait_ready()
        df = spark.range(0, records, numPartitions=4).select(
            F.concat(F.lit("k"), (F.col("id") % 1000).cast("string")).alias("key"),
            F.lit(VALUE).alias("value"),
        )
        df.cache().count()
        started = time.perf_counter()
        df.write.format("raftlog").option("endpoints", ",".join(cluster.endpoints)).mode(
            "append"
        ).save()
        took = time.perf_counter() - started
        total = sum(cluster.status("n1")["partitions"][p]["high_water_mark"] for p in range(3))
        assert total >= records, f"the sink wrote {total} of {records}"
    return records / took, took


def main(records: int = 1_000_000) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(
        Path(tmp) / "cluster", replicas=3, partitions=1, durable=False,
        raft={"compact_every_operations": 10**9, "compact_every_bytes": 0},  # no compaction
    ) as cluster:  # fmt: skip
        cluster.wait_ready()
        started = time.perf_counter()
        asyncio.run(load(cluster.endpoints, records))
        load_s = time.perf_counter() - started
        hwm = max(cluster.status(n)["partitions"][0]["high_water_mark"] for n in cluster.nodes)
        deadline = time.monotonic() + 60
        while (
            min(cluster.status(n)["partitions"][0]["high_water_mark"] for n in cluster.nodes) < hwm
        ):
            if time.monotonic() > deadline:
                raise TimeoutError("followers did not catch up within 60 s")
            time.sleep(0.2)
        spark = local_session(
            "raftlog-bench", master="local[*]", conf={"spark.driver.memory": "4g"}
        )
        follower = next(n for n in cluster.nodes if n != cluster.leader(0))
        replay = PageReplay(cluster.nodes[follower].url)
        source, jvm, jvm_replay = (
            spark.read.format(fmt)
            .option("endpoints", endpoints)
            .option("maxRecordsPerSplit", "125000")
            .load()
            for fmt, endpoints in (
                ("raftlog", ",".join(cluster.endpoints)),
                ("raftlog-jvm", ",".join(cluster.endpoints)),
                ("raftlog-jvm", replay.url),
            )
        )
        parquet_path = str(Path(tmp) / "records.parquet")
        source.write.parquet(parquet_path)
        parquet = spark.read.parquet(parquet_path)
        count = parquet.count()
        assert count == records, f"expected {records} records, found {count}"
        spark.dataSource.register(ArrowCeiling)
        ceiling = (
            spark.read.format("arrow-ceiling")
            .option("records", str(records))
            .option("perSplit", "125000")
            .option("page", "20000")
            .load()
        )
        assert ceiling.count() == records
        assert jvm.count() == records
        for df in (source, parquet, ceiling, jvm, jvm_replay):  # warm up: JIT, workers, replay
            timed_noop(df)
        raft_s, parquet_s, ceiling_s, jvm_s, replay_s = [], [], [], [], []
        for _ in range(3):
            raft_s.append(timed_noop(source))
            parquet_s.append(timed_noop(parquet))
            ceiling_s.append(timed_noop(ceiling))
            jvm_s.append(timed_noop(jvm))
            replay_s.append(timed_noop(jvm_replay))
        agg_s: dict[str, list[float]] = {"raftlog": [], "parquet": [], "raftlog-jvm": []}
        for _ in range(3):
            for name, df in (("raftlog", source), ("parquet", parquet), ("raftlog-jvm", jvm)):
                agg_s[name].append(timed_aggregate(df))
        replay.server.shutdown()
        raft_rate, parquet_rate = records / min(raft_s), records / min(parquet_s)
        ceiling_rate, jvm_rate = records / min(ceiling_s), records / min(jvm_s)
        replay_rate = records / min(replay_s)
        args = archive.parse_args(
            ["--endpoints", ",".join(cluster.endpoints), "--output", str(Path(tmp) / "archive"),
             "--checkpoint", str(Path(tmp) / "checkpoint"), "--once", "--timeout-seconds", "900"]
        )  # fmt: skip
        started = time.perf_counter()
        archived = archive.run(spark, args, open(os.devnull, "w"))  # noqa: SIM115
        archive_s = time.perf_counter() - started
        sink_records = min(records, 300_000)
        sink_rows_s, sink_s = sink_rate(spark, sink_records, Path(tmp))
        spark.stop()
    cores = os.cpu_count()
    print(f"python {platform.python_version()}, Spark local[*] on {cores} cores, "
          f"{records:,} records of 100 B in one partition of a 3-node local cluster "
          f"(loaded in {load_s:.0f} s)\n")  # fmt: skip
    print("| measurement | result |")
    print("|---|---|")
    print(f"| `raftlog` source, batch read (noop sink), best of 3 | "
          f"{raft_rate:,.0f} rows/s ({min(raft_s):.2f} s) |")  # fmt: skip
    print(f"| same records from a local Parquet file, same session, best of 3 | "
          f"{parquet_rate:,.0f} rows/s ({min(parquet_s):.2f} s) |")  # fmt: skip
    print(f"| ratio raftlog / Parquet (goal: at least 50 %) | {raft_rate / parquet_rate:.0%} |")
    print(f"| ceiling: a Python data source yielding ready Arrow batches of the same rows, "
          f"best of 3 | {ceiling_rate:,.0f} rows/s ({min(ceiling_s):.2f} s), "
          f"{ceiling_rate / parquet_rate:.0%} of Parquet |")  # fmt: skip
    print(f"| ratio raftlog / ceiling | {raft_rate / ceiling_rate:.0%} |")
    print(f"| `raftlog-jvm` source (WAL pages decoded in the JVM), best of 3 | "
          f"{jvm_rate:,.0f} rows/s ({min(jvm_s):.2f} s) |")  # fmt: skip
    print(f"| ratio raftlog-jvm / Parquet (goal: at least 50 %) | {jvm_rate / parquet_rate:.0%} |")
    print(f"| `raftlog-jvm` from the same pages replayed from memory (no node work), "
          f"best of 3 | {replay_rate:,.0f} rows/s ({min(replay_s):.2f} s), "
          f"{replay_rate / parquet_rate:.0%} of Parquet |")  # fmt: skip
    rounds = zip(raft_s, parquet_s, ceiling_s, jvm_s, replay_s, strict=True)
    every = "; ".join(", ".join(f"{t:.2f}" for t in r) for r in rounds)
    print(f"| every round, s (raftlog, Parquet, ceiling, raftlog-jvm, replayed) | {every} |")
    agg = {name: records / min(t) for name, t in agg_s.items()}
    for name in ("raftlog", "raftlog-jvm"):
        print(f"| full aggregate (count, sum of value lengths, max index per partition), "
              f"`{name}` against Parquet, best of 3 | {agg[name]:,.0f} against "
              f"{agg['parquet']:,.0f} rows/s: {agg[name] / agg['parquet']:.0%} |")  # fmt: skip
    print(f"| sink: `df.write.format(\"raftlog\")`, {sink_records:,} rows by key into 3 "
          f"partitions of a 3-node cluster, fsync on | {sink_rows_s:,.0f} rows/s "
          f"({sink_s:.1f} s) |")  # fmt: skip
    print(f"| archive job (`--once`, into Parquet by partition and date), one run | "
          f"{archived / archive_s:,.0f} records/s ({archived:,} in {archive_s:.1f} s, "
          f"query start included) |")  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=int(os.environ.get("RECORDS", 1_000_000)))
    main(p.parse_args().records)
