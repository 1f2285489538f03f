"""The node's shared log: one journal, one group commit and one fsync per batch for all of a
node's partitions (as TiKV's raft-engine or CockroachDB's shared engine).

Each partition keeps its own WAL (`wal.py`) for reads, compaction and snapshots, written to the
page cache; what makes a write durable is the journal, which carries the same records tagged with
their partition. Spreading appends over many partitions then no longer splits the fsync batches:
the disk sees one fsync per batch of the whole node. A checkpoint makes the WALs durable (one
fdatasync for each written since the last) and deletes the journal before it, so the journal stays
small and a restart replays at most `checkpoint_bytes` of it.

Layout: `journal/<seq:016x>.jrn`, one segment per checkpoint. Records are framed as the WAL's
(`length u32 | crc32c u32 | body`; a zero length never is one, so preallocated space ends them):

    CHECKPOINT = 0x13 u8 | count u32 | count x (partition u32 | last index u64)   first record
                 [| count x (partition u32 | commit index u64)]   (older journals lack these)
    FRAMES     = 0x11 u8 | partition u32 | WAL records (entries, commit records), as in the WAL
    RESET      = 0x12 u8 | partition u32 | index u64 | term u64                 a snapshot install
    DONE       = 0x14 u8 | seq u64        every WAL is durable up to segment `seq`'s CHECKPOINT

Recovery starts at the newest segment whose CHECKPOINT is DONE (older ones are deleted only once
a DONE is durable) and replays each later record into its partition's WAL by content, not by
position (`replay_into`): an entry already there with its term is kept (same index and term, same
entry); a different one above the WAL's commit index is replaced, as the append that wrote it did;
one at or below the commit index marks the record stale (a committed entry never changes, so the
record was overwritten later, durably). A record that would leave a gap was cut by a truncation
or snapshot install that reached the WAL's disk before the crash, and is dropped with it. RESET is
made durable before the WAL is reset, so a replay never resurrects entries an install discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import struct
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from crc32c import crc32c

from raftlog.node.core.types import Entry
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.errors import StorageFailed, WalCorruption, make_directory
from raftlog.node.storage.fileio import FileOps

log = logging.getLogger("raftlog.storage.journal")

# Types of their own, never a WAL record's (T_ENTRY 1, T_COMMIT 2): a FRAMES record carries WAL
# records framed as the journal's are, so after a torn FRAMES record a whole WAL record inside it
# must not pass for a journal record that follows (which would make a torn tail look like damage).
J_FRAMES, J_RESET, J_CHECKPOINT, J_DONE = 0x11, 0x12, 0x13, 0x14
_PART = struct.Struct("<BI")  # type, partition
_RESET = struct.Struct("<BIQQ")
_COUNT = struct.Struct("<BI")
_POS = struct.Struct("<IQ")
_DONE = struct.Struct("<BQ")
NAME = re.compile(r"^([0-9a-f]{16})\.jrn$")
DEFAULT_CHECKPOINT_BYTES = 64 * 1024 * 1024
# The body of a well-formed record, for telling damage from a torn tail: a known type, then a
# partition below 2**16 (or a DONE's sequence). A lookahead: matches may overlap, and a record
# header's CRC bytes that look like a body's start must not hide the real one just after.
_SHAPE = re.compile(rb"(?=[\x11-\x13][\s\S]{2}\x00\x00|\x14)")


@dataclass
class Reset:
    index: int
    term: int


Op = bytes | Reset  # a FRAMES record's WAL records, or a snapshot install


@dataclass
class Found:
    """What recovery read: each partition's records after the last complete checkpoint."""

    ops: dict[int, list[Op]] = field(default_factory=dict)
    trusted: dict[int, int] = field(default_factory=dict)  # last index durable at the checkpoint
    committed: dict[int, int] = field(default_factory=dict)  # commit index at the checkpoint
    segments: list[int] = field(default_factory=list)  # sequences on disk, oldest first
    start: int | None = None  # the segment replay starts at
    repairs: list[str] = field(default_factory=list)


def _frame(body: bytes) -> bytes:
    return fmt.REC_HEAD.pack(len(body), crc32c(body)) + body


def encode_checkpoint(positions: dict[int, int], commits: dict[int, int] | None = None) -> bytes:
    """The CHECKPOINT record: each partition's last index, then its commit index. The commits
    come after what older versions read, so a node rolled back still reads this journal (and
    one written by them has none: their commits are taken as 0)."""
    parts = sorted(positions)
    body = _COUNT.pack(J_CHECKPOINT, len(parts)) + b"".join(
        _POS.pack(p, positions[p]) for p in parts
    )
    if commits is not None:
        body += b"".join(_POS.pack(p, commits.get(p, 0)) for p in parts)
    return _frame(body)


