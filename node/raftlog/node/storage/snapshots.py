"""Snapshots on disk: written atomically, read as chunks, installed from chunks.

A snapshot file is

    magic "RLOGSNP1" | header length u32 | header (JSON) | header crc32c u32 | data

where the header holds the last included index and term, the membership at that index, and the
data's length and crc32c. A transfer sends the file's bytes in chunks, each with its offset and
crc32c; the receiver appends them to a `.partial` file (so a transfer can resume at the size
received), verifies the whole file when the last chunk is in, and only when the core accepts it is
it renamed into place.
A half-received snapshot never replaces a good one.
A partition keeps at most PARTIALS_KEPT partial files: an upload that starts removes the oldest
others (a peer could start one per index and term and leave each on disk), and an open keeps the
newest. Each upload is bounded by the total its first chunk gives: no chunk may end past it or
give another, and it must fit the volume with `space_kept` to spare (the WAL of every partition
shares the volume).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from crc32c import crc32c

from raftlog.node.core.types import Membership, SnapshotMeta
from raftlog.node.storage.errors import SnapshotCorruption, SnapshotNoRoom
from raftlog.node.storage.fileio import FileOps, atomic_write

MAGIC = b"RLOGSNP1"
SNAP_NAME = re.compile(r"^([0-9]{20})-([0-9]{20})\.snap$")
DEFAULT_CHUNK_BYTES = 1024 * 1024
# The upload that starts and the newest other: two transfers at once (a deposed leader's, not yet
# stopped, beside its successor's) both finish, where cutting each other off they would each
# start over in turn. Partial files verified and offered to the core are not counted.
PARTIALS_KEPT = 2
# Free space an upload leaves on the volume: the logs' next segments, the hard state and the
# journal's checkpoint need room there, and a full volume stops every partition of the node.
# A tenth of a volume smaller than ten times this, so that a small one still takes snapshots.
SPACE_KEPT = 64 * 1024 * 1024


def space_kept(st: os.statvfs_result) -> int:
    return min(SPACE_KEPT, st.f_blocks * st.f_frsize // 10)


def snapshot_name(index: int, term: int) -> str:
    return f"{index:020d}-{term:020d}.snap"


def encode_snapshot(meta: SnapshotMeta, data: bytes) -> bytes:
    header = json.dumps(
        {
            "index": meta.index,
            "term": meta.term,
            "voters": sorted(meta.membership.voters),
            "learners": sorted(meta.membership.learners),
            "data_bytes": len(data),
            "data_crc32c": crc32c(data),
        },
        sort_keys=True,
    ).encode()
    return b"".join(
        [
            MAGIC,
            struct.pack("<I", len(header)),
            header,
            struct.pack("<I", crc32c(header)),
            data,
        ]
    )


def decode_snapshot(path: str, raw: bytes) -> tuple[SnapshotMeta, bytes]:
    """Parse and verify a whole snapshot file; raises `SnapshotCorruption` naming the reason."""
    if raw[:8] != MAGIC:
        raise SnapshotCorruption(path, "bad magic (not a raftlog snapshot)")
    if len(raw) < 12:
        raise SnapshotCorruption(path, "cut short in the header")
    (hlen,) = struct.unpack_from("<I", raw, 8)
    header = raw[12 : 12 + hlen]
    if len(header) != hlen or len(raw) < 16 + hlen:
        raise SnapshotCorruption(path, "cut short in the header")
    (hcrc,) = struct.unpack_from("<I", raw, 12 + hlen)
    if crc32c(header) != hcrc:
        raise SnapshotCorruption(path, "header checksum mismatch")
    h = json.loads(header)
    data = raw[16 + hlen :]
    if len(data) != h["data_bytes"]:
        raise SnapshotCorruption(path, f"data is {len(data)} bytes, header says {h['data_bytes']}")
    if crc32c(data) != h["data_crc32c"]:
        raise SnapshotCorruption(path, "data checksum mismatch")
    meta = SnapshotMeta(
        h["index"], h["term"], Membership(frozenset(h["voters"]), frozenset(h["learners"]))
    )
    return meta, data


@dataclass(frozen=True, slots=True)
class Chunk:
    offset: int
    data: bytes
    crc32c: int
    total: int  # the whole file's size

    @property
    def last(self) -> bool:
        return self.offset + len(self.data) >= self.total

    @classmethod
    def of(cls, raw: bytes, offset: int, chunk_bytes: int) -> Chunk:
        """The chunk of a whole snapshot file's bytes starting at `offset`."""
        data = raw[offset : offset + chunk_bytes]
        return cls(offset, data, crc32c(data), len(raw))


