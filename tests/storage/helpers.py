from __future__ import annotations

import random

from crc32c import crc32c

from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.segment import scan


def payload(index: int, term: int, size: int = 40) -> bytes:
    rng = random.Random(index * 1_000_003 + term)
    return b"%d/%d:" % (index, term) + rng.randbytes(size)


def ents(lo: int, hi: int, term: int, size: int = 40) -> list[Entry]:
    """Entries lo..hi inclusive, with payloads derived from (index, term)."""
    return [Entry(i, term, EntryKind.NORMAL, payload(i, term, size)) for i in range(lo, hi + 1)]


def records_end(path: str) -> int:
    """Where the records of a WAL's last segment end (zeros follow, up to its allocated size)."""
    with open(path, "rb") as f:
        return scan(path, f.read(), is_last=True).valid_end


def forged(raw: bytes, last: bool = False, byte: int = -1) -> bytes:
    """Segment object `raw` with `byte` of its first (or `last`) entry's data flipped and that
    record's checksum made to match: only a digest of the whole object tells it from the real
    one."""
    entries = [r for r in scan("object", raw, is_last=False).records if r.kind == fmt.T_ENTRY]
    rec = entries[-1] if last else entries[0]
    length = fmt.REC_HEAD.unpack_from(raw, rec.offset)[0]
    body = bytearray(raw[rec.offset + 8 : rec.offset + 8 + length])
    body[byte] ^= 1
    head = fmt.REC_HEAD.pack(length, crc32c(bytes(body)))
    out = raw[: rec.offset] + head + bytes(body) + raw[rec.offset + 8 + length :]
    assert scan("object", out, is_last=False).corruption is None and out != raw
    return out
