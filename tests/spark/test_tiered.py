"""Tiered reads (`archiveUrl`): a reader behind the compaction floor reads what the nodes
compacted away straight from the cluster's archive on the real S3-compatible server, in the
executors, with rows identical to a node read; `failOnDataLoss` fires only for what is in neither
place, naming both; bad archive options fail naming the option and the reason.

The cluster: 3 nodes, 2 partitions, 4 KiB WAL segments archived every 0.2 s, compaction forced
once every node knows them archived. That the tasks read the objects themselves (not the nodes,
which may serve below their floor from their own archive) is shown by the plan (one archive split
per segment object, no node split below the floor) and by reads of copies of the archive under
other prefixes, which the nodes know nothing of: an altered or a removed object there fails the
read, naming it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyspark.sql import SparkSession

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster
from raftlog.harness.s3 import S3Server
from raftlog.node.storage.archive_manifest import Manifest, ManifestError, manifest_key
from raftlog.spark import archived
from raftlog.spark.nodes import DataLoss
from raftlog.spark.options import OptionError, parse
from raftlog.spark.source import LogSplit, RaftlogBatchReader, read_log
from tests.spark.helpers import (
    FakeNode,
    Row,
    append,
    error,
    raftlog_df,
    records,
    rows_of,
    wait_replicated,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

BUCKET = "archive"
PREFIX = "tiered"
PARTITIONS = 2
EP = {"endpoints": "http://127.0.0.1:1"}
# Kafka's headers (pairs in order, a repeated key, bytes that are not UTF-8): appended above the
# floor, where both places hold them, to compare the two reads of the same records.
KAFKA_RECORDS: list[dict[str, Any]] = [
    {"key": "kh", "value": "pairs", "headers": [
        {"key": "trace", "value": "a"}, {"key": "bin", "value_b64": "AP/+"},
        {"key": "trace", "value": "b"}, {"key": "empty", "value": ""},
    ]},
    {"value": "no-pairs", "headers": []},
]  # fmt: skip


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3"), buckets=(BUCKET,)) as server:
        yield server


@pytest.fixture(scope="module")
def creds(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("creds") / "archive-credentials"
    f.write_text(f"{s3.access_key}\n{s3.secret_key}\n")
    return f


def archive_options(s3: S3Server, creds: Path, prefix: str = PREFIX) -> dict[str, str]:
    return {
        "archiveUrl": f"s3://{BUCKET}/{prefix}",
        "archiveEndpoint": s3.endpoint,
        "archiveRegion": s3.region,
        "archiveCredentialsFile": str(creds),
    }


def fs_of(s3: S3Server) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(**s3.pyarrow_options())


def manifest(s3: S3Server, p: int, prefix: str = PREFIX) -> Manifest | None:
    # pyarrow reads an object's size, then that many bytes: a manifest the leader replaced in
    # between comes cut at the old size (a CI run read one), so read again, as the reader does.
    for attempt in range(1, archived.MANIFEST_READS + 1):
        try:
            with fs_of(s3).open_input_stream(f"{BUCKET}/{manifest_key(prefix, p)}") as f:
                return Manifest.from_json("manifest", f.read())
        except FileNotFoundError:
            return None
        except ManifestError:
            if attempt == archived.MANIFEST_READS:
                raise
    raise AssertionError("unreachable")


def archived_past(s3: S3Server, p: int, index: int) -> Manifest | None:
    """The manifest of `p` once it reaches past `index`, else None."""
    m = manifest(s3, p)
    return m if m is not None and m.archived_index > index else None


def floors(cluster: LocalCluster, p: int) -> dict[str, int]:
    return {n: cluster.status(n)["partitions"][p]["compaction_floor"] for n in cluster.nodes}


def knows_archived(cluster: LocalCluster, p: int, index: int) -> bool:
    """Whether every member read a manifest reaching `index` (its own archive floor)."""
    for n in cluster.nodes:
        a = cluster.status(n)["partitions"][p].get("archive") or {}
        if int(a.get("archived_index") or 0) < index:
            return False
    return True


@pytest.fixture(scope="module")
def cluster(s3: S3Server, creds: Path, tmp_path_factory: pytest.TempPathFactory):
    env = {
        "RAFTLOG_SEGMENT_BYTES": "4096",
        "RAFTLOG_ARCHIVE_URL": f"s3://{BUCKET}/{PREFIX}",
        "RAFTLOG_ARCHIVE_ENDPOINT": s3.endpoint,
        "RAFTLOG_ARCHIVE_REGION": s3.region,
        "RAFTLOG_ARCHIVE_CREDENTIALS_FILE": str(creds),
        "RAFTLOG_ARCHIVE_INTERVAL_S": "0.2",
    }
    with LocalCluster(
        tmp_path_factory.mktemp("tiered"), replicas=3, partitions=PARTITIONS, durable=False,
        raft={"compact_every_operations": 10**6, "compact_number_entries": 0}, env=env,
    ) as c:  # fmt: skip
        c.wait_ready()
        yield c


def tombstones(n: int, tag: str) -> list[dict[str, Any]]:
    """Keyed deletes, and records with no key, no headers and no timestamp."""
    return [{"key": f"k{i}", "value": None} if i % 2 else {"value": f"{tag}-bare-{i}"}
            for i in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
def history(cluster: LocalCluster, s3: S3Server) -> dict[int, list[Row]]:
    """Per partition: what was acknowledged. The first 300 or so records of each partition are
    archived and compacted on every node; the last ones are on the nodes (and in part archived)."""
    acked: dict[int, list[Row]] = {}
    for p in range(PARTITIONS):
        rows = append(cluster, p, records(150, f"old{p}", keys=7, pad=100))
        rows += append(cluster, p, tombstones(10, f"old{p}"))
        rows += append(cluster, p, records(150, f"older{p}", keys=0, pad=100))
        wait_replicated(cluster, p, rows[-1][1])
        acked[p] = rows
    for p in range(PARTITIONS):
        # Every member must know the sealed segments archived before it compacts them.
        m = wait_for(partial(archived_past, s3, p, 200), "uploads")
        wait_until("every member to read the manifest",
                   partial(knows_archived, cluster, p, m.archived_index))  # fmt: skip
        for n in cluster.nodes:
            code, body = cluster.request(n, "POST", f"/v1/admin/partitions/{p}/compact")
            assert code == 200, body
        assert min(floors(cluster, p).values()) > 100, floors(cluster, p)
    for p in range(PARTITIONS):
        asyncio.run(_append_raw(cluster, p, KAFKA_RECORDS))  # rows not in `acked`: see below
        acked[p] += append(cluster, p, tombstones(6, f"new{p}"))
        acked[p] += append(cluster, p, records(120, f"new{p}", keys=3, pad=100))
        wait_replicated(cluster, p, acked[p][-1][1])
    return acked


async def _append_raw(cluster: LocalCluster, p: int, recs: list[dict[str, Any]]) -> None:
    async with AsyncClient(cluster.endpoints) as c:
        await c.append(p, recs)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """`check()`'s first true answer, waited for up to `timeout`."""
    got: list[Any] = [None]

    def ready() -> bool:
        got[0] = check()
        return bool(got[0])

    wait_until(what, ready, timeout=timeout)
    return got[0]


