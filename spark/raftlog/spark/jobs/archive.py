"""The archive job: a cluster's committed records, streamed into Parquet, exactly once.

    python -m raftlog.spark.jobs.archive --endpoints http://n1:7001,http://n2:7001 \
        --output /data/orders --checkpoint /data/orders-checkpoint [--once]

Files land under `<output>/partition=<p>/date=<yyyy-mm-dd>/` (the record's timestamp, or the
day it was archived when the producer gave none). Spark's file sink and the checkpoint make it
exactly once across restarts: a restarted job resumes after the last committed micro-batch, and
readers of `<output>` (through its `_spark_metadata`) never see a batch twice or half. A progress
line is printed per micro-batch. It runs on `local[*]` unless `--master` (or spark-submit) says
otherwise; `--retention-hold NAME` keeps the cluster from compacting what it has not archived.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from pyspark.sql.streaming.query import StreamingQuery

from raftlog.spark import register


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m raftlog.spark.jobs.archive",
        description="Stream a raftlog cluster's committed records into Parquet, exactly once.",
    )
    # The same environment as raftctl's (`raftctl local up` prints these exports).
    endpoints = os.environ.get("RAFTLOG_ENDPOINTS")
    p.add_argument("--endpoints", default=endpoints, required=endpoints is None,
                   help="comma-separated node URLs (default: $RAFTLOG_ENDPOINTS)")  # fmt: skip
    p.add_argument("--output", required=True, help="the Parquet directory (any Hadoop path)")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument("--master", default=None, help="Spark master (default local[*], unless "
                   "spark-submit gives one)")  # fmt: skip
    p.add_argument("--partitions", default=None, help="raftlog partitions to archive (all)")
    p.add_argument("--starting-offsets", default="earliest",
                   help="where a new archive starts: earliest, latest or JSON")  # fmt: skip
    p.add_argument("--trigger-seconds", type=float, default=10.0,
                   help="seconds between micro-batches (default 10)")  # fmt: skip
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--once", action="store_true",
                   help="archive what is committed now, then stop (AvailableNow)")  # fmt: skip
    p.add_argument("--retention-hold", default=None, metavar="NAME",
                   help="hold compaction at what is not archived yet (holder name)")  # fmt: skip
    p.add_argument("--token-file", default=os.environ.get("RAFTLOG_TOKEN_FILE"),
                   help="file holding the admin token, which holds need on a cluster that has "
                   "one (default: $RAFTLOG_TOKEN_FILE)")  # fmt: skip
    p.add_argument("--ca-file", default=os.environ.get("RAFTLOG_CA_FILE"),
                   help="CA bundle for https endpoints (default: $RAFTLOG_CA_FILE)")  # fmt: skip
    p.add_argument("--timeout-seconds", type=float, default=None,
                   help="stop after this long (default: run until stopped)")  # fmt: skip
    args = p.parse_args(argv)
    if args.trigger_seconds <= 0:
        p.error("--trigger-seconds: must be positive")
    if args.max_offsets_per_trigger is not None and args.max_offsets_per_trigger < 1:
        p.error("--max-offsets-per-trigger: must be at least 1")
    return args


def source_options(args: argparse.Namespace) -> dict[str, str]:
    opts = {"endpoints": args.endpoints, "startingOffsets": args.starting_offsets}
    optional = {
        "partitions": args.partitions,
        "maxOffsetsPerTrigger": args.max_offsets_per_trigger,
        "retentionHold": args.retention_hold,
        "tokenFile": args.token_file,
        "caFile": args.ca_file,
    }
    opts.update({k: str(v) for k, v in optional.items() if v is not None})
    return opts


def archived(df: DataFrame) -> DataFrame:
    """The records as archived: the source's columns and `date`, the partition column."""
    when = F.coalesce(F.col("timestamp"), F.current_timestamp())
    return df.withColumn("date", F.to_date(when))


class ProgressPrinter(StreamingQueryListener):
    """One line per micro-batch: records, rate, and where each partition stands."""

    def __init__(self, query_name: str, out: TextIO = sys.stdout) -> None:
        self.query_name = query_name
        self.out = out
        self.records = 0  # every micro-batch's, as the events come (recentProgress keeps 100)
        # (batch id, timestamp) of the latest progress event: one listener gets them in order.
        self.latest: tuple[int, str] | None = None

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        p = event.progress
        if p.name != self.query_name:
            return
        self.records += p.numInputRows
        self.latest = (p.batchId, p.timestamp)
        ends = [s.endOffset for s in p.sources]
        secs = p.batchDuration / 1000
        rate = p.numInputRows / secs if secs > 0 else 0.0
        print(
            f"archive batch {p.batchId}: {p.numInputRows} records in {secs:.1f} s "
            f"({rate:,.0f} records/s), {self.records} this run; next offsets {', '.join(ends)}",
            file=self.out,
            flush=True,
        )

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass


def start(spark: SparkSession, args: argparse.Namespace, name: str) -> StreamingQuery:
    register(spark)
    reader = spark.readStream.format("raftlog")
    for k, v in source_options(args).items():
        reader = reader.option(k, v)
    writer = (
        archived(reader.load())
        .writeStream.queryName(name)
        .format("parquet")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
        .partitionBy("partition", "date")
    )
    if args.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(args.trigger_seconds * 1000)} milliseconds")
    return writer.start()


def run(spark: SparkSession, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run the archive until it is done (--once), stopped (SIGTERM, SIGINT) or timed out.
    Returns the number of records archived by this run."""
    name = f"raftlog-archive-{int(time.time() * 1000)}"
    printer = ProgressPrinter(name, out)
    spark.streams.addListener(printer)
    try:
        query = start(spark, args, name)
        deadline = time.monotonic() + args.timeout_seconds if args.timeout_seconds else None
        try:
            while query.isActive:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                query.awaitTermination(1)
            query.stop()
            error = query.exception()
            if error is not None:
                raise RuntimeError(f"the archive query failed: {error}")
        finally:
            if query.isActive:
                query.stop()
        # The listener counts every micro-batch (`recentProgress` keeps only the last
        # spark.sql.streaming.numRecentProgressUpdates, 100 by default). Its events come
        # asynchronously: wait (bounded) until it has seen the query's last progress.
        last = query.lastProgress
        lag_deadline = time.monotonic() + 10
        while (
            last is not None
            and (int(last["batchId"]), str(last["timestamp"])) != printer.latest
            and time.monotonic() < lag_deadline
        ):
            time.sleep(0.1)
        return printer.records
    finally:
        spark.streams.removeListener(printer)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    builder = SparkSession.builder.appName("raftlog-archive")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit, which sets it
        # Spark's Python workers run `python3` from PATH unless told: not the interpreter that
        # has raftlog (a venv not activated), and they fail to import the source.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if args.master:
        builder = builder.master(args.master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[*]")
    # Dates of the `date=` folders in UTC, whatever the machine's zone: the same record
    # always lands in the same folder.
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    stopping: dict[str, Any] = {}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["signal"] = signum
        for q in spark.streams.active:
            q.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        n = run(spark, args)
    finally:
        spark.stop()
    print(f"archive: {n} records written to {args.output} by this run", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
