"""What a read task does when a replica cannot serve it: a replica behind the planned range
(503 `behind`) is passed over for another; a range compacted in part after planning (410) fails
as data loss or, with failOnDataLoss=false, is read from the floor on; a table read retries its
replicas for up to `timeoutSeconds`. The tasks' code is called directly (no Spark needed)."""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Iterator

import msgspec
import pyarrow as pa
import pytest

from raftlog.harness.local import LocalCluster
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import Record, encode_record
from raftlog.node.server import columnar
from raftlog.node.storage.archive_manifest import Manifest
from raftlog.spark import archived, arrow
from raftlog.spark.nodes import DataLoss
from raftlog.spark.options import Options, parse
from raftlog.spark.source import LogSplit, TableSplit, read_log, read_table
from tests.spark.helpers import (
    Answer,
    FakeNode,
    Row,
    append,
    column_page,
    error,
    records,
    serving,
    wait_replicated,
)

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


@pytest.mark.parametrize("refusal", ["behind", "unknown_partition"])
def test_a_replica_behind_the_range_is_passed_over_for_another(cluster, refusal):
    """503 `behind`, or 404 `unknown_partition` from a replica that held the partition when
    surveyed (a member recreated with an empty disk, not yet given its partitions): both are
    one replica's state, and failed the task when the other replica could serve it."""
    acked = append(cluster, 0, records(50, "behind"))
    wait_replicated(cluster, 0, acked[-1][1])
    first, last = acked[0][1], acked[-1][1]
    refused = (
        error(503, "behind", high_water_mark=first - 1)
        if refusal == "behind"
        else error(404, "unknown_partition")
    )
    behind = FakeNode(lambda path, n: refused)
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


def numbered(n: int, noops: tuple[int, ...] = ()) -> list[Entry]:
    """Entries 1..n of partition 0, each the record `v<i>` keyed `k<i % 3>`, but `noops`."""
    return [
        Entry(i, 1, EntryKind.NOOP, b"") if i in noops
        else Entry(i, 1, EntryKind.NORMAL, encode_record(Record(b"k%d" % (i % 3), b"v%d" % i)))
        for i in range(1, n + 1)
    ]  # fmt: skip


def values(indexes: range | list[int]) -> list[tuple[int, bytes | None]]:
    return [(i, b"v%d" % i) for i in indexes]


def read_from(answers: list[Answer], start: int, stop: int, **options: str) -> tuple[
    list[tuple[int, bytes | None]], list[FakeNode]
]:  # fmt: skip
    """The rows a task reads of [start, stop) of partition 0 from fake replicas (in order)."""
    nodes = [FakeNode(a) for a in answers]
    try:
        opts = parse({"endpoints": nodes[0].url, **options}, streaming=False)
        split = LogSplit(0, start, stop, [n.url for n in nodes])
        return read_rows(read_log(opts, split)), nodes
    finally:
        for n in nodes:
            n.close()


def test_pages_of_one_record_and_entries_that_are_not_records_read_each_record_once():
    """Pages of two indexes over a log with no-op entries: some pages hold one record, and a
    page's next index is past what it holds (not its first index plus its record count)."""
    log = numbered(9, noops=(3, 6))
    got, _ = read_from([serving(log)], 1, 10, pageRecords="2")
    assert got == values([1, 2, 4, 5, 7, 8, 9])


def replica_503_first(entries: list[Entry]) -> Answer:
    """A replica that cannot serve its first request (503), then serves `entries`."""
    serve = serving(entries)

    def answer(path: str, n: int) -> tuple[int, str, bytes]:
        return error(503, "no_leader") if n == 0 else serve(path, n)

    return answer


def test_a_range_compacted_on_one_replica_is_read_from_another_that_answers_late():
    """Data loss only when every replica compacted the range: one that has not, but could not
    answer the first round, is asked again."""
    log = numbered(9)
    got, (_, late) = read_from([serving(log, floor=6), replica_503_first(log)], 1, 10)
    assert got == values(range(1, 10))
    assert len(late.requests) >= 2