def _segment_path(path: str, seq: int) -> str:
    return os.path.join(path, f"{seq:016x}.jrn")


def list_journal(path: str) -> list[int]:
    if not os.path.isdir(path):
        return []
    return sorted(int(m.group(1), 16) for n in os.listdir(path) if (m := NAME.match(n)))


def _valid_record_follows(raw: bytes, start: int) -> bool:
    view, size = memoryview(raw), len(raw)
    for m in _SHAPE.finditer(raw, start + 8):
        h = m.start() - 8
        if h >= start and fmt.check_record(view, h, size) is None:
            return True
    return False


class Torn(NamedTuple):
    offset: int
    reason: str


def _records(full: str) -> tuple[list[memoryview], Torn | None]:
    """The bodies of a segment's records, and where and why its tail was cut, if it was torn (a
    damaged record with no whole record after it: a write the process died in)."""
    with open(full, "rb") as f:
        raw = f.read()
    view, pos, size = memoryview(raw), 0, len(raw)
    out: list[memoryview] = []
    while pos < size:
        reason = fmt.check_record(view, pos, size)
        if reason is not None:
            if raw.count(0, pos) == size - pos:
                break  # preallocated space never written
            if not _valid_record_follows(raw, pos + 1):
                return out, Torn(pos, f"{reason} at offset {pos} ({size - pos} bytes dropped)")
            raise WalCorruption(full, pos, None, f"journal {reason}")
        length = fmt.REC_HEAD.unpack_from(view, pos)[0]
        out.append(view[pos + 8 : pos + 8 + length])
        pos += 8 + length
    return out, None


def read_journal(path: str) -> Found:
    """Read the journal in `path` without changing it (raises `WalCorruption` on damage)."""
    found = Found(segments=list_journal(path))
    bodies: dict[int, list[memoryview]] = {}
    done: set[int] = set()
    torn_at: dict[int, Torn] = {}
    for seq in found.segments:
        full = _segment_path(path, seq)
        recs, torn = _records(full)
        if torn is not None:
            torn_at[seq] = torn
            found.repairs.append(f"ignored a torn tail of {os.path.basename(full)}: {torn.reason}")
        if recs and recs[0][0] != J_CHECKPOINT:
            raise WalCorruption(full, 0, None, "journal segment does not start with a checkpoint")
        bodies[seq] = recs
        done.update(_DONE.unpack_from(b)[1] for b in recs if b[0] == J_DONE)
    complete = [s for s in found.segments if s in done and bodies[s]]
    start = complete[-1] if complete else -1
    for seq, torn in torn_at.items():
        # A torn tail is the last write of a process that died. Before a later segment that
        # holds records it cannot be (the sync that tore it wrote nothing after it), unless
        # the segment is superseded: older than the newest complete checkpoint, left by a
        # process killed between that checkpoint and deleting what it replaced.
        if seq >= start and any(bodies[later] for later in found.segments if later > seq):
            raise WalCorruption(
                _segment_path(path, seq), torn.offset, None, f"journal {torn.reason}"
            )
    if not complete:
        if any(b[0] in (J_FRAMES, J_RESET) for recs in bodies.values() for b in recs):
            raise WalCorruption(path, 0, None, "journal records without a complete checkpoint")
        return found
    found.start = complete[-1]
    head = bodies[found.start][0]
    (count,) = struct.unpack_from("<I", head, 1)
    for k in range(count):
        p, last = _POS.unpack_from(head, 5 + k * _POS.size)
        found.trusted[p] = last
    if len(head) >= 5 + 2 * count * _POS.size:
        for k in range(count, 2 * count):
            p, commit = _POS.unpack_from(head, 5 + k * _POS.size)
            found.committed[p] = commit
    for seq in found.segments:
        if seq < found.start:
            continue
        for b in bodies[seq]:
            kind = b[0]
            if kind == J_FRAMES:
                p = _PART.unpack_from(b)[1]
                found.ops.setdefault(p, []).append(bytes(b[_PART.size :]))
            elif kind == J_RESET:
                _, p, index, term = _RESET.unpack_from(b)
                found.ops.setdefault(p, []).append(Reset(index, term))
            elif kind not in (J_CHECKPOINT, J_DONE):
                raise WalCorruption(_segment_path(path, seq), 0, None, f"journal type {kind}")
    return found


