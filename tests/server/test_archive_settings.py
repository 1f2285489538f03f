"""The continuous archive's settings (off by default, validated naming the field) and its
manifest (format, contiguity). The archive against a real S3 server: tests/s3/test_archive.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import types
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pydantic import ValidationError
from tests.server.helpers import LeadingDriver, archiving_node
from tests.storage.helpers import forged

from raftlog.node.core.errors import NotLeader
from raftlog.node.core.raft import Role
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from raftlog.node.server import archive, archive_reads, columnar, walpage
from raftlog.node.server.api_common import ApiError
from raftlog.node.settings import NodeSettings
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.archive_manifest import (
    ArchivedSegment,
    ArchivedSnapshot,
    Manifest,
    ManifestError,
    archived_index,
    manifest_key,
    segment_key,
    snapshot_key,
)
from raftlog.node.storage.archive_objects import object_entries
from raftlog.node.storage.durable import DurableStorage

SECRET = "s3cr3t-never-shown"


def settings(tmp_path: Path, **over: Any) -> NodeSettings:
    return NodeSettings(
        node_id="n1",
        peers={"n1": "http://127.0.0.1:7001"},
        data_dir=tmp_path,
        insecure_no_auth=True,
        **over,
    )


def test_archiving_is_off_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("RAFTLOG_ARCHIVE"):
            monkeypatch.delenv(name)
    s = settings(tmp_path)
    assert s.archive_url is None and s.archive_endpoint is None
    assert s.archive_credentials_file is None and s.archive_interval_s == 10.0


def test_url_and_endpoint_are_checked_naming_the_field(tmp_path: Path) -> None:
    s = settings(tmp_path, archive_url="s3://bucket/some/prefix/", archive_endpoint="http://h:1/")
    assert s.archive_url == "s3://bucket/some/prefix" and s.archive_endpoint == "http://h:1"
    assert settings(tmp_path, archive_url="s3://bucket").archive_url == "s3://bucket"
    for bad in ("bucket/prefix", "https://bucket/p", "s3:///prefix", "s3://b/p?x=1"):
        with pytest.raises(ValidationError, match="archive_url") as e:
            settings(tmp_path, archive_url=bad)
        assert "s3://bucket/prefix" in str(e.value)
    with pytest.raises(ValidationError, match="archive_endpoint"):
        settings(tmp_path, archive_url="s3://b/p", archive_endpoint="127.0.0.1:9000")
    with pytest.raises(ValidationError, match="archive_interval_s"):
        settings(tmp_path, archive_url="s3://b/p", archive_interval_s=0)
    with pytest.raises(
        ValidationError, match="archive_endpoint: set, but neither archive_url nor restore_url"
    ):
        settings(tmp_path, archive_endpoint="http://h:1")


def test_environment_names_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAFTLOG_ARCHIVE_URL", "s3://b/cluster-a")
    monkeypatch.setenv("RAFTLOG_ARCHIVE_INTERVAL_S", "2.5")
    monkeypatch.setenv("RAFTLOG_ARCHIVE_REGION", "eu-west-1")
    s = settings(tmp_path)
    assert (s.archive_url, s.archive_interval_s, s.archive_region) == (
        "s3://b/cluster-a",
        2.5,
        "eu-west-1",
    )


def test_credentials_from_a_file_of_two_lines_or_json_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    assert settings(tmp_path, archive_url="s3://b/p").archive_credentials() is None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    assert settings(tmp_path, archive_url="s3://b/p").archive_credentials() == (
        "env-key",
        "env-secret",
    )
    lines = tmp_path / "lines"
    lines.write_text(f"AKID\n{SECRET}\n")
    s = settings(tmp_path, archive_url="s3://b/p", archive_credentials_file=lines)
    assert s.archive_credentials() == ("AKID", SECRET)  # the file wins over the environment
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"access_key_id": "AKID2", "secret_access_key": SECRET}))
    s = settings(tmp_path, archive_url="s3://b/p", archive_credentials_file=doc)
    assert s.archive_credentials() == ("AKID2", SECRET)
    assert SECRET not in repr(s) and SECRET not in str(s.model_dump())


@pytest.mark.parametrize(
    "content",
    [f"only-one-line-{SECRET}\n", f"a\nb\n{SECRET}\n", '{"access_key_id": "k"}', "{not json"],
)
def test_a_bad_credentials_file_is_refused_naming_the_field_not_the_secret(
    tmp_path: Path, content: str
) -> None:
    f = tmp_path / "creds"
    f.write_text(content)
    with pytest.raises(ValidationError, match="archive_credentials_file") as e:
        settings(tmp_path, archive_url="s3://b/p", archive_credentials_file=f)
    assert SECRET not in str(e.value)
    with pytest.raises(ValidationError, match=r"archive_credentials_file: .* cannot be read"):
        settings(tmp_path, archive_url="s3://b/p", archive_credentials_file=tmp_path / "none")


def seg(first: int, last: int) -> ArchivedSegment:
    return ArchivedSegment(first, last, f"k{first}", 10, "00")


def snap(index: int) -> ArchivedSnapshot:
    return ArchivedSnapshot(index, 1, f"s{index}", 10, "00")


@pytest.mark.parametrize(
    ("segments", "snapshots", "expected"),
    [
        ([], [], 0),
        ([], [snap(40)], 0),
        ([seg(1, 10)], [], 10),
        ([seg(11, 20), seg(1, 10)], [], 20),  # in any order
        ([seg(1, 10), seg(11, 20), seg(31, 40)], [], 20),  # a gap stops it
        ([seg(1, 10), seg(11, 20), seg(31, 40)], [snap(29)], 20),  # not covered
        ([seg(1, 10), seg(11, 20), seg(31, 40)], [snap(30)], 40),  # bridged by the snapshot
        ([seg(5, 10), seg(11, 12)], [], 12),  # from the first archived entry
        ([seg(1, 10), seg(21, 30), seg(11, 20)], [], 30),  # in any order, a gap filled later
        ([seg(1, 20), seg(5, 10), seg(21, 25)], [], 25),  # one within another lowers nothing
    ],
)
def test_archived_index_is_contiguous_from_the_first_archived_entry(
    segments: list[ArchivedSegment], snapshots: list[ArchivedSnapshot], expected: int
) -> None:
    assert archived_index(segments, snapshots) == expected


def test_manifest_round_trip_and_refusals() -> None:
    m = Manifest(3, term=7, leader="n2", segments=[seg(1, 10), seg(11, 20)], snapshots=[snap(9)])
    doc = json.loads(m.to_json())
    assert doc["format"] == 1 and doc["archived_index"] == 20 and doc["partition"] == 3
    assert doc["segments"][1] == {
        "first_index": 11,
        "last_index": 20,
        "key": "k11",
        "bytes": 10,
        "sha256": "00",
    }
    assert doc["snapshots"] == [{"index": 9, "term": 1, "key": "s9", "bytes": 10, "sha256": "00"}]
    back = Manifest.from_json("k", m.to_json())
    assert back == m and back.archived_index == 20
    with pytest.raises(ManifestError, match="k: format 2, this node reads 1"):
        Manifest.from_json("k", json.dumps({**doc, "format": 2}).encode())
    with pytest.raises(ManifestError, match="k: not a manifest"):
        Manifest.from_json("k", b"{")
    with pytest.raises(ManifestError, match="k: not a JSON object"):
        Manifest.from_json("k", b"[]")
    with pytest.raises(ManifestError, match="first_index"):
        bad = {**doc, "segments": [{**doc["segments"][0], "first_index": -1}]}
        Manifest.from_json("k", json.dumps(bad).encode())


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"format": None}, "^k: format None, this node reads 1$"),
        ({"segments": 7}, "^k: not a manifest \\(TypeError"),
        ({"partition": True}, "partition: True is not"),
        ({"term": 1.5}, "term: 1.5 is not"),
        ({"segments": [{"first_index": 1, "last_index": 2, "bytes": 3, "sha256": "00"}]}, "key"),
    ],
)
def test_a_manifest_with_a_field_missing_or_of_another_type_is_refused(
    change: dict[str, Any], why: str
) -> None:
    doc = {**json.loads(Manifest(0, term=1, leader="n1").to_json()), **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(ManifestError, match=why):
        Manifest.from_json("k", json.dumps(doc).encode())


def test_a_manifest_refused_for_a_field_names_its_key() -> None:
    doc = {**json.loads(Manifest(0).to_json()), "term": -1}
    with pytest.raises(ManifestError, match=r"^x/p0/manifest\.json: "):
        Manifest.from_json("x/p0/manifest.json", json.dumps(doc).encode())


def test_a_manifest_read_lists_its_objects_by_index_and_its_latest_snapshot() -> None:
    """Whatever order the JSON lists them in: the first archived entry is the first segment's,
    and the latest snapshot (the one a leader's next snapshot must be newer than) the one of
    the highest index, not the first listed nor the one of the highest term."""
    m = Manifest(0, term=2, segments=[seg(11, 20), seg(1, 10)], snapshots=[snap(30), snap(9)])
    back = Manifest.from_json("k", m.to_json())
    assert [s.first_index for s in back.segments] == [1, 11]
    assert back.latest_snapshot == snap(30)
    assert Manifest(0, snapshots=[snap(9), snap(30), snap(12)]).latest_snapshot == snap(30)


def test_keys_sort_by_index() -> None:
    assert manifest_key("a/b", 2) == "a/b/p2/manifest.json"
    assert manifest_key("", 0) == "p0/manifest.json"
    assert segment_key("x", 0, 9, 10, "f" * 64) < segment_key("x", 0, 11, 100, "0" * 64)
    assert (
        segment_key("x", 0, 1, 2, "ab" * 32)
        == "x/p0/segments/00000000000000000001-00000000000000000002-abababababababab.wal"
    )
    assert snapshot_key("x", 1, 5, 2, "cd" * 32).endswith(
        "p1/snapshots/00000000000000000005-00000000000000000002-cdcdcdcdcdcdcdcd.snap"
    )
    # Other bytes for the same range: another key, so a named object is never replaced.
    assert segment_key("x", 0, 1, 2, "ab" * 32) != segment_key("x", 0, 1, 2, "ac" * 32)


# ---------------------------------------------------------------- a store call that never ends
class Stubborn:
    """Object store calls that do not end, not even once cancelled (as one obstore GET was once
    seen not to), until `release`d: the test's loop must be able to close."""

    def __init__(self) -> None:
        self.released = False

    async def call(self) -> bytes:
        while not self.released:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue
        raise asyncio.CancelledError

    async def put(self, key: str, data: bytes) -> None:
        await self.call()

    async def get(self, key: str) -> bytes | None:
        return await self.call()


@pytest.mark.asyncio
async def test_a_store_call_that_never_ends_is_a_timeout_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(archive, "CALL_S", 0.2)
    stuck = Stubborn()
    try:
        # Bounded by the test too: without the bound, the call would hold it for good.
        with pytest.raises(TimeoutError, match=r"p0/manifest\.json: no answer from the object"):
            await asyncio.wait_for(archive._bounded(stuck.call(), "p0/manifest.json"), 30)
    finally:
        stuck.released = True


@pytest.mark.asyncio
async def test_closing_the_archiver_never_waits_on_a_stuck_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Driver:
        archive_floor = 1
        raft = types.SimpleNamespace(role=Role.FOLLOWER)

    node = types.SimpleNamespace(drivers={0: Driver()})
    monkeypatch.setattr(archive, "CLOSE_S", 0.2)
    stuck = Stubborn()
    a = archive.Archiver(node, stuck, "x", 0.05)  # type: ignore[arg-type]
    a.start()
    try:
        await asyncio.sleep(0.1)  # the pass is in the stuck GET
        await asyncio.wait_for(a.close(), 30)  # without the bound, close would hold it for good
        assert a._task is not None and not a._task.done()  # left behind, still stuck
    finally:
        stuck.released = True


# ---------------------------------------------------------------- a flush cuts at the commit index
class MemoryStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    async def get(self, key: str) -> bytes | None:
        return self.objects.get(key)

    def manifest(self) -> Manifest:
        """The manifest of partition 0 under the prefix "x", as written."""
        return Manifest.from_json("m", self.objects["x/p0/manifest.json"])


@pytest.mark.asyncio
@pytest.mark.parametrize("commit", [5, 37, 58, 60])
async def test_a_flush_archives_exactly_up_to_the_commit_index_across_sealed_segments(
    tmp_path: Path, commit: int
) -> None:
    """Segments are sealed by size, not by commit: a sealed segment may reach past the commit
    index (a leader's uncommitted tail). A flush archives its committed part too, and what
    follows the commit index never (the periodic pass only takes whole committed segments)."""
    storage = DurableStorage(
        str(tmp_path / "p0"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    entries = [Entry(i, 1, EntryKind.NORMAL, b"x" * 40) for i in range(1, 61)]
    storage.save(HardState(1, None, commit), entries)
    assert len(storage.wal.sealed_segments()) >= 3
    assert any(s.first_index <= commit < s.last_index for s in storage.wal.sealed_segments()) or (
        commit >= storage.wal.active_segment().first_index
    )

    d = LeadingDriver(storage, commit)

    node = archiving_node(d)
    store = MemoryStore()
    a = archive.Archiver(node, store, "x", 3600)
    periodic = await _archived_after(a, store, flush=False)
    assert periodic <= commit
    assert await a.flush(0) == commit
    m = store.manifest()
    assert m.archived_index == commit
    got = [e.index for s in m.segments for e in object_entries(s.key, store.objects[s.key])]
    assert got == list(range(1, commit + 1))  # every committed entry once, nothing above
    storage.close()


async def _archived_after(a: archive.Archiver, store: MemoryStore, flush: bool) -> int:
    await a.pass_once()
    raw = store.objects.get("x/p0/manifest.json")
    return Manifest.from_json("m", raw).archived_index if raw else 0


# ---------------------------------------------------------------- tiered reads, in memory
# `server/archive_reads.py` over an archive held in memory: the journeys through a node's HTTP
# routes against the real S3 server are in tests/s3/test_tiered_reads.py.
async def archive_of(tmp_path: Path, n: int) -> tuple[MemoryStore, list[Entry]]:
    """A one-partition archive (prefix "x") of `n` entries, each naming its index, committed in
    batches of 7 (so the objects hold commit records between entries) and flushed."""
    storage = DurableStorage(
        str(tmp_path / "src"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    entries = [Entry(i, 1, EntryKind.NORMAL, b"%05d" % i + b"x" * 35) for i in range(1, n + 1)]
    for lo in range(0, n, 7):
        storage.save(HardState(1, None, min(lo + 7, n)), entries[lo : lo + 7])

    d = LeadingDriver(storage, n)

    store = MemoryStore()
    a = archive.Archiver(archiving_node(d), store, "x", 3600)
    assert await a.flush(0) == n
    storage.close()
    return store, entries


class Partition:
    """What the tiered reads see of a partition's driver and node: its floor and its mark."""

    def __init__(self, store: MemoryStore, floor: int, commit: int) -> None:
        self.p = 0
        self.raft = types.SimpleNamespace(
            commit=commit, log=types.SimpleNamespace(first_index=lambda: floor)
        )
        self.high_water_mark = commit  # the mark readers are shown
        self.storage = types.SimpleNamespace(
            compaction_floor=lambda: floor,
            snapshot_meta=lambda: types.SimpleNamespace(index=floor - 1),
        )
        self.node = types.SimpleNamespace(
            settings=types.SimpleNamespace(
                archive_url="s3://b/x", archive_endpoint=None, archive_region=None
            ),
            drivers={0: self},
        )
        self.node.archiver = archive.Archiver(self.node, store, "x", 3600)  # type: ignore[arg-type]
        self.reader = archive_reads.of(self.node.archiver)

    async def read(self, start: int, end: int, limit: int = 1000, max_bytes: int = 1 << 20) -> Any:
        return await self.reader.entries(self, start, end, limit, max_bytes)  # type: ignore[arg-type]

    async def below_floor(self, start: int, stop: int = 10**9, limit: int = 1000) -> Any:
        return await archive_reads.entries_below_floor(
            self.node,  # type: ignore[arg-type]
            self,  # type: ignore[arg-type]
            start,
            stop,
            limit,
            1 << 20,
            self.raft.commit,
        )


def stored_manifest(store: MemoryStore) -> Manifest:
    return store.manifest()


@pytest.mark.asyncio
async def test_archived_entries_read_back_within_their_bounds_across_objects(
    tmp_path: Path,
) -> None:
    store, entries = await archive_of(tmp_path, 60)
    assert len(stored_manifest(store).segments) >= 4
    part = Partition(store, floor=61, commit=60)
    assert await part.read(1, 61) == entries  # every entry once, in order, across objects
    assert await part.read(3, 50, limit=10) == entries[2:12]
    assert await part.read(5, 50, max_bytes=1) == [entries[4]]  # at least one
    three = sum(e.size for e in entries[4:7])
    assert await part.read(5, 50, max_bytes=three) == entries[4:7]  # about max_bytes: at most
    assert await part.read(5, 5) == []
    with pytest.raises(LookupError):
        await part.read(61, 70)  # not archived


@pytest.mark.asyncio
async def test_a_read_that_ends_at_an_object_boundary_never_gets_the_next_object(
    tmp_path: Path,
) -> None:
    """A read ends at `end` or after `limit` entries: the object after that is not its to GET
    (here it is damaged: a read that went on to it would fail for what it never serves)."""
    store, entries = await archive_of(tmp_path, 60)
    first, second = stored_manifest(store).segments[:2]
    store.objects[second.key] = b"damaged"
    part = Partition(store, floor=61, commit=60)
    upto = entries[: first.last_index]
    assert await part.read(1, first.last_index + 1) == upto
    assert await part.read(1, 61, limit=first.last_index) == upto
    with pytest.raises(archive_reads.ArchiveCorrupt):
        await part.read(1, 61)


def named(store: MemoryStore, segments: list[ArchivedSegment]) -> None:
    """The archive's manifest made to name `segments`."""
    m = stored_manifest(store)
    m.segments = segments
    store.objects["x/p0/manifest.json"] = m.to_json()


@pytest.mark.asyncio
async def test_an_object_that_is_not_the_one_the_manifest_names_is_never_served(
    tmp_path: Path,
) -> None:
    store, _ = await archive_of(tmp_path, 60)
    real = stored_manifest(store).segments
    s0, s1, s2 = real[:3]

    async def refused(segments: list[ArchivedSegment], start: int, why: str) -> None:
        named(store, segments)
        part = Partition(store, floor=61, commit=60)
        with pytest.raises(archive_reads.ArchiveCorrupt, match=why):
            await part.read(start, 61)

    # Fewer entries than named (its size and digest right): the next ones are not skipped.
    wide = ArchivedSegment(s0.first_index, s1.last_index, s0.key, s0.bytes, s0.sha256)
    await refused([wide, *real[2:]], 1, f"the manifest names 1..{s1.last_index}")
    # Entries from further on than named, up to the named last one.
    late = ArchivedSegment(s1.first_index - 3, s1.last_index, s1.key, s1.bytes, s1.sha256)
    await refused([late, *real[2:]], late.first_index, f"holds entries {s1.first_index}..")
    # Other bytes than the digest named, every record's checksum sound.
    store.objects[s2.key] = forged(store.objects[s2.key])
    await refused(real, s2.first_index, "sha256 differs")
    # A named object missing: corrupt, not compacted (a 410 would read as data loss).
    del store.objects[s2.key]
    await refused(real, s2.first_index, "named by the manifest, but not in the store")
    # A manifest that is not one.
    store.objects["x/p0/manifest.json"] = b"{"
    part = Partition(store, floor=61, commit=60)
    with pytest.raises(archive_reads.ArchiveCorrupt, match="not a manifest"):
        await part.read(1, 61)


@pytest.mark.asyncio
async def test_a_cached_manifest_is_read_again_when_it_does_not_hold_the_index(
    tmp_path: Path,
) -> None:
    store, entries = await archive_of(tmp_path, 60)
    full = store.objects["x/p0/manifest.json"]
    segments = stored_manifest(store).segments
    named(store, segments[:2])  # the archive as it was earlier
    part = Partition(store, floor=61, commit=60)
    assert await part.read(1, 3) == entries[:2]
    store.objects["x/p0/manifest.json"] = full  # it grew since
    last = segments[-1].last_index
    assert await part.read(last, last + 1) == [entries[last - 1]]


@pytest.mark.asyncio
async def test_below_the_floor_reads_stop_at_the_floor_and_the_mark(tmp_path: Path) -> None:
    store, entries = await archive_of(tmp_path, 60)
    # The floor below what is archived: the read stops at it (the WAL serves from there).
    assert await Partition(store, floor=40, commit=60).below_floor(30) == entries[29:39]
    # This replica's mark below what is archived: never above it.
    assert await Partition(store, floor=61, commit=45).below_floor(30) == entries[29:45]
    assert await Partition(store, floor=61, commit=60).below_floor(30, stop=33) == entries[29:32]
    # Below what the archive holds: 410, naming what it holds.
    named(store, stored_manifest(store).segments[1:])
    part = Partition(store, floor=61, commit=60)
    first = stored_manifest(store).segments[0].first_index
    with pytest.raises(ApiError) as gone:
        await part.below_floor(first - 1)
    assert gone.value.status == 410
    assert gone.value.body["archived_first_index"] == first
    assert gone.value.body["archived_index"] == 60
    assert f"holds {first}..60" in gone.value.body["reason"]


@pytest.mark.asyncio
async def test_a_read_refused_for_a_bad_manifest_reads_it_again_once_it_is_repaired(
    tmp_path: Path,
) -> None:
    """A manifest that named the wrong object: 502, and the next read reads the manifest again
    (not the cached one) and is served once it is right again."""
    store, entries = await archive_of(tmp_path, 60)
    full = store.objects["x/p0/manifest.json"]
    real = stored_manifest(store).segments
    s1, s2 = real[1], real[2]
    swapped = ArchivedSegment(s1.first_index, s1.last_index, s2.key, s2.bytes, s2.sha256)
    named(store, [real[0], swapped, *real[2:]])
    part = Partition(store, floor=61, commit=60)
    with pytest.raises(ApiError) as bad:
        await part.below_floor(s1.first_index)
    assert bad.value.status == 502 and bad.value.body["key"] == s2.key
    store.objects["x/p0/manifest.json"] = full
    got = await part.below_floor(s1.first_index, stop=s1.last_index + 1)
    assert got == entries[s1.first_index - 1 : s1.last_index]
    assert part.reader.counters(0).errors == 1


class Down(MemoryStore):
    async def get(self, key: str) -> bytes | None:
        raise ConnectionRefusedError("the store is down")


@pytest.mark.asyncio
async def test_a_store_that_cannot_be_read_is_503_and_counted(tmp_path: Path) -> None:
    part = Partition(Down(), floor=61, commit=60)
    with pytest.raises(ApiError) as down:
        await part.below_floor(1)
    assert down.value.status == 503 and down.value.body["error"] == "archive_unavailable"
    assert "the store is down" in down.value.body["reason"]
    assert part.reader.counters(0).errors == 1


@pytest.mark.parametrize(
    ("archived", "first", "floor", "readable"),
    [
        (0, 0, 1, 1),  # nothing archived, nothing compacted
        (0, 0, 50, 50),  # nothing archived: the floor
        (49, 1, 50, 1),  # the archive reaches the floor: from its first entry
        (30, 1, 50, 50),  # entries between the archive and the floor: from the floor
        (70, 60, 50, 50),  # the archive begins above the floor
    ],
)
def test_a_member_serves_from_the_archives_first_entry_when_it_reaches_the_floor(
    archived: int, first: int, floor: int, readable: int
) -> None:
    st = archive.PartitionArchive(archived_index=archived, first_index=first)
    assert st.readable_from(floor) == readable


def test_the_archive_lag_is_never_below_zero() -> None:
    """A member whose mark is below what the manifest it read reaches (a follower behind)."""
    st = archive.PartitionArchive(archived_index=20, first_index=1)
    assert st.as_json(10)["lag_entries"] == 0
    assert st.as_json(25)["lag_entries"] == 5


@pytest.mark.asyncio
async def test_a_followers_pass_holds_compaction_at_what_the_manifest_names_archived(
    tmp_path: Path,
) -> None:
    store, _ = await archive_of(tmp_path, 60)
    named(store, stored_manifest(store).segments[1:])  # the archive begins above 1
    first = stored_manifest(store).segments[0].first_index

    class Follower:
        archive_floor = 0
        raft = types.SimpleNamespace(role=Role.FOLLOWER)

    d = Follower()
    a = archive.Archiver(types.SimpleNamespace(drivers={0: d}, id="n2"), store, "x", 3600)  # type: ignore[arg-type]
    assert d.archive_floor == 1  # nothing known yet: nothing compacted
    await a.pass_once()
    st = a.partitions[0]
    assert (st.archived_index, st.first_index, st.last_error) == (60, first, None)
    assert d.archive_floor == 61  # compaction never takes an entry the store does not hold


@pytest.mark.asyncio
async def test_a_wal_page_below_the_floor_is_bounded_as_one_from_the_wal_and_says_what_is_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, entries = await archive_of(tmp_path, 60)
    part = Partition(store, floor=61, commit=60)

    async def page(start: int, limit: int, max_bytes: int) -> dict[str, Any]:
        body, kind = await archive_reads.page_below_floor(
            part.node,  # type: ignore[arg-type]
            part,  # type: ignore[arg-type]
            "wal",
            start,
            61,
            limit,
            max_bytes,
        )
        assert kind == walpage.CONTENT_TYPE
        doc: dict[str, Any] = msgspec.msgpack.decode(body)
        return doc

    got = await page(10, 5, 1 << 20)
    assert (got["first"], got["next"], got["high_water_mark"], got["compaction_floor"]) == (
        10,
        15,
        60,
        61,
    )
    assert got["records"] == b"".join(fmt.encode_entry(e) for e in entries[9:14])
    counters = part.reader.counters(0)
    assert (counters.reads, counters.entries, counters.errors) == (1, 5, 0)
    # Never more than a page from the WAL may hold, whatever `max_bytes` asks.
    monkeypatch.setattr(columnar, "MAX_PAGE_BYTES", sum(e.size for e in entries[:3]))
    assert (await page(10, 50, 64 << 20))["next"] == 13


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []

    async def put(self, key: str, data: bytes) -> None:
        self.puts.append(key)
        await super().put(key, data)


@pytest.mark.asyncio
async def test_a_snapshot_is_archived_once_with_its_index_and_term(tmp_path: Path) -> None:
    """No snapshot, none archived; one taken, archived once under its index and term; a pass
    with nothing new writes nothing (not even the manifest)."""
    storage = DurableStorage(
        str(tmp_path / "p0"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    entries = [Entry(i, 1 if i <= 20 else 3, EntryKind.NORMAL, b"x" * 40) for i in range(1, 61)]
    storage.save(HardState(3, None, 60), entries)

    d = LeadingDriver(storage, 60, term=3)

    store = CountingStore()
    a = archive.Archiver(archiving_node(d), store, "x", 3600)
    try:
        assert await a.flush(0) == 60
        assert stored_manifest(store).snapshots == []
        storage.create_snapshot(SnapshotMeta(30, 3, Membership.of(["n1"])), b"state at 30")
        await a.pass_once()
        (snap,) = stored_manifest(store).snapshots
        assert (snap.index, snap.term) == (30, 3)
        assert snap.key.startswith("x/p0/snapshots/00000000000000000030-00000000000000000003-")
        written = list(store.puts)
        await a.pass_once()
        await a.pass_once()
        assert store.puts == written  # nothing new: nothing uploaded, no manifest written
        m = stored_manifest(store)
        assert len(m.snapshots) == 1
        uploaded = sum(s.bytes for s in m.segments) + sum(s.bytes for s in m.snapshots)
        assert a.partitions[0].uploaded_bytes == uploaded
    finally:
        storage.close()


@pytest.mark.asyncio
async def test_a_pass_archives_every_sealed_segment_up_to_one_ending_at_the_commit_index(
    tmp_path: Path,
) -> None:
    storage = DurableStorage(
        str(tmp_path / "p0"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    storage.save(
        HardState(1, None, 0), [Entry(i, 1, EntryKind.NORMAL, b"x" * 40) for i in range(1, 61)]
    )
    sealed = storage.wal.sealed_segments()
    commit = sealed[1].last_index  # the second sealed segment's last entry
    storage.save(HardState(1, None, commit), [])

    d = LeadingDriver(storage, commit)

    store = MemoryStore()
    a = archive.Archiver(archiving_node(d), store, "x", 3600)
    try:
        await a.pass_once()
        m = stored_manifest(store)
        assert [(s.first_index, s.last_index) for s in m.segments] == [
            (s.first_index, s.last_index) for s in sealed[:2]
        ]
        assert a.partitions[0].archived_index == commit and d.archive_floor == commit + 1
        # Everything committed: the pass takes the sealed segments, never the active one
        # (its records may still change; a flush takes them).
        storage.save(HardState(1, None, 60), [])
        d.raft.commit = 60
        await a.pass_once()
        last_sealed = storage.wal.sealed_segments()[-1].last_index
        assert stored_manifest(store).archived_index == last_sealed < 60
    finally:
        storage.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("cut", ["first", "last but one"])
async def test_a_flush_cut_at_any_entry_of_a_segment_then_the_rest_archive_each_entry_once(
    tmp_path: Path, cut: str
) -> None:
    """A flush whose commit index is a sealed segment's first entry (its one committed entry)
    or its last but one (the next object holds the segment's last entry alone)."""
    storage = DurableStorage(
        str(tmp_path / "p0"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    terms = {i: 1 + i // 4 for i in range(61)}  # a term for every few entries
    storage.save(
        HardState(16, None, 0),
        [Entry(i, terms[i], EntryKind.NORMAL, b"x" * 40) for i in range(1, 61)],
    )
    seg = storage.wal.sealed_segments()[1]
    first_commit = seg.first_index if cut == "first" else seg.last_index - 1
    storage.save(HardState(16, None, first_commit), [])

    d = LeadingDriver(storage, first_commit, term=16)

    store = MemoryStore()
    a = archive.Archiver(archiving_node(d), store, "x", 3600)
    try:
        assert await a.flush(0) == first_commit
        storage.save(HardState(16, None, 60), [])
        d.raft.commit = 60
        assert await a.flush(0) == 60
        m = stored_manifest(store)
        got = [e.index for s in m.segments for e in object_entries(s.key, store.objects[s.key])]
        assert got == list(range(1, 61))
        assert len(m.segments) > len(storage.wal.sealed_segments())  # some cut mid-segment
        for s in m.segments:
            raw = store.objects[s.key]
            assert s.key == segment_key("x", 0, s.first_index, s.last_index, s.sha256)
            # Each object's header: its first entry and the term of the entry below it.
            first, prev_term, _ = fmt.decode_header(s.key, raw)
            assert (first, prev_term) == (
                s.first_index,
                terms[s.first_index - 1] if s.first_index > 1 else 0,
            )
    finally:
        storage.close()


@pytest.mark.asyncio
async def test_a_gap_in_the_log_is_bridged_by_the_snapshot_just_below_it(tmp_path: Path) -> None:
    """Entries compacted before they were archived (archiving stalled), the log now beginning
    right after a snapshot: the snapshot, then the log from there, archived; the archive
    reaches its end through the snapshot."""
    storage = DurableStorage(
        str(tmp_path / "p0"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    storage.save(
        HardState(1, None, 0), [Entry(i, 1, EntryKind.NORMAL, b"x" * 40) for i in range(1, 61)]
    )
    sealed = storage.wal.sealed_segments()
    storage.save(HardState(1, None, sealed[0].last_index), [])

    d = LeadingDriver(storage, sealed[0].last_index)

    store = MemoryStore()
    a = archive.Archiver(archiving_node(d), store, "x", 3600)
    try:
        await a.pass_once()
        assert stored_manifest(store).archived_index == sealed[0].last_index
        below = sealed[2].first_index - 1
        storage.save(HardState(1, None, 60), [])
        d.raft.commit = 60
        storage.create_snapshot(SnapshotMeta(below, 1, Membership.of(["n1"])), b"state")
        storage.compact(below + 1)
        assert storage.wal.sealed_segments()[0].first_index == below + 1
        await a.pass_once()
        assert a.partitions[0].last_error is None
        m = stored_manifest(store)
        assert [s.index for s in m.snapshots] == [below]
        assert [s.first_index for s in m.segments][:2] == [1, below + 1]
        last_sealed = storage.wal.sealed_segments()[-1].last_index
        assert m.archived_index == last_sealed
    finally:
        storage.close()


def leader_over(tmp_path: Path, commit: int, point: int) -> tuple[DurableStorage, Any]:
    """A leader's driver over 60 entries of term 2 committed up to `commit`, whose read point
    (what a quorum confirms) is `point`."""
    storage = DurableStorage(
        str(tmp_path / "p0"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    storage.save(
        HardState(2, None, commit),
        [Entry(i, 2, EntryKind.NORMAL, b"x" * 40) for i in range(1, 61)],
    )

    d = LeadingDriver(storage, commit, term=2, point=point)

    return storage, d


@pytest.mark.asyncio
async def test_a_flush_below_the_read_point_fails_rather_than_answer_a_lower_point(
    tmp_path: Path,
) -> None:
    """The read point above what this member could archive (its leadership moved meanwhile):
    a backup point must cover every record acknowledged before the call, so no point."""
    storage, d = leader_over(tmp_path, commit=40, point=41)
    a = archive.Archiver(types.SimpleNamespace(drivers={0: d}, id="n1"), MemoryStore(), "x", 3600)  # type: ignore[arg-type]
    try:
        with pytest.raises(RuntimeError, match="archived up to 40, below the read point 41"):
            await a.flush(0)
        assert a.partitions[0].last_error is not None
    finally:
        storage.close()


@pytest.mark.asyncio
async def test_a_segment_file_missing_from_the_log_is_named_not_passed_over(
    tmp_path: Path,
) -> None:
    """A segment still in this member's log whose file is gone (deleted by hand, a damaged
    disk): the flush fails naming the file, rather than stop as if nothing were left and
    leave only "archived up to 0" to go on."""
    storage, d = leader_over(tmp_path, commit=40, point=40)
    first = storage.wal.sealed_segments()[0]
    os.unlink(first.path)
    a = archive.Archiver(types.SimpleNamespace(drivers={0: d}, id="n1"), MemoryStore(), "x", 3600)  # type: ignore[arg-type]
    try:
        with pytest.raises(RuntimeError, match=f"segment file {re.escape(first.path)} "):
            await a.flush(0)
        assert "is missing from this member's log" in (a.partitions[0].last_error or "")
    finally:
        storage.close()


@pytest.mark.asyncio
async def test_a_leader_never_writes_over_a_manifest_written_during_its_pass(
    tmp_path: Path,
) -> None:
    """Another leader (of the same term: the previous pass of this one, or of a later term)
    writes the manifest while this pass uploads: the pass leaves it as it is."""

    class Racing(MemoryStore):
        def __init__(self, other: Manifest) -> None:
            super().__init__()
            self.other = other

        async def put(self, key: str, data: bytes) -> None:
            await super().put(key, data)
            if "/segments/" in key and "x/p0/manifest.json" not in self.objects:
                self.objects["x/p0/manifest.json"] = self.other.to_json()

    for term in (2, 3):
        other = Manifest(0, term=term, leader="n9", segments=[seg(1, 3)])
        store = Racing(other)
        storage, d = leader_over(tmp_path / str(term), commit=60, point=60)
        a = archive.Archiver(types.SimpleNamespace(drivers={0: d}, id="n1"), store, "x", 3600)  # type: ignore[arg-type]
        try:
            with pytest.raises((archive.ManifestChanged, archive.StaleLeader)):
                await a.flush(0)
            assert stored_manifest(store) == other
        finally:
            storage.close()


@pytest.mark.asyncio
async def test_a_leader_of_the_same_term_continues_its_own_manifest(tmp_path: Path) -> None:
    storage, d = leader_over(tmp_path, commit=30, point=30)
    store = MemoryStore()
    a = archive.Archiver(types.SimpleNamespace(drivers={0: d}, id="n1"), store, "x", 3600)  # type: ignore[arg-type]
    try:
        assert await a.flush(0) == 30
        storage.save(HardState(2, None, 60), [])
        d.raft.commit = 60
        await a.pass_once()
        assert a.partitions[0].last_error is None
        m = stored_manifest(store)
        assert (m.term, m.leader) == (2, "n1")
        assert m.archived_index == storage.wal.sealed_segments()[-1].last_index
    finally:
        storage.close()


def test_an_archive_url_is_a_bucket_and_a_prefix_without_slashes_at_its_ends() -> None:
    assert archive.split_archive_url("s3://b/x/y/") == ("b", "x/y")
    assert archive.split_archive_url("s3://b") == ("b", "")


@pytest.mark.asyncio
async def test_an_archive_error_is_shown_until_a_pass_succeeds_and_a_follower_never_flushes(
    tmp_path: Path,
) -> None:
    class Flaky(MemoryStore):
        down = True

        async def get(self, key: str) -> bytes | None:
            if self.down:
                raise ConnectionRefusedError("the store is down")
            return await super().get(key)

    class Follower:
        archive_floor = 0
        raft = types.SimpleNamespace(role=Role.FOLLOWER, leader="n1")

    store = Flaky()
    a = archive.Archiver(types.SimpleNamespace(drivers={0: Follower()}, id="n2"), store, "x", 3600)  # type: ignore[arg-type]
    await a.pass_once()
    st = a.partitions[0]
    assert st.last_error == "ConnectionRefusedError: the store is down" and st.errors == 1
    store.down = False
    await a.pass_once()
    assert st.last_error is None and st.errors == 1
    with pytest.raises(NotLeader):
        await a.flush(0)
