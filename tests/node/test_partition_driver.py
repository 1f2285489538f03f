"""The node's partition driver, in process: a snapshot and the entries behind it in one Ready."""

from __future__ import annotations

import asyncio

from raftlog.node.core.messages import AppendRequest
from raftlog.node.core.types import Entry, Membership, SnapshotMeta
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.snapshots import Chunk, encode_snapshot

PEERS = {f"n{i}": f"http://127.0.0.1:{9 + i}" for i in (1, 2, 3)}  # nobody listens there


def test_entries_after_an_installed_snapshot_are_kept(tmp_path):
    async def run() -> None:
        node = Node(NodeSettings(node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False))
        await node.start()
        try:
            d = node.drivers[0]
            meta = SnapshotMeta(10, 2, Membership(frozenset(PEERS)))
            raw = encode_snapshot(meta, KeyedTable().snapshot())
            rx = d.storage.snapshots.receiver(10, 2)
            assert rx.write(Chunk.of(raw, 0, len(raw)))
            got, data = rx.verify()
            # Both arrive before the driver's next turn, so one Ready carries both.
            d.snapshot_received("n1", 2, rx, got, data)
            new = (Entry(11, 2, data=b"x"), Entry(12, 2, data=b"y"))
            d.step(AppendRequest("n1", "n2", 2, 10, 2, new, 10))
            for _ in range(100):
                await asyncio.sleep(0.01)
                if d.storage.last_index() >= 12:
                    break
            assert d.failed is None
            assert d.storage.snapshot_meta().index == 10
            assert d.storage.entries(11, 13) == list(new)
            assert d.raft.log.last_index() == 12
        finally:
            await node.close()

    asyncio.run(run())
