"""Continuous archive: each partition's leader uploads its committed WAL segments and snapshots
to object storage, with a manifest per partition (`storage.archive_manifest`).

Every `archive_interval_s`, for each partition:

- on its leader: the manifest is read (a new leader continues the previous one's), then the
  latest snapshot is uploaded when it is newer than the archived one, then every sealed segment
  whose entries are all committed and not all archived yet (from the first index not archived),
  then the manifest, last, so it never names a missing object. Before the manifest is written
  it is read again, and it is written only if unchanged since the pass read it (a deposed leader
  that has not heard of it yet, or the previous leader's last pass, may write it meanwhile);
  one written by a leader of a later term is never overwritten. Re-uploading an object is
  harmless (same key, same bytes); one that no manifest names is left behind.
- on the other members: the manifest is read (one GET).

What a member last saw archived (its own uploads, or the manifest it read) is its partition's
archive floor (`PartitionDriver.archive_floor`): compaction never removes an entry above it.
Each member holds its own floor from what it knows, and knows nothing until it has read the
manifest (the floor then stays at 1: nothing is compacted), so no member ever compacts an entry
that is not in the object store, whoever leads and whatever the store's state: while the store
is down, appends go on, compaction waits, and `last_error` says why; the next pass catches up.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

from raftlog.node.core.errors import NotLeader
from raftlog.node.core.raft import Role
from raftlog.node.settings import NodeSettings
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.archive_manifest import (
    ArchivedSegment,
    ArchivedSnapshot,
    Manifest,
    manifest_key,
    segment_key,
    snapshot_key,
)

if TYPE_CHECKING:
    from obstore.store import ClientConfig

    from raftlog.node.server.node import Node
    from raftlog.node.server.partition import PartitionDriver

log = logging.getLogger("raftlog.archive")

MAX_ERROR_CHARS = 500
CLOSE_S = 5.0  # at most this long for a cancelled pass to end when the node stops
POINT_S = 30.0  # for a flush's read point (a quorum's heartbeat answers)
CALL_S = 90.0  # an object store call's bound, past the client's timeouts and retries
T = TypeVar("T")


class ObjectStore(Protocol):
    async def put(self, key: str, data: bytes) -> None: ...

    async def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such object."""
        ...


