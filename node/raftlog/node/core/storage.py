"""The storage interface the core reads from, and the driver writes to.

The core only reads (as etcd-io/raft's Storage interface): the driver persists what a `Ready`
hands out and compacts behind a durable snapshot. The in-memory storage of the simulator and the
durable WAL of the node implement the same protocol, so the simulator can run against either.
"""

from __future__ import annotations

from typing import Protocol

from raftlog.node.core.types import Entry, HardState, SnapshotMeta


class LogStorage(Protocol):
    def initial_state(self) -> tuple[HardState, SnapshotMeta]:
        """The durable hard state and the latest snapshot's metadata."""
        ...

    def first_index(self) -> int:
        """The compaction floor: the first index still held."""
        ...

    def last_index(self) -> int:
        """The last index held (first_index - 1 when the log is empty)."""
        ...

    def term(self, index: int) -> int:
        """Term of `index`, for first_index - 1 <= index <= last_index.

        Raises `Compacted` below that range and `Unavailable` above it.
        """
        ...

    def entries(self, lo: int, hi: int) -> list[Entry]:
        """Entries in [lo, hi), within [first_index, last_index + 1)."""
        ...

    def config_entries(self, lo: int) -> list[Entry]:
        """The membership entries at or above `lo` (a restart rebuilds its config history
        from these without reading the whole log)."""
        ...

    def snapshot_meta(self) -> SnapshotMeta: ...


class WritableStorage(LogStorage, Protocol):
    """What a driver needs on top of the core's read view."""

    def save(self, hard_state: HardState | None, entries: list[Entry]) -> None:
        """Durably truncate from entries[0].index if needed, append, and record the hard state."""
        ...

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Replace log and snapshot by a received, verified snapshot."""
        ...

    def create_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Record a snapshot of applied state; the log is not touched."""
        ...

    def snapshot_data(self) -> bytes: ...

    def compact(self, new_first_index: int) -> int:
        """Drop entries below `new_first_index`, never past the snapshot. Returns how many."""
        ...
