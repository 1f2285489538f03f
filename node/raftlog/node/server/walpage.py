"""WAL pages: committed records exactly as the WAL frames them, for readers that check and
decode records themselves (the JVM Spark reader, `format=wal` on `/columns`).

A column page costs the node about a microsecond of CPU per record (checksum, msgspec decode,
columns). On a small machine shared with Spark, that work is the read's bottleneck; a WAL page
moves it to the reader, which scales with the executors. The node does the `pread` and nothing
per record: no checksum check (the reader checks every record's crc32c, so damaged bytes are
served as they are and the reader asks another replica), no decode, no worker thread.

The page is one MessagePack map:

| field | value |
|---|---|
| `partition`, `high_water_mark`, `compaction_floor`, `next` | as in the column page |
| `first` | the index of the first entry record in `records` (the one asked for) |
| `records` | WAL records (`segment.py`: length u32, crc32c u32, body), `first` to `next - 1` |

The entries run in order without gaps; COMMIT records may sit between them.

Entries of every kind are framed (no-ops and membership changes too: the reader skips what is
not NORMAL). Committed entries the driver has not persisted yet come from the core, framed by
the WAL's encoder (so their checksums are real). The bounds are the column page's: never above
this replica's high-water mark, `limit` entries, about `max_bytes` (at most MAX_PAGE_BYTES) of
records, Compacted below the floor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from raftlog.node.server.columnar import MAX_PAGE_BYTES, committed_range
from raftlog.node.storage.segment import encode_entry

if TYPE_CHECKING:
    from raftlog.node.server.partition import PartitionDriver

CONTENT_TYPE = "application/vnd.raftlog.wal+msgpack"
_encoder = msgspec.msgpack.Encoder()


def read_wal_records(
    d: PartitionDriver, start: int, stop: int, limit: int, max_bytes: int
) -> bytes:
    """The WAL page of committed records [start, stop) (see the module docstring). Runs on
    the event loop: one pread per segment spanned, and a join of the bytes."""
    r = committed_range(d, start, stop, limit, min(max_bytes, MAX_PAGE_BYTES))
    parts = [raw.buf for raw in r.raws]
    parts.extend(encode_entry(e) for e in r.tail)
    page: dict[str, Any] = {
        "partition": d.p,
        "high_water_mark": r.hwm,
        "compaction_floor": d.storage.compaction_floor(),
        "next": r.next_index,
        "first": start,
        "records": b"".join(parts),
    }
    return _encoder.encode(page)
