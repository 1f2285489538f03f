"""Shared by the node tests that drive a partition in-process."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.raft import Role
from raftlog.node.core.types import Membership, SnapshotMeta
from raftlog.node.server.node import Node
from raftlog.node.server.partition import PartitionDriver
from raftlog.node.settings import NodeSettings
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.snapshots import Chunk, encode_snapshot


async def until(cond: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Wait until `cond()` holds, polling every 10 ms; fails naming `what` after `timeout`."""
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


def one_node(data_dir: Path, **settings: object) -> NodeSettings:
    """The settings of a one-node cluster, n1, ticking every 5 ms (and `settings`)."""
    return NodeSettings(
        insecure_no_auth=True,
        node_id="n1",
        peers={"n1": "http://127.0.0.1:10"},
        data_dir=data_dir,
        tick_ms=5,
        **settings,  # type: ignore[arg-type]
    )


def compacting_node(data_dir: Path, every: int = 50) -> Node:
    """A one-node cluster whose partition snapshots every `every` operations and compacts
    behind it, over segments of 4 KiB (so compaction removes some)."""
    raft = RaftConfig(compact_every_operations=every, compact_number_entries=0)
    return Node(one_node(data_dir, segment_bytes=4096, raft=raft))


def offer_empty_snapshot(d: PartitionDriver, index: int, term: int, voters: set[str]) -> None:
    """Hand `d` an empty table's snapshot at (index, term), received whole from n1 in one
    verified chunk, as a snapshot stream would."""
    meta = SnapshotMeta(index, term, Membership(frozenset(voters)))
    raw = encode_snapshot(meta, KeyedTable().snapshot())
    rx = d.storage.snapshots.receiver(index, term)
    assert rx.write(Chunk.of(raw, 0, len(raw)))
    got, data = rx.verify()
    d.snapshot_received("n1", term, rx, got, data)


class LeadingDriver:
    """A partition driver as the archiver sees it (`server/archive.py`): leading `storage` in
    `term` with `commit` committed. Its read point is the commit index at the time it is asked,
    unless `point` fixes one (a quorum that confirmed less)."""

    archive_floor = 1

    def __init__(
        self, storage: DurableStorage, commit: int, term: int = 1, point: int | None = None
    ) -> None:
        self.storage = storage
        self.raft = types.SimpleNamespace(role=Role.LEADER, term=term, commit=commit, leader="n1")
        self._point = point

    async def linearizable_point(self) -> int:
        return int(self.raft.commit) if self._point is None else self._point


def archiving_node(driver: LeadingDriver) -> Any:
    """The node an `Archiver` of partition 0 reads: its drivers and its id."""
    return types.SimpleNamespace(drivers={0: driver}, id="n1")
