"""The on-disk format of WAL segments, and the scan that validates one.

A segment file is a 32-byte header followed by records:

    header:  magic "RLOGWAL1" | first_index u64 | prev_term u64 | flags u32 | crc32c u32
    record:  length u32 | crc32c u32 | body (length bytes)
    body:    ENTRY  = 1 u8 | index u64 | term u64 | kind u8 | data
             COMMIT = 2 u8 | commit u64

The record checksum covers the body, and a length is never 0, so the zeros that follow the last
record of a preallocated segment never read as one. A damaged length is caught too: it delimits
other bytes, whose checksum does not match, or it runs past the end of the file.
`prev_term` is the term of the entry just below `first_index` (the anchor a follower's append is
checked against once older segments are compacted). The RESET flag marks a segment that starts
a new log after a snapshot install: every older segment is obsolete.
"""

from __future__ import annotations

import re
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from crc32c import crc32c

from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.storage.errors import WalCorruption

SEGMENT_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")  # sequence, first index
MAGIC = b"RLOGWAL1"
HEADER = struct.Struct("<8sQQI")  # magic, first_index, prev_term, flags (then crc32c u32)
HEADER_SIZE = HEADER.size + 4
FLAG_RESET = 1

REC_HEAD = struct.Struct("<II")  # length, crc32c
ENTRY_HEAD = struct.Struct("<BQQB")  # type, index, term, kind
COMMIT_BODY = struct.Struct("<BQ")
ENTRY_FRAME = struct.Struct("<IIBQQB")  # REC_HEAD then ENTRY_HEAD: an entry record's first bytes
T_ENTRY = 1
T_COMMIT = 2
MAX_RECORD = 64 * 1024 * 1024  # a length above this is damage, not data


def encode_header(first_index: int, prev_term: int, flags: int) -> bytes:
    head = HEADER.pack(MAGIC, first_index, prev_term, flags)
    return head + crc32c(head).to_bytes(4, "little")


def decode_header(path: str, raw: bytes) -> tuple[int, int, int]:
    if len(raw) < HEADER_SIZE:
        raise WalCorruption(path, 0, None, f"segment header is {len(raw)} bytes, not {HEADER_SIZE}")
    magic, first, prev_term, flags = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise WalCorruption(path, 0, None, f"bad magic {magic!r}")
    if crc32c(raw[: HEADER.size]) != int.from_bytes(raw[HEADER.size : HEADER_SIZE], "little"):
        raise WalCorruption(path, 0, None, "segment header checksum mismatch")
    return first, prev_term, flags


def _frame(body: bytes) -> bytes:
    return REC_HEAD.pack(len(body), crc32c(body)) + body


def encode_entry(e: Entry) -> bytes:
    return _frame(ENTRY_HEAD.pack(T_ENTRY, e.index, e.term, e.kind) + e.data)


def encode_commit(commit: int) -> bytes:
    return _frame(COMMIT_BODY.pack(T_COMMIT, commit))


def decode_entry_body(body: memoryview) -> Entry:
    _, index, term, kind = ENTRY_HEAD.unpack_from(body)
    return Entry(index, term, EntryKind(kind), bytes(body[ENTRY_HEAD.size :]))


def iter_bodies(buf: bytes | memoryview, verify: bool = False) -> Iterator[memoryview]:
    """Bodies of the well-formed records in `buf` (a range already validated at open)."""
    view = memoryview(buf)
    pos, end = 0, len(view)
    while pos + REC_HEAD.size <= end:
        length, crc = REC_HEAD.unpack_from(view, pos)
        body = view[pos + 8 : pos + 8 + length]
        if verify and crc32c(body) != crc:
            raise ValueError(f"checksum mismatch at offset {pos}")
        yield body
        pos += 8 + length


@dataclass
class RawRange:
    """Entries [first, first + len(offsets)) of one segment, as the bytes read from its file."""

    path: str
    first: int
    buf: bytes  # the file's bytes from offsets[0] (commit records may sit between entries)
    offsets: array[int]  # each entry's record, as a file offset
    terms: array[int]  # each entry's term (the WAL's in-memory index)


@dataclass
class Rows:
    """The NORMAL entries of a range of the log, as columns: no `Entry` per record."""

    index: array[int] = field(default_factory=lambda: array("q"))
    term: array[int] = field(default_factory=lambda: array("q"))
    data: list[bytes] = field(default_factory=list)

    def add_entries(self, entries: list[Entry]) -> None:
        for e in entries:
            if e.kind == EntryKind.NORMAL:
                self.index.append(e.index)
                self.term.append(e.term)
                self.data.append(e.data)

    def add_raw(self, raw: RawRange) -> None:
        """Every record of `raw` checked against its checksum and its expected index (the read
        serves what the record says only when both hold), its NORMAL entries added.

        One tight loop over the records, one test per record for everything unusual, bytes
        slices (not memoryviews, which the garbage collector tracks), indexes and terms added
        in one call each: this is the bulk read's hot path. Raises WalCorruption.
        """
        buf, base, first = raw.buf, raw.offsets[0], raw.first
        unpack, data, size, head = ENTRY_FRAME.unpack_from, self.data, len(buf), ENTRY_HEAD.size
        others: list[int] = []  # no-op and membership entries: not rows
        expected, off = first, base
        try:
            for off in raw.offsets:
                pos = off - base
                length, crc, rtype, at, _, kind = unpack(buf, pos)
                end = pos + 8 + length
                body = buf[pos + 8 : end]
                if kind or at != expected or rtype != T_ENTRY or end > size or crc32c(body) != crc:
                    if at != expected or rtype != T_ENTRY or end > size:
                        raise WalCorruption(raw.path, off, expected, "not the entry the index says")
                    if crc32c(body) != crc:
                        raise WalCorruption(raw.path, off, expected, "record checksum mismatch")
                    others.append(at)
                else:
                    data.append(body[head:])
                expected += 1
        except struct.error:
            raise WalCorruption(raw.path, off, expected, "record cut short") from None
        if not others:
            self.index.extend(range(first, expected))
            self.term.frombytes(raw.terms.tobytes())  # u64 as i64: terms are below 2**63
            return
        skip = set(others)
        for i, t in zip(range(first, expected), raw.terms, strict=True):
            if i not in skip:
                self.index.append(i)
                self.term.append(t)


