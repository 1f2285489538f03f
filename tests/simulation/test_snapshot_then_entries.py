"""A Ready holding both a snapshot and the entries right after it (found in review).

When an InstallSnapshot and the append behind it are stepped before the driver takes a Ready,
that Ready carries the snapshot and new entries together. The snapshot must be installed first:
installing resets the log, and doing it second wiped entries the follower had acknowledged.
"""

from __future__ import annotations

import logging

import pytest

from raftlog.node.core.messages import AppendRequest, AppendResponse, InstallSnapshot
from raftlog.node.core.types import Entry, Membership, SnapshotMeta
from raftlog.node.sim.cluster import Cluster
from raftlog.node.statemachine import KeyedTable

pytestmark = [pytest.mark.simulation]


@pytest.mark.parametrize("storage", ["memory", "wal"])
def test_simulator_driver_keeps_entries_that_follow_a_snapshot(tmp_path, storage, caplog):
    caplog.set_level(logging.ERROR, logger="raftlog.storage")
    c = Cluster(
        ["n1", "n2", "n3"],
        seed=1,
        compaction=False,
        data_dir=str(tmp_path) if storage == "wal" else None,
    )
    node = c.nodes["n2"]
    meta = SnapshotMeta(10, 2, Membership.of(["n1", "n2", "n3"]))
    node.pending_snapshots[0] = {meta.index: (meta, KeyedTable().snapshot())}
    raft = node.raft(0)
    raft.step(InstallSnapshot("n1", "n2", 2, meta))
    new = (Entry(11, 2, data=b"x"), Entry(12, 2, data=b"y"))
    raft.step(AppendRequest("n1", "n2", 2, 10, 2, new, 10))
    acks = []
    c.network.send = lambda now, src, dst, payload, extra_delay=0: acks.append(payload)  # type: ignore[method-assign]
    c._process(node)
    storage_ = node.storages[0]
    assert storage_.snapshot_meta().index == 10
    assert storage_.last_index() == 12, "the entries after the snapshot were kept"
    assert storage_.entries(11, 13) == list(new)
    acked = [p.message.index for p in acks if isinstance(p.message, AppendResponse)]
    assert max(acked) == 12
    c.close()
