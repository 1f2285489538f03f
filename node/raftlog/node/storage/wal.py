"""A segmented write-ahead log for one partition.

Records are appended to the active segment; a segment is sealed (fsynced) and a new one started
once it passes `segment_bytes`. With fsync on, segments are allocated at that size before they
are written (`prealloc.py`: an fdatasync then need not journal the file's growth).

An in-memory index holds, per segment, the file offset and term of every entry, so `term()` never
touches the disk and a range read is one `pread` per segment spanned (a backfill round of 128
entries is one seek, not a scan).

Writes go to the page cache; `sync()` makes everything written so far durable. The storage layer
above decides when to sync (group commit batches many writers into one fsync). Suffix truncation
and compaction change files in place and are durable before they return.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from crc32c import crc32c

from raftlog.node.core.errors import Compacted, SafetyViolation, Unavailable
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.errors import StorageFailed, make_directory
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.prealloc import Spare, install, prepare
from raftlog.node.storage.recovery import analyze_wal

log = logging.getLogger("raftlog.storage.wal")

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
# The newest entries written stay in memory too, so the reads that follow an append (the apply
# after the commit, appends to followers a little behind) need no pread and no decoding.
TAIL_CACHE_ENTRIES = 4096
TAIL_CACHE_BYTES = 4 * 1024 * 1024
T = TypeVar("T")
NO_SPARE_YET = 1 << 62  # `_spare_at` while a spare is being prepared, or never is


def segment_name(seq: int, first_index: int) -> str:
    return f"{seq:016x}-{first_index:016x}.wal"


@dataclass
class Segment:
    seq: int
    path: str
    fd: int
    first_index: int
    prev_term: int
    end: int  # write position: just after the last valid record
    offsets: array[int] = field(default_factory=lambda: array("Q"))
    terms: array[int] = field(default_factory=lambda: array("Q"))

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.offsets) - 1

    @property
    def last_term(self) -> int:
        return self.terms[-1] if self.terms else self.prev_term


class Wal:
    def __init__(
        self,
        path: str,
        segments: list[Segment],
        *,
        segment_bytes: int,
        durable: bool,
        ops: FileOps,
        commit: int,
        config_indexes: list[int],
        recovery: list[str],
        preallocate: bool = True,
    ) -> None:
        self.path = path
        self._segments = segments
        self._firsts = [s.first_index for s in segments]
        self.segment_bytes = segment_bytes
        self.durable = durable
        self.ops = ops
        # Preallocation saves fsync work only: without fsync the files just grow.
        self.prealloc = segment_bytes if durable and preallocate else 0
        self._spare: Spare | None = None
        self._spare_at = segment_bytes // 2 if self.prealloc else NO_SPARE_YET
        self.commit = commit  # the highest commit record written
        self.config_indexes = config_indexes
        self.recovery = recovery  # what opening repaired (torn tail, interrupted install)
        self.failed: StorageFailed | None = None
        # Generations, not a flag: `sync` may run in a worker thread while the event loop keeps
        # writing, and must never mark a write durable that its fsync did not cover.
        self._written_gen = 0
        self._synced_gen = 0
        # The last entries written, contiguous from `_tail_first` (see TAIL_CACHE_*).
        self._tail: list[Entry] = []
        self._tail_first = 0
        self._tail_bytes = 0
        # With the node's journal (`journal.py`): each write's records go there too, and the
        # journal's fsync makes them durable; this WAL is synced at checkpoints.
        self.on_write: Callable[[bytes | bytearray], None] | None = None
        self._checkpoint_gen = 0
        # Write-behind (with the journal only: it holds the records until this file does): the
        # active segment's newest records wait here, up to `write_behind` bytes, so a partition
        # costs one write syscall per that many bytes, not one per append and commit record
        # (at 16 partitions one per partition per pass: bench/partitions.py, bench/RESULTS.md).
        # Whatever reads or changes the file writes them first (`flush`).
        self.write_behind = 0
        self._pending = bytearray()

    # ================================================================== open and recover
    @classmethod
    def open(
        cls,
        path: str,
        *,
        base_index: int = 0,
        base_term: int = 0,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        durable: bool = True,
        ops: FileOps | None = None,
        trusted_last: int | None = None,
        preallocate: bool = True,
    ) -> Wal:
        """Open (or create) the WAL in `path`, recovering from a crash at any instant.

        `base_index`/`base_term` anchor a brand-new WAL (the entry just below its first one).
        Raises `WalCorruption` on damage that is not a torn tail. `trusted_last`: the last index
        a journal checkpoint made durable; damage after it in the last segment is a tail the
        journal replays (written since, never synced here), not corruption.
        """
        ops = ops or FileOps()
        make_directory(path, "a WAL's")
        found = analyze_wal(path, trusted_last)
        if found.corruption is not None:
            raise found.corruption
        prealloc = segment_bytes if durable and preallocate else 0
        recovery = found.repairs()
        for name in ([found.torn_header] if found.torn_header else []) + found.superseded:
            os.unlink(os.path.join(path, name))
        if (found.torn_header or found.superseded) and durable:
            ops.fsync_dir(path)
        segments: list[Segment] = []
        config_indexes: list[int] = []
        for s in found.segments:
            seg = Segment(s.seq, s.path, -1, s.first_index, s.scan.prev_term, s.scan.valid_end)
            for r in s.scan.records:
                if r.kind == fmt.T_ENTRY:
                    seg.offsets.append(r.offset)
                    seg.terms.append(r.term)
                    if r.entry_kind == EntryKind.CONFIG:
                        config_indexes.append(r.index)
            seg.fd = os.open(s.path, os.O_RDWR)
            segments.append(seg)
            changed = s.scan.torn is not None
            if changed:
                ops.truncate(seg.fd, s.scan.valid_end)  # the zeros allocated below replace it
            if s is found.segments[-1]:
                if s.scan.size < prealloc or (changed and prealloc):
                    # A cut tail, or a WAL of before preallocation (best effort: see prealloc).
                    ops.try_allocate(seg.fd, prealloc, seg.end)
                    changed = True
                os.lseek(seg.fd, seg.end, os.SEEK_SET)  # where the next record goes
            if changed and durable:
                ops.fsync(seg.fd)
        # Compaction deletes commit records with their segments, but only entries that were
        # committed are ever compacted, and a segment's commit records never pass its entries.
        commit = max(found.commit, segments[0].first_index - 1) if segments else found.commit

        if not segments:
            header = (base_index + 1, base_term, fmt.FLAG_RESET)
            segments.append(cls._create_segment(path, 1, header, ops, durable, prealloc, None))
        last = segments[-1].last_index
        if commit > last:
            recovery.append(f"commit record {commit} is past the last entry {last}; using {last}")
            commit = last
        for msg in recovery:
            log.warning("%s: %s", path, msg)
        return cls(
            path,
            segments,
            segment_bytes=segment_bytes,
            durable=durable,
            ops=ops,
            commit=commit,
            config_indexes=config_indexes,
            recovery=recovery,
            preallocate=preallocate,
        )

    @staticmethod
    def _create_segment(
        path: str,
        seq: int,
        header: tuple[int, int, int],
        ops: FileOps,
        durable: bool,
        prealloc: int,
        spare: Spare | None,
    ) -> Segment:
        """A new segment (first index, prev term, flags), from `spare` when it was prepared."""
        fd = spare.take() if spare is not None else None
        if fd is None:
            fd = prepare(path, prealloc, ops, durable)
        try:
            first_index, prev_term, _ = header
            name = segment_name(seq, first_index)
            full = install(path, fd, name, header, ops, durable)
        except BaseException:
            os.close(fd)
            raise
        return Segment(seq, full, fd, first_index, prev_term, fmt.HEADER_SIZE)

    def _new_segment(self, seq: int, header: tuple[int, int, int]) -> Segment:
        spare, self._spare = self._spare, None
        self._spare_at = self.segment_bytes // 2 if self.prealloc else NO_SPARE_YET
        return self._io(
            "create segment",
            self.path,
            lambda: self._create_segment(
                self.path, seq, header, self.ops, self.durable, self.prealloc, spare
            ),
        )

    def _start_spare(self) -> None:
        """Prepare the next segment's file in a thread (the active one is half full)."""
        self._spare_at = NO_SPARE_YET
        self._spare = Spare(self.path, self.prealloc, self.ops, self.durable)

    def close(self) -> None:
        if self._pending and self.failed is None:
            with contextlib.suppress(StorageFailed):  # logged; the journal holds the records
                self.flush()
        if self._spare is not None:
            self._spare.discard(self.path)
            self._spare = None
        for s in self._segments:
            if s.fd >= 0:
                os.close(s.fd)
                s.fd = -1

    # ================================================================== reads
    def first_index(self) -> int:
        return self._segments[0].first_index

    def last_index(self) -> int:
        return self._segments[-1].last_index

    def segment_count(self) -> int:
        return len(self._segments)

    def sealed_segments(self) -> list[Segment]:
        """Every segment but the active one: sealed (ended at its last record, fsynced) and
        never written again; one holding only committed entries never changes until it is
        compacted or a snapshot install resets the log. Read only, in the owner's loop."""
        return self._segments[:-1]

    def active_segment(self) -> Segment:
        """The segment being written. Its records up to the commit index are on file once
        `flush` ran (write-behind may hold the newest) and never change; those above may be
        truncated. Read only, in the owner's loop."""
        return self._segments[-1]

    def _segment_of(self, index: int) -> Segment:
        return self._segments[bisect.bisect_right(self._firsts, index) - 1]

    def term(self, index: int) -> int:
        first = self.first_index()
        if index < first - 1:
            raise Compacted(f"index {index} is below the compaction floor {first}")
        if index > self.last_index():
            raise Unavailable(f"index {index} is beyond the last index {self.last_index()}")
        if index == first - 1:
            return self._segments[0].prev_term
        seg = self._segment_of(index)
        return seg.terms[index - seg.first_index]

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Entries in [lo, hi): one pread per segment spanned."""
        if lo < self.first_index():
            raise Compacted(f"index {lo} is below the compaction floor {self.first_index()}")
        if hi > self.last_index() + 1:
            raise Unavailable(f"index {hi - 1} is beyond the last index {self.last_index()}")
        tail_first = self._tail_first
        if self._tail and tail_first <= lo and hi <= tail_first + len(self._tail):
            return self._tail[lo - tail_first : hi - tail_first]
        self.flush()
        out: list[Entry] = []
        i = bisect.bisect_right(self._firsts, lo) - 1
        while lo < hi:
            seg = self._segments[i]
            stop = min(hi, seg.last_index + 1)
            if stop > lo:
                start_off = seg.offsets[lo - seg.first_index]
                end_off = seg.offsets[stop - seg.first_index] if stop <= seg.last_index else seg.end
                buf = os.pread(seg.fd, end_off - start_off, start_off)
                for body in fmt.iter_bodies(buf):
                    if body[0] == fmt.T_ENTRY:
                        out.append(fmt.decode_entry_body(body))
                lo = stop
            i += 1
        return out

    def read_raw(self, lo: int, hi: int, max_bytes: int) -> list[fmt.RawRange]:
        """The records of entries [lo, hi) as read from the files, for a bulk reader: one pread
        per segment spanned and no `Entry` per record (`segment.Rows.add_raw` checks and
        decodes them, and may run in another thread: the bytes are a copy). Stops once about
        `max_bytes` of records are read, after at least one entry.

        Truncation and reset only remove entries above the commit index, so a committed range
        read here is the committed log even when the WAL changes afterwards.
        """
        if lo < self.first_index():
            raise Compacted(f"index {lo} is below the compaction floor {self.first_index()}")
        if hi > self.last_index() + 1:
            raise Unavailable(f"index {hi - 1} is beyond the last index {self.last_index()}")
        self.flush()
        out: list[fmt.RawRange] = []
        i = bisect.bisect_right(self._firsts, lo) - 1
        budget = max_bytes
        while lo < hi and budget > 0:
            seg = self._segments[i]
            stop = min(hi, seg.last_index + 1)
            if stop > lo:
                a, b = lo - seg.first_index, stop - seg.first_index
                start_off = seg.offsets[a]
                # The first entry whose record starts past the budget ends the read (bisect on
                # the in-memory offsets: no record is looked at to find it).
                b = max(a + 1, bisect.bisect_left(seg.offsets, start_off + budget, a, b))
                stop = seg.first_index + b
                end_off = seg.offsets[b] if b < len(seg.offsets) else seg.end
                buf = os.pread(seg.fd, end_off - start_off, start_off)
                out.append(fmt.RawRange(seg.path, lo, buf, seg.offsets[a:b], seg.terms[a:b]))
                budget -= len(buf)
                lo = stop
            i += 1
        return out

    # ================================================================== writes
    def _io(self, op: str, path: str, fn: Callable[[], T]) -> T:
        if self.failed is not None:
            raise self.failed
        try:
            return fn()
        except OSError as e:
            self.failed = StorageFailed(path, op, e)
            log.error("%s", self.failed)
            raise self.failed from e

    def flush(self) -> None:
        """Write the records write-behind holds to the active segment's file: before anything
        reads the file (by path too: call it in the owner's loop first) or changes it."""
        if self._pending:
            buf, self._pending = self._pending, bytearray()
            seg = self._segments[-1]
            self._io("write", seg.path, functools.partial(self.ops.write, seg.fd, buf))

    def _write(self, seg: Segment, buf: bytes | bytearray) -> None:
        """Write `buf` at the active segment's end, or hold it (write-behind)."""
        if self.write_behind:
            self._pending += buf
            if len(self._pending) >= self.write_behind:
                self.flush()
        else:
            self._io("write", seg.path, functools.partial(self.ops.write, seg.fd, buf))
        if self.on_write is not None:
            self.on_write(buf)

    def _check_writable(self) -> None:
        if self.failed is not None:
            raise self.failed

    def append(self, entries: list[Entry], commit: int = 0) -> None:
        """Write entries (not yet durable: see `sync`). An overlap truncates the old suffix.

        `commit`, when above the recorded commit index, is recorded right after them in the
        same write (as `append_commit` would next): one write and one journal record per Ready
        instead of two, a few microseconds per partition on every replica of every round
        (bench/partitions.py, bench/RESULTS.md)."""
        if not entries:
            if commit:
                self.append_commit(commit)
            return
        self._check_writable()
        first = entries[0].index
        if first <= self.last_index():
            self.truncate_from(first)
        elif first != self.last_index() + 1:
            raise SafetyViolation(
                f"append at {first} leaves a gap after the last index {self.last_index()}"
            )
        # One tight loop and one write per segment touched: this is the hot path of every append.
        pack_head, pack_rec = fmt.ENTRY_HEAD.pack, fmt.REC_HEAD.pack
        i, n = 0, len(entries)
        while i < n:
            seg = self._segments[-1]
            if seg.end >= self.segment_bytes and seg.offsets:
                self._roll()
                continue
            if seg.end >= self._spare_at:
                self._start_spare()
            room = self.segment_bytes - seg.end
            buf = bytearray()
            offsets: list[int] = []
            terms: list[int] = []
            configs: list[int] = []
            while i < n and (len(buf) < room or not (offsets or seg.offsets)):
                e = entries[i]
                head = pack_head(fmt.T_ENTRY, e.index, e.term, e.kind)
                data = e.data
                offsets.append(seg.end + len(buf))
                terms.append(e.term)
                buf += pack_rec(len(head) + len(data), crc32c(data, crc32c(head)))
                buf += head
                buf += data
                if e.kind == EntryKind.CONFIG:
                    configs.append(e.index)
                i += 1
            if i == n and commit > self.commit:
                buf += fmt.encode_commit(commit)
                self.commit = commit
            self._write(seg, buf)
            seg.offsets.extend(offsets)
            seg.terms.extend(terms)
            seg.end += len(buf)
            self.config_indexes.extend(configs)
            self._written_gen += 1
        self._remember(entries)

    def _remember(self, entries: list[Entry]) -> None:
        """Keep the entries just written in the tail cache (bounded; the oldest leave first)."""
        tail = self._tail
        if not tail or entries[0].index != self._tail_first + len(tail):
            tail.clear()
            self._tail_first = entries[0].index
            self._tail_bytes = 0
        tail.extend(entries)
        self._tail_bytes += sum(len(e.data) for e in entries)
        if len(tail) > TAIL_CACHE_ENTRIES or self._tail_bytes > TAIL_CACHE_BYTES:
            # Trim to three quarters of the bounds at once, so trimming is not paid per append.
            keep_n, keep_bytes, cut = TAIL_CACHE_ENTRIES * 3 // 4, TAIL_CACHE_BYTES * 3 // 4, 0
            size = self._tail_bytes
            while cut < len(tail) and (len(tail) - cut > keep_n or size > keep_bytes):
                size -= len(tail[cut].data)
                cut += 1
            del tail[:cut]
            self._tail_first += cut
            self._tail_bytes = size

    def append_commit(self, commit: int) -> None:
        """Record the commit index (rides along with the next sync)."""
        if commit <= self.commit:
            return
        self._check_writable()
        seg = self._segments[-1]
        rec = fmt.encode_commit(commit)
        self._write(seg, rec)
        seg.end += len(rec)
        self.commit = commit
        self._written_gen += 1

    def sync(self) -> None:
        """Make every record written so far durable (one fsync of the active segment).

        Safe to call from a worker thread while the owner keeps appending (group commit): a
        write that lands while the fsync runs is left for the next sync. Not concurrent with
        truncation, compaction or reset, which only the owner performs between syncs. Never
        with write-behind on (the journal's sync makes records durable then).
        """
        if self.write_behind:
            # The held records are not in the file, and this runs off the owner's loop.
            raise RuntimeError("Wal.sync with write-behind on: sync the journal instead")
        target = self._written_gen
        if target == self._synced_gen:
            self._check_writable()
            return
        seg = self._segments[-1]
        if self.durable:
            self._io("fdatasync", seg.path, lambda: self.ops.fdatasync(seg.fd))
        self._synced_gen = max(self._synced_gen, target)

    def sync_active(self) -> None:
        """fdatasync the active segment whatever this WAL wrote (a journal checkpoint at
        start: a crashed process's writes read back from the page cache, not yet durable)."""
        self.flush()
        seg = self._segments[-1]
        if self.durable:
            self._io("fdatasync", seg.path, lambda: self.ops.fdatasync(seg.fd))
        self._synced_gen = self._checkpoint_gen = self._written_gen

    def checkpoint_fd(self) -> int | None:
        """A descriptor of the active segment for a checkpoint to fdatasync in its thread
        (the caller closes it), or None when nothing was written since the last checkpoint.
        Older segments were synced when sealed."""
        self.flush()
        if self._written_gen == self._checkpoint_gen:
            return None
        self._checkpoint_gen = self._written_gen
        return self._io("dup", self.path, lambda: os.dup(self._segments[-1].fd))

    def _roll(self) -> None:
        """Seal the active segment (durably) and start the next one."""
        self.flush()
        old = self._segments[-1]
        # A sealed segment ends at its last record: space allocated past it (only when
        # `segment_bytes` was lowered since) would read as damage once it is not the last.
        if os.fstat(old.fd).st_size > old.end:
            self._io("truncate", old.path, lambda: self.ops.truncate(old.fd, old.end))
        if self.durable:
            self._io("fsync", old.path, lambda: self.ops.fsync(old.fd))
        new = self._new_segment(old.seq + 1, (old.last_index + 1, old.last_term, 0))
        self._segments.append(new)
        self._firsts.append(new.first_index)

    def truncate_from(self, index: int) -> None:
        """Durably remove entries at and after `index` (a divergent, uncommitted tail)."""
        self._check_writable()
        if index <= self.commit:
            raise SafetyViolation(
                f"refusing to truncate at {index}: entries up to {self.commit} are committed"
            )
        if index <= self.first_index() - 1 or index > self.last_index():
            raise SafetyViolation(
                f"truncation at {index} is outside the log [{self.first_index()}, "
                f"{self.last_index()}]"
            )
        self.flush()
        # Newest first, so that a crash part-way leaves a prefix of the old log.
        removed = False
        while len(self._segments) > 1 and self._segments[-1].first_index > index:
            seg = self._segments.pop()
            self._firsts.pop()
            os.close(seg.fd)
            self._io("unlink", seg.path, functools.partial(self.ops.unlink, seg.path))
            removed = True
        if removed and self.durable:
            # Before the kept segment is cut: were a removed segment to come back after a crash,
            # it would follow a segment that now ends in allocated zeros (refused as damage).
            self._io("fsync", self.path, lambda: self.ops.fsync_dir(self.path))
        seg = self._segments[-1]
        keep = index - seg.first_index
        new_end = seg.offsets[keep] if keep < len(seg.offsets) else seg.end
        # Cut, then allocate again: the records cut must read as zeros, not stay behind the
        # new ones where a scan could take them for the log's.
        self._io("truncate", seg.path, lambda: self.ops.truncate(seg.fd, new_end))
        if self.prealloc:
            self._io(
                "allocate",
                seg.path,
                lambda: self.ops.try_allocate(seg.fd, self.prealloc, new_end),
            )
        os.lseek(seg.fd, new_end, os.SEEK_SET)
        del seg.offsets[keep:]
        del seg.terms[keep:]
        seg.end = new_end
        # Commit records written after the cut went with it: record the commit index again.
        rec = fmt.encode_commit(self.commit)
        self._io("write", seg.path, lambda: self.ops.write(seg.fd, rec))
        seg.end += len(rec)
        if self.durable:
            self._io("fsync", seg.path, lambda: self.ops.fsync(seg.fd))
        cut = bisect.bisect_left(self.config_indexes, index)
        del self.config_indexes[cut:]
        if index < self._tail_first + len(self._tail):
            keep = max(0, index - self._tail_first)
            self._tail_bytes -= sum(len(e.data) for e in self._tail[keep:])
            del self._tail[keep:]

    def compact(self, new_first_index: int) -> int:
        """Delete whole segments below `new_first_index`; the active one always stays.

        The caller guarantees the entries removed are covered by a durable snapshot. Returns the
        number of entries removed; the floor becomes the first index of the oldest segment kept.
        """
        self._check_writable()
        dropped = 0
        removed = False
        while len(self._segments) > 1 and self._segments[0].last_index < new_first_index:
            seg = self._segments[0]
            dropped += len(seg.offsets)
            self._io("unlink", seg.path, functools.partial(self.ops.unlink, seg.path))
            os.close(seg.fd)
            self._segments.pop(0)
            self._firsts.pop(0)
            removed = True
        if removed and self.durable:
            self._io("fsync", self.path, lambda: self.ops.fsync_dir(self.path))
        cut = bisect.bisect_left(self.config_indexes, self.first_index())
        del self.config_indexes[:cut]
        return dropped

    def reset(self, index: int, term: int) -> None:
        """Start an empty log after (index, term), for a snapshot install.

        The new segment is flagged RESET and made durable before the old ones are deleted, so a
        crash in between is finished by the next open.
        """
        self._check_writable()
        self._pending = bytearray()  # records of the segments deleted below (journal: RESET)
        old = self._segments
        new = self._new_segment(old[-1].seq + 1, (index + 1, term, fmt.FLAG_RESET))
        # The new log is the log from here on, even if removing the old files fails below
        # (they are superseded by the RESET segment and removed at the next open).
        self._segments = [new]
        self._firsts = [new.first_index]
        self.config_indexes = []
        self._tail.clear()
        self._tail_bytes = 0
        try:
            for seg in old:
                self._io("unlink", seg.path, functools.partial(self.ops.unlink, seg.path))
        finally:
            for seg in old:
                os.close(seg.fd)
        if self.durable:
            self._io("fsync", self.path, lambda: self.ops.fsync_dir(self.path))
        # A snapshot is installed only past the commit index, so it is the commit now; one read
        # from a record of the log it replaces (a replayed install) must not stay above it.
        self.commit = index
        self._synced_gen = self._written_gen  # the new segment was synced when created
