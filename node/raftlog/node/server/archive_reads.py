"""Tiered reads: committed entries below the compaction floor, served from the continuous archive.

Compaction removes what a snapshot covers, and a reader that fell behind the floor used to get
410 and either lose records or hold retention on the cluster. With archiving on (`archive.py`),
compaction never removes an entry before it is in the object store, so `GET /records` and
`GET /columns` below the floor read the partition's manifest, GET the segment objects that cover
the range, and answer exactly the shape a read from the WAL answers (`next` included).

What a read from the archive serves is what this replica would serve from its WAL: entries
[start, min(to, start + limit, floor, high-water mark + 1)), so never above this replica's mark
and never anything uncommitted (the leader uploads only sealed segments at or below its commit).
It stops at the floor (the reader's next read continues from `next`, from the WAL), at a gap in
the archive (entries kept there only as a snapshot), and after MAX_OBJECTS_PER_READ objects.
Nothing is served unchecked: each object must be the one the manifest names (size and sha256,
`archive_objects.check_object`), every record must pass its CRC32C and hold the index it should,
and the object must hold exactly the manifest's [first_index, last_index].

The answers when the archive does not serve the read (decided here, for both routes):

- 410 `compacted`: the archive does not hold `from` either (below its first entry, in a gap,
  nothing archived yet). The 410 of a node without archive, plus where to look: `archive_url`,
  `archive_endpoint`, `archive_region`, `archived_first_index` (null: none), `archived_index`.
- 503 `archive_unavailable`: the store cannot be read (down, refused, timed out). The archive
  may well hold the range, so this must not read as data loss (a 410 would make a Spark reader
  with `failOnDataLoss=false` skip records that exist); clients retry 503. `reason` names the
  store's error; the same archive fields.
- 502 `archive_corrupt`: what the store returned is not what the manifest names (size, digest,
  a record's checksum or index, a named object missing, a manifest that is not one): an error,
  never the data, and never taken for data loss either. `key` names the object; the same
  archive fields. 502 (not 503): the node is fine, its upstream answered wrongly.

Objects are cached (CACHE_OBJECTS, CACHE_BYTES, least recently used first) checked once, with the
offsets of their entry records, so a reader paging through a 64 MiB segment GETs and checks it
once, not once per page (`archive_objects.object_entries` scans the whole object on every call);
concurrent reads of one object share its GET. The manifest of a partition is cached for
MANIFEST_TTL_S, and read again at once when it does not hold the asked index: it only grows, and
a segment it names never changes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from raftlog.node.core.types import Entry
from raftlog.node.server import columnar, walpage
from raftlog.node.server.api_common import ApiError
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.archive_manifest import (
    ArchivedSegment,
    Manifest,
    ManifestError,
    manifest_key,
)
from raftlog.node.storage.archive_objects import check_object, segment_for
from raftlog.node.storage.errors import WalCorruption

if TYPE_CHECKING:
    from raftlog.node.server.archive import Archiver
    from raftlog.node.server.node import Node
    from raftlog.node.server.partition import PartitionDriver

log = logging.getLogger("raftlog.archive")

CACHE_OBJECTS = 4  # checked objects kept (a few: one reader pages through one at a time)
CACHE_BYTES = 256 << 20  # and their bytes at most (an object above it is used, not kept)
MANIFEST_TTL_S = 30.0
GET_TIMEOUT_S = 20.0  # one GET at most (the store's client retries within it)
MAX_OBJECTS_PER_READ = 16  # a page reads at most this many objects (`next` says where it ended)
MAX_ERROR_CHARS = 500
_encoder = msgspec.msgpack.Encoder()


class ArchiveUnavailable(Exception):
    """The store could not be read (its error, as text)."""


class ArchiveCorrupt(Exception):
    """The store returned what the manifest does not name."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key


@dataclass(frozen=True, slots=True)
class CheckedObject:
    """A segment object checked whole, with where each of its entries' records begins."""

    seg: ArchivedSegment
    raw: bytes
    offsets: array[int]  # offsets[i]: the record of entry seg.first_index + i

    def entries(self, lo: int, hi: int) -> Iterator[Entry]:
        """Entries [lo, hi) (within the segment), decoded one at a time."""
        view = memoryview(self.raw)
        first = self.seg.first_index
        for off in self.offsets[lo - first : hi - first]:
            length = fmt.REC_HEAD.unpack_from(view, off)[0]
            yield fmt.decode_entry_body(view[off + 8 : off + 8 + length])


def check(seg: ArchivedSegment, raw: bytes) -> CheckedObject:
    """`raw` as the object `seg` names, or WalCorruption naming the key: its size and digest,
    every record (checksum, the index it holds), exactly the entries [first, last]. In a worker
    thread (a digest and a scan of up to a segment's bytes)."""
    check_object(seg, raw)
    found = fmt.scan(seg.key, raw, is_last=False)
    if found.corruption is not None:
        raise found.corruption
    offsets = array("q", (r.offset for r in found.records if r.kind == fmt.T_ENTRY))
    last = found.first_index + len(offsets) - 1
    if found.first_index != seg.first_index or last != seg.last_index or not offsets:
        raise WalCorruption(
            seg.key,
            0,
            seg.first_index,
            f"holds entries {found.first_index}..{last}, the manifest names "
            f"{seg.first_index}..{seg.last_index}",
        )
    return CheckedObject(seg, raw, offsets)


