"""The `raftlog` PySpark data source: committed records of a raftlog cluster as a DataFrame.

    from raftlog.spark import register
    register(spark)
    spark.read.format("raftlog").option("endpoints", "http://node-1:7001").load()

See `raftlog.spark.source` for how reads are planned and `raftlog.spark.options` for options.
`raftlog-jvm` is the same batch read of the log in the JVM (`jvm_jar()`, built by `make jvm`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from raftlog.spark.source import RaftlogDataSource

__all__ = ["RaftlogDataSource", "jvm_jar", "register"]


def register(spark: Any) -> None:
    """Register the `raftlog` format with a SparkSession (once per session is enough).

    On a local master, Spark's Python workers must import raftlog too: they run
    `PYSPARK_PYTHON` (else `python3` from PATH), fixed when the session started. One that
    cannot import it is refused here, naming the fix, rather than failing in every task."""
    sc = spark.sparkContext
    worker = getattr(sc, "pythonExec", None)
    if worker and str(sc.master).startswith("local") and worker != sys.executable:
        probe = subprocess.run(
            [worker, "-c", "import raftlog.spark"], capture_output=True, timeout=60
        )
        if probe.returncode != 0:
            raise RuntimeError(
                f"Spark's Python workers run {worker!r}, which cannot import raftlog: set "
                f"PYSPARK_PYTHON={sys.executable} before the SparkSession is created "
                "(or use raftlog.spark.session.local_session)"
            )
    spark.dataSource.register(RaftlogDataSource)


def jvm_jar() -> str:
    """The path of the jar of the `raftlog-jvm` format (for `spark.jars` or `--jars`)."""
    jar = Path(__file__).parent / "jars" / "raftlog-spark.jar"
    if not jar.is_file():
        raise FileNotFoundError(f"{jar} is missing: build it with `make jvm` (needs a JDK 17)")
    return str(jar)
