"""Drive one or a few cores by hand, without the simulator: message in, Ready out."""

from __future__ import annotations

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.messages import Message
from raftlog.node.core.raft import Raft, Ready
from raftlog.node.core.storage import WritableStorage
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership
from raftlog.node.server.compaction_pass import CompactionPass, begin_snapshot, compact_behind
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.memory import MemoryStorage

CFG = RaftConfig(election_ticks=10, heartbeat_ticks=1)


def storage_with(
    entries: list[tuple[int, int]],
    voters: tuple[str, ...] = ("a", "b", "c"),
    commit: int = 0,
    term: int = 0,
) -> MemoryStorage:
    """A storage holding entries given as (index, term)."""
    s = MemoryStorage(Membership.of(list(voters)))
    s.save(
        HardState(term=term or (entries[-1][1] if entries else 0)),
        [Entry(i, t, EntryKind.NORMAL, b"%d/%d" % (i, t)) for i, t in entries],
    )
    if commit:
        s.save(HardState(term=s.hard_state.term, commit=commit), [])
    return s


def drain(raft: Raft, storage: MemoryStorage) -> Ready:
    """Process every Ready the way a driver must; returns them merged."""
    merged = Ready()
    while raft.has_ready():
        rd = raft.ready()
        storage.save(rd.hard_state, rd.entries)
        merged.messages.extend(rd.messages)
        merged.committed.extend(rd.committed)
        merged.events.extend(rd.events)
        merged.snapshot_requests.extend(rd.snapshot_requests)
        raft.advance(rd)
    return merged


def sent(rd: Ready, kind: type) -> list[Message]:
    return [m for m in rd.messages if isinstance(m, kind)]


def snapshot_and_compact(
    storage: WritableStorage,
    raft: Raft,
    table: KeyedTable,
    config: RaftConfig,
    retention_hold: int | None = None,
    force: bool = False,
) -> CompactionPass | None:
    """A whole snapshot-and-compaction pass at once if one is due, written in the caller's
    thread (the node's driver and the simulator write the snapshot while the table goes on
    applying instead: see `server.partition`). None when there is nothing to do."""
    pending = begin_snapshot(storage, raft, table, config, force)
    if pending is None:
        return None
    storage.create_snapshot(pending.meta, pending.capture.encode())
    return compact_behind(storage, pending.meta.index, table.applied_index, config, retention_hold)