class ReplayTarget(Protocol):
    """What `replay_into` needs of a WAL (`wal.Wal` has it)."""

    commit: int

    def first_index(self) -> int: ...
    def last_index(self) -> int: ...
    def term(self, index: int) -> int: ...
    def append(self, entries: list[Entry]) -> None: ...
    def append_commit(self, commit: int) -> None: ...
    def reset(self, index: int, term: int) -> None: ...


def lost_partitions(data_dir: str, found: Found) -> dict[int, int]:
    """Partitions whose directory is gone while the journal says they held entries (at its
    checkpoint, or written since): partition -> the last index held at the checkpoint (0 when
    all it held came after). Replayed into a new directory, such a partition would come back
    without its hard state: a vote forgotten."""
    held = {p: last for p, last in found.trusted.items() if last > 0}
    held.update({p: held.get(p, 0) for p in found.ops})
    return {
        p: last
        for p, last in sorted(held.items())
        if not os.path.isdir(os.path.join(data_dir, f"p{p}"))
    }


def replay_into(wal: ReplayTarget, ops: Iterable[Op]) -> list[str]:
    """Apply one partition's journal records to its WAL, by content (see the module's rules).
    Returns what it did that a person may want to know (records dropped as cut or stale)."""
    notes: list[str] = []
    dropped_gap = dropped_stale = 0
    for op in ops:
        if isinstance(op, Reset):
            wal.reset(op.index, op.term)
            continue
        batch: list[Entry] = []
        stale = gap = False
        for body in fmt.iter_bodies(op, verify=True):
            if body[0] == fmt.T_COMMIT:
                if batch:  # a Ready's entries, its commit record after them in one record
                    outcome = _replay_entries(wal, batch)
                    gap |= outcome == "gap"
                    stale |= outcome == "stale"
                    batch = []
                commit = fmt.COMMIT_BODY.unpack_from(body)[1]
                wal.append_commit(min(commit, wal.last_index()))
                continue
            _, index, term, _ = fmt.ENTRY_HEAD.unpack_from(body)
            if batch or not _holds(wal, index, term):
                batch.append(fmt.decode_entry_body(body))  # decoded only when not already there
        if batch:
            outcome = _replay_entries(wal, batch)
            gap |= outcome == "gap"
            stale |= outcome == "stale"
        dropped_gap += gap
        dropped_stale += stale
    if dropped_gap:
        notes.append(f"{dropped_gap} journal records cut by a later truncation or install")
    if dropped_stale:
        notes.append(f"{dropped_stale} journal records overwritten later")
    return notes


class CommitLoss(NamedTuple):
    commit: int  # the highest commit index the journal records
    last: int  # the last entry a replay leaves

    @property
    def reason(self) -> str:
        return (
            f"the journal records commit index {self.commit}, but the WAL and the journal hold "
            f"entries only up to {self.last}: committed entries {self.last + 1}..{self.commit} "
            "are missing (a WAL segment deleted or cut)"
        )


def commit_past_log(last: int, ops: Iterable[Op], commit: int = 0) -> CommitLoss | None:
    """A `CommitLoss` when the journal records a commit index past the last entry a replay of
    `ops` over a WAL ending at `last` leaves, else None. Committed entries are never cut, and a
    commit record is journaled after the entries it covers (`fsync` makes both durable), so such
    a commit means entries this member held committed are gone: a WAL segment deleted, or cut
    below what the journal's checkpoint made durable. Index arithmetic as `replay_into` places
    entries: a batch that starts past `last + 1` is cut (dropped); a later one only raises
    `last`, since what it replaces is never committed; an install resets it. `commit`: the
    partition's commit index at the checkpoint (in its CHECKPOINT record), the evidence when
    nothing was journaled since (a WAL is durable up to its checkpoint position, which is never
    below that commit)."""

    def placed(last: int, lo: int, hi: int) -> int:  # a batch of entries lo..hi (0: none)
        return hi if lo and lo <= last + 1 and hi > last else last

    for op in ops:
        if isinstance(op, Reset):
            last = op.index
            continue
        lo = hi = 0
        for body in fmt.iter_bodies(op):
            if body[0] == fmt.T_COMMIT:
                commit = max(commit, fmt.COMMIT_BODY.unpack_from(body)[1])
                last, lo, hi = placed(last, lo, hi), 0, 0
                continue
            index = fmt.ENTRY_HEAD.unpack_from(body)[1]
            lo, hi = lo or index, index
        last = placed(last, lo, hi)
    return CommitLoss(commit, last) if commit > last else None


