"""What a read task does when a replica cannot serve it: a replica behind the planned range
(503 `behind`) is passed over for another; a range compacted in part after planning (410) fails
as data loss or, with failOnDataLoss=false, is read from the floor on; a table read retries its
replicas for up to `timeoutSeconds`. The tasks' code is called directly (no Spark needed)."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator

import pyarrow as pa
import pytest

from raftlog.harness.local import LocalCluster
from raftlog.node.server import columnar
from raftlog.spark.nodes import DataLoss
from raftlog.spark.options import parse
from raftlog.spark.source import LogSplit, TableSplit, read_log, read_table
from tests.spark.helpers import Answer, FakeNode, Row, append, error, records, wait_replicated

pytestmark = [pytest.mark.spark, pytest.mark.slow]


KEPT = 20  # compact_number_entries: a compaction leaves the range's tail readable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One node, small segments, compaction only when asked (keeping the last 20 entries)."""
    with LocalCluster(
        tmp_path_factory.mktemp("fallbacks"), replicas=1, partitions=1, durable=False,
        raft={"compact_every_operations": 10**6, "compact_number_entries": KEPT},
        env={"RAFTLOG_SEGMENT_BYTES": "4096"},
    ) as c:  # fmt: skip
        c.wait_ready()
        yield c


def read_rows(batches: Iterator[pa.RecordBatch]) -> list[tuple[int, bytes | None]]:
    table = pa.Table.from_batches(list(batches))
    return list(zip(table["index"].to_pylist(), table["value"].to_pylist(), strict=True))


def expected(acked: list[Row]) -> list[tuple[int, bytes | None]]:
    return [(r[1], r[4]) for r in acked]


def test_a_replica_behind_the_range_is_passed_over_for_another(cluster):
    acked = append(cluster, 0, records(50, "behind"))
    wait_replicated(cluster, 0, acked[-1][1])
    first, last = acked[0][1], acked[-1][1]
    behind = FakeNode(lambda path, n: error(503, "behind", high_water_mark=first - 1))
    try:
        opts = parse({"endpoints": behind.url, "pageRecords": "20"}, streaming=False)
        split = LogSplit(0, first, last + 1, [behind.url, cluster.nodes["n1"].url])
        got = read_rows(read_log(opts, split))
    finally:
        behind.close()
    assert got == expected(acked)
    pages = [p for p in behind.requests if "/columns?" in p]
    assert len(pages) >= 3, "each page is asked of the first replica first"
    assert all(f"min_index={last}" in p for p in pages), "the planned end is the mark asked for"


def test_a_range_compacted_in_part_after_planning_fails_or_is_read_from_the_floor(cluster, caplog):
    acked = append(cluster, 0, records(60, "compacted", pad=300))
    wait_replicated(cluster, 0, acked[-1][1])
    first, last = acked[0][1], acked[-1][1]
    code, body = cluster.request("n1", "POST", "/v1/admin/partitions/0/compact")
    assert code == 200, body
    floor = body["compaction_floor"]
    assert floor == last - KEPT + 1 and first < floor, (first, floor, last)
    url = cluster.nodes["n1"].url
    split = LogSplit(0, first, last + 1, [url])  # planned before the compaction
    strict = parse({"endpoints": url, "pageRecords": "25"}, streaming=False)
    with pytest.raises(DataLoss, match=f"{first} is below the compaction floor {floor}"):
        read_rows(read_log(strict, split))
    lenient = parse(
        {"endpoints": url, "pageRecords": "25", "failOnDataLoss": "false"}, streaming=False
    )
    with caplog.at_level(logging.WARNING, logger="raftlog.spark"):
        got = read_rows(read_log(lenient, split))
    assert got == [r for r in expected(acked) if r[0] >= floor]
    assert f"skipped records [{first}, {floor})" in caplog.text


def test_a_410_whose_floor_has_not_passed_the_read_is_retried_not_skipped(cluster):
    """During a snapshot install a replica may refuse a read with a floor that is not yet past
    it: that is no data loss (to fail on, or to skip over with failOnDataLoss=false) but a
    reason to retry."""
    acked = append(cluster, 0, records(30, "installing"))
    wait_replicated(cluster, 0, acked[-1][1])
    first, last = acked[0][1], acked[-1][1]
    real = cluster.nodes["n1"].url
    refusals = {"n": 0}

    def refuse_then_forward(path: str, n: int) -> tuple[int, str, bytes]:
        if refusals["n"] < 3:  # the install is under way
            refusals["n"] += 1
            return error(410, "compacted", compaction_floor=first)
        with urllib.request.urlopen(real + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()

    node = FakeNode(refuse_then_forward)
    try:
        opts = parse({"endpoints": node.url, "pageRecords": "50"}, streaming=False)
        got = read_rows(read_log(opts, LogSplit(0, first, last + 1, [node.url])))
    finally:
        node.close()
    assert got == expected(acked), "nothing skipped, nothing read twice"
    assert refusals["n"] == 3


def table_answer(failures: int) -> Answer:
    """503 for the first `failures` requests, then a snapshot of one row at index 5."""
    page = columnar.table_page(0, 5, 1, {b"k": b"v"})

    def answer(path: str, n: int) -> tuple[int, str, bytes]:
        assert "/snapshot/table" in path
        if n < failures:
            return error(503, "no_leader")
        return 200, columnar.CONTENT_TYPE, page

    return answer


def test_a_table_read_retries_for_timeout_seconds_then_says_so():
    # Six refusals in a row: more than a fixed number of attempts, well within the timeout.
    flaky = FakeNode(table_answer(6))
    try:
        opts = parse(
            {"endpoints": flaky.url, "mode": "table", "timeoutSeconds": "60"}, streaming=False
        )
        table = pa.Table.from_batches(list(read_table(opts, TableSplit(0, 6, [flaky.url]))))
    finally:
        flaky.close()
    assert len(flaky.requests) == 7
    assert list(zip(table["key"].to_pylist(), table["value"].to_pylist(), strict=True)) == [
        (b"k", b"v")
    ]
    down = FakeNode(table_answer(10**9))
    try:
        opts = parse(
            {"endpoints": down.url, "mode": "table", "timeoutSeconds": "0.5"}, streaming=False
        )
        with pytest.raises(TimeoutError, match=r"within timeoutSeconds=0\.5: .*no_leader"):
            list(read_table(opts, TableSplit(0, 6, [down.url])))
    finally:
        down.close()
    assert len(down.requests) >= 1
