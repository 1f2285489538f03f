"""The continuous archive's layout in object storage and its per-partition manifest (pure).

Under the archive's prefix, each partition has

    p<N>/segments/<first>-<last>-<digest>.wal   WAL segments of committed entries, as framed
    p<N>/snapshots/<index>-<term>-<digest>.snap  snapshot files, as the node stored them
    p<N>/manifest.json                           what the archive holds, written last

(`<first>`, `<last>`, `<index>`, `<term>` zero-padded to 20 digits, so keys sort by index;
`<digest>` the first 16 hex digits of the object's SHA-256). The digest in the key means an
upload never replaces an object with other bytes: two leaders' objects for the same range (a
deposed leader's late pass, commit records placed differently) have keys of their own, and the
one a manifest names stays as it names it. A
segment object is a WAL segment file: the 32-byte header then the records with their CRC32C,
byte for byte as the leader's WAL wrote them. When a leader's segment begins below what is
archived already (segment boundaries differ from member to member), the object holds its records
from the first index not archived yet, behind a header naming that index: the records are still
the WAL's bytes, and `segment.scan` reads either.

The manifest (JSON, `format` 1):

    {"format": 1, "partition": 0, "term": 3, "leader": "n1",
     "segments": [{"first_index", "last_index", "key", "bytes", "sha256"}, ...],
     "snapshots": [{"index", "term", "key", "bytes", "sha256"}, ...],
     "archived_index": 1234}

`archived_index` is the highest index the archived entries reach contiguously from the first
archived entry. A gap that an archived snapshot covers (a leader whose log starts after a
snapshot install, above what the previous leader archived) is bridged by that snapshot: the
state up to it is archived, the entries of the gap only as that state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

FORMAT = 1


class ManifestError(ValueError):
    """A manifest that cannot be read: names the key and what is wrong."""


class _BadField(ValueError):
    """A field of the wrong type or range; `from_json` names the manifest's key with it."""


@dataclass(frozen=True, slots=True)
class ArchivedSegment:
    first_index: int
    last_index: int
    key: str
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ArchivedSnapshot:
    index: int
    term: int
    key: str
    bytes: int
    sha256: str


@dataclass(slots=True)
class Manifest:
    partition: int
    term: int = 0  # the term of the leader that wrote it last
    leader: str | None = None
    segments: list[ArchivedSegment] = field(default_factory=list)
    snapshots: list[ArchivedSnapshot] = field(default_factory=list)

    @property
    def archived_index(self) -> int:
        return archived_index(self.segments, self.snapshots)

    @property
    def latest_snapshot(self) -> ArchivedSnapshot | None:
        return max(self.snapshots, key=lambda s: s.index, default=None)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "partition": self.partition,
                "term": self.term,
                "leader": self.leader,
                "segments": [
                    {
                        "first_index": s.first_index,
                        "last_index": s.last_index,
                        "key": s.key,
                        "bytes": s.bytes,
                        "sha256": s.sha256,
                    }
                    for s in self.segments
                ],
                "snapshots": [
                    {
                        "index": s.index,
                        "term": s.term,
                        "key": s.key,
                        "bytes": s.bytes,
                        "sha256": s.sha256,
                    }
                    for s in self.snapshots
                ],
                "archived_index": self.archived_index,
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, key: str, raw: bytes) -> Manifest:
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ManifestError(f"{key}: not a JSON object")
            if doc.get("format") != FORMAT:
                raise ManifestError(
                    f"{key}: format {doc.get('format')!r}, this node reads {FORMAT}"
                )
            m = cls(
                partition=_int(doc, "partition"),
                term=_int(doc, "term"),
                leader=doc.get("leader"),
                segments=[
                    ArchivedSegment(
                        _int(s, "first_index"),
                        _int(s, "last_index"),
                        str(s["key"]),
                        _int(s, "bytes"),
                        str(s["sha256"]),
                    )
                    for s in doc["segments"]
                ],
                snapshots=[
                    ArchivedSnapshot(
                        _int(s, "index"),
                        _int(s, "term"),
                        str(s["key"]),
                        _int(s, "bytes"),
                        str(s["sha256"]),
                    )
                    for s in doc["snapshots"]
                ],
            )
        except ManifestError:
            raise
        except _BadField as e:
            raise ManifestError(f"{key}: {e}") from None
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(f"{key}: not a manifest ({type(e).__name__}: {e})") from None
        m.segments.sort(key=lambda s: s.first_index)
        m.snapshots.sort(key=lambda s: s.index)
        return m


def _int(doc: Any, name: str) -> int:
    v = doc[name]
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _BadField(f"{name}: {v!r} is not a non-negative integer")
    return v


def archived_index(segments: list[ArchivedSegment], snapshots: list[ArchivedSnapshot]) -> int:
    """The highest index reached contiguously from the first archived entry (0: none), a gap
    covered by an archived snapshot bridged (see the module's docstring)."""
    if not segments:
        return 0
    ordered = sorted(segments, key=lambda s: s.first_index)
    reached = ordered[0].first_index - 1
    for s in ordered:
        if s.first_index > reached + 1 and not any(
            snap.index >= s.first_index - 1 and snap.index > reached for snap in snapshots
        ):
            break
        reached = max(reached, s.last_index)
    return reached


def partition_prefix(prefix: str, partition: int) -> str:
    return f"{prefix}/p{partition}" if prefix else f"p{partition}"


def manifest_key(prefix: str, partition: int) -> str:
    return f"{partition_prefix(prefix, partition)}/manifest.json"


def segment_key(prefix: str, partition: int, first: int, last: int, sha256: str) -> str:
    where = f"{partition_prefix(prefix, partition)}/segments"
    return f"{where}/{first:020d}-{last:020d}-{sha256[:16]}.wal"


def snapshot_key(prefix: str, partition: int, index: int, term: int, sha256: str) -> str:
    where = f"{partition_prefix(prefix, partition)}/snapshots"
    return f"{where}/{index:020d}-{term:020d}-{sha256[:16]}.snap"
