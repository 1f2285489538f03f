from __future__ import annotations

import random

from raftlog.node.core.types import Entry, EntryKind
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
