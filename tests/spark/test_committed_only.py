"""Uncommitted records are never read: entries appended on an isolated leader, which cannot
commit them, are in its log but not in a batch read of it (by either source: `raftlog` and the
JVM reader `raftlog-jvm`)."""

from __future__ import annotations

import json
import time

import pytest

from raftlog.harness.local import LocalCluster
from tests.spark.helpers import append, records, rows_of, wait_replicated

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.parametrize("fmt", ["raftlog", "raftlog-jvm"])
def test_a_batch_read_of_an_isolated_leader_excludes_its_uncommitted_entries(spark, tmp_path, fmt):
    with LocalCluster(tmp_path, replicas=3, partitions=1, durable=False) as cluster:
        cluster.wait_ready()
        acked = append(cluster, 0, records(30, "acked", keys=4))
        wait_replicated(cluster, 0, acked[-1][1])
        leader = cluster.leader(0)
        assert leader is not None
        for n in cluster.nodes:
            if n != leader:
                cluster.pause(n)  # the leader is alone: nothing it appends now can commit
        try:
            for i in range(5):
                body = json.dumps({"key": "orphan", "value": f"orphan-{i}"}).encode()
                try:
                    code, _ = cluster.request(
                        leader, "POST", "/v1/partitions/0/records", body,
                        {"Content-Type": "application/json"}, timeout=0.3,
                    )  # fmt: skip
                except OSError:  # no answer: it waits for a quorum that is not there
                    code = None
                assert code != 200, "an append was acknowledged without a quorum"
            deadline = time.monotonic() + 10
            while True:
                st = cluster.status(leader)["partitions"][0]
                if st["last_index"] > st["high_water_mark"]:
                    break
                assert time.monotonic() < deadline, f"no uncommitted entry in the log: {st}"
                time.sleep(0.05)
            df = (
                spark.read.format(fmt)
                .option("endpoints", cluster.nodes[leader].url)
                .option("maxRecordsPerSplit", "7")
                .load()
            )
            got = rows_of(df)
            st = cluster.status(leader)["partitions"][0]
            assert st["last_index"] > st["high_water_mark"], "the orphans must still be there"
            assert got == acked
            assert all(r[3] != b"orphan" for r in got)
        finally:
            for n in cluster.nodes:
                cluster.resume(n)