@dataclass
class ScannedRecord:
    offset: int  # of the record's length field
    kind: int  # T_ENTRY or T_COMMIT
    index: int  # entry index, or the commit index
    term: int
    entry_kind: int


@dataclass
class ScanResult:
    first_index: int
    prev_term: int
    flags: int
    records: list[ScannedRecord]
    valid_end: int  # offset just after the last valid record
    size: int  # the file's size
    torn: str | None  # why the bytes after valid_end are a torn tail, if any
    corruption: WalCorruption | None  # damage that is not a torn tail


def scan(path: str, raw: bytes, is_last: bool) -> ScanResult:
    """Validate every record of a segment.

    The last segment's records end where only zeros follow (`prealloc`: the file is allocated
    at full size; a record's length is never 0) or at the end of the file.
    A damaged record is a torn tail only in the last segment, and only when no valid record
    follows it (a write cut short, or space the filesystem extended but the write never filled).
    A damaged record with valid ones after it is corruption, even at the tail: a flipped length
    looks like a record cut short, and treating it as torn would silently drop the entries after
    it. The scan stops there and reports it, and the caller refuses to open.
    """
    first, prev_term, flags = decode_header(path, raw)
    records: list[ScannedRecord] = []
    pos, size = HEADER_SIZE, len(raw)
    expected = first
    view = memoryview(raw)

    def result(torn: str | None, corruption: WalCorruption | None) -> ScanResult:
        return ScanResult(first, prev_term, flags, records, pos, size, torn, corruption)

    while pos < size:
        reason = check_record(view, pos, size)
        if reason is not None:
            if is_last and raw.count(0, pos) == size - pos:
                break  # preallocated space never written (a zero length is never a record)
            if is_last and not _valid_record_follows(raw, pos + 1):
                return result(f"{reason} at offset {pos} ({size - pos} bytes dropped)", None)
            return result(None, WalCorruption(path, pos, expected, reason))
        length = REC_HEAD.unpack_from(view, pos)[0]
        body = view[pos + 8 : pos + 8 + length]
        rtype = body[0]
        if rtype == T_ENTRY and length >= ENTRY_HEAD.size:
            _, index, term, kind = ENTRY_HEAD.unpack_from(body)
            if index != expected:
                return result(
                    None, WalCorruption(path, pos, index, f"entry {index} where {expected} belongs")
                )
            if kind not in (0, 1, 2):
                return result(None, WalCorruption(path, pos, index, f"unknown entry kind {kind}"))
            records.append(ScannedRecord(pos, T_ENTRY, index, term, kind))
            expected += 1
        elif rtype == T_COMMIT and length == COMMIT_BODY.size:
            _, commit = COMMIT_BODY.unpack_from(body)
            records.append(ScannedRecord(pos, T_COMMIT, commit, 0, 0))
        else:
            return result(None, WalCorruption(path, pos, expected, f"unknown record type {rtype}"))
        pos += 8 + length
    return result(None, None)


def check_record(view: memoryview, pos: int, size: int) -> str | None:
    """Why the record at `pos` is damaged, or None when it is well formed."""
    if pos + REC_HEAD.size > size:
        return "record header cut short"
    length, crc = REC_HEAD.unpack_from(view, pos)
    end = pos + REC_HEAD.size + length
    if length == 0 or length > MAX_RECORD:
        return f"impossible record length {length}"
    if end > size:
        return f"record of {length} bytes cut short"
    if crc32c(view[pos + 8 : end]) != crc:
        return "record checksum mismatch"
    return None


# What the body of a well-formed record looks like, for finding one after damage: an entry
# (type 1, an index and a term below 2**40, kind 0..2) or a commit record (type 2, length 9).
# Lookaheads: matches may overlap, so bytes that only look like a start (in the header before a
# record, say) never hide a real one that begins inside them.
_ENTRY_SHAPE = re.compile(rb"(?=\x01[\s\S]{5}\x00\x00\x00[\s\S]{5}\x00\x00\x00[\x00-\x02])")
_COMMIT_SHAPE = re.compile(rb"(?=\x09\x00\x00\x00[\s\S]{4}\x02)")


def _valid_record_follows(raw: bytes, start: int) -> bool:
    """Whether a well-formed record begins anywhere at or after `start`.

    Every position whose bytes have the shape of a record is checked (regular-expression search,
    at C speed), so damage spanning several records is not mistaken for a torn tail. Indexes and
    terms are assumed below 2**40.
    """
    view = memoryview(raw)
    size = len(raw)
    for m in _ENTRY_SHAPE.finditer(raw, start + 8):
        h = m.start() - 8
        if h >= start and check_record(view, h, size) is None:
            return True
    for m in _COMMIT_SHAPE.finditer(raw, start):
        if check_record(view, m.start(), size) is None:
            return True
    return False
