"""The archive job: committed records into Parquet partitioned by raftlog partition and date,
exactly once across a restart, with a progress line per micro-batch."""

from __future__ import annotations

import datetime as dt
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftlog.harness.local import LocalCluster
from raftlog.spark.jobs import archive
from tests.spark.helpers import Row, append, records, rows_of, wait_replicated

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_archive_is_exactly_once_across_a_restart_and_partitioned(spark, tmp_path):
    out, checkpoint = tmp_path / "archive", tmp_path / "checkpoint"
    with LocalCluster(tmp_path / "cluster", replicas=3, partitions=2, durable=False) as cluster:
        cluster.wait_ready()
        acked: list[Row] = []
        for p in (0, 1):
            acked += append(cluster, p, records(30, f"first{p}", keys=4))
            wait_replicated(cluster, p, acked[-1][1])
        argv = ["--endpoints", ",".join(cluster.endpoints), "--output", str(out),
                "--checkpoint", str(checkpoint), "--once", "--max-offsets-per-trigger", "25",
                "--timeout-seconds", "120"]  # fmt: skip
        lines = io.StringIO()
        assert archive.run(spark, archive.parse_args(argv), lines) == 60
        progress = [line for line in lines.getvalue().splitlines() if "archive batch" in line]
        assert len(progress) >= 3, lines.getvalue()  # 60 records, at most 25 per micro-batch
        assert all("records/s" in line for line in progress)
        for p in (0, 1):
            acked += append(cluster, p, records(20, f"second{p}", keys=4))
            wait_replicated(cluster, p, acked[-1][1])
        # The restart is the command itself, as the README gives it (its own Spark, local[*],
        # the venv not activated: Spark's workers must still find raftlog): it resumes from the
        # checkpoint and writes only what came after.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "VIRTUAL_ENV"))}
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = ":".join(d for d in env["PATH"].split(":") if d != venv_bin)
        done = subprocess.run(
            [sys.executable, "-m", "raftlog.spark.jobs.archive", *argv],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "archive batch" in done.stdout
        assert "archive: 40 records written" in done.stdout, done.stdout
    df = spark.read.parquet(str(out))
    got = rows_of(df)
    assert got == sorted(acked, key=lambda r: (r[0], r[1]))
    today = dt.datetime.now(dt.UTC).date()
    dates = {r["date"] for r in df.select("date").distinct().collect()}
    assert dates <= {dt.date(2023, 11, 14), today, today - dt.timedelta(days=1)}, dates
    assert dt.date(2023, 11, 14) in dates
    assert sorted(d.name for d in out.iterdir() if d.name.startswith("partition=")) == [
        "partition=0",
        "partition=1",
    ]
    assert any(d.name == "date=2023-11-14" for d in (out / "partition=0").iterdir())


def test_the_archive_counts_every_micro_batch_not_only_the_recent_ones(spark, tmp_path):
    # Spark keeps the progress of the last `numRecentProgressUpdates` micro-batches only (100 by
    # default); with 2 kept, the 8 micro-batches of this run are counted all the same.
    with LocalCluster(tmp_path / "cluster", replicas=1, partitions=1, durable=False) as cluster:
        cluster.wait_ready()
        acked = append(cluster, 0, records(40, "counted"))
        wait_replicated(cluster, 0, acked[-1][1])
        argv = ["--endpoints", ",".join(cluster.endpoints), "--output", str(tmp_path / "out"),
                "--checkpoint", str(tmp_path / "checkpoint"), "--once",
                "--max-offsets-per-trigger", "5", "--timeout-seconds", "120"]  # fmt: skip
        lines = io.StringIO()
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2")
        try:
            assert archive.run(spark, archive.parse_args(argv), lines) == 40
        finally:
            spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
    batches = [line for line in lines.getvalue().splitlines() if "archive batch" in line]
    assert len(batches) >= 8, lines.getvalue()
    assert spark.read.parquet(str(tmp_path / "out")).count() == 40