class S3ObjectStore:
    """An S3 bucket through obstore's asyncio API, with bounded retries and timeouts (a store
    that is down fails a pass in seconds; the next pass tries again)."""

    def __init__(
        self,
        url: str,
        endpoint: str | None = None,
        region: str | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        from obstore.store import S3Store  # only when archiving is on

        bucket, self.prefix = split_archive_url(url)
        options: dict[str, Any] = {}
        if endpoint is not None:
            options["endpoint"] = endpoint
            options["virtual_hosted_style_request"] = False
        if region is not None:
            options["region"] = region
        if credentials is not None:
            options["access_key_id"], options["secret_access_key"] = credentials
        client: ClientConfig = {"timeout": "30s", "connect_timeout": "5s"}
        if (endpoint or "").startswith("http://"):
            client["allow_http"] = True
        self._store = S3Store(
            bucket,
            client_options=client,
            retry_config={
                "max_retries": 2,
                "backoff": {
                    "init_backoff": timedelta(milliseconds=100),
                    "max_backoff": timedelta(seconds=1),
                    "base": 2,
                },
                "retry_timeout": timedelta(seconds=10),
            },
            **options,
        )

    async def put(self, key: str, data: bytes) -> None:
        import obstore

        await _bounded(obstore.put_async(self._store, key, data), key)

    async def get(self, key: str) -> bytes | None:
        import obstore

        try:
            result = await _bounded(obstore.get_async(self._store, key), key)
        except FileNotFoundError:
            return None
        return bytes(await _bounded(result.bytes_async(), key))


async def _bounded(call: Awaitable[T], key: str) -> T:
    """`call`'s result, or TimeoutError after CALL_S: the client's own timeouts and retries end
    a call well before that, but an obstore future was once seen never to complete (see
    `Archiver.close`), and a pass waiting on it forever would end archiving on this node. The
    call is cancelled and left behind, never awaited again. obstore's calls are futures, awaited
    as they are (no task around them), so one left pending holds no task for the event loop's
    shutdown to wait on."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=CALL_S)
    finally:
        if not task.done():
            task.cancel()
    if not done:
        raise TimeoutError(f"{key}: no answer from the object store within {CALL_S:.0f} s")
    return task.result()


def store_for(settings: NodeSettings, url: str) -> S3ObjectStore:
    """The store at `url` (the archive's or the restore's) through the node's object-store
    settings (endpoint, region, credentials: one object store per cluster)."""
    return S3ObjectStore(
        url, settings.archive_endpoint, settings.archive_region, settings.archive_credentials()
    )


def split_archive_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix` as (bucket, prefix without slashes at its ends)."""
    u = urlsplit(url)
    return u.netloc, u.path.strip("/")


@dataclass
class PartitionArchive:
    """What one partition's archiving knows and did (shown in the status and metrics)."""

    manifest: Manifest | None = None  # as this member last wrote it as leader
    archived_index: int = 0  # the highest index this member knows archived contiguously
    first_index: int = 0  # the first archived entry (0: none known)
    last_error: str | None = None
    last_upload_at: float | None = None  # seconds since the epoch
    last_pass_at: float | None = None
    uploaded_bytes: int = 0
    errors: int = 0

    def readable_from(self, floor: int) -> int:
        """The lowest index this member serves: its compaction floor, or the archive's first
        entry when the archive reaches the floor (tiered reads serve what is between)."""
        if self.first_index and self.archived_index + 1 >= floor:
            return min(floor, self.first_index)
        return floor

    def as_json(self, commit: int) -> dict[str, Any]:
        return {
            "archived_index": self.archived_index,
            "first_index": self.first_index,
            "lag_entries": max(0, commit - self.archived_index),
            "last_error": self.last_error,
            "last_upload_at": self.last_upload_at,
        }


class StaleLeader(Exception):
    """A leader of a later term writes the manifest: this one no longer does."""


class ManifestChanged(Exception):
    """Another leader wrote the manifest during this pass."""


class Archiver:
    def __init__(self, node: Node, store: ObjectStore, prefix: str, interval_s: float) -> None:
        self.node = node
        self.store = store
        self.prefix = prefix
        self.interval_s = interval_s
        self.partitions = {p: PartitionArchive() for p in node.drivers}
        self._task: asyncio.Task[None] | None = None
        self._locks: dict[int, asyncio.Lock] = {}
        for d in node.drivers.values():
            d.archive_floor = 1  # nothing known archived yet: nothing compacted

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop the passes. A pass is given CLOSE_S to end once cancelled, then left behind: a
        node stopping must never wait on the object store. (A pass was once seen stuck after
        its cancellation, awaiting an obstore GET that never completed: the task cancelling,
        the future pending, under load in the test suite.)"""
        if self._task is None:
            return
        self._task.cancel()
        done, _ = await asyncio.wait({self._task}, timeout=CLOSE_S)
        if not done:
            log.warning(
                "the archive pass did not end within %.0f s of its cancellation (an object "
                "store call); the node stops without it",
                CLOSE_S,
            )

    async def _run(self) -> None:
        while True:
            await self.pass_once()
            await asyncio.sleep(self.interval_s)

    async def pass_once(self) -> None:
        """One pass over every partition (errors are recorded, never raised)."""
        for p, d in list(self.node.drivers.items()):
            st = self.partitions.setdefault(p, PartitionArchive())
            try:
                async with self._lock(p):
                    if d.raft.role == Role.LEADER:
                        await self._lead(p, d, st)
                    else:
                        await self._follow(p, d, st)
                st.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed(p, st, e)
            st.last_pass_at = time.time()

    def _failed(self, p: int, st: PartitionArchive, e: Exception) -> None:
        st.errors += 1
        msg = f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]
        if st.last_error != msg:
            log.warning("p%d archive: %s", p, msg)
        st.last_error = msg

    def _lock(self, p: int) -> asyncio.Lock:
        """One pass of a partition at a time: a flush and the periodic pass would otherwise
        each find the manifest changed by the other."""
        return self._locks.setdefault(p, asyncio.Lock())

    async def flush(self, p: int) -> int:
        """On the partition's leader: archive everything committed now, the active segment's
        committed records included (as an object of their own; the rest of that segment
        follows in a later object), and return the archived index, at least the commit index
        read at the call. A backup point is taken this way. Raises NotLeader on a follower,
        and what the store raised when it fails (also recorded as `last_error`)."""
        d = self.node.drivers[p]
        st = self.partitions.setdefault(p, PartitionArchive())
        if d.raft.role != Role.LEADER:
            raise NotLeader(d.raft.leader)
        # A leader elected moments ago may not know the commit index yet (it learns it by
        # committing an entry of its term): a read point (ReadIndex) covers every record
        # acknowledged before this call, whoever acknowledged it.
        point = await asyncio.wait_for(d.linearizable_point(), POINT_S)
        try:
            async with self._lock(p):
                await self._lead(p, d, st, active=True)
            if st.archived_index < point:
                raise RuntimeError(
                    f"archived up to {st.archived_index}, below the read point {point} (the "
                    "leadership moved meanwhile?); ask again"
                )
        except Exception as e:
            self._failed(p, st, e)
            raise
        st.last_error = None
        return st.archived_index

    def _known(self, d: PartitionDriver, st: PartitionArchive, m: Manifest) -> None:
        st.archived_index = m.archived_index
        st.first_index = m.segments[0].first_index if m.segments else 0
        d.archive_floor = st.archived_index + 1

    async def _read_manifest(self, p: int) -> Manifest:
        key = manifest_key(self.prefix, p)
        raw = await self.store.get(key)
        return Manifest(p) if raw is None else Manifest.from_json(key, raw)

    async def _follow(self, p: int, d: PartitionDriver, st: PartitionArchive) -> None:
        self._known(d, st, await self._read_manifest(p))

    async def _put(self, st: PartitionArchive, key: str, data: bytes) -> None:
        await self.store.put(key, data)
        st.uploaded_bytes += len(data)
        st.last_upload_at = time.time()

    async def _lead(
        self, p: int, d: PartitionDriver, st: PartitionArchive, active: bool = False
    ) -> None:
        term = d.raft.term
        # Read every pass (one GET): a leader continues whatever the previous one wrote.
        base = await self._read_manifest(p)
        if base.term > term:
            raise StaleLeader(
                f"the manifest was written by a leader of term {base.term} (this one's is "
                f"{term}); left to it"
            )
        self._known(d, st, base)
        m = Manifest.from_json("manifest", base.to_json())  # a copy to add to
        changed = False
        try:
            changed |= await self._upload_snapshot(p, d, st, m)
            changed |= await self._upload_segments(p, d, st, m, active)
        finally:
            if changed:
                await self._write_manifest(p, d, st, m, term, base)
        st.manifest = m

    async def _upload_snapshot(
        self, p: int, d: PartitionDriver, st: PartitionArchive, m: Manifest
    ) -> bool:
        meta, path = d.storage.snapshot_meta(), d.storage.snapshots.file
        latest = m.latest_snapshot
        if meta.index == 0 or path is None or (latest is not None and latest.index >= meta.index):
            return False
        try:
            raw = await asyncio.to_thread(_read, path)
        except FileNotFoundError:
            return False  # replaced by a newer one meanwhile: the next pass takes that
        digest = hashlib.sha256(raw).hexdigest()
        key = snapshot_key(self.prefix, p, meta.index, meta.term, digest)
        await self._put(st, key, raw)
        m.snapshots.append(ArchivedSnapshot(meta.index, meta.term, key, len(raw), digest))
        return True

    async def _upload_segments(
        self, p: int, d: PartitionDriver, st: PartitionArchive, m: Manifest, active: bool
    ) -> bool:
        changed = False
        commit = d.raft.commit
        next_index = m.archived_index + 1 if m.segments else d.storage.first_index()
        wal = d.storage.wal
        for seg in [*wal.sealed_segments(), *([wal.active_segment()] if active else [])]:
            # Whole: a sealed segment of committed entries. Otherwise (the active segment, or a
            # sealed one reaching past the commit index) only a flush takes its committed part,
            # cut after the record of `last`: the bytes past it may still change.
            whole = seg is not wal.active_segment() and seg.last_index <= commit
            if not whole and not active:
                break
            last = seg.last_index if whole else min(seg.last_index, commit)
            if last < seg.first_index:
                break
            if last < next_index:
                if not whole:
                    break
                continue
            if seg.first_index > next_index:
                snap = m.latest_snapshot
                if snap is None or snap.index < seg.first_index - 1:
                    raise RuntimeError(
                        f"entries {next_index}..{seg.first_index - 1} are neither archived nor "
                        "in this leader's log, and no archived snapshot covers them"
                    )
            start = max(seg.first_index, next_index)
            # What to cut, read now (in the driver's loop, where the WAL changes): the record
            # of `start` and the term below it, and the end of the record of `last`.
            wal.flush()  # records write-behind holds: the file is read by path below
            offset = seg.offsets[start - seg.first_index]
            prev_term = seg.terms[start - 1 - seg.first_index] if start > seg.first_index else 0
            end = None
            if not whole:
                end = seg.offsets[last + 1 - seg.first_index] if last < seg.last_index else seg.end
            try:
                data = await asyncio.to_thread(
                    _segment_object, seg.path, seg.first_index, start, offset, prev_term, end
                )
            except FileNotFoundError as e:
                if any(s is seg for s in (*wal.sealed_segments(), wal.active_segment())):
                    # Still this log's segment, yet its file is gone: said, never passed over
                    # as if nothing were left to archive.
                    raise RuntimeError(
                        f"segment file {seg.path} (entries {seg.first_index}.."
                        f"{seg.last_index}) is missing from this member's log"
                    ) from e
                break  # removed meanwhile (a snapshot install reset the log): next pass
            digest = hashlib.sha256(data).hexdigest()
            key = segment_key(self.prefix, p, start, last, digest)
            await self._put(st, key, data)
            m.segments.append(ArchivedSegment(start, last, key, len(data), digest))
            next_index = last + 1
            changed = True
        return changed

    async def _write_manifest(
        self,
        p: int,
        d: PartitionDriver,
        st: PartitionArchive,
        m: Manifest,
        term: int,
        base: Manifest,
    ) -> None:
        """Write `m` unless the manifest changed since this pass read it (`base`): then another
        leader wrote it (this pass's objects stay unnamed, harmless), and the next pass starts
        from its version."""
        current = await self._read_manifest(p)
        if current.term > term:
            raise StaleLeader(
                f"the manifest was written by a leader of term {current.term} (this one's is "
                f"{term}); left to it"
            )
        if current.to_json() != base.to_json():
            raise ManifestChanged(
                f"the manifest changed during the pass (written by {current.leader} in term "
                f"{current.term}); the next pass continues from it"
            )
        m.term, m.leader = term, self.node.id
        m.segments.sort(key=lambda s: s.first_index)
        m.snapshots.sort(key=lambda s: s.index)
        await self.store.put(manifest_key(self.prefix, p), m.to_json())
        self._known(d, st, m)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _segment_object(
    path: str, first: int, start: int, offset: int, prev_term: int, end: int | None = None
) -> bytes:
    """The segment file's bytes up to `end` (None: all); from `start` (the record at `offset`)
    behind a header of its own when the entries below it are archived already."""
    raw = _read(path)
    if end is not None:
        raw = raw[:end]
    if start == first:
        return raw
    _, _, flags = fmt.decode_header(path, raw)
    return fmt.encode_header(start, prev_term, flags & ~fmt.FLAG_RESET) + raw[offset:]


def make_archiver(node: Node) -> Archiver | None:
    """The node's archiver, or None when archiving is off (no `archive_url`)."""
    s = node.settings
    if s.archive_url is None:
        return None
    store = store_for(s, s.archive_url)
    return Archiver(node, store, store.prefix, s.archive_interval_s)
