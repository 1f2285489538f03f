"""Tiered reads (`server/archive_reads.py`) against the real S3-compatible server: `/records` and
`/columns` below the compaction floor are served from the continuous archive, identical to what
the WAL served before compaction, bounded by the floor and the mark; below what the archive
holds, 410 with where to look; a damaged object is an error (502), never data; the store down
is 503 `archive_unavailable`, and reads come back with it."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from array import array
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import obstore
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from obstore.store import S3Store
from tests.server.helpers import until
from tests.storage.helpers import forged

from raftlog.client import Client
from raftlog.harness.local import LocalCluster
from raftlog.harness.s3 import S3Server
from raftlog.node.core.config import RaftConfig
from raftlog.node.core.types import EntryKind
from raftlog.node.record import decode_record
from raftlog.node.server.app import build_app
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.archive_manifest import ArchivedSegment, Manifest

pytestmark = [pytest.mark.s3]

BUCKET = "tiered"
COLUMNS = "application/vnd.raftlog.columns+msgpack"
WAL = "application/vnd.raftlog.wal+msgpack"
ARCHIVE_FIELDS = (
    "archive_url",
    "archive_endpoint",
    "archive_region",
    "archived_first_index",
    "archived_index",
)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3"), buckets=(BUCKET,)) as server:
        yield server


@pytest.fixture
def creds(s3: S3Server, tmp_path: Path) -> Path:
    f = tmp_path / "archive-credentials"
    f.write_text(f"{s3.access_key}\n{s3.secret_key}\n")
    return f


def store(s3: S3Server) -> S3Store:
    return S3Store(BUCKET, **s3.obstore_config())


def manifest(s3: S3Server, prefix: str) -> Manifest:
    raw = bytes(obstore.get(store(s3), f"{prefix}/p0/manifest.json").bytes())
    return Manifest.from_json("manifest", raw)


def settings(tmp_path: Path, s3: S3Server | None, creds: Path | None, prefix: str) -> NodeSettings:
    """One node over 4 KiB segments, snapshotting every 20 operations and compacting all it
    may behind the snapshot (with archiving on, behind what is archived)."""
    archive: dict[str, Any] = {}
    if s3 is not None:
        archive = {
            "archive_url": f"s3://{BUCKET}/{prefix}",
            "archive_endpoint": s3.endpoint,
            "archive_region": s3.region,
            "archive_credentials_file": creds,
            "archive_interval_s": 0.1,
        }
    return NodeSettings(
        insecure_no_auth=True,
        node_id="n1",
        peers={"n1": "http://127.0.0.1:10"},
        data_dir=tmp_path / "n1",
        tick_ms=5,
        segment_bytes=4096,
        raft=RaftConfig(compact_every_operations=20, compact_number_entries=0),
        **archive,
    )


class Api:
    """A node in this process behind its aiohttp app, with what it acknowledged: every record
    as the WAL served it right after its append (before any compaction could reach it)."""

    def __init__(self, node: Node, client: TestClient[Any, Any]) -> None:
        self.node = node
        self.client = client
        self.acked: list[dict[str, Any]] = []

    async def append(self, batches: int, tag: str) -> None:
        hold = "/v1/admin/partitions/0/holds/readback"
        for i in range(batches):
            # Held from the next index on, so compaction (behind a snapshot every 20 entries)
            # cannot take the batch before it is read back, however the loop is scheduled.
            after = self.node.drivers[0].raft.log.last_index() + 1
            r = await self.client.put(hold, json={"min_index": after, "ttl_seconds": 60})
            assert r.status == 200, await r.text()
            recs = [
                {
                    "key": f"k{i % 7}",
                    "value": f"{tag}-{i}-{j}-" + "x" * 60,
                    "headers": {"i": str(j)},
                }
                for j in range(4)
            ]
            r = await self.client.post("/v1/partitions/0/records", json={"records": recs})
            assert r.status == 200, await r.text()
            done = await r.json()
            assert done["last_index"] - done["first_index"] == 3
            page = await self.json(f"/v1/partitions/0/records?from={done['first_index']}&limit=4")
            assert [(x["key"], x["value"]) for x in page["records"]] == [
                (x["key"], x["value"]) for x in recs
            ]
            self.acked.extend(page["records"])
        r = await self.client.delete(hold)
        assert r.status == 204, await r.text()

    async def get(self, path: str) -> tuple[int, bytes, str]:
        r = await self.client.get(path)
        return r.status, await r.read(), r.headers.get("Content-Type", "")

    async def json(self, path: str, status: int = 200) -> dict[str, Any]:
        code, raw, _ = await self.get(path)
        assert code == status, (code, raw[:500])
        doc: dict[str, Any] = json.loads(raw)
        return doc

    @property
    def floor(self) -> int:
        return self.node.drivers[0].storage.compaction_floor()

    async def compacted_past(self, index: int, timeout: float = 60.0) -> None:
        """Append until compaction removed every entry up to `index`."""
        deadline = time.monotonic() + timeout
        n = 0
        while self.floor <= index:
            assert time.monotonic() < deadline, f"floor {self.floor} still at or below {index}"
            n += 1
            await self.append(5, f"more{n}")
            await asyncio.sleep(0.05)  # the archiver's passes

    async def metric(self, name: str) -> float:
        text = await (await self.client.get("/metrics")).text()
        for line in text.splitlines():
            if line.startswith(f'{name}{{partition="0"}} '):
                return float(line.split()[-1])
        raise AssertionError(f"{name} not in /metrics")


class Nodes:
    """The in-process nodes a test started, each closed at its end."""

    def __init__(self) -> None:
        self.started: list[Api] = []

    async def start(self, s: NodeSettings) -> Api:
        node = Node(s)
        await node.start()
        client: TestClient[Any, Any] = TestClient(TestServer(build_app(node)))
        await client.start_server()
        api = Api(node, client)
        self.started.append(api)
        d = node.drivers[0]
        await until(lambda: d.raft.role.name == "LEADER", "leadership")
        return api

    async def stop(self, api: Api) -> None:
        self.started.remove(api)
        await api.client.close()
        await api.node.close()


@pytest_asyncio.fixture
async def nodes() -> AsyncIterator[Nodes]:
    made = Nodes()
    yield made
    for api in list(made.started):
        await made.stop(api)


# ---------------------------------------------------------------------- reading pages
async def read_records(api: Api, start: int, limit: int = 100) -> list[dict[str, Any]]:
    """Every record from `start` to the mark, page by page through `next`."""
    out: list[dict[str, Any]] = []
    while True:
        page = await api.json(f"/v1/partitions/0/records?from={start}&limit={limit}")
        assert page["next"] >= start
        if page["next"] == start:
            assert start == page["high_water_mark"] + 1
            return out
        assert all(r["index"] <= page["high_water_mark"] for r in page["records"])
        out.extend(page["records"])
        start = page["next"]


def strings(offsets: bytes, data: bytes, valid: bytes | None = None) -> list[bytes | None]:
    o = array("i")
    o.frombytes(offsets)
    return [
        None if valid is not None and not valid[i] else data[o[i] : o[i + 1]]
        for i in range(len(o) - 1)
    ]


def column_records(page: dict[str, Any]) -> list[dict[str, Any]]:
    """A column page's rows in the JSON read's shape."""
    ints = {}
    for name in ("index", "term", "timestamp_ms", "header_offsets"):
        a = array("q" if name != "header_offsets" else "i")
        a.frombytes(page[name])
        ints[name] = a
    keys = strings(page["key_offsets"], page["key_data"], page["key_valid"])
    values = strings(page["value_offsets"], page["value_data"], page["value_valid"])
    hk = strings(page["header_key_offsets"], page["header_key_data"])
    hv = strings(page["header_value_offsets"], page["header_value_data"])
    ho = ints["header_offsets"]
    out = []
    for i in range(page["count"]):
        k, v = keys[i], values[i]
        out.append(
            {
                "index": ints["index"][i],
                "term": ints["term"][i],
                "key": None if k is None else k.decode(),
                "value": None if v is None else v.decode(),
                "headers": {
                    hk[j].decode(): hv[j].decode()  # type: ignore[union-attr]
                    for j in range(ho[i], ho[i + 1])
                },
                "timestamp_ms": ints["timestamp_ms"][i],
            }
        )
    return out


def wal_records(page: dict[str, Any]) -> list[dict[str, Any]]:
    """A WAL page's NORMAL entries in the JSON read's shape, every record's checksum checked
    and the entries contiguous from `first`."""
    out = []
    at = page["first"]
    for body in fmt.iter_bodies(page["records"], verify=True):
        if body[0] != fmt.T_ENTRY:
            continue
        e = fmt.decode_entry_body(body)
        assert e.index == at
        at += 1
        if e.kind != EntryKind.NORMAL:
            continue
        r = decode_record(e.data)
        assert isinstance(r.headers, dict) and r.key is not None and r.value is not None
        out.append(
            {
                "index": e.index,
                "term": e.term,
                "key": r.key.decode(),
                "value": r.value.decode(),
                "headers": r.headers,
                "timestamp_ms": r.timestamp_ms,
            }
        )
    assert at == page["next"]
    return out


async def read_columns(
    api: Api, start: int, fmt_name: str = "columns", limit: int = 100
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        path = f"/v1/partitions/0/columns?from={start}&limit={limit}&format={fmt_name}"
        code, raw, ctype = await api.get(path)
        assert code == 200, (code, raw[:500])
        assert ctype == (COLUMNS if fmt_name == "columns" else WAL)
        page = msgspec.msgpack.decode(raw)
        if page["next"] == start:
            return out
        rows = column_records(page) if fmt_name == "columns" else wal_records(page)
        assert all(r["index"] <= page["high_water_mark"] for r in rows)
        out.extend(rows)
        start = page["next"]


def below_floor_objects(m: Manifest, floor: int) -> list[ArchivedSegment]:
    return [s for s in m.segments if s.last_index < floor]


# ---------------------------------------------------------------------- tests
@pytest.mark.asyncio
async def test_every_record_reads_back_from_index_1_after_compaction(
    nodes: Nodes, s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    api: Api = await nodes.start(settings(tmp_path, s3, creds, "all"))
    await api.append(60, "a")
    await api.compacted_past(400)
    floor = api.floor
    m = manifest(s3, "all")
    assert m.segments[0].first_index == 1 and len(below_floor_objects(m, floor)) >= 8
    assert await api.metric("raftlog_archive_reads_total") == 0

    # /records from 1: every acknowledged record, identical and in order, the ones below the
    # floor from the archive, the rest from the WAL.
    got = await read_records(api, 1)
    assert got[: len(api.acked)] == api.acked
    assert len(got) == len(api.acked)  # nothing else was appended
    assert api.floor > 1 and await api.metric("raftlog_archive_reads_total") > 0
    served = await api.metric("raftlog_archive_read_entries_total")
    assert served >= floor - 1
    # The column page and the WAL page hold the same records.
    assert await read_columns(api, 1) == api.acked
    assert await read_columns(api, 1, "wal", limit=37) == api.acked
    assert await api.metric("raftlog_archive_read_errors_total") == 0


@pytest.mark.asyncio
async def test_a_page_below_the_floor_keeps_the_bounds_of_a_wal_page(
    nodes: Nodes, s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    api: Api = await nodes.start(settings(tmp_path, s3, creds, "bounds"))
    await api.append(40, "b")
    await api.compacted_past(200)
    # A retention hold at the floor: the archive goes on past it, so it holds entries the WAL
    # still holds too (a read from the archive must stop at the floor all the same).
    r = await api.client.put(
        "/v1/admin/partitions/0/holds/test", json={"min_index": api.floor, "ttl_seconds": 300}
    )
    assert r.status == 200, await r.text()
    floor = api.floor  # after the hold: a snapshot in flight may have moved it up to there
    archiver = api.node.archiver
    assert archiver is not None
    while archiver.partitions[0].archived_index < floor + 60:
        await api.append(5, "held")
        await asyncio.sleep(0.05)
    assert api.floor == floor
    by_index = {r["index"]: r for r in api.acked}
    hwm = api.node.drivers[0].high_water_mark

    # `limit` entries at most, across objects (segments of about 25 entries).
    page = await api.json("/v1/partitions/0/records?from=2&limit=70")
    assert page["high_water_mark"] >= hwm and page["partition"] == 0
    assert page["next"] == 72
    assert page["records"] == [by_index[i] for i in range(2, 72) if i in by_index]
    # A read that starts below the floor stops at the floor; the next read goes on from there.
    page = await api.json(f"/v1/partitions/0/records?from={floor - 3}&limit=1000")
    assert page["next"] == floor
    assert page["records"] == [by_index[i] for i in range(floor - 3, floor) if i in by_index]
    nxt = await api.json(f"/v1/partitions/0/records?from={floor}&limit=5")
    assert nxt["records"][0]["index"] == min(i for i in by_index if i >= floor)
    # About `max_bytes`, at least one record.
    page = await api.json("/v1/partitions/0/records?from=5&max_bytes=1")
    assert page["next"] == 6 and page["records"] == [by_index[5]]
    # /columns: `to` and `limit`; the page's fields are the WAL page's.
    code, raw, _ = await api.get("/v1/partitions/0/columns?from=3&to=40&limit=1000")
    assert code == 200
    cols = msgspec.msgpack.decode(raw)
    assert cols["next"] == 40 and cols["compaction_floor"] == api.floor
    assert cols["high_water_mark"] >= hwm and cols["partition"] == 0
    assert column_records(cols) == [by_index[i] for i in range(3, 40) if i in by_index]
    code, raw, _ = await api.get("/v1/partitions/0/columns?from=3&limit=10&format=wal")
    wal = msgspec.msgpack.decode(raw)
    assert (wal["first"], wal["next"]) == (3, 13)
    assert wal_records(wal) == [by_index[i] for i in range(3, 13) if i in by_index]
    # No-op entries (a leader's first) are not records, but `next` passes them.
    first = await api.json("/v1/partitions/0/records?from=1&limit=1")
    assert first["records"] == [] and first["next"] == 2


@pytest.mark.asyncio
async def test_below_what_the_archive_holds_is_410_naming_the_archive(
    nodes: Nodes, s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    """A log compacted before archiving was turned on: the archive begins at the floor of that
    moment; a read below it is 410 with where the archive is and what it holds."""
    api: Api = await nodes.start(settings(tmp_path, None, None, "late"))
    await api.append(30, "before")
    await api.compacted_past(60)
    gone = await api.json("/v1/partitions/0/records?from=1", status=410)
    assert gone["error"] == "compacted" and not set(ARCHIVE_FIELDS) & set(gone)  # as before
    acked = api.acked
    await nodes.stop(api)

    api = await nodes.start(settings(tmp_path, s3, creds, "late"))
    api.acked = acked
    first = api.floor  # where the archive begins (the WAL's first segment after the restart)
    assert first > 1
    await api.compacted_past(first + 80)  # archiving (from `first`) lets compaction go on
    m = manifest(s3, "late")
    assert m.segments[0].first_index == first > 1
    for start, kind in ((1, "records"), (first - 1, "records"), (1, "columns")):
        gone = await api.json(f"/v1/partitions/0/{kind}?from={start}", status=410)
        assert gone["error"] == "compacted"
        assert gone["compaction_floor"] == api.floor
        assert {k: gone[k] for k in ARCHIVE_FIELDS[:4]} == {
            "archive_url": f"s3://{BUCKET}/late",
            "archive_endpoint": s3.endpoint,
            "archive_region": s3.region,
            "archived_first_index": first,
        }
        assert gone["archived_index"] >= m.archived_index >= api.floor - 1
        assert f"s3://{BUCKET}/late holds {first}.." in gone["reason"]
    # From the archive's first entry (an object cut from the middle of a segment) on: all there.
    got = await read_records(api, first)
    assert got == [r for r in acked if r["index"] >= first]
    assert await read_columns(api, first) == got


@pytest.mark.asyncio
async def test_a_damaged_object_is_an_error_never_data(
    nodes: Nodes, s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    api: Api = await nodes.start(settings(tmp_path, s3, creds, "damaged"))
    await api.append(40, "d")
    await api.compacted_past(300)
    # Everything archived (the leader's next pass then writes no manifest over the test's).
    d, archiver = api.node.drivers[0], api.node.archiver
    assert archiver is not None

    def settled() -> bool:
        m = archiver.partitions[0].manifest
        snap = None if m is None else m.latest_snapshot
        sealed = d.storage.wal.sealed_segments()
        return (
            m is not None
            and snap is not None
            and snap.index == d.storage.snapshot_meta().index
            and (not sealed or m.archived_index == sealed[-1].last_index)
        )

    await until(settled, "the archive caught up")
    m = manifest(s3, "damaged")
    objects = below_floor_objects(m, api.floor)
    assert len(objects) >= 6
    by_index = {r["index"]: r for r in api.acked}
    st = store(s3)
    # A manifest naming, for objects[2]'s range, the next object (its size and digest right):
    # the entries it holds are not the ones asked for.
    real = bytes(obstore.get(st, "damaged/p0/manifest.json").bytes())
    swapped = Manifest.from_json("m", real)
    other = swapped.segments[3]
    i = swapped.segments.index(objects[2])
    swapped.segments[i] = ArchivedSegment(
        objects[2].first_index, objects[2].last_index, other.key, other.bytes, other.sha256
    )
    obstore.put(st, "damaged/p0/manifest.json", swapped.to_json())
    err = await api.json(f"/v1/partitions/0/records?from={objects[2].first_index}", status=502)
    assert err["error"] == "archive_corrupt" and err["key"] == other.key
    assert f"the manifest names {objects[2].first_index}..{objects[2].last_index}" in err["reason"]
    obstore.put(st, "damaged/p0/manifest.json", real)
    for target, bad in (
        (objects[2], lambda raw: forged(raw, last=True, byte=-5)),
        (objects[4], lambda raw: raw[:-10]),
    ):
        original = bytes(obstore.get(st, target.key).bytes())
        obstore.put(st, target.key, bad(original))
        for path in (
            f"/v1/partitions/0/records?from={target.first_index}",
            f"/v1/partitions/0/records?from={target.first_index - 5}&limit=50",  # runs into it
            f"/v1/partitions/0/columns?from={target.last_index}",
            f"/v1/partitions/0/columns?from={target.first_index}&format=wal",
        ):
            err = await api.json(path, status=502)
            assert err["error"] == "archive_corrupt" and err["key"] == target.key, err
            assert "differs from the manifest's" in err["reason"]
            assert "records" not in err and err["archive_url"] == f"s3://{BUCKET}/damaged"
        # The objects around it still read; with the object repaired, it reads again.
        width = objects[1].last_index - objects[0].first_index + 1
        before = await api.json(
            f"/v1/partitions/0/records?from={objects[0].first_index}&limit={width}"
        )
        assert before["next"] == objects[1].last_index + 1
        assert before["records"] == [
            by_index[i] for i in range(objects[0].first_index, before["next"]) if i in by_index
        ]
        obstore.put(st, target.key, original)
        width = target.last_index - target.first_index + 1
        page = await api.json(f"/v1/partitions/0/records?from={target.first_index}&limit={width}")
        span = range(target.first_index, page["next"])
        assert page["next"] == target.last_index + 1
        assert page["records"] == [by_index[i] for i in span if i in by_index]
    assert await api.metric("raftlog_archive_read_errors_total") == 9


@pytest.mark.slow
@pytest.mark.asyncio
async def test_store_down_is_503_archive_unavailable_and_reads_come_back(
    nodes: Nodes, tmp_path: Path
) -> None:
    with S3Server(tmp_path / "s3b", buckets=(BUCKET,)) as s3b:
        creds = tmp_path / "creds-b"
        creds.write_text(f"{s3b.access_key}\n{s3b.secret_key}\n")
        api: Api = await nodes.start(settings(tmp_path, s3b, creds, "down"))
        await api.append(40, "s")
        await api.compacted_past(250)
        objects = below_floor_objects(manifest(s3b, "down"), api.floor)
        by_index = {r["index"]: r for r in api.acked}
        # One read below the floor: the manifest and that object are cached.
        near = await api.json(f"/v1/partitions/0/records?from={objects[-1].first_index}&limit=3")
        assert near["records"]
        s3b.stop(remove=False)
        floor = api.floor
        started = time.monotonic()
        for path in (
            f"/v1/partitions/0/records?from={objects[1].first_index}",
            f"/v1/partitions/0/columns?from={objects[2].first_index}",
            f"/v1/partitions/0/columns?from={objects[3].first_index}&format=wal",
        ):
            err = await api.json(path, status=503)
            assert err["error"] == "archive_unavailable", err
            assert "retry" in err["reason"] and "Error" in err["reason"]  # the store's error
            assert err["archive_endpoint"] == s3b.endpoint
            assert err["archived_first_index"] == 1 and err["archived_index"] >= floor - 1
        assert time.monotonic() - started < 60
        # A cached object still reads; above the floor the WAL serves as ever.
        again = await api.json(f"/v1/partitions/0/records?from={objects[-1].first_index}&limit=3")
        assert again["records"] == near["records"]
        top = await api.json(f"/v1/partitions/0/records?from={api.floor}")
        assert top["records"] and top["records"][0]["index"] >= api.floor
        s3b.start()
        got = await read_records(api, 1)
        assert got == [by_index[r["index"]] for r in got] and len(got) == len(api.acked)


@pytest.mark.slow
@pytest.mark.e2e
def test_every_member_serves_the_archive_up_to_its_own_mark(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    """Three node processes: the leader archives, every member compacts behind what it read
    in the manifest, and each serves reads from index 1, followers included, never above its
    own mark."""
    env = {
        "RAFTLOG_SEGMENT_BYTES": "4096",
        "RAFTLOG_ARCHIVE_URL": f"s3://{BUCKET}/cluster",
        "RAFTLOG_ARCHIVE_ENDPOINT": s3.endpoint,
        "RAFTLOG_ARCHIVE_REGION": s3.region,
        "RAFTLOG_ARCHIVE_CREDENTIALS_FILE": str(creds),
        "RAFTLOG_ARCHIVE_INTERVAL_S": "0.2",
    }
    raft = {"compact_every_operations": 20, "compact_number_entries": 0}
    with LocalCluster(tmp_path / "c", replicas=3, durable=False, env=env, raft=raft) as cluster:
        cluster.wait_ready()

        def call(name: str, path: str) -> Any:
            code, doc = cluster.request(name, "GET", path)
            assert code == 200, (name, path, code, doc)
            return doc

        acked: dict[int, tuple[str, str]] = {}
        deadline = time.monotonic() + 120
        i = 0
        # Through the client: leadership may move under the CI's load meanwhile.
        with Client(cluster.endpoints) as client:
            while True:
                floors = [
                    cluster.status(n)["partitions"][0]["compaction_floor"] for n in cluster.nodes
                ]
                if min(floors) > 200:
                    break
                assert time.monotonic() < deadline, floors
                for _ in range(10):
                    recs = [{"key": f"k{i}", "value": f"v{i}-{j}-" + "y" * 80} for j in range(4)]
                    done = client.append(0, recs)
                    for j, r in enumerate(recs):
                        acked[done.first_index + j] = (r["key"], r["value"])
                    i += 1
                time.sleep(0.2)
        for name in cluster.nodes:
            start, got = 1, {}
            while True:
                page = call(name, f"/v1/partitions/0/records?from={start}&limit=500")
                for r in page["records"]:
                    assert r["index"] <= page["high_water_mark"]
                    got[r["index"]] = (r["key"], r["value"])
                if page["next"] == start:
                    break
                start = page["next"]
            mark = max(got)
            assert got == {i: kv for i, kv in acked.items() if i <= mark}, name
            assert mark >= max(acked) - 40  # a follower may be a little behind
            with urllib.request.urlopen(cluster.nodes[name].url + "/metrics", timeout=5) as r:
                text = r.read().decode()
            reads = next(
                x for x in text.splitlines() if x.startswith("raftlog_archive_reads_total")
            )
            assert float(reads.split()[-1]) > 0, (name, reads)
