"""When and how far to compact: a pure function of the partition's counters and the config.

- `compact_every_operations`: applied operations between two snapshot-and-compaction passes;
  `compact_every_bytes`: or that many bytes of entries, whichever comes first.
- `compact_number_entries`: the most recent applied entries always kept after a compaction, so
  briefly lagging followers are caught up by backfill rather than by a snapshot.
- `max_entries_per_compaction`: the most entries one pass removes.
Only entries covered by a durable snapshot are removed, and never past a retention hold.
"""

from __future__ import annotations

from raftlog.node.core.config import RaftConfig


def should_snapshot(
    applied: int, last_snapshot_index: int, config: RaftConfig, bytes_since: int = 0
) -> bool:
    """Due after `compact_every_operations` entries, or `compact_every_bytes` of them (large
    records would otherwise fill gigabytes of log between two snapshots)."""
    if applied <= last_snapshot_index:
        return False
    return applied - last_snapshot_index >= config.compact_every_operations or (
        config.compact_every_bytes > 0 and bytes_since >= config.compact_every_bytes
    )


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
