"""Backups and restore from the continuous archive (`archive.py`, `storage/archive_manifest.py`).

A backup is a point: for each partition, the index its leader had archived when asked
(`Archiver.flush`, through `POST /v1/admin/partitions/{p}/archive`), recorded as the object
`<prefix>/backups/<name>.json` once every partition is archived up to it.

A restore starts a new cluster's partitions from the archive. The target is resolved once, to an
index per partition (`resolve`), by whoever creates the cluster (the operator, `raftctl`), and
every member is given the same indexes (`restore_indexes`): members that resolved "latest" on
their own, while the source cluster still archives, could restore different logs, which Raft
cannot reconcile. On its first start, each member writes each partition it does not hold yet
(`restore_missing`):

- the archived entries from the first of the contiguous run that reaches the index, up to it,
  byte for byte as archived (every record checked) and committed;
- a snapshot at the index: the keyed table (rows and producers' sequences, so a producer's
  retry is still recognised) and the new cluster's voters, whose membership then holds from
  there: the source's membership entries stay in the log as history, below the snapshot.

Every member then holds the same committed log up to the index, and the first leader's entry
follows it. The partition is written in a scratch directory renamed into place when whole, so a
crash mid-restore leaves nothing the node would open.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from raftlog.node.record import Record
from raftlog.node.server.archive import ObjectStore
from raftlog.node.server.restore_target import Target, check_backup_name
from raftlog.node.settings import NodeSettings
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.archive_manifest import (
    ArchivedSegment,
    Manifest,
    ManifestError,
    manifest_key,
    partition_prefix,
)
from raftlog.node.storage.archive_objects import check_object, object_entries
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.snapshots import SnapshotStore, decode_snapshot

log = logging.getLogger("raftlog.restore")

_record = msgspec.msgpack.Decoder(Record)


class RestoreError(ValueError):
    """A restore or backup that cannot be done as asked: names the partition and why."""


# ====================================================================== backups


@dataclass(frozen=True)
class Backup:
    name: str
    created_at: str  # ISO 8601, UTC
    partitions: dict[int, int]  # partition -> the archived index it holds

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": 1,
                "name": self.name,
                "created_at": self.created_at,
                "partitions": {str(p): i for p, i in sorted(self.partitions.items())},
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, key: str, raw: bytes) -> Backup:
        try:
            doc = json.loads(raw)
            if doc.get("format") != 1:
                raise RestoreError(f"{key}: format {doc.get('format')!r}, this reads 1")
            parts = {int(p): int(i) for p, i in doc["partitions"].items()}
            return cls(str(doc["name"]), str(doc["created_at"]), parts)
        except RestoreError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RestoreError(f"{key}: not a backup ({type(e).__name__}: {e})") from None


def backup_key(prefix: str, name: str) -> str:
    return f"{prefix}/backups/{name}.json" if prefix else f"backups/{name}.json"


async def write_backup(store: ObjectStore, prefix: str, backup: Backup) -> str:
    """Record `backup` (its partitions archived up to their indexes already); refuses a name
    taken, so a backup point never moves."""
    key = backup_key(prefix, backup.name)
    if await store.get(key) is not None:
        raise RestoreError(f"backup {backup.name!r} exists already ({key}); give another name")
    await store.put(key, backup.to_json())
    return key


async def take_backup(
    store: ObjectStore,
    prefix: str,
    name: str,
    partitions: int,
    flush: Callable[[int], Awaitable[int]],
    adopt: bool = False,
) -> Backup:
    """A backup named `name`: each partition's leader archives what it has committed
    (`flush(p)` -> its archived index, through the admin API), then the point is recorded. A
    record acknowledged before the call is in the backup; one acknowledged after it is not,
    unless it committed before its partition's flush. `adopt`: a record of that name already
    written (by an earlier try of the same backup) is the backup."""
    check_backup_name(name)
    key = backup_key(prefix, name)
    raw = await store.get(key)
    if raw is not None and adopt:  # an earlier try of this very backup got as far as its record
        return Backup.from_json(key, raw)
    if raw is not None:
        raise RestoreError(f"backup {name!r} exists already ({key}); give another name")
    indexes = {p: await flush(p) for p in range(partitions)}
    backup = Backup(name, now_iso(), indexes)
    await write_backup(store, prefix, backup)
    return backup


async def read_backup(store: ObjectStore, prefix: str, name: str) -> Backup:
    key = backup_key(prefix, name)
    raw = await store.get(key)
    if raw is None:
        raise RestoreError(f"backup {name!r}: no {key} in the archive")
    return Backup.from_json(key, raw)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# ====================================================================== resolving a target


async def read_manifest(store: ObjectStore, prefix: str, p: int) -> Manifest | None:
    key = manifest_key(prefix, p)
    raw = await store.get(key)
    return None if raw is None else Manifest.from_json(key, raw)


async def resolve(
    store: ObjectStore, prefix: str, partitions: int, target: Target
) -> dict[int, int]:
    """The index each of `partitions` partitions comes back at (0: nothing archived, the
    partition starts empty). Raises RestoreError naming the partition when the archive cannot
    give what is asked."""
    if await read_manifest(store, prefix, partitions) is not None:
        raise RestoreError(
            f"the archive has a partition {partitions} (at least {partitions + 1} partitions): "
            f"a cluster of {partitions} cannot hold them; give the source's partition count"
        )
    backup = await read_backup(store, prefix, target.backup) if target.backup else None
    out: dict[int, int] = {}
    for p in range(partitions):
        try:
            m = await read_manifest(store, prefix, p)
        except ManifestError as e:
            raise RestoreError(f"partition {p}: {e}") from None
        archived = m.archived_index if m is not None else 0
        if target.kind == "latest":
            want = archived
        elif target.kind == "backup":
            assert backup is not None
            want = backup.partitions.get(p, 0)
        elif target.kind == "index":
            if target.indexes is not None:
                want = target.indexes.get(p, archived)
            else:
                assert target.index is not None
                want = target.index
        else:
            assert target.time_ms is not None
            want = await _last_before(store, m, target.time_ms, p) if m is not None else 0
        if want > archived:
            raise RestoreError(
                f"partition {p}: index {want} is not archived (the archive reaches {archived})"
            )
        if want > 0:
            assert m is not None
            _run_to(m, want, p)  # a run of entries and a snapshot base reach it
        out[p] = want
    return out


async def _last_before(store: ObjectStore, m: Manifest, time_ms: int, p: int) -> int:
    """The index before the first archived record stamped after `time_ms` (the whole archive
    when none is): a restore to a time is a prefix of the log, cut at the first record after
    it, since producers' clocks need not rise with the index. Refused when no archived record
    carries a time (a cut could not be placed), and when the cut falls below the first archived
    entry (what is below it is only in a snapshot, whose records' times are unknown)."""
    last, stamped = 0, False
    segments = _reachable(m)
    for seg in segments:
        for e in object_entries(seg.key, await _fetch(store, seg)):
            stamp = _stamp(e) if e.kind == EntryKind.NORMAL else 0
            stamped = stamped or stamp > 0
            if stamp > time_ms:
                if e.index == segments[0].first_index and e.index > 1:
                    raise RestoreError(
                        f"partition {p}: the first archived record (index {e.index}) is stamped "
                        "after the time; the records below it are only in a snapshot, whose "
                        "times are unknown"
                    )
                return e.index - 1
            last = e.index
    if not stamped and last:
        raise RestoreError(
            f"partition {p}: no archived record carries a timestamp (timestamp_ms), so no "
            "time can place a cut; restore to an index or a backup"
        )
    return min(last, m.archived_index)


def _stamp(e: Entry) -> int:
    try:
        return _record.decode(e.data).timestamp_ms
    except msgspec.DecodeError:
        return 0  # not a record: no time, never after one


def _reachable(m: Manifest) -> list[ArchivedSegment]:
    """The segments up to the archived index, in order."""
    return [s for s in m.segments if s.first_index <= m.archived_index]


def _run_to(m: Manifest, index: int, p: int) -> tuple[list[ArchivedSegment], int]:
    """The contiguous run of segments that reaches `index`, and the index of the archived
    snapshot to start the table from (0: none, the run starts at 1)."""
    run: list[ArchivedSegment] = []
    for s in sorted(m.segments, key=lambda s: s.first_index):
        if run and s.first_index != run[-1].last_index + 1:
            if s.first_index > index:
                break
            run = []  # a gap below the index: the run starts again after it
        if s.first_index > index:
            break
        run.append(s)
    if not run or run[-1].last_index < index:
        raise RestoreError(f"partition {p}: no archived run of entries reaches index {index}")
    first = run[0].first_index
    bases = [s.index for s in m.snapshots if first - 1 <= s.index <= index]
    if first > 1 and not bases:
        raise RestoreError(
            f"partition {p}: the archived entries start at {first} and no archived snapshot "
            f"covers the ones below (between {first - 1} and {index})"
        )
    return run, max(bases, default=0)


async def _fetch(store: ObjectStore, seg: ArchivedSegment) -> bytes:
    raw = await store.get(seg.key)
    if raw is None:
        raise RestoreError(f"{seg.key}: named by the manifest but not in the store")
    check_object(seg, raw)
    return raw


# ====================================================================== writing a partition


@dataclass(frozen=True)
class Restored:
    partition: int
    index: int
    term: int
    first_index: int  # the first entry in the restored log
    entries: int
    seconds: float


async def restore_partition(
    store: ObjectStore, prefix: str, p: int, index: int, path: str, voters: Iterable[str]
) -> Restored:
    """Write partition `p` at `index` from the archive into `path` (which must not exist)."""
    started = time.monotonic()
    membership = Membership(frozenset(voters))
    if os.path.exists(path):
        raise RestoreError(f"partition {p}: {path} exists; a restore only fills a new member")
    scratch = f"{path}.restoring"
    shutil.rmtree(scratch, ignore_errors=True)  # a crash's leftover: never opened
    if index == 0:
        storage = DurableStorage(scratch, bootstrap=membership)
        storage.close()
        _into_place(scratch, path)
        return Restored(p, 0, 0, 1, 0, time.monotonic() - started)
    m = await read_manifest(store, prefix, p)
    if m is None:
        raise RestoreError(f"partition {p}: no manifest in the archive")
    run, base = _run_to(m, index, p)
    table = KeyedTable()
    if base:
        snap = next(s for s in m.snapshots if s.index == base)
        raw = await store.get(snap.key)
        if raw is None:
            raise RestoreError(f"{snap.key}: named by the manifest but not in the store")
        _, data = decode_snapshot(snap.key, raw)
        table = KeyedTable.restore(data)
    storage = DurableStorage(scratch)
    try:
        first = run[0].first_index
        term, written = 0, 0
        for seg in run:
            raw = await _fetch(store, seg)
            if seg is run[0] and first > 1:
                _, prev_term, _ = fmt.decode_header(seg.key, raw)
                storage.wal.reset(first - 1, prev_term)
            entries = object_entries(seg.key, raw, first, index + 1)
            for e in entries:
                table.apply(e)  # skips what the base snapshot covers
            if entries:
                term = entries[-1].term
                storage.save(HardState(term, None, entries[-1].index), entries)
                written += len(entries)
            if seg.last_index >= index:
                break
        if written != index - first + 1:
            raise RestoreError(
                f"partition {p}: {written} entries read from the archive for {first}..{index}"
            )
        storage.create_snapshot(SnapshotMeta(index, term, membership), table.snapshot())
        # The new voters as an entry too, right after the restored log, the same on every
        # member: a member that joins later replays the source's membership entries below the
        # index, then this one, rather than keeping the source's members until the next change.
        # Not committed here; the first leader commits it with its first entry.
        config = Entry(index + 1, term, EntryKind.CONFIG, membership.encode())
        storage.save(HardState(term, None, index), [config])
    finally:
        storage.close()
    _into_place(scratch, path)
    return Restored(p, index, term, first, written, time.monotonic() - started)


def _into_place(scratch: str, path: str) -> None:
    """The finished partition renamed into place, durably (its files, then the rename)."""
    _fsync_dir(scratch)
    os.rename(scratch, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _holds(path: str) -> bool:
    """Whether `path` is a partition this member holds: a snapshot or a log in it."""
    if not os.path.isdir(path):
        return False
    snap = os.path.join(path, "snap")
    if os.path.isdir(snap) and SnapshotStore.peek(snap) is not None:
        return True
    wal = os.path.join(path, "wal")
    return os.path.isdir(wal) and any(name.endswith(".wal") for name in os.listdir(wal))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def restore_missing(settings: NodeSettings) -> list[Restored]:
    """On a member's start: restore each partition of `restore_indexes` it does not hold yet.
    A member that joins an existing cluster (`join`) restores nothing: it is sent the log."""
    if settings.restore_url is None or settings.join:
        return []
    from raftlog.node.server.archive import store_for

    store = store_for(settings, settings.restore_url)
    done = []
    for p, index in sorted(settings.restore_indexes.items()):
        path = os.path.join(settings.data_dir, f"p{p}")
        if _holds(path):
            continue
        if os.path.isdir(path):  # nothing in it (a crash before its first write): restored
            log.warning("p%d: %s holds no snapshot and no log; restoring into it", p, path)
            shutil.rmtree(path)
        os.makedirs(settings.data_dir, exist_ok=True)
        r = await restore_partition(store, store.prefix, p, index, path, settings.peers)
        log.warning(
            "p%d restored from %s at index %d (term %d): %d entries from %d, in %.1f s",
            p,
            partition_prefix(settings.restore_url, p),
            r.index,
            r.term,
            r.entries,
            r.first_index,
            r.seconds,
        )
        done.append(r)
    return done
