"""The core's view of one partition's log: durable entries in storage plus unstable ones.

Storage holds what the driver has persisted; `unstable` holds what the core has accepted but the
driver has not yet made durable (handed out in `Ready.entries`). Entries below the compaction
floor are gone; the entry just below the floor is still known by its term (the snapshot boundary).
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from raftlog.node.core.errors import Compacted, SafetyViolation, Unavailable
from raftlog.node.core.storage import LogStorage
from raftlog.node.core.types import Entry, SnapshotMeta


# Compiled by mypyc (raftlog/node/native.py); the simulation's broken cores subclass it.
@mypyc_attr(allow_interpreted_subclasses=True)
class RaftLog:
    def __init__(self, storage: LogStorage, committed: int, snapshot_index: int) -> None:
        self.storage = storage
        # Unstable entries start at `offset`; entries of storage at or above it are superseded.
        self.offset = storage.last_index() + 1
        self.unstable: list[Entry] = []
        self.pending_snapshot: SnapshotMeta | None = None
        # The state machine restarts from the snapshot and re-applies up to the durable commit.
        self.committed = max(committed, snapshot_index)
        self.applied = snapshot_index

    # ---- indices -------------------------------------------------------------------------
    def first_index(self) -> int:
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index + 1
        return self.storage.first_index()

    def last_index(self) -> int:
        if self.unstable:
            return self.unstable[-1].index
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        return self.storage.last_index()

    def last_term(self) -> int:
        return self.term(self.last_index())

    def stable_index(self) -> int:
        """The last entry known durable on this node."""
        if self.pending_snapshot is not None:
            return min(self.offset - 1, self.pending_snapshot.index - 1)
        return min(self.offset - 1, self.storage.last_index())

    def term(self, index: int) -> int:
        """Term of the entry at `index`; the boundary just below the floor is known too."""
        if self.pending_snapshot is not None and index == self.pending_snapshot.index:
            return self.pending_snapshot.term
        if index >= self.offset:
            pos = index - self.offset
            if pos < len(self.unstable):
                return self.unstable[pos].term
            raise Unavailable(f"index {index} is beyond the last entry {self.last_index()}")
        if self.pending_snapshot is not None and index < self.pending_snapshot.index:
            raise Compacted(f"index {index} is below the snapshot at {self.pending_snapshot.index}")
        return self.storage.term(index)

    def term_or_none(self, index: int) -> int | None:
        try:
            return self.term(index)
        except (Compacted, Unavailable):
            return None

    def matches(self, index: int, term: int) -> bool:
        """The anchor check of every append.

        Below the boundary (floor - 1) the entry was committed and compacted: it counts as a
        match. At the boundary the snapshot's term decides; above it the log does.
        """
        boundary = self.first_index() - 1
        if index < boundary:
            return True
        return self.term_or_none(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    # ---- reads ---------------------------------------------------------------------------
    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Entries in [lo, hi). Raises Compacted below the floor."""
        if lo < self.first_index():
            raise Compacted(f"index {lo} is below the compaction floor {self.first_index()}")
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return []
        out: list[Entry] = []
        if lo < self.offset:
            out.extend(self.storage.entries(lo, min(hi, self.offset)))
        if hi > self.offset:
            start = max(lo, self.offset) - self.offset
            out.extend(self.unstable[start : hi - self.offset])
        return out

    def committed_entries_to_apply(self, max_entries: int) -> list[Entry]:
        lo = self.applied + 1
        if lo > self.committed:
            return []
        return self.entries(lo, min(self.committed, lo + max_entries - 1) + 1)

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The last index <= `index` whose term is <= `term`, and that term.

        Stops at the boundary below the floor, where the term is still known.
        """
        boundary = self.first_index() - 1
        index = min(index, self.last_index())
        if index < boundary:
            return index, 0  # compacted here: its term is unknown
        while index > boundary:
            t = self.term(index)
            if t <= term:
                return index, t
            index -= 1
        return boundary, self.term(boundary)

    # ---- writes --------------------------------------------------------------------------
    def append(self, entries: list[Entry]) -> None:
        """Appends entries that follow or overwrite the tail (the caller checked the anchor)."""
        if not entries:
            return
        first = entries[0].index
        if first <= self.committed:
            raise SafetyViolation(
                f"refusing to overwrite committed entry {first} (high-water mark {self.committed})"
            )
        if first > self.last_index() + 1:
            raise SafetyViolation(
                f"append at {first} would leave a hole after last index {self.last_index()}"
            )
        if first >= self.offset:
            del self.unstable[first - self.offset :]
        else:
            # Overwrites durable entries: the driver truncates storage from `first` when it
            # persists these (Ready.entries starts below the storage's last index).
            self.unstable = []
            self.offset = first
        self.unstable.extend(entries)

    def maybe_append(
        self, prev_index: int, prev_term: int, entries: tuple[Entry, ...]
    ) -> tuple[int, int] | None:
        """Follower side of an anchored append. None on mismatch, else (last new index, first
        index actually written or 0).

        Entries that are already present are skipped; the first conflicting one truncates the
        (necessarily uncommitted) divergent tail, which is replaced by the leader's entries.
        """
        if not self.matches(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        if entries and prev_index == self.last_index():
            # The live case: every entry is new here. The loop below would find that out one
            # entry at a time, each through an Unavailable raised and caught.
            self.append(list(entries))
            return last_new, entries[0].index
        written = 0
        floor = self.first_index()
        for i, e in enumerate(entries):
            if e.index < floor:
                continue  # committed and compacted here: it matches by construction
            t = self.term_or_none(e.index)
            if t == e.term:
                continue
            if t is not None and e.index <= self.committed:
                raise SafetyViolation(
                    f"leader sent entry {e.index} term {e.term} conflicting with committed "
                    f"entry of term {t} (high-water mark {self.committed})"
                )
            self.append(list(entries[i:]))
            written = e.index
            break
        return last_new, written

    def commit_to(self, index: int) -> bool:
        if index <= self.committed:
            return False
        if index > self.last_index():
            raise SafetyViolation(f"commit index {index} beyond last index {self.last_index()}")
        self.committed = index
        return True

    def applied_to(self, index: int) -> None:
        if index > self.committed:
            raise SafetyViolation(f"applied {index} beyond high-water mark {self.committed}")
        self.applied = max(self.applied, index)

    def stable_to(self, index: int, term: int) -> None:
        """The driver persisted entries up to `index`; forget the unstable copy."""
        if index < self.offset or not self.unstable:
            return
        pos = index - self.offset
        if pos >= len(self.unstable) or self.unstable[pos].term != term:
            return  # overwritten meanwhile; a later Ready carries the replacement
        del self.unstable[: pos + 1]
        self.offset = index + 1

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log by a snapshot (its data is installed by the driver)."""
        self.pending_snapshot = meta
        self.unstable = []
        self.offset = meta.index + 1
        self.committed = meta.index
        self.applied = meta.index

    def snapshot_persisted(self, index: int) -> None:
        if self.pending_snapshot is not None and self.pending_snapshot.index == index:
            self.pending_snapshot = None
