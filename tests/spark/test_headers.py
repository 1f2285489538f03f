"""Kafka's headers (`includeHeaders=true`): `array<struct<key string, value binary>>` with every
pair in the record's order, repeated keys and binary values kept, read alike by both formats; the
default `map<string,string>` column the same in both; and a write of Kafka-typed headers read
back as written."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster
from raftlog.spark import arrow
from tests.spark.helpers import raftlog_df

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FORMATS = pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])
RECORDS: list[dict[str, Any]] = [
    {"value": "map", "headers": {"a": "1", "b": "2"}},
    {"value": "pairs", "headers": [
        {"key": "trace", "value": "a"},
        {"key": "bin", "value_b64": "AP/+"},
        {"key": "trace", "value": "b"},
        {"key": "empty", "value": ""},
    ]},
    {"value": "none"},
    {"value": "no-pairs", "headers": []},
]  # fmt: skip
# The headers each record reads with includeHeaders=true.
KAFKA = {
    "map": [("a", b"1"), ("b", b"2")],
    "pairs": [("trace", b"a"), ("bin", b"\x00\xff\xfe"), ("trace", b"b"), ("empty", b"")],
    "none": [],
    "no-pairs": [],
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("headers"), replicas=1, partitions=2) as c:
        c.wait_ready()

        async def go() -> None:
            async with AsyncClient(c.endpoints) as client:
                await client.append(0, RECORDS)

        asyncio.run(go())
        yield c


def pairs_of(headers: list[Row]) -> list[tuple[str, bytes]]:
    return [(h["key"], bytes(h["value"])) for h in headers]


@FORMATS
def test_include_headers_reads_kafkas_type_with_every_pair(spark, cluster, fmt):
    df = raftlog_df(spark, cluster, {"includeHeaders": "true", "partitions": "0"}, fmt=fmt)
    assert df.schema == arrow.KAFKA_SCHEMA
    assert df.schema["headers"].dataType.simpleString() == "array<struct<key:string,value:binary>>"
    got = {bytes(r["value"]).decode(): pairs_of(r["headers"]) for r in df.collect()}
    assert got == KAFKA


def test_the_map_column_is_the_same_in_both_formats(spark, cluster):
    def rows(fmt: str) -> dict[str, Any]:
        df = raftlog_df(spark, cluster, {"partitions": "0"}, fmt=fmt)
        return {bytes(r["value"]).decode(): r["headers"] for r in df.collect()}

    python, jvm = rows("raftlog"), rows("raftlog-jvm")
    assert python == jvm
    assert python["map"] == {"a": "1", "b": "2"} and python["none"] == {}
    # The JSON read API gives each record's headers as they were appended.
    code, page = cluster.get("n1", "/v1/partitions/0/records?from=1")
    assert code == 200
    by_value = {r["value"]: r["headers"] for r in page["records"]}
    assert by_value["map"] == {"a": "1", "b": "2"}
    assert by_value["pairs"] == RECORDS[1]["headers"]
    assert by_value["none"] == {} and by_value["no-pairs"] == []


def test_a_write_of_kafka_headers_reads_back_as_written(spark, cluster):
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [StructField("value", StringType()), StructField("headers", arrow.KAFKA_HEADERS)]
    )
    rows = [
        ("w1", [("k", b"\x01\x02"), ("k", b"\x03")]),
        ("w2", []),
        ("w3", [("text", b"plain")]),
    ]
    df = spark.createDataFrame(rows, schema)
    assert df.schema["headers"].dataType.elementType == header
    endpoints = ",".join(cluster.endpoints)
    df.coalesce(1).write.format("raftlog").option("endpoints", endpoints).option(
        "writeId", "kafka-headers"
    ).mode("append").save()
    back = raftlog_df(spark, cluster, {"includeHeaders": "true"}, fmt="raftlog-jvm")
    got = {bytes(r["value"]).decode(): pairs_of(r["headers"]) for r in back.collect()}
    assert {k: got[k] for k in ("w1", "w2", "w3")} == dict(rows)
