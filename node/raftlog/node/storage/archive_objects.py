"""Reading the continuous archive's objects (pure: bytes in, entries out).

A segment object (`archive_manifest`) is a WAL segment: its header, then records with their
CRC32C. `object_entries` checks every record it returns (checksum, the index it should hold),
so a reader of the archive trusts it as the WAL's own reads do. Shared by the node's tiered
reads, restore, and the Spark source's executors, which read the archive through this module
and `archive_manifest` alone (the "archive format" part of docs/architecture.md): `Rows`
(entries as columns) and `WalCorruption` (a damaged object) are theirs from here.
"""

from __future__ import annotations

import hashlib

from raftlog.node.core.types import Entry
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.archive_manifest import ArchivedSegment, Manifest
from raftlog.node.storage.errors import WalCorruption
from raftlog.node.storage.segment import Rows

__all__ = ["Rows", "WalCorruption", "check_object", "object_entries", "segment_for"]


def object_entries(key: str, raw: bytes, start: int = 1, stop: int = 2**63) -> list[Entry]:
    """The entries of segment object `key` with index in [start, stop), every record checked.
    Raises WalCorruption (naming the key) for an object that is not whole and sound."""
    res = fmt.scan(key, raw, is_last=False)
    if res.corruption is not None:
        raise res.corruption
    out: list[Entry] = []
    view = memoryview(raw)
    for r in res.records:
        if r.kind != fmt.T_ENTRY or r.index < start:
            continue
        if r.index >= stop:
            break
        length = fmt.REC_HEAD.unpack_from(view, r.offset)[0]
        out.append(fmt.decode_entry_body(view[r.offset + 8 : r.offset + 8 + length]))
    return out


def segment_for(manifest: Manifest, index: int) -> ArchivedSegment | None:
    """The archived segment holding `index`, or None when no segment of the manifest does."""
    for s in manifest.segments:
        if s.first_index <= index <= s.last_index:
            return s
    return None


def check_object(seg: ArchivedSegment, raw: bytes) -> None:
    """Raises WalCorruption when `raw` is not the object the manifest names (size, digest)."""
    if len(raw) != seg.bytes or hashlib.sha256(raw).hexdigest() != seg.sha256:
        raise WalCorruption(
            seg.key,
            0,
            seg.first_index,
            f"{len(raw)} bytes whose sha256 differs from the manifest's ({seg.bytes} bytes)",
        )
