"""The `raftlog` PySpark data source: committed records of a raftlog cluster as a DataFrame.

    from raftlog.spark import register
    register(spark)
    spark.read.format("raftlog").option("endpoints", "http://node-1:7001").load()

See `raftlog.spark.source` for how reads are planned and `raftlog.spark.options` for options.
"""

from __future__ import annotations

from typing import Any

from raftlog.spark.source import RaftlogDataSource

__all__ = ["RaftlogDataSource", "register"]


def register(spark: Any) -> None:
    """Register the `raftlog` format with a SparkSession (once per session is enough)."""
    spark.dataSource.register(RaftlogDataSource)
