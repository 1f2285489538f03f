from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.spark.helpers import start_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark per test process (each xdist worker starts its own)."""
    session = start_spark()
    yield session
    session.stop()