def plain(rows: list[Row]) -> list[Row]:
    """Rows without the Kafka-headers records (which `history` does not list)."""
    return [r for r in rows if r[4] not in (b"pairs", b"no-pairs")]


def batch_splits(options: dict[str, str], cluster: LocalCluster) -> list[Any]:
    opts = parse({"endpoints": ",".join(cluster.endpoints), **options}, streaming=False)
    return list(RaftlogBatchReader(opts).partitions())


# ====================================================================== batch
def test_a_batch_read_from_earliest_reads_below_the_floor_from_the_archive(
    spark: SparkSession, cluster: LocalCluster, s3: S3Server, creds: Path, history
) -> None:
    opts = archive_options(s3, creds)
    floor = {p: min(floors(cluster, p).values()) for p in range(PARTITIONS)}
    # Planned: [1, floor) of each partition from the archive, one split per segment object.
    splits = batch_splits({**opts, "maxRecordsPerSplit": "50"}, cluster)
    for p in range(PARTITIONS):
        m = manifest(s3, p)
        assert m is not None
        mine = [s for s in splits if isinstance(s, archived.ArchiveSplit) and s.partition == p]
        assert mine[0].start == 1
        assert mine[-1].stop == floor[p]
        assert all(a.stop == b.start for a, b in itertools.pairwise(mine))
        assert {s.segment.key for s in mine} <= {s.key for s in m.segments}
        assert len({s.segment.key for s in mine}) == len(mine) > 3
        from_nodes = [s for s in splits if isinstance(s, LogSplit) and s.partition == p]
        assert from_nodes[0].start == floor[p]
    # And read: every record once, as acknowledged (keys, values, headers, timestamps, terms).
    got = rows_of(raftlog_df(spark, cluster, {**opts, "maxRecordsPerSplit": "50"}))
    assert len({(r[0], r[1]) for r in got}) == len(got)
    want = sorted(r for p in range(PARTITIONS) for r in history[p])
    assert plain(got) == want
    assert [r for r in got if r[1] < floor[r[0]]] == [r for r in want if r[1] < floor[r[0]]]
    assert sum(1 for r in got if r[1] < floor[r[0]]) > 200


