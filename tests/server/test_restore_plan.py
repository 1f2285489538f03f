"""Restore from an archive held in memory (`server/restore.py`), without an S3 server: what a
restored partition holds on disk (the archived entries up to the index, committed; a snapshot
there and one membership entry after it, both naming the new voters), which partitions a member
counts as held, and the time targets that cannot be placed. The journeys against the real S3
server are in tests/s3/test_backup_restore.py and tests/s3/test_local_restore.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.server.helpers import LeadingDriver, archiving_node
from tests.server.test_archive_settings import MemoryStore
from tests.storage.helpers import forged

from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from raftlog.node.record import Record, encode_record
from raftlog.node.server import archive, restore
from raftlog.node.server.restore_target import Target, check_backup_name, parse_target
from raftlog.node.settings import NodeSettings
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.archive_manifest import ArchivedSegment, ArchivedSnapshot
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.errors import WalCorruption


async def archived(tmp_path: Path, entries: list[Entry], commit: int, *then: int) -> MemoryStore:
    """A one-partition archive (prefix "x") of `entries`, flushed up to `commit` (then up to
    each of `then`, the commit index moved there)."""
    storage = DurableStorage(
        str(tmp_path / "src"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    storage.save(HardState(1, None, commit), entries)

    d = LeadingDriver(storage, commit)

    store = MemoryStore()
    a = archive.Archiver(archiving_node(d), store, "x", 3600)
    for c in (commit, *then):
        storage.save(HardState(1, None, c), [])
        d.raft.commit = c
        assert await a.flush(0) == c
    storage.close()
    return store


def blobs(n: int) -> list[Entry]:
    return [Entry(i, 1, EntryKind.NORMAL, b"x" * 40) for i in range(1, n + 1)]


@pytest.mark.asyncio
async def test_a_restored_partition_is_the_archived_log_then_the_new_voters(
    tmp_path: Path,
) -> None:
    store = await archived(tmp_path, blobs(60), 60)
    path = str(tmp_path / "dst" / "p0")
    (tmp_path / "dst").mkdir()
    done = await restore.restore_partition(store, "x", 0, 45, path, ["a", "b", "c"])
    assert (done.index, done.first_index, done.entries) == (45, 1, 45)
    s = DurableStorage(path, durable=False)
    try:
        hs, snap = s.initial_state()
        assert (snap.index, hs.commit) == (45, 45)
        assert snap.membership == Membership.of(["a", "b", "c"])
        assert [e.data for e in s.entries(1, 46)] == [b"x" * 40] * 45
        # One entry after the restored log: the new voters, not committed yet.
        assert s.last_index() == 46
        (config,) = s.entries(46, 47)
        assert config.kind == EntryKind.CONFIG
        assert Membership.decode(config.data) == Membership.of(["a", "b", "c"])
    finally:
        s.close()
    assert restore._holds(path)
    # A member's first start holds nothing yet: an empty directory is not a partition.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not restore._holds(str(empty))
    assert not restore._holds(str(tmp_path / "absent"))


@pytest.mark.asyncio
async def test_a_time_target_is_refused_where_no_record_carries_a_time(tmp_path: Path) -> None:
    store = await archived(tmp_path, blobs(30), 30)
    with pytest.raises(restore.RestoreError, match="partition 0: no archived record carries"):
        await restore.resolve(store, "x", 1, Target("time", time_ms=10**12))


@pytest.mark.asyncio
async def test_a_time_target_cuts_before_the_first_record_stamped_after_it(
    tmp_path: Path,
) -> None:
    # Stamps not rising with the index: the cut is before the first one after the time.
    stamps = [100, 300, 200, 250, 400, 150, 500]
    entries = [
        Entry(i + 1, 1, EntryKind.NORMAL, encode_record(Record(None, b"v", {}, t)))
        for i, t in enumerate(stamps)
    ]
    store = await archived(tmp_path, entries, len(entries))
    got = await restore.resolve(store, "x", 1, Target("time", time_ms=260))
    assert got == {0: 1}  # index 2 (300) is the first after 260
    assert await restore.resolve(store, "x", 1, Target("time", time_ms=1000)) == {0: 7}


@pytest.mark.asyncio
async def test_a_backup_name_is_taken_once_unless_the_same_backup_is_resumed() -> None:
    store = MemoryStore()
    flushed: list[int] = []

    async def flush(p: int) -> int:
        flushed.append(p)
        return 10 + p

    first = await restore.take_backup(store, "x", "b1", 2, flush)
    assert first.partitions == {0: 10, 1: 11} and flushed == [0, 1]
    with pytest.raises(restore.RestoreError, match="'b1' exists already"):
        await restore.take_backup(store, "x", "b1", 2, flush)
    resumed = await restore.take_backup(store, "x", "b1", 2, flush, adopt=True)
    assert resumed == first and flushed == [0, 1]  # the record it wrote, no second flush


# ---------------------------------------------------------------- targets and backup names
@pytest.mark.parametrize(
    ("text", "target", "described"),
    [
        ("latest", Target("latest"), "latest"),
        ("index:7", Target("index", index=7), "index 7"),
        ("index:1=9,0=5", Target("index", indexes={0: 5, 1: 9}), "index 0=5,1=9"),
        ("index:1=3", Target("index", indexes={1: 3}), "index 1=3"),
        ("time:1250", Target("time", time_ms=1250), "time 1970-01-01T00:00:01.250000+00:00"),
        (
            "time:1970-01-01T01:00:01.250+01:00",
            Target("time", time_ms=1250),
            "time 1970-01-01T00:00:01.250000+00:00",
        ),
        ("backup:nightly_1.b-2", Target("backup", backup="nightly_1.b-2"), "backup nightly_1.b-2"),
        (  # a time whose float product with 1000 falls just below the millisecond
            "time:1987-05-10T10:40:21.915Z",
            Target("time", time_ms=547_641_621_915),
            "time 1987-05-10T10:40:21.915000+00:00",
        ),
    ],
)
def test_a_target_is_read_to_the_millisecond_and_described_as_read(
    text: str, target: Target, described: str
) -> None:
    assert parse_target(text) == target
    assert target.describe() == described


@pytest.mark.parametrize("text", ["latest:now", "index:", "index:0=5,x=1", "time:", "backup:"])
def test_a_target_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_target(text)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a" * 128, True),
        ("0.b_c-d", True),
        ("a" * 129, False),
        ("", False),
        ("-a", False),
        (".a", False),
        ("a/b", False),
        ("A", False),
    ],
)
def test_a_backup_name_is_1_to_128_safe_characters(name: str, ok: bool) -> None:
    if ok:
        check_backup_name(name)
    else:
        with pytest.raises(ValueError, match="backup name"):
            check_backup_name(name)


# ---------------------------------------------------------------- resolving a target
def with_manifest(store: MemoryStore, change: dict[str, Any], p: int = 0) -> None:
    """Partition `p`'s manifest made what `change` says (a copy of partition 0's as a base)."""
    m = store.manifest()
    for k, v in change.items():
        setattr(m, k, v)
    m.partition = p
    store.objects[f"x/p{p}/manifest.json"] = m.to_json()


@pytest.mark.asyncio
async def test_each_kind_of_target_resolves_to_its_index_per_partition(tmp_path: Path) -> None:
    store = await archived(tmp_path, blobs(60), 60)
    with_manifest(store, {}, p=1)
    archived_index = store.manifest().archived_index
    assert archived_index == 60
    assert await restore.resolve(store, "x", 2, Target("latest")) == {0: 60, 1: 60}
    assert await restore.resolve(store, "x", 2, Target("index", index=45)) == {0: 45, 1: 45}
    # One partition named: the others come back at what is archived.
    assert await restore.resolve(store, "x", 2, Target("index", indexes={1: 7})) == {0: 60, 1: 7}
    # A backup that does not name a partition: it comes back empty.
    await restore.write_backup(store, "x", restore.Backup("b", "2026-01-01T00:00:00Z", {0: 30}))
    assert await restore.resolve(store, "x", 2, Target("backup", backup="b")) == {0: 30, 1: 0}
    # The archive holds more partitions than asked for: refused.
    with pytest.raises(restore.RestoreError, match="at least 2 partitions"):
        await restore.resolve(store, "x", 1, Target("latest"))


@pytest.mark.asyncio
async def test_an_index_no_archived_run_and_snapshot_reach_is_refused_when_planned(
    tmp_path: Path,
) -> None:
    """The archive begins above index 1 with no snapshot below its first entry: its entries
    are archived, but a restore could not start a log from them."""
    store = await archived(tmp_path, blobs(60), 60)
    segments = store.manifest().segments
    with_manifest(store, {"segments": segments[1:]})
    first = segments[1].first_index
    with pytest.raises(restore.RestoreError, match=f"archived entries start at {first}"):
        await restore.resolve(store, "x", 1, Target("index", index=first + 2))


@pytest.mark.asyncio
async def test_a_time_target_keeps_a_record_stamped_at_the_time_and_none_before_the_first(
    tmp_path: Path,
) -> None:
    stamps = [100, 300, 200]
    entries = [
        Entry(i + 1, 1, EntryKind.NORMAL, encode_record(Record(None, b"v", {}, t)))
        for i, t in enumerate(stamps)
    ]
    store = await archived(tmp_path, entries, len(entries))
    assert await restore.resolve(store, "x", 1, Target("time", time_ms=300)) == {0: 3}
    assert await restore.resolve(store, "x", 1, Target("time", time_ms=299)) == {0: 1}
    assert await restore.resolve(store, "x", 1, Target("time", time_ms=50)) == {0: 0}
    # A manifest naming no entries (a snapshot only): nothing to cut, the partition empty.
    with_manifest(store, {"segments": []})
    assert await restore.resolve(store, "x", 1, Target("time", time_ms=50)) == {0: 0}


@pytest.mark.asyncio
async def test_a_backup_name_taken_while_the_backup_was_flushing_is_not_written_over() -> None:
    store = MemoryStore()
    other = restore.Backup("b1", "2026-01-01T00:00:00Z", {0: 3})

    async def flush(p: int) -> int:
        if restore.backup_key("x", "b1") not in store.objects:  # another taker, meanwhile
            await restore.write_backup(store, "x", other)
        return 10

    with pytest.raises(restore.RestoreError, match="'b1' exists already"):
        await restore.take_backup(store, "x", "b1", 1, flush)
    assert await restore.read_backup(store, "x", "b1") == other


def test_a_backup_is_recorded_under_the_archives_prefix_and_read_only_in_its_format() -> None:
    assert restore.backup_key("x/y", "b") == "x/y/backups/b.json"
    assert restore.backup_key("", "b") == "backups/b.json"  # an archive at the bucket's root
    b = restore.Backup("b", "2026-01-01T00:00:00Z", {0: 3, 1: 4})
    assert restore.Backup.from_json("k", b.to_json()) == b
    doc = json.loads(b.to_json())
    del doc["format"]
    with pytest.raises(restore.RestoreError, match="k: format None, this reads 1"):
        restore.Backup.from_json("k", json.dumps(doc).encode())


async def archived_across_a_gap(tmp_path: Path) -> tuple[MemoryStore, int]:
    """A one-partition archive (prefix "x") of 60 keyed records whose first object is followed
    by a gap that a snapshot just below the next object covers (the log was compacted past
    entries not archived yet), and a later snapshot at 58; returns the first one's index."""
    storage = DurableStorage(
        str(tmp_path / "src"), bootstrap=Membership.of(["n1"]), durable=False, segment_bytes=512
    )
    entries = [Entry(i, term_of(i), EntryKind.NORMAL, keyed(i)) for i in range(1, 61)]
    storage.save(HardState(21, None, 0), entries)
    sealed = storage.wal.sealed_segments()
    storage.save(HardState(21, None, sealed[0].last_index), [])

    d = LeadingDriver(storage, sealed[0].last_index, term=21)

    store = MemoryStore()
    a = archive.Archiver(archiving_node(d), store, "x", 3600)
    await a.pass_once()
    below = sealed[2].first_index - 1
    storage.save(HardState(21, None, 60), [])
    d.raft.commit = 60
    table = KeyedTable()
    for e in entries[:below]:
        table.apply(e)
    storage.create_snapshot(
        SnapshotMeta(below, entries[below - 1].term, Membership.of(["n1"])), table.snapshot()
    )
    storage.compact(below + 1)
    assert await a.flush(0) == 60
    for e in entries[below:58]:
        table.apply(e)
    storage.create_snapshot(
        SnapshotMeta(58, entries[57].term, Membership.of(["n1"])), table.snapshot()
    )
    await a.pass_once()
    storage.close()
    m = store.manifest()
    assert m.segments[1].first_index == below + 1 > m.segments[0].last_index + 1
    assert [s.index for s in m.snapshots] == [below, 58]
    return store, below