class SnapshotStore:
    """The latest durable snapshot of a partition, in `path` (one file; older ones are removed)."""

    def __init__(self, path: str, *, durable: bool = True, ops: FileOps | None = None) -> None:
        self.path = path
        self.durable = durable
        self.ops = ops or FileOps()
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".tmp"):
                os.unlink(os.path.join(path, name))  # a local write cut short: never valid
        self.meta, self.file = self._load_latest()
        # Partial files verified whole and offered to the core, which installs or drops them in
        # its next pass: never removed by an upload that starts meanwhile.
        self.sealed: set[str] = set()
        # The total each partial file's upload gave (in memory: after a restart the next chunk
        # gives it again, and a file already larger starts over).
        self.totals: dict[str, int] = {}
        for stale in self._oldest(self._partials(), PARTIALS_KEPT):
            os.unlink(stale)  # the transfers that may resume are the ones written last

    @staticmethod
    def peek(path: str) -> SnapshotMeta | None:
        """The latest snapshot's metadata in `path`, read without changing anything."""
        files = SnapshotStore._list(path)
        if not files:
            return None
        full = os.path.join(path, files[-1][2])
        with open(full, "rb") as f:
            return decode_snapshot(full, f.read())[0]

    def _partials(self) -> list[str]:
        return [os.path.join(self.path, n) for n in os.listdir(self.path) if n.endswith(".partial")]

    @staticmethod
    def _oldest(partials: list[str], keep: int) -> list[str]:
        """`partials` but the `keep` written last."""

        def written(path: str) -> float:
            try:
                return os.path.getmtime(path)
            except FileNotFoundError:
                return 0.0

        return sorted(partials, key=written)[: max(0, len(partials) - keep)]

    def begin_upload(self, partial: str) -> None:
        """An upload into `partial` starts: the oldest other partial files go, but for the
        newest PARTIALS_KEPT - 1 and those offered to the core (`sealed`). A transfer cut off by
        it starts over (`SnapshotReceiver.write`)."""
        others = [p for p in self._partials() if p != partial and p not in self.sealed]
        for stale in self._oldest(others, PARTIALS_KEPT - 1):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        self.totals = {p: t for p, t in self.totals.items() if os.path.exists(p)}

    def check_room(self, partial: str, total: int) -> None:
        """Refuse an upload of `total` bytes that would leave less than `space_kept` free."""
        st = os.statvfs(self.path)
        free, kept = st.f_bavail * st.f_frsize, space_kept(st)
        if total + kept > free:
            raise SnapshotNoRoom(partial, total, free, kept)

    def _files(self) -> list[tuple[int, int, str]]:
        return self._list(self.path)

    @staticmethod
    def _list(path: str) -> list[tuple[int, int, str]]:
        out = []
        for name in os.listdir(path):
            m = SNAP_NAME.match(name)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), name))
        return sorted(out)

    def _load_latest(self) -> tuple[SnapshotMeta | None, str | None]:
        files = self._files()
        if not files:
            return None, None
        full = os.path.join(self.path, files[-1][2])
        with open(full, "rb") as f:
            meta, _ = decode_snapshot(full, f.read())  # renamed into place only once verified
        return meta, full

    def data(self) -> bytes:
        if self.file is None:
            return b""
        with open(self.file, "rb") as f:
            return decode_snapshot(self.file, f.read())[1]

    def read_latest(self) -> tuple[SnapshotMeta | None, bytes]:
        """The latest snapshot's metadata and data, both from its file (so they always agree):
        safe in a worker thread while the owner saves a newer snapshot, which removes the file
        being opened (then the newer one is read)."""
        for _ in range(8):
            file = self.file
            if file is None:
                return None, b""
            try:
                with open(file, "rb") as f:
                    return decode_snapshot(file, f.read())
            except FileNotFoundError:
                if self.file == file:
                    raise
        raise SnapshotCorruption(self.path, "the latest snapshot kept being replaced while read")

    def save(self, meta: SnapshotMeta, data: bytes) -> None:
        """Write a snapshot of local state atomically; it becomes the latest."""
        self._became_latest(meta, self.write_file(meta, data))

    def write_file(self, meta: SnapshotMeta, data: bytes) -> str:
        """Write a snapshot file atomically and durably without making it the latest (`adopt`
        does): it touches only its own file, so it may run in a worker thread. A crash after
        the rename leaves a valid file the next open takes if it is the newest."""
        final = os.path.join(self.path, snapshot_name(meta.index, meta.term))
        atomic_write(final, encode_snapshot(meta, data), self.ops, self.durable)
        return final

    def adopt(self, meta: SnapshotMeta, final: str) -> bool:
        """Make a file from `write_file` the latest; False (and the file removed) when a newer
        snapshot was installed meanwhile."""
        if self.meta is not None and meta.index <= self.meta.index:
            if final != self.file:
                with contextlib.suppress(FileNotFoundError):  # an install already removed it
                    os.unlink(final)
            return False
        self._became_latest(meta, final)
        return True

    def _became_latest(self, meta: SnapshotMeta, final: str) -> None:
        self.meta, self.file = meta, final
        for _, _, name in self._files():
            full = os.path.join(self.path, name)
            if full != final:
                os.unlink(full)

    # ---- transfer -----------------------------------------------------------------------
    def chunks(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES, start: int = 0) -> Iterator[Chunk]:
        """The latest snapshot file as chunks, from byte `start` (to resume a transfer)."""
        if self.file is None:
            return
        with open(self.file, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            f.seek(start)
            offset = start
            while offset < total:
                data = f.read(chunk_bytes)
                yield Chunk(offset, data, crc32c(data), total)
                offset += len(data)

    def receiver(self, index: int, term: int) -> SnapshotReceiver:
        return SnapshotReceiver(self, index, term)


class SnapshotReceiver:
    """Receives one snapshot's chunks into a `.partial` file; `finish` verifies and installs it."""

    def __init__(self, store: SnapshotStore, index: int, term: int) -> None:
        self.store = store
        self.index = index
        self.term = term
        self.partial = os.path.join(store.path, snapshot_name(index, term) + ".partial")
        # Resume where an earlier attempt stopped; the final verification catches any damage.
        self.received = os.path.getsize(self.partial) if os.path.exists(self.partial) else 0

    def write(self, chunk: Chunk) -> bool:
        """Append a chunk; False for a retransmission of bytes already here."""
        if crc32c(chunk.data) != chunk.crc32c:
            raise SnapshotCorruption(
                self.partial, f"chunk at offset {chunk.offset} checksum mismatch"
            )
        end = chunk.offset + len(chunk.data)
        if end > chunk.total:
            raise SnapshotCorruption(
                self.partial, f"chunk at offset {chunk.offset} ends at {end}, past {chunk.total}"
            )
        known = self.store.totals.get(self.partial)
        if (known is not None and known != chunk.total) or self.received > chunk.total:
            # Bytes of another file under this index and term: start over from them.
            self._discard()
        if chunk.offset < self.received:
            return False
        if chunk.offset > self.received:
            raise SnapshotCorruption(
                self.partial, f"chunk at offset {chunk.offset}, expected {self.received}"
            )
        if self.received == 0:
            self.store.check_room(self.partial, chunk.total)
            self.store.begin_upload(self.partial)
        self.store.totals[self.partial] = chunk.total
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.store.ops.write(fd, chunk.data)
        finally:
            os.close(fd)
        self.received += len(chunk.data)
        return True

    def verify(self) -> tuple[SnapshotMeta, bytes]:
        """Check the whole received file; a damaged one is discarded (the transfer restarts)."""
        with open(self.partial, "rb") as f:
            raw = f.read()
        try:
            meta, data = decode_snapshot(self.partial, raw)
            if (meta.index, meta.term) != (self.index, self.term):
                raise SnapshotCorruption(
                    self.partial,
                    f"holds index {meta.index} term {meta.term}, expected {self.index} {self.term}",
                )
        except SnapshotCorruption:
            os.unlink(self.partial)
            self.store.totals.pop(self.partial, None)
            self.received = 0
            raise
        self.store.sealed.add(self.partial)
        return meta, data

    def commit(self, meta: SnapshotMeta) -> None:
        """Make the verified file the latest snapshot: fsync, rename, fsync the directory."""
        final = os.path.join(self.store.path, snapshot_name(meta.index, meta.term))
        if self.store.durable:
            fd = os.open(self.partial, os.O_RDONLY)
            try:
                self.store.ops.fsync(fd)
            finally:
                os.close(fd)
        self.store.ops.replace(self.partial, final)
        self.store.sealed.discard(self.partial)
        self.store.totals.pop(self.partial, None)
        if self.store.durable:
            self.store.ops.fsync_dir(self.store.path)
        self.store._became_latest(meta, final)

    def _discard(self) -> None:
        if self.partial in self.store.sealed:
            raise SnapshotCorruption(self.partial, "is verified and offered; it is not replaced")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.partial)
        self.store.totals.pop(self.partial, None)
        self.received = 0

    def abort(self) -> None:
        self.store.sealed.discard(self.partial)
        self.store.totals.pop(self.partial, None)
        if os.path.exists(self.partial):
            os.unlink(self.partial)
