"""In-memory storage: what the simulator treats as a node's disk.

It survives a simulated crash (the simulator keeps the object and builds a fresh core on it),
so it models exactly what is durable: hard state, persisted entries, the snapshot.
"""

from __future__ import annotations

from raftlog.node.core.errors import Compacted, SafetyViolation, Unavailable
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta


class MemoryStorage:
    def __init__(self, bootstrap: Membership | None = None) -> None:
        self.hard_state = HardState()
        self.snapshot = SnapshotMeta(membership=bootstrap or Membership())
        self._snapshot_data = b""
        # ents[0] is a placeholder standing for the entry just below the floor (index and term).
        self._ents: list[Entry] = [Entry(0, 0, EntryKind.NOOP)]

    # ---- LogStorage ----------------------------------------------------------------------
    def initial_state(self) -> tuple[HardState, SnapshotMeta]:
        return self.hard_state, self.snapshot

    def first_index(self) -> int:
        return self._ents[0].index + 1

    def last_index(self) -> int:
        return self._ents[0].index + len(self._ents) - 1

    def term(self, index: int) -> int:
        base = self._ents[0].index
        if index < base:
            raise Compacted(f"index {index} is below the compaction floor {base + 1}")
        if index > self.last_index():
            raise Unavailable(f"index {index} is beyond the last index {self.last_index()}")
        return self._ents[index - base].term

    def entries(self, lo: int, hi: int) -> list[Entry]:
        base = self._ents[0].index
        if lo <= base:
            raise Compacted(f"index {lo} is below the compaction floor {base + 1}")
        if hi > self.last_index() + 1:
            raise Unavailable(f"index {hi - 1} is beyond the last index {self.last_index()}")
        return self._ents[lo - base : hi - base]

    def config_entries(self, lo: int) -> list[Entry]:
        start = max(lo, self.first_index()) - self._ents[0].index
        return [e for e in self._ents[start:] if e.kind == EntryKind.CONFIG]

    def snapshot_meta(self) -> SnapshotMeta:
        return self.snapshot

    # ---- writes --------------------------------------------------------------------------
    def save(self, hard_state: HardState | None, entries: list[Entry]) -> None:
        if entries:
            first = entries[0].index
            base = self._ents[0].index
            if first <= self.hard_state.commit:
                raise SafetyViolation(
                    f"storage refuses to overwrite committed entry {first} "
                    f"(durable high-water mark {self.hard_state.commit})"
                )
            if first <= base or first > self.last_index() + 1:
                raise SafetyViolation(
                    f"append at {first} does not fit the log [{base + 1}, {self.last_index()}]"
                )
            del self._ents[first - base :]
            self._ents.extend(entries)
        if hard_state is not None:
            self.hard_state = hard_state

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self.snapshot = meta
        self._snapshot_data = data
        self._ents = [Entry(meta.index, meta.term, EntryKind.NOOP)]
        if self.hard_state.commit < meta.index:
            self.hard_state = HardState(self.hard_state.term, self.hard_state.vote, meta.index)

    def create_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        if meta.index <= self.snapshot.index:
            return
        self.snapshot = meta
        self._snapshot_data = data

    def snapshot_data(self) -> bytes:
        return self._snapshot_data

    def compact(self, new_first_index: int) -> int:
        base = self._ents[0].index
        keep_from = new_first_index - 1  # the new placeholder
        if keep_from <= base:
            return 0
        if keep_from > self.snapshot.index:
            raise SafetyViolation(
                f"compaction to {new_first_index} would pass the snapshot at {self.snapshot.index}"
            )
        dropped = keep_from - base
        b = self._ents[keep_from - base]
        self._ents = [Entry(b.index, b.term, EntryKind.NOOP), *self._ents[keep_from - base + 1 :]]
        return dropped