def term_of(i: int) -> int:
    return 1 + i // 3  # a term for every few entries


def keyed(i: int) -> bytes:
    """Record `i`: one of three keys, its value naming it."""
    return encode_record(Record(b"k%d" % (i % 3), b"v%d" % i))


@pytest.mark.asyncio
async def test_a_restore_across_a_gap_starts_from_the_snapshot_below_the_run(
    tmp_path: Path,
) -> None:
    store, below = await archived_across_a_gap(tmp_path)
    assert await restore.resolve(store, "x", 1, Target("latest")) == {0: 60}
    # An index a few entries into the object before the later snapshot at 58 (its term is
    # not the term of the object's first entry).
    seg = store.manifest().segments[-2]
    index = seg.first_index + 3
    assert below < seg.first_index and index <= seg.last_index and index < 58
    path = str(tmp_path / "dst" / "p0")
    (tmp_path / "dst").mkdir()
    done = await restore.restore_partition(store, "x", 0, index, path, ["a"])
    assert (done.index, done.first_index, done.entries) == (index, below + 1, index - below)
    s = DurableStorage(path, durable=False)
    try:
        hs, snap = s.initial_state()
        assert (snap.index, hs.commit) == (index, index)
        assert snap.term == done.term == term_of(index)
        assert [e.index for e in s.entries(below + 1, index + 1)] == list(
            range(below + 1, index + 1)
        )
        assert s.term(below) == term_of(below)  # the log's start knows the term below it
        # The table as of the index: the snapshot below the run, then the run's records.
        table = KeyedTable.restore(s.snapshot_data())
        last = {i % 3: b"v%d" % i for i in range(1, index + 1)}
        assert [table.get(b"k%d" % k) for k in range(3)] == [last[0], last[1], last[2]]
    finally:
        s.close()
    # Into a member's existing partition: never.
    with pytest.raises(restore.RestoreError, match="exists; a restore only fills a new member"):
        await restore.restore_partition(store, "x", 0, index, path, ["a"])