@dataclass
class PartitionReads:
    """What this node served from the archive for one partition (for `/metrics`)."""

    reads: int = 0  # requests answered from the archive
    entries: int = 0  # entries they held
    errors: int = 0  # requests answered 502 or 503 because of the archive


@dataclass
class ArchiveReads:
    """The archive's reader of one node: its caches and counters (`of(archiver)`)."""

    archiver: Archiver
    partitions: dict[int, PartitionReads] = field(default_factory=dict)
    _manifests: dict[int, tuple[Manifest, float]] = field(default_factory=dict)
    _objects: OrderedDict[str, CheckedObject] = field(default_factory=OrderedDict)
    _cached_bytes: int = 0
    _loading: dict[str, asyncio.Task[CheckedObject]] = field(default_factory=dict)

    def counters(self, p: int) -> PartitionReads:
        return self.partitions.setdefault(p, PartitionReads())

    async def entries(
        self, d: PartitionDriver, start: int, end: int, limit: int, max_bytes: int
    ) -> list[Entry]:
        """Archived entries [start, end): at most `limit`, and about `max_bytes` (at least one).
        Empty only when start >= end. Raises ArchiveUnavailable, ArchiveCorrupt, or
        LookupError when the archive does not hold `start`."""
        if start >= end:
            return []
        m = await self.manifest(d.p, start)
        out: list[Entry] = []
        size, at = 0, start
        for _ in range(MAX_OBJECTS_PER_READ):
            seg = segment_for(m, at)
            if seg is None or at >= end or len(out) >= limit:
                break
            obj = await self._object(seg)
            hi = min(end, seg.last_index + 1, at + limit - len(out))
            for e in obj.entries(at, hi):
                if out and size + e.size > max_bytes:
                    return out
                out.append(e)
                size += e.size
            at = hi
        if not out:
            raise LookupError(start)
        return out

    async def manifest(self, p: int, start: int | None = None) -> Manifest:
        """The partition's manifest: the cached one while fresh and holding `start`."""
        loop = asyncio.get_running_loop()
        cached = self._manifests.get(p)
        if (
            cached is not None
            and loop.time() - cached[1] < MANIFEST_TTL_S
            and (start is None or segment_for(cached[0], start) is not None)
        ):
            return cached[0]
        key = manifest_key(self.archiver.prefix, p)
        raw = await self._get(key)
        try:
            m = Manifest(p) if raw is None else Manifest.from_json(key, raw)
        except ManifestError as e:
            raise ArchiveCorrupt(key, str(e)) from None
        self._manifests[p] = (m, loop.time())
        return m

    def known(self, p: int) -> Manifest | None:
        """The manifest last read, if any (for an error's fields: no GET)."""
        cached = self._manifests.get(p)
        return None if cached is None else cached[0]

    def forget(self, p: int, key: str | None) -> None:
        """Drop the partition's manifest and the object `key` (after they failed a check)."""
        self._manifests.pop(p, None)
        if key is not None:
            self._drop(key)

    def _drop(self, key: str) -> None:
        old = self._objects.pop(key, None)
        if old is not None:
            self._cached_bytes -= len(old.raw)

    async def _get(self, key: str) -> bytes | None:
        try:
            return await asyncio.wait_for(self.archiver.store.get(key), GET_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # obstore's errors, OSError, TimeoutError: the store's fault
            raise ArchiveUnavailable(f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS]) from None

    async def _object(self, seg: ArchivedSegment) -> CheckedObject:
        hit = self._objects.get(seg.key)
        if hit is not None and hit.seg == seg:
            self._objects.move_to_end(seg.key)
            return hit
        task = self._loading.get(seg.key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(seg))
            self._loading[seg.key] = task
            task.add_done_callback(functools.partial(self._loaded, seg.key))
        return await asyncio.shield(task)  # a reader that leaves does not stop the others'

    def _loaded(self, key: str, task: asyncio.Task[CheckedObject]) -> None:
        if self._loading.get(key) is task:
            del self._loading[key]
        if not task.cancelled():
            task.exception()  # retrieved: its readers may all have left

    async def _load(self, seg: ArchivedSegment) -> CheckedObject:
        raw = await self._get(seg.key)
        if raw is None:
            raise ArchiveCorrupt(seg.key, "named by the manifest, but not in the store")
        try:
            obj = await asyncio.to_thread(check, seg, raw)
        except WalCorruption as e:  # its text speaks of a WAL that will not open: not this
            at = "" if e.index is None else f", entry {e.index}"
            raise ArchiveCorrupt(seg.key, f"{e.reason} (offset {e.offset}{at})") from None
        if len(raw) <= CACHE_BYTES:
            self._drop(seg.key)  # a version named by an older manifest
            self._objects[seg.key] = obj
            self._cached_bytes += len(raw)
            while len(self._objects) > CACHE_OBJECTS or self._cached_bytes > CACHE_BYTES:
                _, old = self._objects.popitem(last=False)
                self._cached_bytes -= len(old.raw)
        return obj