def _holds(wal: ReplayTarget, index: int, term: int) -> bool:
    return wal.first_index() <= index <= wal.last_index() and wal.term(index) == term


def _replay_entries(wal: ReplayTarget, entries: list[Entry]) -> str:
    first = wal.first_index()
    entries = [e for e in entries if e.index >= first]
    if not entries:
        return "below"
    for i, e in enumerate(entries):
        last = wal.last_index()
        if e.index > last + 1:
            return "gap"
        if e.index <= last:
            if wal.term(e.index) == e.term:
                continue
            if e.index <= wal.commit:
                return "stale"
        wal.append(entries[i:])
        return "applied"
    return "applied"


class CheckpointTarget(ReplayTarget, Protocol):
    """What a checkpoint needs of a WAL."""

    def sync_active(self) -> None: ...
    def checkpoint_fd(self) -> int | None: ...


class PartitionJournal:
    """One partition's handle on the node's journal."""

    def __init__(self, journal: Journal, partition: int) -> None:
        self.journal = journal
        self.partition = partition
        self._head = _PART.pack(J_FRAMES, partition)
        self._head_crc = crc32c(self._head)

    @property
    def pending(self) -> list[Op]:
        return self.journal.found.ops.get(self.partition, [])

    @property
    def trusted_last(self) -> int | None:
        return self.journal.found.trusted.get(self.partition)

    @property
    def checkpoint_commit(self) -> int:
        return self.journal.found.committed.get(self.partition, 0)

    def add_frames(self, frames: bytes | bytearray) -> None:
        """Journal WAL records just written to this partition's WAL (durable at the next sync)."""
        j = self.journal
        head = fmt.REC_HEAD.pack(len(frames) + len(self._head), crc32c(frames, self._head_crc))
        with j.lock:
            buf = j.buf
            buf += head
            buf += self._head
            buf += frames
        j.written += len(frames) + 13

    def reset(self, index: int, term: int) -> None:
        """Journal a snapshot install, durably, before the WAL is reset."""
        self.journal.add(_frame(_RESET.pack(J_RESET, self.partition, index, term)))
        self.journal.sync()