@pytest.mark.asyncio
async def test_a_plan_needs_a_run_of_entries_from_1_or_from_just_above_a_snapshot(
    tmp_path: Path,
) -> None:
    store = await archived(tmp_path, blobs(60), 60)
    real = store.manifest().segments
    s0, s1, s2 = real[:3]

    async def plan(index: int) -> dict[int, int]:
        return await restore.resolve(store, "x", 1, Target("index", index=index))

    # A gap after the first object, a snapshot (named; only planned here) just below the next.
    bridge = ArchivedSnapshot(s2.first_index - 1, 1, "x/p0/snapshots/s", 1, "00")
    with_manifest(store, {"segments": [s0, *real[2:]], "snapshots": [bridge]})
    assert await plan(s0.first_index + 1) == {0: s0.first_index + 1}  # below the gap
    assert await plan(s2.first_index + 1) == {0: s2.first_index + 1}  # above it
    with pytest.raises(
        restore.RestoreError, match=f"no archived run of entries reaches index {s0.last_index + 1}"
    ):
        await plan(s0.last_index + 1)  # in it
    # Entries from 2 on and no snapshot below them.
    from2 = ArchivedSegment(2, s1.last_index, s1.key, s1.bytes, s1.sha256)
    with_manifest(store, {"segments": [from2, *real[2:]], "snapshots": []})
    with pytest.raises(restore.RestoreError, match="archived entries start at 2"):
        await plan(5)


