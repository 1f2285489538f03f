"""Term and vote, written atomically (temp file, fsync, rename, fsync of the directory).

They change only in elections, so a whole-file rewrite costs little; the commit index, which
changes all the time, rides in the WAL instead.
"""

from __future__ import annotations

import json
import os

from crc32c import crc32c

from raftlog.node.storage.errors import CorruptFile
from raftlog.node.storage.fileio import FileOps, atomic_write


class HardStateFile:
    def __init__(self, path: str, *, durable: bool = True, ops: FileOps | None = None) -> None:
        self.path = path
        self.durable = durable
        self.ops = ops or FileOps()
        # Found when opened. Absent until the first term or vote is saved, and entries are
        # never written before it (`DurableStorage._reconcile_term`).
        self.on_disk = os.path.exists(path)
        self.term, self.vote = self._load()

    def _load(self) -> tuple[int, str | None]:
        if not os.path.exists(self.path):
            return 0, None
        with open(self.path, "rb") as f:
            raw = f.read()
        body, _, crc = raw.rstrip(b"\n").rpartition(b"\n")
        if not crc.isdigit() or crc32c(body) != int(crc):
            # Written by rename only, so this is disk damage: never guess a term or a vote.
            raise CorruptFile(self.path, "hard state checksum mismatch")
        h = json.loads(body)
        return int(h["term"]), h["vote"]

    def save(self, term: int, vote: str | None) -> None:
        if (term, vote) == (self.term, self.vote):
            return
        body = json.dumps({"term": term, "vote": vote}, sort_keys=True).encode()
        atomic_write(
            self.path, body + b"\n" + str(crc32c(body)).encode() + b"\n", self.ops, self.durable
        )
        self.term, self.vote = term, vote

    def lost_beside(self, last_index: int, snapshot_index: int) -> bool:
        """Whether the file was lost: it is written before the first entry and only ever
        replaced, so its absence beside any entry, or a snapshot past the initial members'
        (taken from entries, or installed after the leader's first append), means votes this
        member may have cast are gone (the node refuses to start; `raftctl wal check` says
        CORRUPTED). A partition compacted whole has a snapshot and no entry past it."""
        return not self.on_disk and max(last_index, snapshot_index) > 0