def test_rows_from_the_archive_equal_rows_from_the_nodes(
    cluster: LocalCluster, s3: S3Server, creds: Path, history
) -> None:
    """The same records read from both places (archived and still on the nodes): the same
    Arrow batches, column for column, in both headers' types."""
    for p in range(PARTITIONS):
        floor = min(floors(cluster, p).values())
        m = wait_for(partial(archived_past, s3, p, floor + 100), "segments above the floor")
        m = manifest(s3, p)
        assert m is not None
        both = [s for s in m.segments if s.first_index >= floor]
        assert both, (floor, m.segments)
        lo, hi = both[0].first_index, both[-1].last_index + 1
        for include in ("false", "true"):
            opts = parse(
                {"endpoints": ",".join(cluster.endpoints), "includeHeaders": include,
                 "pageRecords": "40", **archive_options(s3, creds)}, streaming=False,
            )  # fmt: skip
            from_nodes = pa.Table.from_batches(
                list(read_log(opts, LogSplit(p, lo, hi, cluster.endpoints)))
            )
            from_archive = pa.Table.from_batches(
                [b for s in both for b in archived.read_piece(opts, p, s, s.first_index,
                                                              s.last_index + 1)]
            )  # fmt: skip
            assert from_archive.num_rows == from_nodes.num_rows > 100
            assert from_archive.schema == from_nodes.schema
            assert from_archive.equals(from_nodes), include
            values = from_archive["value"].to_pylist()
            assert b"pairs" in values and None in values  # Kafka's headers, tombstones


def test_a_range_compacted_after_planning_is_read_from_the_archive(
    s3: S3Server, creds: Path, history
) -> None:
    """A node task (planned before compaction passed it) finds 410 on every replica (a node
    that answers so): it reads that part from the archive; without the archive options it is
    data loss."""
    m = manifest(s3, 0)
    assert m is not None
    floor = m.segments[3].first_index
    node = FakeNode(lambda path, n: error(410, "compacted", compaction_floor=floor))
    try:
        split = LogSplit(0, 5, floor, [node.url])
        opts = parse({"endpoints": node.url, "pageRecords": "25", **archive_options(s3, creds)},
                     streaming=False)  # fmt: skip
        table = pa.Table.from_batches(list(read_log(opts, split)))
        assert len(node.requests) == 1  # asked once, then the archive
        got = list(zip(table["index"].to_pylist(), table["value"].to_pylist(), strict=True))
        assert got == [(r[1], r[4]) for r in history[0] if 5 <= r[1] < floor]
        no_archive = parse({"endpoints": node.url}, streaming=False)
        with pytest.raises(DataLoss, match=f"5 is below the compaction floor {floor}"):
            list(read_log(no_archive, split))
    finally:
        node.close()


