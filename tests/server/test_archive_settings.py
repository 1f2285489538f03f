"""The continuous archive's settings (off by default, validated naming the field) and its
manifest (format, contiguity). The archive against a real S3 server: tests/s3/test_archive.py."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from raftlog.node.core.raft import Role
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership
from raftlog.node.server import archive
from raftlog.node.settings import NodeSettings
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
    with pytest.raises(ManifestError, match="first_index"):
        bad = {**doc, "segments": [{**doc["segments"][0], "first_index": -1}]}
        Manifest.from_json("k", json.dumps(bad).encode())


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

    class Driver:
        archive_floor = 1
        raft = types.SimpleNamespace(role=Role.LEADER, term=1, commit=commit, leader="n1")

        def __init__(self) -> None:
            self.storage = storage

        async def linearizable_point(self) -> int:
            return commit

    node = types.SimpleNamespace(drivers={0: Driver()}, id="n1")
    store = MemoryStore()
    a = archive.Archiver(node, store, "x", 3600)  # type: ignore[arg-type]
    periodic = await _archived_after(a, store, flush=False)
    assert periodic <= commit
    assert await a.flush(0) == commit
    m = Manifest.from_json("m", store.objects["x/p0/manifest.json"])
    assert m.archived_index == commit
    got = [e.index for s in m.segments for e in object_entries(s.key, store.objects[s.key])]
    assert got == list(range(1, commit + 1))  # every committed entry once, nothing above
    storage.close()


async def _archived_after(a: archive.Archiver, store: MemoryStore, flush: bool) -> int:
    await a.pass_once()
    raw = store.objects.get("x/p0/manifest.json")
    return Manifest.from_json("m", raw).archived_index if raw else 0
