"""When and how far to compact: a pure function of the partition's counters and the config.

- `compact_every_operations`: applied operations between two snapshot-and-compaction passes.
- `compact_number_entries`: the most recent applied entries always kept after a compaction, so
  briefly lagging followers are caught up by backfill rather than by a snapshot.
- `max_entries_per_compaction`: the most entries one pass removes.
Only entries covered by a durable snapshot are removed, and never past a retention hold.
"""

from __future__ import annotations

from raftlog.node.config import RaftConfig


def should_snapshot(applied: int, last_snapshot_index: int, config: RaftConfig) -> bool:
    return applied - last_snapshot_index >= config.compact_every_operations


def compaction_floor(
    *,
    first_index: int,
    snapshot_index: int,
    applied: int,
    config: RaftConfig,
    retention_hold: int | None = None,
) -> int | None:
    """The new first index to keep, or None when nothing should be removed now.

    `retention_hold` is the lowest index a reader still needs (it stays in the log).
    """
    last_removable = min(snapshot_index, applied - config.compact_number_entries)
    if retention_hold is not None:
        last_removable = min(last_removable, retention_hold - 1)
    last_removable = min(last_removable, first_index - 1 + config.max_entries_per_compaction)
    if last_removable < first_index:
        return None
    return last_removable + 1
