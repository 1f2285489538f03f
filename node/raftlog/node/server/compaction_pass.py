"""One snapshot-and-compaction pass of a partition, as every driver runs it after applying.

When `compact_every_operations` entries were applied since the last snapshot, the keyed table is
captured at the applied index (`begin_snapshot`) and written as a snapshot; once that file is
durable and the latest, `compact_behind` compacts the log behind it, keeping the
`compact_number_entries` most recent entries, removing at most `max_entries_per_compaction`, and
never passing a retention hold (see `core.compaction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.node.core.compaction import compaction_floor, should_snapshot
from raftlog.node.core.config import RaftConfig
from raftlog.node.core.raft import Raft
from raftlog.node.core.storage import WritableStorage
from raftlog.node.core.types import SnapshotMeta
from raftlog.node.statemachine import KeyedTable, TableCapture


@dataclass(frozen=True, slots=True)
class PendingSnapshot:
    meta: SnapshotMeta  # index, term and membership the snapshot covers
    capture: TableCapture  # the table at meta.index


@dataclass(frozen=True, slots=True)
class CompactionPass:
    snapshot_index: int
    dropped: int  # entries removed from the log
    floor: int  # the compaction floor after the pass: the first index still held


def applied_snapshot_meta(raft: Raft, table: KeyedTable) -> SnapshotMeta:
    """What a snapshot of the table as applied now covers: its index, term and membership."""
    applied = table.applied_index
    return SnapshotMeta(applied, raft.log.term(applied), raft.membership_at(applied))


def snapshot_covering(
    storage: WritableStorage, raft: Raft, table: KeyedTable, required: int
) -> tuple[SnapshotMeta, bytes]:
    """The stored snapshot if it covers `required`, else a fresh one of the applied table."""
    meta = storage.snapshot_meta()
    if meta.index >= required:
        return meta, storage.snapshot_data()
    return applied_snapshot_meta(raft, table), table.snapshot()


def begin_snapshot(
    storage: WritableStorage, raft: Raft, table: KeyedTable, config: RaftConfig, force: bool = False
) -> PendingSnapshot | None:
    """Capture the table for a snapshot if one is due (or `force`d by an operator), else None.

    The capture is a copy: the snapshot's bytes can be encoded and written elsewhere while the
    table goes on applying."""
    applied = table.applied_index
    taken = storage.snapshot_meta().index
    due = should_snapshot(applied, taken, config, table.bytes_since_capture)
    if not due and not (force and applied > taken):
        return None
    if applied < storage.first_index():
        return None  # the table was just restored from a snapshot: nothing new to cover
    return PendingSnapshot(applied_snapshot_meta(raft, table), table.capture())


def compact_behind(
    storage: WritableStorage,
    snapshot_index: int,
    applied: int,
    config: RaftConfig,
    retention_hold: int | None = None,
) -> CompactionPass:
    """Compact the log behind the durable snapshot at `snapshot_index` (already the latest)."""
    floor = compaction_floor(
        first_index=storage.first_index(),
        snapshot_index=storage.snapshot_meta().index,
        applied=applied,
        config=config,
        retention_hold=retention_hold,
    )
    dropped = storage.compact(floor) if floor is not None else 0
    return CompactionPass(snapshot_index, dropped, storage.first_index())
