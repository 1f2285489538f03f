"""A partition's snapshots are written off the event loop: the log is compacted behind a
snapshot only once its file is durable, at most one is in flight, and a crash image taken at any
step of the write opens to the same table."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.server.helpers import compacting_node, offer_empty_snapshot, until

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.messages import AppendRequest
from raftlog.node.core.raft import Role
from raftlog.node.core.types import Entry
from raftlog.node.server.node import Node
from raftlog.node.server.partition import PartitionDriver
from raftlog.node.settings import NodeSettings
from raftlog.node.statemachine import KeyedTable, TableCapture
from raftlog.node.storage.fileio import FileOps

HOLD_SECONDS = 10.0  # a held step gives up after this, so broken code fails instead of hanging


class HeldOps(FileOps):
    """File operations of the snapshot store whose first `step` ("fsync": the new file's,
    before the rename; "fsync_dir": after the rename) waits until released."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.reached = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def _hold(self) -> None:
        self.calls += 1
        if self.calls == 1:  # the first write only: later ones (an install's) go through
            self.reached.set()
            self.release.wait(HOLD_SECONDS)

    def fsync(self, fd: int) -> None:
        if self.step == "fsync":
            self._hold()
        super().fsync(fd)

    def fsync_dir(self, path: str) -> None:
        if self.step == "fsync_dir":
            self._hold()
        super().fsync_dir(path)


async def _leader(node: Node) -> PartitionDriver:
    await node.start()
    d = node.drivers[0]
    await until(lambda: d.raft.role == Role.LEADER, "election")
    await until(lambda: d.table.applied_index >= d.raft.log.last_index(), "no-op")
    return d


@contextlib.asynccontextmanager
async def _held_leader(
    data_dir: Path, step: str = "fsync"
) -> AsyncIterator[tuple[PartitionDriver, HeldOps]]:
    """A one-node leader whose snapshot store holds its first write at `step` until released."""
    node = compacting_node(data_dir)
    d = await _leader(node)
    held = HeldOps(step)
    d.storage.snapshots.ops = held
    try:
        yield d, held
    finally:
        held.release.set()
        await node.close()


def _record(i: int) -> bytes:
    return b'{"key": "k%d", "value": "%s"}' % (i % 37, b"v" * 100 + b"%d" % i)


async def _append(d: PartitionDriver, lo: int, hi: int) -> None:
    for i in range(lo, hi, 10):
        await d.propose([_record(j) for j in range(i, min(i + 10, hi))])


async def _await_hold(held: HeldOps) -> None:
    await until(held.reached.is_set, "the snapshot write reaching its held step")


def test_the_log_is_compacted_only_once_the_snapshot_is_durable(tmp_path):
    """While the snapshot's file waits for its fsync, appends go on (the loop is free), and
    neither the snapshot index nor the compaction floor moves; after it, both do."""

    async def run() -> None:
        async with _held_leader(tmp_path) as (d, held):
            before = (d.storage.snapshot_meta().index, d.storage.first_index())
            await _append(d, 0, 60)  # passes compact_every_operations: a snapshot starts
            await _await_hold(held)
            await asyncio.wait_for(_append(d, 60, 200), HOLD_SECONDS / 2)
            assert (d.storage.snapshot_meta().index, d.storage.first_index()) == before
            assert held.calls == 1, "a second snapshot started while one was in flight"
            held.release.set()
            await until(lambda: d.storage.first_index() > before[1], "the compaction")
            snap = d.storage.snapshot_meta().index
            assert snap >= 50
            assert d.storage.first_index() <= snap + 1  # nothing past the snapshot
            assert d.counters.snapshots_taken >= 1
            # The snapshot is the table as applied at its index.
            replay = KeyedTable.restore(d.storage.snapshot_data())
            assert replay.applied_index == snap
            for e in d.raft.read_committed(snap + 1, d.table.applied_index + 1):
                replay.apply(e)
            assert replay.rows == d.table.rows

    asyncio.run(run())


def test_an_operator_pass_waits_for_the_snapshot_in_flight_then_takes_a_new_one(tmp_path):
    async def run() -> None:
        async with _held_leader(tmp_path) as (d, held):
            await _append(d, 0, 60)
            await _await_hold(held)
            await _append(d, 60, 80)  # applied beyond the snapshot in flight
            applied = d.table.applied_index
            operator = asyncio.ensure_future(d.compact_now())
            await asyncio.sleep(0.1)
            assert not operator.done(), "answered before the snapshot in flight was durable"
            held.release.set()
            done = await asyncio.wait_for(operator, HOLD_SECONDS)
            assert done is not None
            assert done.snapshot_index == applied == d.storage.snapshot_meta().index
            assert done.floor == d.storage.first_index() <= applied + 1
            assert await d.compact_now() is None  # nothing new since: no snapshot

    asyncio.run(run())


def test_a_retention_hold_bounds_the_compaction_after_the_write(tmp_path):
    async def run() -> None:
        async with _held_leader(tmp_path) as (d, held):
            await _append(d, 0, 60)
            await _await_hold(held)
            d.storage.set_hold("reader", 20, ttl_seconds=600)  # set while the write is held
            held.release.set()
            await _append(d, 60, 300)
            await d.compact_now()  # None when a pass due anyway was just at this index
            assert d.storage.snapshot_meta().index == d.table.applied_index >= 300
            assert d.storage.first_index() <= 20

    asyncio.run(run())