_readers: weakref.WeakKeyDictionary[Archiver, ArchiveReads] = weakref.WeakKeyDictionary()


def of(archiver: Archiver) -> ArchiveReads:
    """The archive reader of the node of `archiver` (made on the first call)."""
    reader = _readers.get(archiver)
    if reader is None:
        reader = _readers[archiver] = ArchiveReads(archiver)
    return reader


# ====================================================================== the routes' side
def _where(node: Node, p: int, reader: ArchiveReads | None) -> dict[str, Any]:
    """Where the partition's history is archived, for an error's fields."""
    s = node.settings
    m = reader.known(p) if reader is not None else None
    archived = (
        m.archived_index
        if m is not None
        else node.archiver.partitions[p].archived_index
        if node.archiver is not None and p in node.archiver.partitions
        else 0
    )
    return {
        "archive_url": s.archive_url,
        "archive_endpoint": s.archive_endpoint,
        "archive_region": s.archive_region,
        "archived_first_index": m.segments[0].first_index if m is not None and m.segments else None,
        "archived_index": archived,
    }


def compacted(node: Node, d: PartitionDriver, start: int, in_archive: bool = False) -> ApiError:
    """410 `compacted`: `start` is below the floor (and, with archiving on, not archived: the
    archive's fields say where to look)."""
    floor = d.storage.compaction_floor()
    extra: dict[str, Any] = {}
    reason = f"index {start} is below the compaction floor {floor}"
    if node.archiver is not None:
        extra = _where(node, d.p, of(node.archiver))
        first = extra["archived_first_index"]
        held = "nothing" if first is None else f"{first}..{extra['archived_index']}"
        reason += f" and not in the archive ({extra['archive_url']} holds {held})"
    return ApiError(
        410,
        "compacted",
        f"{reason}; read the snapshot or from the floor",
        compaction_floor=floor,
        snapshot_index=d.storage.snapshot_meta().index,
        **extra,
    )


async def entries_below_floor(
    node: Node, d: PartitionDriver, start: int, stop: int, limit: int, max_bytes: int, hwm: int
) -> list[Entry]:
    """Committed entries from `start`, below this replica's floor, from the archive: at most
    `limit`, about `max_bytes` (at least one), below `stop`, never above `hwm` (this replica's
    mark when the read began) nor at or above the floor. Raises ApiError: 410 without archiving
    or when the archive does not hold `start`, 502 `archive_corrupt`, 503 `archive_unavailable`
    (see the module's docstring)."""
    if node.archiver is None:
        raise compacted(node, d, start)
    reader = of(node.archiver)
    counters = reader.counters(d.p)
    end = min(stop, d.raft.log.first_index(), hwm + 1)
    try:
        entries = await reader.entries(d, start, end, limit, max_bytes)
    except LookupError:
        raise compacted(node, d, start) from None
    except ArchiveUnavailable as e:
        counters.errors += 1
        raise ApiError(
            503,
            "archive_unavailable",
            f"index {start} is below the compaction floor and the archive cannot be read now "
            f"({e}); retry later",
            **_where(node, d.p, reader),
        ) from None
    except ArchiveCorrupt as e:
        counters.errors += 1
        reader.forget(d.p, e.key)
        log.error("p%d: a read of archived index %d refused: %s", d.p, start, e)
        raise ApiError(
            502,
            "archive_corrupt",
            f"the archive's object is not the one its manifest names: {e}",
            key=e.key,
            **_where(node, d.p, reader),
        ) from None
    counters.reads += 1
    counters.entries += len(entries)
    return entries


async def page_below_floor(
    node: Node,
    d: PartitionDriver,
    fmt_name: str,
    start: int,
    stop: int,
    limit: int,
    max_bytes: int,
) -> tuple[bytes, str]:
    """The `/columns` page (`format` columns or wal) of committed records [start, stop) below
    the floor, from the archive: the same page, bounds and fields as one read from the WAL
    (`columnar.read_records`, `walpage.read_wal_records`). Returns (body, content type)."""
    hwm = d.high_water_mark
    max_bytes = min(max_bytes, columnar.MAX_PAGE_BYTES)
    entries = await entries_below_floor(node, d, start, stop, limit, max_bytes, hwm)
    nxt = entries[-1].index + 1 if entries else start
    floor = d.storage.compaction_floor()
    if fmt_name == "wal":  # the records framed as the WAL frames them (real checksums)
        page: dict[str, Any] = {
            "partition": d.p,
            "high_water_mark": hwm,
            "compaction_floor": floor,
            "next": nxt,
            "first": start,
            "records": b"".join(fmt.encode_entry(e) for e in entries),
        }
        return _encoder.encode(page), walpage.CONTENT_TYPE
    rows = fmt.Rows()
    rows.add_entries(entries)
    build = functools.partial(
        columnar.record_page, d.p, rows, high_water_mark=hwm, next_index=nxt, floor=floor
    )
    async with columnar.read_turn() as turn:
        return await turn.run(build), columnar.CONTENT_TYPE
