"""One snapshot-and-compaction pass of a partition, as every driver runs it after applying.

When `compact_every_operations` entries were applied since the last snapshot, the keyed table is
snapshotted at the applied index; then the log is compacted behind that durable snapshot, keeping
the `compact_number_entries` most recent entries, removing at most `max_entries_per_compaction`,
and never passing a retention hold (see `core.compaction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.node.config import RaftConfig
from raftlog.node.core.compaction import compaction_floor, should_snapshot
from raftlog.node.core.raft import Raft
from raftlog.node.core.types import SnapshotMeta
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.base import WritableStorage


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


def snapshot_and_compact(
    storage: WritableStorage,
    raft: Raft,
    table: KeyedTable,
    config: RaftConfig,
    retention_hold: int | None = None,
    force: bool = False,
) -> CompactionPass | None:
    """Run a pass if one is due (or `force`d by an operator); None when there is nothing to do."""
    applied = table.applied_index
    due = should_snapshot(applied, storage.snapshot_meta().index, config)
    if not due and not (force and applied > storage.snapshot_meta().index):
        return None
    if applied < storage.first_index():
        return None  # the table was just restored from a snapshot: nothing new to cover
    meta = applied_snapshot_meta(raft, table)
    storage.create_snapshot(meta, table.snapshot())
    floor = compaction_floor(
        first_index=storage.first_index(),
        snapshot_index=storage.snapshot_meta().index,
        applied=applied,
        config=config,
        retention_hold=retention_hold,
    )
    dropped = storage.compact(floor) if floor is not None else 0
    return CompactionPass(meta.index, dropped, storage.first_index())
