from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.spark.helpers import start_spark


@pytest.fixture(scope="session")
def spark_stderr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the local Spark (and its Python workers) write their standard error."""
    return tmp_path_factory.mktemp("spark") / "stderr.log"


@pytest.fixture(scope="session")
def spark(spark_stderr: Path) -> Iterator[SparkSession]:
    """One local Spark per test process (each xdist worker starts its own)."""
    session = start_spark(spark_stderr)
    yield session
    session.stop()
