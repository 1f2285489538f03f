"""The last chapter of `make demo`: Spark reads the demo cluster's committed log and its table."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from pyspark.sql import functions as F

from raftlog.spark.session import local_session


def spark_reads(endpoints: Sequence[str], latest: Mapping[str, str]) -> None:
    """Read every partition (mode=log, by `raftlog` and by the JVM reader `raftlog-jvm`, which
    must agree) and partition 0's table (mode=table) with a local Spark; the table must hold
    `latest` (each key's last acknowledged value), or AssertionError."""
    # A local demo: bind Spark to loopback (no warning about the hostname's address).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = local_session("raftlog-demo")
    try:
        log = spark.read.format("raftlog").option("endpoints", ",".join(endpoints)).load()
        print('    spark.read.format("raftlog"): the committed records, by partition')
        per_partition = (
            log.groupBy("partition")
            .agg(F.count("*").alias("records"), F.min("index"), F.max("index"))
            .orderBy("partition")
            .collect()
        )
        for r in per_partition:
            print(f"      partition {r['partition']}: {r['records']} records, indexes "
                  f"{r['min(index)']}..{r['max(index)']} (older: in the snapshot)")  # fmt: skip
        jvm = spark.read.format("raftlog-jvm").option("endpoints", ",".join(endpoints)).load()
        # Set operations take no map column: the headers are compared as JSON.
        a, b = (df.withColumn("headers", F.to_json("headers")) for df in (log, jvm))
        differ = a.exceptAll(b).count() + b.exceptAll(a).count()
        print(f'    spark.read.format("raftlog-jvm") (the same read in the JVM): '
              f"{jvm.count()} records, {differ} differing from raftlog's")  # fmt: skip
        if differ:
            raise AssertionError("raftlog-jvm read other records than raftlog")
        table = (
            spark.read.format("raftlog")
            .option("endpoints", ",".join(endpoints))
            .option("mode", "table")
            .option("partitions", "0")
            .load()
            .select(F.col("key").cast("string"), F.col("value").cast("string"))
        )
        rows = {r["key"]: r["value"] for r in table.collect()}
        right = sum(rows.get(k) == v for k, v in latest.items())
        print(f"    mode=table (snapshot plus tail) of partition 0: {len(rows)} keys; "
              f"{right} of {len(latest)} hold the latest value written")  # fmt: skip
        for k in sorted(rows)[:3]:
            print(f"      {k} = {rows[k]}")
        if right != len(latest) or len(rows) != len(latest):
            raise AssertionError("the table read by Spark differs from what was acknowledged")
    finally:
        spark.stop()