class Journal:
    def __init__(
        self,
        path: str,
        *,
        durable: bool = True,
        ops: FileOps | None = None,
        checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES,
    ) -> None:
        """Open the journal in `path` and read what it holds for replay; `start` opens it for
        writing once every partition has replayed its records."""
        self.path = path
        self.durable = durable
        self.ops = ops or FileOps()
        self.checkpoint_bytes = checkpoint_bytes
        make_directory(path, "the journal's")
        self.found = read_journal(path)
        for msg in self.found.repairs:
            log.warning("%s: %s", path, msg)
        # `buf` and the segments: appended to in the loop, written by a sync in a thread.
        self.lock = threading.Lock()
        self._io = threading.Lock()  # one sync writes at a time
        self.buf = bytearray()
        self._unsynced = False  # `write_out` wrote to the segment since the last fdatasync
        self.written = 0  # bytes journaled since the last checkpoint
        self._fd = -1
        self._seq = max(self.found.segments, default=0)
        self._sealed: list[tuple[int, bytearray]] = []  # segments left, with what they still need
        self.failed: StorageFailed | None = None
        self.checkpoints = 0

    def partition(self, p: int) -> PartitionJournal:
        return PartitionJournal(self, p)

    # ================================================================== writing
    def add(self, record: bytes) -> None:
        with self.lock:
            self.buf += record
        self.written += len(record)

    def sync(self) -> None:
        """Write what was journaled and make it durable (one fdatasync); safe in a worker
        thread while the loop goes on journaling."""
        with self._io:
            if self.failed is not None:
                raise self.failed
            with self.lock:
                sealed, self._sealed = self._sealed, []
                buf, self.buf = self.buf, bytearray()
                fd = self._fd
            try:
                for old_fd, rest in sealed:
                    self._write(old_fd, rest)
                    os.close(old_fd)
                if buf or self._unsynced:
                    self._write(fd, buf)
                    self._unsynced = False
            except OSError as e:
                self.failed = StorageFailed(self.path, "write", e)
                log.error("%s", self.failed)
                raise self.failed from e

    def write_out(self) -> bool:
        """Write what was journaled to the segment now, without an fdatasync; False when a sync
        is running or a checkpoint's segment change is pending (wait for a sync instead).

        For a commit index alone, before readers are shown it: a process killed after that
        keeps it (as etcd writes a commit-only hard state unsynced). Only a power loss may step
        it back, to the last synced one, which Raft allows."""
        if not self._io.acquire(blocking=False):
            return False
        try:
            if self.failed is not None:
                raise self.failed
            with self.lock:
                if self._sealed:
                    return False
                buf, self.buf = self.buf, bytearray()
                fd = self._fd
            if buf:
                try:
                    self.ops.write(fd, buf)
                except OSError as e:
                    self.failed = StorageFailed(self.path, "write", e)
                    log.error("%s", self.failed)
                    raise self.failed from e
                self._unsynced = True
            return True
        finally:
            self._io.release()

    def _write(self, fd: int, data: bytearray) -> None:
        if data:
            self.ops.write(fd, data)
        if self.durable:
            self.ops.fdatasync(fd)

    def _open_segment(
        self, positions: dict[int, int], commits: dict[int, int] | None = None
    ) -> None:
        """Start segment `seq + 1` with a CHECKPOINT of `positions` and `commits`; what was
        journaled before goes to the previous one at the next sync."""
        full = _segment_path(self.path, self._seq + 1)
        fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._seq += 1  # once it exists: a checkpoint that could not create it is tried again
        if self.durable:
            # Allocated ahead, so the fdatasyncs need not journal the file's growth (`prealloc`).
            self.ops.try_allocate(fd, self.checkpoint_bytes + (1 << 20), 0)
        with self.lock:
            if self._fd >= 0:
                self._sealed.append((self._fd, self.buf))
            self._fd = fd
            self.buf = bytearray(encode_checkpoint(positions, commits))
        self.written = 0

    def _done(self) -> None:
        self.add(_frame(_DONE.pack(J_DONE, self._seq)))

    def _drop_before(self, seq: int) -> None:
        for old in list_journal(self.path):
            if old < seq:
                self.ops.unlink(_segment_path(self.path, old))
        if self.durable:
            self.ops.fsync_dir(self.path)

    def start(self, wals: dict[int, CheckpointTarget]) -> None:
        """Make every WAL durable (they hold the replayed records now), open a new segment
        with a complete checkpoint and delete the journal read at open."""
        for w in wals.values():
            # Every one, replayed into or not: what a crashed process wrote is in the page
            # cache and read back as the WAL's, but not durable until synced.
            w.sync_active()
        self._open_segment(
            {p: w.last_index() for p, w in wals.items()}, {p: w.commit for p, w in wals.items()}
        )
        self._done()
        self.sync()
        self._drop_before(self._seq)
        self.found = Found(segments=[self._seq], start=self._seq)

    def due(self) -> bool:
        return self.written >= self.checkpoint_bytes

    async def checkpoint(
        self,
        wals: Callable[[], dict[int, CheckpointTarget]],
        durable: Callable[[], Awaitable[None]],
    ) -> None:
        """Start a new segment, make every WAL written since the last checkpoint durable, and
        delete the older segments once the new checkpoint is marked DONE, durably.

        `durable` waits for a sync of the journal (the node's group commit)."""
        if self.failed is not None:
            raise self.failed
        loop = asyncio.get_running_loop()
        targets = wals()
        fds = {p: w.checkpoint_fd() for p, w in targets.items()}
        try:
            self._open_segment(
                {p: w.last_index() for p, w in targets.items()},
                {p: w.commit for p, w in targets.items()},
            )
            await durable()  # the old segment's tail, and the new one's CHECKPOINT

            def sync_wals() -> None:
                for fd in fds.values():
                    if fd is not None and self.durable:
                        self.ops.fdatasync(fd)
                if self.durable:
                    self.ops.fsync_dir(self.path)

            try:
                await loop.run_in_executor(None, sync_wals)
            except OSError as e:
                # The WALs' pages can no longer be trusted to reach the disk: stop writing.
                self.failed = StorageFailed(self.path, "checkpoint fdatasync", e)
                log.error("%s", self.failed)
                raise self.failed from e
        finally:
            for fd in fds.values():
                if fd is not None:
                    os.close(fd)
        self._done()
        await durable()
        await loop.run_in_executor(None, self._drop_before, self._seq)
        self.checkpoints += 1

    def close(self) -> None:
        with self.lock:
            fds = [fd for fd, _ in self._sealed] + ([self._fd] if self._fd >= 0 else [])
            self._sealed, self._fd = [], -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