@pytest.fixture(scope="module")
def unarchived(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, int, list[Row]]]:
    """A 3-node cluster without archiving, compacted: (the cluster, its floor, the rows written)."""
    with LocalCluster(
        tmp_path_factory.mktemp("unarchived"), replicas=3, partitions=1, durable=False,
        raft={"compact_every_operations": 10**6, "compact_number_entries": 0},
        env={"RAFTLOG_SEGMENT_BYTES": "4096"},
    ) as c:  # fmt: skip
        c.wait_ready()
        written = append(c, 0, records(100, "plain", keys=5, pad=100))
        wait_replicated(c, 0, written[-1][1])
        for n in c.nodes:
            code, body = c.request(n, "POST", "/v1/admin/partitions/0/compact")
            assert code == 200, body
        floor = min(floors(c, 0).values())
        assert floor > 20
        written += append(c, 0, records(20, "after", pad=100))  # the nodes hold these
        wait_replicated(c, 0, written[-1][1])
        yield c, floor, written


def test_without_the_archive_options_a_read_below_the_floor_is_data_loss(
    spark: SparkSession, unarchived: tuple[LocalCluster, int, list[Row]]
) -> None:
    cluster, floor, written = unarchived
    df = raftlog_df(spark, cluster, {"startingOffsets": json.dumps({"0": 1})})
    with pytest.raises(Exception, match="below the compaction floor") as e:
        df.collect()
    assert f"raftlog partition 0: the starting offset 1 is below the compaction floor {floor}" in (
        str(e.value)
    )
    # And from earliest, without the archive, the read starts at the floor (as it always did):
    # every record the nodes still hold, and none below. The entry at the floor need not be a
    # record (a new leader's empty entry, after an election between compaction and the append).
    got = rows_of(raftlog_df(spark, cluster, {"partitions": "0"}))
    now = min(floors(cluster, 0).values())
    assert now >= floor
    assert got == [r for r in written if r[1] >= now]
    assert got and got[-1] == written[-1]


def test_an_archive_without_the_start_is_data_loss_naming_both_places(
    spark: SparkSession, cluster: LocalCluster, s3: S3Server, creds: Path, history
) -> None:
    floor = min(floors(cluster, 0).values())
    empty = archive_options(s3, creds, prefix="nothing-here")
    df = raftlog_df(spark, cluster, {**empty, "startingOffsets": json.dumps({"0": 1})})
    with pytest.raises(Exception, match="in neither place") as e:
        df.collect()
    said = str(e.value)
    assert f"raftlog partition 0: records [1, {floor}) are in neither place" in said
    assert f"below the compaction floor {floor} on every replica" in said
    assert f"the archive s3://{BUCKET}/nothing-here has no manifest" in said
    assert "failOnDataLoss=false" in said
    # An archive that starts above the index asked for: only [asked, its first) is lost.
    m = manifest(s3, 0)
    assert m is not None
    fs = fs_of(s3)
    second = m.segments[1]
    part = Manifest(
        0, m.term, m.leader, [s for s in m.segments if s.first_index >= second.first_index]
    )
    fs.create_dir(f"{BUCKET}/late")
    for s in part.segments:
        fs.copy_file(f"{BUCKET}/{s.key}", f"{BUCKET}/{s.key}".replace(f"/{PREFIX}/", "/late/"))
    late = Manifest(0, m.term, m.leader, [
        type(s)(s.first_index, s.last_index, s.key.replace(f"{PREFIX}/", "late/", 1), s.bytes,
                s.sha256) for s in part.segments
    ])  # fmt: skip
    with fs.open_output_stream(f"{BUCKET}/{manifest_key('late', 0)}") as f:
        f.write(late.to_json())
    opts = {**archive_options(s3, creds, prefix="late"), "partitions": "0"}
    with pytest.raises(Exception, match="in neither place") as e:
        raftlog_df(spark, cluster, {**opts, "startingOffsets": json.dumps({"0": 1})}).collect()
    assert f"records [1, {second.first_index}) are in neither place" in str(e.value)
    assert f"holds [{second.first_index}, " in str(e.value)
    # From earliest, that archive's first index is where the read starts; with
    # failOnDataLoss=false, a start below it skips to it.
    want = [r for r in history[0] if r[1] >= second.first_index]
    assert plain(rows_of(raftlog_df(spark, cluster, opts))) == want
    lenient = {**opts, "startingOffsets": json.dumps({"0": 1}), "failOnDataLoss": "false"}
    assert plain(rows_of(raftlog_df(spark, cluster, lenient))) == want


