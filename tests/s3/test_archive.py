"""The continuous archive (`server/archive.py`) against the real S3-compatible server: a node's
committed WAL segments and snapshots uploaded with a manifest, compaction held while the store is
down and catching up once it is back, and a new leader continuing the same manifest."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest
from aiohttp.test_utils import TestClient, TestServer
from obstore.store import S3Store
from tests.server.helpers import until
from tests.steady import STEADY_ENV

from raftlog.harness.local import LocalCluster
from raftlog.harness.s3 import S3Server
from raftlog.node.core.config import RaftConfig
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.server.app import build_app
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.archive_manifest import ArchivedSegment, Manifest

pytestmark = [pytest.mark.s3]

BUCKET = "archive"


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


def manifest(s3: S3Server, prefix: str, p: int = 0) -> Manifest | None:
    try:
        raw = bytes(obstore.get(store(s3), f"{prefix}/p{p}/manifest.json").bytes())
    except FileNotFoundError:
        return None
    return Manifest.from_json("manifest", raw)


def object_bytes(s3: S3Server, key: str) -> bytes:
    return bytes(obstore.get(store(s3), key).bytes())


def archived_entries(raw: bytes) -> list[Entry]:
    """The entries of a segment object, every record's checksum verified by the WAL's scan."""
    found = fmt.scan("object", raw, is_last=False)
    assert found.corruption is None and found.torn is None, found
    assert found.valid_end == len(raw)
    view = memoryview(raw)
    out = []
    for r in found.records:
        if r.kind == fmt.T_ENTRY:
            length = fmt.REC_HEAD.unpack_from(view, r.offset)[0]
            out.append(fmt.decode_entry_body(view[r.offset + 8 : r.offset + 8 + length]))
    return out


def assert_contiguous(m: Manifest) -> None:
    ranges = [(s.first_index, s.last_index) for s in m.segments]
    assert ranges == sorted(ranges)
    for (_, last), (first, _) in itertools.pairwise(ranges):
        assert first == last + 1, f"gap or overlap between {last} and {first}: {ranges}"
    assert m.archived_index == ranges[-1][1]


def node_settings(
    tmp_path: Path, s3: S3Server, creds: Path, prefix: str, **raft: Any
) -> NodeSettings:
    return NodeSettings(
        insecure_no_auth=True,
        node_id="n1",
        peers={"n1": "http://127.0.0.1:10"},
        data_dir=tmp_path / "n1",
        tick_ms=5,
        segment_bytes=4096,
        archive_url=f"s3://{BUCKET}/{prefix}",
        archive_endpoint=s3.endpoint,
        archive_region=s3.region,
        archive_credentials_file=creds,
        archive_interval_s=0.1,
        raft=RaftConfig(**raft),
    )


async def leader_of(node: Node) -> None:
    d = node.drivers[0]
    await until(lambda: d.raft.role.name == "LEADER", "leadership")


async def append(node: Node, n: int, tag: str) -> None:
    d = node.drivers[0]
    for i in range(n):
        await d.propose([f"{tag}-{i}-{j}".encode() * 8 for j in range(4)])


@pytest.mark.asyncio
async def test_committed_segments_are_uploaded_as_the_wal_wrote_them(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    node = Node(node_settings(tmp_path, s3, creds, "a", compact_every_operations=10**9))
    await node.start()
    try:
        await leader_of(node)
        d = node.drivers[0]
        await append(node, 150, "a")
        sealed = d.storage.wal.sealed_segments()
        assert len(sealed) >= 4
        await until(
            lambda: (
                node.archiver is not None
                and node.archiver.partitions[0].archived_index == sealed[-1].last_index
            ),
            "the sealed segments archived",
        )
        m = manifest(s3, "a")
        assert m is not None and m.leader == "n1" and m.term == d.raft.term
        assert_contiguous(m)
        assert m.segments[0].first_index == 1
        by_first = {s.first_index: s for s in d.storage.wal.sealed_segments()}
        for s in m.segments:
            raw = object_bytes(s3, s.key)
            assert (len(raw), hashlib.sha256(raw).hexdigest()) == (s.bytes, s.sha256)
            assert raw == Path(by_first[s.first_index].path).read_bytes()  # byte for byte
            entries = archived_entries(raw)
            assert [e.index for e in entries] == list(range(s.first_index, s.last_index + 1))
            assert entries == d.storage.entries(s.first_index, s.last_index + 1)
            assert s.last_index <= d.raft.commit
        data = [e.data for s in m.segments for e in archived_entries(object_bytes(s3, s.key))]
        records = [e for s in m.segments for e in archived_entries(object_bytes(s3, s.key))]
        assert sum(e.kind == EntryKind.NORMAL for e in records) >= 100
        assert any(b"a-0-0" in x for x in data)
        # The active segment is never uploaded; no snapshot was taken: none archived.
        assert m.archived_index < d.storage.last_index() and m.snapshots == []
        # The status and the metrics say the same.
        async with TestClient(TestServer(build_app(node))) as client:
            part = (await (await client.get("/v1/status")).json())["partitions"][0]
            assert part["archive"]["archived_index"] == m.archived_index
            assert part["archive"]["lag_entries"] == d.raft.commit - m.archived_index
            assert part["archive"]["last_error"] is None
            assert part["archive"]["last_upload_at"] > time.time() - 60
            text = await (await client.get("/metrics")).text()
        lag = d.raft.commit - m.archived_index
        assert f'raftlog_archive_lag_entries{{partition="0"}} {lag}.0' in text
        assert 'raftlog_archive_uploaded_bytes_total{partition="0"}' in text
        assert 'raftlog_archive_errors_total{partition="0"} 0.0' in text
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_a_leader_continues_a_manifest_from_the_middle_of_its_segment(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    """Members cut their segments at different indexes: a leader whose segment begins below the
    archived index uploads the rest of its records behind a header of their own, no overlap."""
    node = Node(node_settings(tmp_path, s3, creds, "mid", compact_every_operations=10**9))
    assert node.archiver is not None
    node.archiver.interval_s = 3600.0  # one pass at the start (nothing sealed), then by hand
    await node.start()
    try:
        await leader_of(node)
        d = node.drivers[0]
        await append(node, 60, "mid")
        sealed = d.storage.wal.sealed_segments()
        first = sealed[0]
        cut = (first.first_index + first.last_index) // 2
        # What an earlier leader archived, its segment ending at `cut` (its object is there too).
        earlier = Manifest(0, term=0, leader="n0")
        whole = Path(first.path).read_bytes()
        key = "mid/p0/segments/earlier.wal"
        obstore.put(store(s3), key, whole)
        earlier.segments.append(ArchivedSegment(1, cut, key, len(whole), "x"))
        obstore.put(store(s3), "mid/p0/manifest.json", earlier.to_json())
        await node.archiver.pass_once()
        a = node.archiver.partitions[0]
        assert a.last_error is None and a.archived_index == sealed[-1].last_index
        m = manifest(s3, "mid")
        assert m is not None
        assert_contiguous(m)
        assert (m.segments[0].first_index, m.segments[0].last_index) == (1, cut)
        resumed = m.segments[1]
        assert (resumed.first_index, resumed.last_index) == (cut + 1, first.last_index)
        raw = object_bytes(s3, resumed.key)
        head = fmt.decode_header("object", raw)
        assert head[0] == cut + 1 and head[1] == d.storage.term(cut)
        # The records are the WAL's bytes from the record of `cut + 1` on.
        offset = first.offsets[cut + 1 - first.first_index]
        assert raw[fmt.HEADER_SIZE :] == whole[offset:]
        entries = archived_entries(raw)
        assert entries == d.storage.entries(cut + 1, first.last_index + 1)
        for s in m.segments[2:]:  # the next ones whole again
            assert (
                object_bytes(s3, s.key)
                == Path(next(x.path for x in sealed if x.first_index == s.first_index)).read_bytes()
            )
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_a_deposed_leader_never_overwrites_a_later_terms_manifest(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    node = Node(node_settings(tmp_path, s3, creds, "stale", compact_every_operations=10**9))
    assert node.archiver is not None
    node.archiver.interval_s = 3600.0
    await node.start()
    try:
        await leader_of(node)
        await append(node, 40, "stale")
        later = Manifest(0, term=node.drivers[0].raft.term + 5, leader="n9")
        obstore.put(store(s3), "stale/p0/manifest.json", later.to_json())
        await node.archiver.pass_once()
        a = node.archiver.partitions[0]
        assert a.last_error is not None and "left to it" in a.last_error
        assert a.archived_index == 0 and node.drivers[0].archive_floor == 1
        assert manifest(s3, "stale") == later  # untouched
    finally:
        await node.close()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_store_down_appends_go_on_compaction_waits_then_catches_up(
    tmp_path: Path, creds: Path
) -> None:
    with S3Server(tmp_path / "s3b", buckets=(BUCKET,)) as s3b:
        creds.write_text(f"{s3b.access_key}\n{s3b.secret_key}\n")
        settings = node_settings(
            tmp_path, s3b, creds, "b", compact_every_operations=20, compact_number_entries=0
        )
        node = Node(settings)
        await node.start()
        try:
            await leader_of(node)
            d = node.drivers[0]
            assert node.archiver is not None
            a = node.archiver.partitions[0]
            await append(node, 60, "before")
            await until(lambda: a.archived_index > 0 and a.last_error is None, "archived")
            await append(node, 25, "more")  # the next snapshot compacts behind the archive
            await until(lambda: d.storage.first_index() > 1, "compaction behind the archive")
            s3b.stop(remove=False)
            await asyncio.sleep(0.3)  # a pass in flight finishes
            held = a.archived_index
            await append(node, 200, "down")  # appends go on
            await until(lambda: a.last_error is not None, "the error shown", timeout=30)
            async with TestClient(TestServer(build_app(node))) as client:
                part = (await (await client.get("/v1/status")).json())["partitions"][0]
                text = await (await client.get("/metrics")).text()
            assert part["archive"]["last_error"] and part["archive"]["archived_index"] == held
            assert part["archive"]["lag_entries"] == d.raft.commit - held > 150
            assert 'raftlog_archive_errors_total{partition="0"} 0.0' not in text
            # Snapshots went on, so compaction had every reason to pass the archive: it did not.
            assert d.storage.snapshot_meta().index > held + 100
            assert d.counters.snapshots_taken >= 5
            assert d.storage.first_index() <= held + 1
            s3b.start()  # the same data directory
            await until(
                lambda: (
                    a.last_error is None
                    and a.archived_index == d.storage.wal.sealed_segments()[-1].last_index
                ),
                "catching up",
                timeout=60,
            )
            assert a.archived_index > held + 150
            await append(node, 25, "after")  # the next snapshot compacts behind the archive
            await until(lambda: d.storage.first_index() > held + 1, "compaction again")
            m = manifest(s3b, "b")
            assert m is not None
            assert_contiguous(m)
            assert m.segments[0].first_index == 1 and m.archived_index >= a.archived_index - 0
            latest = m.latest_snapshot
            assert latest is not None and latest.index > held
            assert object_bytes(s3b, latest.key)[:4]  # the snapshot file is there
        finally:
            await node.close()


def http(cluster: LocalCluster, name: str, method: str, path: str, body: Any = None) -> Any:
    code, doc = cluster.request(
        name,
        method,
        path,
        json.dumps(body).encode() if body is not None else None,
        {"Content-Type": "application/json"},
        timeout=10,
    )
    assert code == 200, (code, doc)
    return doc


def wait(cond: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


@pytest.mark.slow
@pytest.mark.e2e
def test_a_new_leader_continues_the_same_manifest(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    env = {
        "RAFTLOG_SEGMENT_BYTES": "4096",
        "RAFTLOG_ARCHIVE_URL": f"s3://{BUCKET}/c",
        "RAFTLOG_ARCHIVE_ENDPOINT": s3.endpoint,
        "RAFTLOG_ARCHIVE_REGION": s3.region,
        "RAFTLOG_ARCHIVE_CREDENTIALS_FILE": str(creds),
        "RAFTLOG_ARCHIVE_INTERVAL_S": "0.2",
        **STEADY_ENV,  # the story names each manifest's leader, moved by transfers only
    }
    with LocalCluster(tmp_path / "cluster", replicas=3, durable=False, env=env) as cluster:
        cluster.wait_ready()
        first = cluster.leader(0)
        assert first is not None

        def write(leader: str, n: int, tag: str) -> int:
            last = 0
            for i in range(n):
                recs = [{"key": f"k{i % 7}", "value": f"{tag}-{i}-{j}" * 6} for j in range(4)]
                body = {"records": recs}
                last = http(cluster, leader, "POST", "/v1/partitions/0/records", body)["last_index"]
            return last

        write(first, 120, "one")
        m1 = wait(lambda: (m := manifest(s3, "c")) and len(m.segments) >= 3 and m, "a manifest")
        assert m1.leader == first
        # Every member keeps its own floor from the manifest it read, the followers included.
        for name in cluster.nodes:
            arch = wait(
                lambda name=name: (
                    (p := cluster.status(name)["partitions"][0]).get("archive")
                    and p["archive"]["archived_index"] > 0
                    and p["archive"]
                ),
                f"{name} reading the manifest",
            )
            assert arch["last_error"] is None
        second = next(n for n in cluster.nodes if n != first)
        http(cluster, first, "POST", "/v1/admin/partitions/0/transfer", {"target": second})
        wait(lambda: cluster.leader(0) == second, "the transfer")
        last = write(second, 120, "two")
        m2 = wait(
            lambda: (m := manifest(s3, "c")) and m.leader == second and m.archived_index > last - 60
            and m,
            "the new leader's uploads",
        )  # fmt: skip
        assert m2.term > m1.term
        assert_contiguous(m2)
        assert m2.segments[: len(m1.segments)] == m1.segments  # continued, not rewritten
        # The archived entries are exactly the committed log, read back through the API.
        entries = [e for s in m2.segments for e in archived_entries(object_bytes(s3, s.key))]
        assert [e.index for e in entries] == list(range(1, m2.archived_index + 1))
        served: dict[int, str] = {}
        start = 1
        while start <= m2.archived_index:
            page = http(cluster, second, "GET", f"/v1/partitions/0/records?from={start}&limit=1000")
            for r in page["records"]:
                if r["index"] <= m2.archived_index:
                    served[r["index"]] = r["value"]
            start = page["next"]
        normal = [e for e in entries if e.kind == EntryKind.NORMAL]
        assert len(normal) == len(served) >= 4 * (240 - 60)
        for e in normal:
            assert served[e.index].encode() in e.data
        # And back to the first leader, whose own view of the manifest is two terms old: it
        # reads it again and continues the second's.
        http(cluster, second, "POST", "/v1/admin/partitions/0/transfer", {"target": first})
        wait(lambda: cluster.leader(0) == first, "the transfer back")
        last = write(first, 60, "three")
        m3 = wait(
            lambda: (m := manifest(s3, "c")) and m.leader == first and m.archived_index > last - 60
            and m,
            "the first leader's uploads again",
        )  # fmt: skip
        assert m3.term > m2.term
        assert_contiguous(m3)
        assert m3.segments[: len(m2.segments)] == m2.segments
