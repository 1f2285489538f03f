"""mode=table: the keyed table (latest value per key, tombstones removed), read as a snapshot
plus the log after it, equals what the acknowledged records make of it."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from raftlog.harness.local import LocalCluster
from tests.spark.helpers import Row, append, raftlog_df, records, rows_of, wait_replicated

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def expected_table(acked: list[Row]) -> list[Row]:
    """Latest value per (partition, key) in index order; a tombstone deletes the key."""
    latest: dict[tuple[int, bytes], Row] = {}
    for r in sorted(acked, key=lambda r: (r[0], r[1])):
        if r[3] is None:
            continue
        if r[4] is None:
            latest.pop((r[0], r[3]), None)
        else:
            latest[(r[0], r[3])] = r
    return sorted(latest.values(), key=lambda r: (r[0], r[3] or b""))


def table_rows(
    spark: SparkSession, cluster: LocalCluster
) -> list[tuple[int, bytes | None, bytes | None]]:
    df = raftlog_df(spark, cluster, {"mode": "table"})
    return sorted((r[0], r[3], r[4]) for r in rows_of(df))


def test_table_mode_is_the_latest_value_per_key_across_a_snapshot(spark, tmp_path):
    with LocalCluster(
        tmp_path, replicas=3, partitions=2, durable=False,
        raft={"compact_every_operations": 10**6, "compact_number_entries": 0},
        env={"RAFTLOG_SEGMENT_BYTES": "4096"},
    ) as cluster:  # fmt: skip
        cluster.wait_ready()
        acked: list[Row] = []
        for p in (0, 1):
            acked += append(cluster, p, records(60, f"old{p}", keys=12, pad=300))
            acked += append(
                cluster, p, [{"key": "k1", "value": None}, {"key": "k2", "value": None}]
            )
            acked += append(cluster, p, [{"value": "no key, not in the table"}])
        for p in (0, 1):
            wait_replicated(cluster, p, max(r[1] for r in acked if r[0] == p))
        # Before any snapshot: the table is the log alone.
        want = [(r[0], r[3], r[4]) for r in expected_table(acked)]
        assert table_rows(spark, cluster) == want
        # Snapshot and compact every replica, then write more: the table is snapshot plus tail.
        for name in cluster.nodes:
            for p in (0, 1):
                code, body = cluster.request(name, "POST", f"/v1/admin/partitions/{p}/compact")
                assert code == 200 and body["compaction_floor"] > 1, body
        for p in (0, 1):
            acked += append(cluster, p, records(20, f"new{p}", keys=5))  # overwrites k0..k4
            acked += append(cluster, p, [{"key": "k7", "value": None}])  # deletes a snapshot key
            acked += append(cluster, p, [{"key": "k1", "value": "back"}])  # a deleted key returns
        for p in (0, 1):
            wait_replicated(cluster, p, max(r[1] for r in acked if r[0] == p))
        want = [(r[0], r[3], r[4]) for r in expected_table(acked)]
        assert table_rows(spark, cluster) == want
        assert (0, b"k7", None) not in want and any(w[1] == b"k1" for w in want)
