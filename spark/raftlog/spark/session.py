"""A local SparkSession with the `raftlog` format registered and the `raftlog-jvm` jar on
`spark.jars`: for the demo, the benchmark and the tests (a job on a cluster builds its own
session from spark-submit's settings)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from raftlog.spark import jvm_jar, register


def local_session(
    app: str, master: str = "local[2]", conf: dict[str, str] | None = None
) -> SparkSession:
    # Python workers run this interpreter (the venv's), unless the caller chose another.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    conf = dict(conf or {})
    conf["spark.jars"] = ",".join(filter(None, [conf.get("spark.jars"), jvm_jar()]))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
