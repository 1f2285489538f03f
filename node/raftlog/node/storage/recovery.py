"""What is on disk in a WAL directory, read without changing anything.

`Wal.open` acts on this analysis (cuts a torn tail, removes what a snapshot install superseded, or
refuses on corruption); `raftctl wal check` prints it, and `--repair` acts on it on request.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

from raftlog.node.storage import segment as fmt
from raftlog.node.storage.errors import WalCorruption
from raftlog.node.storage.segment import ScanResult


@dataclass
class ScannedSegment:
    seq: int
    name: str
    path: str
    scan: ScanResult

    @property
    def entries(self) -> int:
        return sum(1 for r in self.scan.records if r.kind == fmt.T_ENTRY)

    @property
    def first_index(self) -> int:
        return self.scan.first_index

    @property
    def last_index(self) -> int:
        return self.scan.first_index + self.entries - 1

    @property
    def last_term(self) -> int:
        terms = [r.term for r in self.scan.records if r.kind == fmt.T_ENTRY]
        return terms[-1] if terms else self.scan.prev_term

    @property
    def commit(self) -> int:
        return max((r.index for r in self.scan.records if r.kind == fmt.T_COMMIT), default=0)


@dataclass
class WalAnalysis:
    path: str
    segments: list[ScannedSegment] = field(default_factory=list)  # in order; the damaged last
    superseded: list[str] = field(default_factory=list)  # older than a snapshot install's reset
    torn_header: str | None = None  # the newest segment, cut while being created
    corruption: WalCorruption | None = None
    unreadable_after: list[str] = field(default_factory=list)  # segments after the corruption

    @property
    def torn(self) -> ScannedSegment | None:
        last = self.segments[-1] if self.segments and self.corruption is None else None
        return last if last is not None and last.scan.torn is not None else None

    @property
    def commit(self) -> int:
        return max((s.commit for s in self.segments), default=0)

    def repairs(self) -> list[str]:
        """What opening the WAL does on its own (all safe: nothing acknowledged is dropped)."""
        out = []
        if self.torn_header:
            out.append(f"remove {self.torn_header}: its header was torn while being created")
        out += [f"remove {n}: superseded by a snapshot install" for n in self.superseded]
        torn = self.torn
        if torn is not None:
            out.append(f"truncate a torn tail of {torn.name}: {torn.scan.torn}")
        return out


def list_segments(path: str) -> list[tuple[int, str]]:
    """(sequence number, file name) of the segment files in `path`, oldest first."""
    found = []
    for name in os.listdir(path):
        m = fmt.SEGMENT_NAME.match(name)
        if m:
            found.append((int(m.group(1), 16), name))
    return sorted(found)


def _read_segment(full: str, is_last: bool) -> tuple[bytes, int]:
    """A segment's bytes, and the file's size. Of the last segment, only up to its first hole
    when nothing was written after it: the space allocated ahead of the records (`prealloc`) is
    a hole to the filesystem until written, so opening does not read megabytes of zeros, and a
    reader racing the writer (`wal check` on a live node) never reads zeros before records the
    writer has just added. Anything written after a hole is read, and judged, as before."""
    with open(full, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        end = _written_end(fd, size) if is_last else size
        return os.pread(fd, end, 0) if end else b"", size


def _written_end(fd: int, size: int) -> int:
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE)  # the file's size when it has none (or no support)
    except OSError:
        return size
    if hole >= size:
        return size
    try:
        os.lseek(fd, hole, os.SEEK_DATA)
    except OSError as e:
        return hole if e.errno == errno.ENXIO else size  # ENXIO: no data after the hole
    return size  # data after a hole: read it all


RACE_REREADS = 5  # reads of the last segment before damage in it is believed


def _scan_segment(full: str, is_last: bool) -> ScanResult:
    """Read and scan a segment. Damage in the last one is believed only once two reads in a row
    show it at the same offset: a writer may be appending while this reads (`wal check` on a
    live node), and within allocated space a page read mid-write shows zeros with records the
    writer finished just after it. Real damage reads the same every time."""
    raw, size = _read_segment(full, is_last)
    scanned = fmt.scan(full, raw, is_last)
    for _ in range(RACE_REREADS if is_last else 0):
        if scanned.corruption is None:
            break
        raw, size = _read_segment(full, is_last)
        again = fmt.scan(full, raw, is_last)
        stable = (
            again.corruption is not None and again.corruption.offset == scanned.corruption.offset
        )
        scanned = again
        if stable:
            break
    scanned.size = size
    return scanned


def analyze_wal(path: str, trusted_last: int | None = None) -> WalAnalysis:
    """`trusted_last`: see `Wal.open`."""
    a = WalAnalysis(path)
    names = list_segments(path)
    heads: list[tuple[int, str, int]] = []
    for i, (seq, name) in enumerate(names):
        full = os.path.join(path, name)
        with open(full, "rb") as f:
            raw = f.read(fmt.HEADER_SIZE)
        try:
            _, _, flags = fmt.decode_header(full, raw)
        except WalCorruption as e:
            # A segment is created header first and synced before it gets entries, so a bad
            # header in the newest one is a crash during creation; anywhere else it is damage.
            if i == len(names) - 1 and os.path.getsize(full) <= fmt.HEADER_SIZE:
                a.torn_header = name
                continue
            a.corruption = e
            a.unreadable_after = [n for _, n in names[i + 1 :]]
            return a
        heads.append((seq, name, flags))
    resets = [i for i, (_, _, flags) in enumerate(heads) if flags & fmt.FLAG_RESET]
    start = resets[-1] if resets else 0
    a.superseded = [name for _, name, _ in heads[:start]]
    heads = heads[start:]
    for i, (seq, name, _) in enumerate(heads):
        full = os.path.join(path, name)
        is_last = i == len(heads) - 1
        seg = ScannedSegment(seq, name, full, _scan_segment(full, is_last))
        damage = seg.scan.corruption
        if (
            is_last
            and damage is not None
            and trusted_last is not None
            and damage.index is not None
            and damage.index > trusted_last
        ):
            # Written after the journal's last checkpoint and never synced here: the journal
            # holds it and replays it.
            seg.scan.torn = f"{damage.reason} at offset {damage.offset}, after the checkpoint"
            seg.scan.corruption = None
        if seg.scan.corruption is None and a.segments:
            prev = a.segments[-1]
            if seg.first_index != prev.last_index + 1 or seg.scan.prev_term != prev.last_term:
                seg.scan.corruption = WalCorruption(
                    full,
                    0,
                    seg.first_index,
                    f"segment does not continue {prev.name} (expected first index "
                    f"{prev.last_index + 1} after term {prev.last_term}, found "
                    f"{seg.first_index} after term {seg.scan.prev_term})",
                )
                seg.scan.valid_end = 0
                seg.scan.records = []
        a.segments.append(seg)
        if seg.scan.corruption is not None:
            a.corruption = seg.scan.corruption
            a.unreadable_after = [n for _, n, _ in heads[i + 1 :]]
            return a
    return a