def test_without_failing_on_data_loss_a_read_skips_only_to_the_lowest_floor(caplog):
    """Every replica compacted the start, to different floors: with failOnDataLoss=false the
    read skips what none has, and reads the rest from the replica that still has it."""
    log = numbered(9)
    with caplog.at_level(logging.WARNING, logger="raftlog.spark"):
        got, _ = read_from(
            [serving(log, floor=7), serving(log, floor=4)], 1, 10, failOnDataLoss="false"
        )
    assert got == values(range(4, 10))
    assert "skipped records [1, 4)" in caplog.text


def test_a_replica_that_makes_no_progress_is_passed_over():
    """A page that ends where it starts is no page: the read goes on from another replica
    (and never loops on the first)."""
    log = numbered(9)

    def stuck(path: str, n: int) -> tuple[int, str, bytes]:
        start = int(path.split("from=")[1].split("&")[0])
        return 200, columnar.CONTENT_TYPE, column_page(0, [], start, start)

    got: list[list[tuple[int, bytes | None]]] = []
    nodes = [FakeNode(stuck), FakeNode(serving(log))]
    opts = parse({"endpoints": nodes[0].url, "timeoutSeconds": "3"}, streaming=False)
    split = LogSplit(0, 1, 10, [n.url for n in nodes])
    reader = threading.Thread(target=lambda: got.append(read_rows(read_log(opts, split))))
    reader.daemon = True
    reader.start()
    reader.join(timeout=30)
    for n in nodes:
        n.close()  # a read still going fails within timeoutSeconds
    assert got == [values(range(1, 10))], "the read did not finish"


@pytest.mark.parametrize("damage", ["not msgpack", "not a page", "a column cut short"])
def test_a_replica_serving_a_damaged_page_is_passed_over(damage):
    """Found by a review: a page that did not decode failed the task at once, where the JVM
    reader (as the README says of both) asks the next replica."""
    log = numbered(9)
    good = serving(log)

    def damaged(path: str, n: int) -> tuple[int, str, bytes] | None:
        answer = good(path, n)
        assert answer is not None
        status, ctype, raw = answer
        if damage == "not msgpack":
            return status, ctype, b"\xc1 not msgpack"
        page = msgspec.msgpack.decode(raw)
        if damage == "not a page":
            del page["next"]
        else:
            page["index"] = page["index"][:8]  # one index for the page's records
        return status, ctype, msgspec.msgpack.encode(page)

    got, (bad, _) = read_from([damaged, good], 1, 10, pageRecords="4")
    assert got == values(range(1, 10))
    assert len(bad.requests) >= 3, "asked first for every page"


TABLE_LOG = [
    Entry(6, 2, EntryKind.NORMAL, encode_record(Record(b"a", b"2"))),
    Entry(7, 2, EntryKind.NORMAL, encode_record(Record(b"c", b"3"))),
    Entry(8, 2, EntryKind.NORMAL, encode_record(Record(b"b", None))),
    Entry(9, 2, EntryKind.NORMAL, encode_record(Record(b"d", b"4"))),
    Entry(10, 2, EntryKind.NORMAL, encode_record(Record(b"a", b"5"))),
]


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_table_read_whose_tail_was_compacted_starts_over_from_the_newer_snapshot(
    fail_on_data_loss: str,
) -> None:
    """The snapshot read first (at 5) is replaced, and the log compacted up to 8, before its
    tail is read: the table is read again from the new snapshot, whatever failOnDataLoss says
    (skipping would lose the changes at 6 to 8)."""
    old = columnar.table_page(0, 5, 1, {b"a": b"1", b"b": b"2"})
    new = columnar.table_page(0, 8, 2, {b"a": b"2", b"c": b"3"})
    pages = serving(TABLE_LOG, floor=9)
    snapshots = {"n": 0}

    def answer(path: str, n: int) -> tuple[int, str, bytes]:
        if "/snapshot/table" in path:
            snapshots["n"] += 1
            return 200, columnar.CONTENT_TYPE, old if snapshots["n"] == 1 else new
        return pages(path, n)

    node = FakeNode(answer)
    try:
        opts = parse(
            {"endpoints": node.url, "mode": "table", "failOnDataLoss": fail_on_data_loss},
            streaming=False,
        )
        table = pa.Table.from_batches(list(read_table(opts, TableSplit(0, 11, [node.url]))))
    finally:
        node.close()
    rows = sorted(zip(table["key"].to_pylist(), table["index"].to_pylist(),
                      table["value"].to_pylist(), strict=True))  # fmt: skip
    assert rows == [(b"a", 10, b"5"), (b"c", None, b"3"), (b"d", 9, b"4")]
    assert snapshots["n"] == 2