@pytest.mark.asyncio
async def test_a_restore_refuses_an_object_that_is_not_the_one_the_manifest_names(
    tmp_path: Path,
) -> None:
    store = await archived(tmp_path, blobs(60), 60)
    seg = store.manifest().segments[1]
    store.objects[seg.key] = forged(store.objects[seg.key])
    (tmp_path / "dst").mkdir()
    with pytest.raises(WalCorruption, match="differs from the manifest's"):
        await restore.restore_partition(store, "x", 0, 45, str(tmp_path / "dst" / "p0"), ["a"])
    assert not (tmp_path / "dst" / "p0").exists()


@pytest.mark.asyncio
async def test_a_time_after_every_record_restores_all_even_a_last_object_of_one_entry(
    tmp_path: Path,
) -> None:
    entries = [
        Entry(i, 1, EntryKind.NORMAL, encode_record(Record(None, b"v", {}, 100 + i)))
        for i in range(1, 31)
    ]
    store = await archived(tmp_path, entries, 29, 30)
    last = store.manifest().segments[-1]
    assert (last.first_index, last.last_index) == (30, 30)
    assert await restore.resolve(store, "x", 1, Target("time", time_ms=10**6)) == {0: 30}


@pytest.mark.asyncio
async def test_a_restore_reads_no_object_past_its_index_and_all_it_names_up_to_it(
    tmp_path: Path,
) -> None:
    store = await archived(tmp_path, blobs(60), 60)
    segments = store.manifest().segments
    s1, s2 = segments[1], segments[2]
    (tmp_path / "dst").mkdir()
    # Up to the end of an object: the next one (damaged here) is not read.
    store.objects[s2.key] = forged(store.objects[s2.key])
    done = await restore.restore_partition(
        store, "x", 0, s1.last_index, str(tmp_path / "dst" / "a"), ["a"]
    )
    assert done.entries == s1.last_index
    # An object holding fewer entries than its manifest names: refused, not a shorter log.
    wide = ArchivedSegment(s1.first_index, s1.last_index + 3, s1.key, s1.bytes, s1.sha256)
    with_manifest(store, {"segments": [segments[0], wide]})
    with pytest.raises(restore.RestoreError, match="entries read from the archive"):
        await restore.restore_partition(
            store, "x", 0, s1.last_index + 2, str(tmp_path / "dst" / "b"), ["a"]
        )


