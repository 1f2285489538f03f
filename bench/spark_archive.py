"""Spark benchmark (issue 21): a batch read of archived history straight from the archive
(`archiveUrl`: the executors read the segment objects with pyarrow's S3 filesystem) against the
same read of the same records from the nodes, in one sitting, alternating.

A local 3-node cluster (fsync off: this measures reading) with the continuous archive on, to a
SeaweedFS S3 server on 127.0.0.1 (`raftlog.harness.s3.S3Server`, `make s3server` builds it), is
loaded with RECORDS records of 100 B in one partition; the leader's archive is flushed (the
active segment's committed records included), and nothing is compacted, so both places hold
every record. The `nodes` read is the `raftlog` source over [1, end) (column pages from the
followers' WALs). The `archive` read is the same source's archive path over the same range: a
benchmark-only reader (below) plans it with `archived.plan` as if every replica's floor stood at
`end` (the nodes would then hold nothing of it) and its tasks run `archived.read_split`, the
product's read: get the object, check its size and sha256, every record's CRC32C, decode, the
same `arrow.page_to_batch`. Each read is `write.format("noop")` (every column of every row);
the two alternate, 4 rounds after a warm-up, best and median reported.

    .venv/bin/python -m bench.spark_archive [--records N] [--segment-bytes B] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster
from raftlog.harness.s3 import S3Server
from raftlog.spark import archived
from raftlog.spark.nodes import client, survey
from raftlog.spark.options import parse
from raftlog.spark.session import local_session
from raftlog.spark.source import RaftlogBatchReader, RaftlogDataSource

VALUE = "x" * 100
BATCH = 2_000
BUCKET = "bench"


class _ArchiveOnlyReader(RaftlogBatchReader):
    """The source's archive path over [1, endingOffsets): planned as if every replica's
    compaction floor stood at the end, read by the product's `archived.read_split`."""

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        nodes = client(opts)
        try:
            view = survey(nodes, opts)
        finally:
            nodes.close()
        assert isinstance(opts.ending, dict)
        out: list[InputPartition] = []
        for p, pv in sorted(view.partitions.items()):
            end = opts.ending[p]
            pv.replicas = [dataclasses.replace(r, floor=end) for r in pv.replicas]
            splits, _ = archived.plan(opts, pv, 1, end, "the benchmark's start")
            out.extend(splits)
        return out


class ArchiveOnly(RaftlogDataSource):
    @classmethod
    def name(cls) -> str:
        return "raftlog-archive-only"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _ArchiveOnlyReader(parse(self.options, streaming=False))


async def load(endpoints: list[str], total: int, clients: int = 4) -> None:
    async with AsyncClient(endpoints, timeout_s=60) as c:
        queue = list(range(0, total, BATCH))

        async def worker() -> None:
            while queue:
                start = queue.pop()
                n = min(BATCH, total - start)
                await c.append(0, [{"value": VALUE} for _ in range(n)])

        await asyncio.gather(*(worker() for _ in range(clients)))


def timed_noop(df: DataFrame) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def wait(what: str, check: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--records", type=int, default=int(os.environ.get("RECORDS", 500_000)))
    ap.add_argument("--segment-bytes", type=int, default=8 << 20)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    with tempfile.TemporaryDirectory() as tmp, S3Server(
        Path(tmp) / "s3", buckets=(BUCKET,)
    ) as s3:  # fmt: skip
        creds = Path(tmp) / "creds"
        creds.write_text(f"{s3.access_key}\n{s3.secret_key}\n")
        env = {
            "RAFTLOG_SEGMENT_BYTES": str(args.segment_bytes),
            "RAFTLOG_ARCHIVE_URL": f"s3://{BUCKET}/c",
            "RAFTLOG_ARCHIVE_ENDPOINT": s3.endpoint,
            "RAFTLOG_ARCHIVE_REGION": s3.region,
            "RAFTLOG_ARCHIVE_CREDENTIALS_FILE": str(creds),
            "RAFTLOG_ARCHIVE_INTERVAL_S": "1",
        }
        with LocalCluster(
            Path(tmp) / "cluster", replicas=3, partitions=1, durable=False, env=env,
            raft={"compact_every_operations": 10**9, "compact_every_bytes": 0},
        ) as cluster:  # fmt: skip
            cluster.wait_ready()
            started = time.perf_counter()
            asyncio.run(load(cluster.endpoints, args.records))
            load_s = time.perf_counter() - started
            leader = cluster.leader(0)
            assert leader is not None
            hwm = int(cluster.status(leader)["partitions"][0]["high_water_mark"])
            wait("followers catching up", lambda: all(
                cluster.status(n)["partitions"][0]["high_water_mark"] >= hwm
                for n in cluster.nodes))  # fmt: skip
            code, body = cluster.request(leader, "POST", "/v1/admin/partitions/0/archive")
            assert code == 200, body
            end = int(body.get("archived_index", 0)) + 1
            assert end > args.records, body
            floors = {n: cluster.status(n)["partitions"][0]["compaction_floor"]
                      for n in cluster.nodes}  # fmt: skip
            assert all(f == 1 for f in floors.values()), floors  # both places hold it all
            spark = local_session(
                "raftlog-bench-archive", master="local[*]", conf={"spark.driver.memory": "3g"}
            )
            spark.dataSource.register(ArchiveOnly)
            common = {
                "endpoints": ",".join(cluster.endpoints),
                "startingOffsets": json.dumps({"0": 1}),
                "endingOffsets": json.dumps({"0": end}),
            }
            archive_opts = {
                "archiveUrl": f"s3://{BUCKET}/c",
                "archiveEndpoint": s3.endpoint,
                "archiveRegion": s3.region,
                "archiveCredentialsFile": str(creds),
            }
            nodes_df = spark.read.format("raftlog").options(**common).load()
            archive_df = (
                spark.read.format("raftlog-archive-only").options(**common, **archive_opts).load()
            )
            tasks = len(_ArchiveOnlyReader(parse({**common, **archive_opts},
                                                 streaming=False)).partitions())  # fmt: skip
            n_nodes, n_archive = nodes_df.count(), archive_df.count()
            assert n_nodes == n_archive >= args.records, (n_nodes, n_archive)
            timed_noop(nodes_df)
            timed_noop(archive_df)  # warm up: workers, JIT
            times: dict[str, list[float]] = {"nodes": [], "archive": []}
            for _ in range(args.rounds):
                times["nodes"].append(timed_noop(nodes_df))
                times["archive"].append(timed_noop(archive_df))
            spark.stop()
    rows = n_nodes
    print(
        f"# Spark read of archived history vs the nodes ({platform.node()}, {os.cpu_count()} "
        f"cores, {rows:,} rows of 100 B, 3 nodes, 1 partition, segments of "
        f"{args.segment_bytes:,} B: {tasks} archive tasks; load {load_s:.1f} s)"
    )
    print("| read | best rows/s | median rows/s | seconds (each round) |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {rows / min(ts):,.0f} | {rows / statistics.median(ts):,.0f} | "
              f"{', '.join(f'{t:.2f}' for t in ts)} |")  # fmt: skip


if __name__ == "__main__":
    main()