def _reopen(data_dir: Path, expected: KeyedTable) -> tuple[int, int]:
    """Open a crash image as a node, let it apply its log and compare its table with the one
    the crashed node had; returns the snapshot index and the compaction floor it opened with."""

    async def run() -> tuple[int, int]:
        node = compacting_node(data_dir, every=10**6)
        d = node.drivers[0]
        opened = (d.storage.snapshot_meta().index, d.storage.first_index())
        await node.start()
        try:
            await until(lambda: d.raft.role == Role.LEADER, "election after the crash")
            await until(lambda: d.table.applied_index >= expected.applied_index, "replay")
            assert d.table.rows == expected.rows
            return opened
        finally:
            await node.close()

    return asyncio.run(run())


def _crash_during(tmp_path: Path, step: str) -> tuple[tuple[int, int], tuple[int, int], str]:
    """Copy the node's files while its snapshot write is held at `step`: what a crash at that
    instant leaves (written bytes are in the page cache, which a process crash keeps). Returns
    the snapshot index and floor before the write, those the copy opens with, and its snap dir."""
    live, image = tmp_path / "live", tmp_path / "image"
    expected = KeyedTable()

    async def run() -> tuple[int, int]:
        async with _held_leader(live, step) as (d, held):
            before = (d.storage.snapshot_meta().index, d.storage.first_index())
            await _append(d, 0, 60)
            await _await_hold(held)
            await _append(d, 60, 90)
            expected.rows, expected.applied_index = dict(d.table.rows), d.table.applied_index
            shutil.copytree(live, image)
            return before

    before = asyncio.run(run())
    listing = " ".join(sorted(os.listdir(image / "p0" / "snap")))
    return before, _reopen(image, expected), listing


def test_a_crash_before_the_snapshot_file_is_durable_opens_with_the_previous_one(tmp_path):
    before, opened, listing = _crash_during(tmp_path, "fsync")
    assert ".tmp" in listing  # the image holds the half-made file
    assert opened == before  # it is dropped; the log was never compacted behind it


def test_a_crash_after_the_rename_before_compaction_opens_with_the_new_snapshot(tmp_path):
    before, opened, _ = _crash_during(tmp_path, "fsync_dir")
    assert opened[0] >= 50  # the renamed file is the newest: taken
    assert opened[1] == before[1]  # and the log still holds everything behind it


def test_a_snapshot_installed_from_the_leader_meanwhile_wins_over_the_one_in_flight(tmp_path):
    """A follower's own snapshot is still being written when the leader's newer one installs:
    the older file is dropped when its write ends, and the installed one stays the latest."""

    async def run() -> None:
        peers = {f"n{i}": f"http://127.0.0.1:{9 + i}" for i in (1, 2, 3)}  # nobody listens
        node = Node(
            NodeSettings(
                insecure_no_auth=True,
                node_id="n2",
                peers=peers,
                data_dir=tmp_path,
                raft=RaftConfig(compact_every_operations=50, compact_number_entries=0),
            )
        )
        await node.start()
        d = node.drivers[0]
        held = HeldOps("fsync")
        d.storage.snapshots.ops = held
        try:
            entries = tuple(Entry(i, 1, data=_record(i)) for i in range(1, 61))
            d.step(AppendRequest("n1", "n2", 1, 0, 0, entries, 60))
            await _await_hold(held)  # the follower's own snapshot at 60 is being written
            offer_empty_snapshot(d, 100, 1, set(peers))
            await until(lambda: d.storage.snapshot_meta().index == 100, "the install")
            installed = os.path.basename(d.storage.snapshots.file or "")
            held.release.set()
            snap_dir = tmp_path / "p0" / "snap"
            await until(lambda: os.listdir(snap_dir) == [installed], "the local file dropped")
            assert d.failed is None
            assert d.storage.snapshot_meta().index == 100
            assert d.counters.snapshots_taken == 0  # the local one was never adopted
        finally:
            held.release.set()
            await node.close()

    asyncio.run(run())


def test_a_snapshot_that_fails_other_than_by_a_write_stops_the_partition_loudly(
    tmp_path, monkeypatch
):
    """Not only a failed write: any error in the snapshot's thread (here: no memory to encode)
    stops the partition, and an operator's pass then fails at once instead of waiting for a
    snapshot that can never be adopted."""

    def no_memory(self: TableCapture) -> bytes:
        raise MemoryError("encoding the table")

    monkeypatch.setattr(TableCapture, "encode", no_memory)

    async def run() -> None:
        node = compacting_node(tmp_path)
        d = await _leader(node)
        try:
            with contextlib.suppress(MemoryError):
                await _append(d, 0, 60)  # passes compact_every_operations: a snapshot starts
            await until(lambda: d.failed is not None, "the partition stopping")
            assert isinstance(d.failed, MemoryError)
            with pytest.raises(MemoryError):
                await asyncio.wait_for(d.compact_now(), HOLD_SECONDS / 2)
            with pytest.raises(MemoryError):
                await d.propose([_record(1)])
        finally:
            await node.close()

    asyncio.run(run())