def test_a_read_waits_for_its_replicas_for_up_to_timeout_seconds_and_sends_the_token():
    """A replica that cannot serve (503) for four seconds, then can: the read waits
    for it (timeoutSeconds=30), every request carrying the token."""
    log = numbered(9)
    serve = serving(log)
    ready_at = time.monotonic() + 4

    def slow(path: str, n: int) -> tuple[int, str, bytes]:
        return error(503, "no_leader") if time.monotonic() < ready_at else serve(path, n)

    got, (node,) = read_from([slow], 1, 10, timeoutSeconds="30", token="s3cret")
    assert got == values(range(1, 10))
    assert len(node.requests) >= 2
    assert set(node.authorizations) == {"Bearer s3cret"}


def test_a_range_compacted_after_planning_is_read_from_the_archive_up_to_the_splits_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With archiveUrl, a split whose range every replica compacted since planning (floor 20,
    past the split's end) reads it from the archive (faked here: it serves what it is asked
    for), and no further than the split's end (the next split reads on from there)."""
    log = numbered(30)
    asked: list[tuple[int, int, int, int]] = []

    def from_archive(
        opts: Options, partition: int, start: int, stop: int, floor: int
    ) -> Iterator[pa.RecordBatch]:
        asked.append((partition, start, stop, floor))
        yield arrow.page_to_batch(msgspec.msgpack.decode(column_page(0, log, start, stop)))

    monkeypatch.setattr(archived, "read_range", from_archive)
    archive = {"archiveUrl": "s3://bucket/prefix", "archiveAccessKeyId": "k",
               "archiveSecretAccessKey": "s"}  # fmt: skip
    got, _ = read_from([serving(log, floor=20)], 1, 10, **archive)
    assert got == values(range(1, 10))
    assert asked == [(0, 1, 10, 20)]


def test_a_manifest_replaced_while_read_is_read_again(monkeypatch):
    """pyarrow reads an object's size, then that many bytes: a manifest the leader rewrote in
    between comes cut at the old size (a CI run planned a tiered read on one). It is read
    again; one that never parses is damage, named, after a few reads."""
    whole = Manifest(partition=0, term=2, leader="n1").to_json()
    reads = [whole[: len(whole) // 2], whole]
    monkeypatch.setattr(archived, "get_object", lambda opts, key: reads.pop(0))
    opts = parse({"endpoints": "http://127.0.0.1:1", "archiveUrl": "s3://bucket/prefix",
                  "archiveAccessKeyId": "k", "archiveSecretAccessKey": "s"},
                 streaming=False)  # fmt: skip
    tier = archived.load(opts, 0)
    assert tier.found and reads == []
    cut = [whole[:-3]] * archived.MANIFEST_READS
    monkeypatch.setattr(archived, "get_object", lambda opts, key: cut.pop(0))
    with pytest.raises(RuntimeError, match=r"prefix/p0/manifest.json: not a manifest"):
        archived.load(opts, 0)
    assert cut == []  # read as many times as it may be, no more