def test_a_partition_left_half_made_is_not_held(tmp_path: Path) -> None:
    """A crash before a partition's first write leaves its folders without a snapshot or a
    log: a member's start restores into it rather than starting it empty."""
    (tmp_path / "p0" / "snap").mkdir(parents=True)
    (tmp_path / "p0" / "wal").mkdir()
    assert not restore._holds(str(tmp_path / "p0"))


@pytest.mark.asyncio
async def test_a_member_that_joins_restores_nothing(tmp_path: Path) -> None:
    s = NodeSettings(
        insecure_no_auth=True,
        node_id="n4",
        peers={"n4": "http://127.0.0.1:1"},
        data_dir=tmp_path,
        join=True,
        restore_url="s3://b/x",
        restore_indexes={0: 5},
        archive_endpoint="http://127.0.0.1:1",
    )
    assert await restore.restore_missing(s) == []
    assert not (tmp_path / "p0").exists()


def test_a_naive_time_is_read_as_local_time_as_python_reads_it(monkeypatch) -> None:
    """`epoch_ms` of a datetime without a zone (Spark's timestamps, collected): local time."""
    import datetime as dt
    import time

    from raftlog.node.record import epoch_ms

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        naive = dt.datetime(2024, 1, 15, 12, 0, 0, 250_000)
        assert epoch_ms(naive) == int(naive.timestamp() * 1000) == 1_705_338_000_250
        aware = naive.replace(tzinfo=dt.UTC)
        assert epoch_ms(aware) == 1_705_320_000_250
    finally:
        monkeypatch.undo()  # the TZ this process had
        time.tzset()