def copy_archive(s3: S3Server, m: Manifest, name: str, sha256: dict[str, str]) -> dict[str, str]:
    """Partition 0's archive copied under prefix `name` (a manifest naming the copies, with the
    digests `sha256` says instead of the manifest's); returns original key -> copy's key."""
    fs = fs_of(s3)
    keys = {s.key: s.key.replace(f"{PREFIX}/", f"{name}/", 1) for s in m.segments}
    for src, dst in keys.items():
        fs.copy_file(f"{BUCKET}/{src}", f"{BUCKET}/{dst}")
    copy = Manifest(0, m.term, m.leader, [
        type(s)(s.first_index, s.last_index, keys[s.key], s.bytes, sha256.get(s.key, s.sha256))
        for s in m.segments
    ])  # fmt: skip
    with fs.open_output_stream(f"{BUCKET}/{manifest_key(name, 0)}") as f:
        f.write(copy.to_json())
    return keys


def test_the_executors_read_and_check_each_object(
    spark: SparkSession, cluster: LocalCluster, s3: S3Server, creds: Path, history
) -> None:
    """Copies of partition 0's archive under prefixes the nodes know nothing of. A verbatim copy
    reads every record; one with an object altered, one whose manifest names another digest for
    an intact object, and one with an object removed fail naming that object: the tasks read
    the objects themselves and check them against the manifest."""
    m = manifest(s3, 0)
    assert m is not None
    floor = min(floors(cluster, 0).values())
    copy_archive(s3, m, "verbatim", {})
    got = rows_of(raftlog_df(spark, cluster, {**archive_options(s3, creds, "verbatim"),
                                              "partitions": "0"}))  # fmt: skip
    assert plain(got) == history[0]
    assert sum(1 for r in got if r[1] < floor) > 100
    fs = fs_of(s3)
    victim = m.segments[2]
    for name in ("altered", "digest", "gone"):
        digest = {victim.key: "0" * 64} if name == "digest" else {}
        keys = copy_archive(s3, m, name, digest)
        target = f"{BUCKET}/{keys[victim.key]}"
        if name == "altered":  # one bit, the same size
            with fs.open_input_stream(target) as f:
                raw = bytearray(f.read())
            raw[len(raw) // 2] ^= 0x01
            with fs.open_output_stream(target) as f:
                f.write(bytes(raw))
        elif name == "gone":
            fs.delete_file(target)
        opts = {**archive_options(s3, creds, prefix=name), "partitions": "0"}
        with pytest.raises(Exception) as e:
            raftlog_df(spark, cluster, opts).collect()
        assert f"the archived object s3://{BUCKET}/{name}/{keys[victim.key]}" in str(e.value)
        assert ("is missing" if name == "gone" else "is damaged") in str(e.value)
        if name == "digest":
            assert "sha256 differs from the manifest's" in str(e.value)


# ====================================================================== streaming
def test_a_stream_from_earliest_after_compaction_reads_everything(
    spark: SparkSession, cluster: LocalCluster, s3: S3Server, creds: Path, history, tmp_path
) -> None:
    opts = {**archive_options(s3, creds), "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "150"}  # fmt: skip
    query = (
        raftlog_df(spark, cluster, opts, stream=True)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(300)
        assert query.exception() is None
        batches = len(query.recentProgress)
    finally:
        query.stop()
    got = rows_of(spark.read.parquet(str(tmp_path / "sink")))
    assert len({(r[0], r[1]) for r in got}) == len(got)
    assert plain(got) == sorted(r for p in range(PARTITIONS) for r in history[p])
    assert batches > 3  # several micro-batches, the first ones all from the archive


# ====================================================================== options
BAD = [
    ({**EP, "archiveEndpoint": "http://s3:9000"}, "archiveEndpoint", "archiveUrl is not"),
    ({**EP, "archiveUrl": "https://bucket/p"}, "archiveUrl", "must be s3://bucket/prefix"),
    ({**EP, "archiveUrl": "s3:///p"}, "archiveUrl", "must be s3://bucket/prefix"),
    ({**EP, "archiveUrl": "s3://b/p", "archiveEndpoint": "s3:9000"}, "archiveEndpoint",
     "http(s) URL"),
    ({**EP, "archiveUrl": "s3://b/p", "archiveAccessKeyId": "k"}, "archiveSecretAccessKey",
     "give both"),
    ({**EP, "archiveUrl": "s3://b/p", "archiveSecretAccessKey": "s"}, "archiveAccessKeyId",
     "give both"),
    ({**EP, "archiveUrl": "s3://b/p", "archiveCredentialsFile": "/nonexistent/creds"},
     "archiveCredentialsFile", "cannot be read"),
    ({**EP, "archiveUrl": "s3://b/p", "archiveCredentialsFile": "/dev/null",
      "archiveAccessKeyId": "k", "archiveSecretAccessKey": "s"}, "archiveAccessKeyId",
     "not both"),
    ({**EP, "archiveUrl": "s3://b/p", "archiveRegion": " "}, "archiveRegion", "is empty"),
    ({**EP, "archiveUrl": "s3://b/p", "mode": "table"}, "archiveUrl", "mode=log"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "option", "reason"), BAD)
def test_bad_archive_options_name_the_option_and_the_reason(options, option, reason) -> None:
    with pytest.raises(OptionError) as e:
        parse(options, streaming=False)
    assert e.value.option == option
    assert reason in e.value.reason, e.value.reason


def test_archive_credentials_come_from_a_file_or_the_options(tmp_path: Path) -> None:
    f = tmp_path / "creds"
    f.write_text("only-one-line\n")
    with pytest.raises(OptionError) as e:
        parse({**EP, "archiveUrl": "s3://b", "archiveCredentialsFile": str(f)}, streaming=True)
    assert e.value.option == "archiveCredentialsFile" and "two lines" in e.value.reason
    assert "only-one-line" not in str(e.value)  # a secret is never shown
    f.write_text("AKID\nSECRET\n")
    a = parse({**EP, "archiveUrl": "s3://b/x/", "archiveCredentialsFile": str(f)},
              streaming=True).archive  # fmt: skip
    assert a is not None
    assert (a.url, a.bucket, a.prefix, a.access_key_id, a.secret_access_key) == (
        "s3://b/x", "b", "x", "AKID", "SECRET")  # fmt: skip
    assert "SECRET" not in repr(a)
    f.write_text('{"access_key_id": "A2", "secret_access_key": "S2"}')
    a = parse({**EP, "archiveUrl": "s3://b", "archiveCredentialsFile": str(f)},
              streaming=False).archive  # fmt: skip
    assert a is not None and (a.prefix, a.access_key_id, a.secret_access_key) == ("", "A2", "S2")
    a = parse({**EP, "archiveUrl": "s3://b/p", "archiveAccessKeyId": "K",
               "archiveSecretAccessKey": "S", "archiveEndpoint": "http://127.0.0.1:8333/",
               "archiveRegion": "eu-west-1"}, streaming=False).archive  # fmt: skip
    assert a is not None
    assert (a.endpoint, a.region, a.access_key_id) == ("http://127.0.0.1:8333", "eu-west-1", "K")
    assert parse(EP, streaming=False).archive is None


def test_readers_without_the_archive_options_reach_history_through_the_nodes(
    spark: SparkSession, cluster: LocalCluster, history
) -> None:
    """A reader that asks for indexes below the floor of an archiving cluster, with no archive
    options of its own (the JVM reader has none), is served by the nodes' tiered reads: every
    record from index 1, as acknowledged, for `raftlog-jvm` as for `raftlog`."""
    floor = {p: min(floors(cluster, p).values()) for p in range(PARTITIONS)}
    assert all(f > 100 for f in floor.values()), floor
    starting = json.dumps({str(p): 1 for p in range(PARTITIONS)})
    want = sorted(r for p in range(PARTITIONS) for r in history[p])
    for fmt in ("raftlog-jvm", "raftlog"):
        got = rows_of(raftlog_df(spark, cluster, {"startingOffsets": starting}, fmt=fmt))
        assert plain(got) == want, fmt
        assert sum(1 for r in got if r[1] < floor[r[0]]) > 200, fmt
