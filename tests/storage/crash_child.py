"""A real single-voter partition appending as fast as it can, to be killed with SIGKILL.

Run as `python crash_child.py DIR`. It recovers DIR, becomes leader, and proposes batches of
records whose bytes are a function of their index (`expected_record`). After each entry is
committed (its batch and the commit record fsynced) it prints `ack INDEX TERM KIND`. It snapshots
and compacts often, so kills land in every path: appends, group-commit fsyncs, segment roll-over,
snapshot writes and segment deletion.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.raft import Raft, Role
from raftlog.node.core.types import Membership
from raftlog.node.record import Record, encode_record
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.compactor import snapshot_and_compact
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.group_commit import GroupCommit

CONFIG = RaftConfig(compact_every_operations=150, compact_number_entries=40)
SEGMENT_BYTES = 16 * 1024


def expected_record(index: int) -> bytes:
    key = b"k%d" % (index % 37)
    if index % 11 == 0:
        return encode_record(Record(key=key))  # a tombstone
    size = (index * 7919) % 300 + 1
    digest = hashlib.sha256(b"%d" % index).digest()
    return encode_record(Record(key=key, value=(digest * (size // 32 + 1))[:size]))


async def run(path: str, seed: int) -> None:
    storage = DurableStorage(path, bootstrap=Membership.of(["n1"]), segment_bytes=SEGMENT_BYTES)
    table = KeyedTable.restore(storage.snapshot_data())
    raft = Raft("n1", CONFIG, storage, seed=seed)
    group = GroupCommit(storage.sync)
    wake = asyncio.Event()
    out = sys.stdout

    async def drive() -> None:
        while True:
            if not raft.has_ready():
                await wake.wait()
                wake.clear()
                continue
            rd = raft.ready()
            storage.write(rd.hard_state, rd.entries)
            if rd.entries or rd.hard_state is not None:
                await group.durable(group.wrote())
            if rd.committed:
                for e in rd.committed:
                    table.apply(e)
                out.write("".join(f"ack {e.index} {e.term} {int(e.kind)}\n" for e in rd.committed))
                out.flush()
            raft.advance(rd)
            snapshot_and_compact(storage, raft, table, CONFIG)

    async def tick() -> None:
        while True:
            raft.tick()
            wake.set()
            await asyncio.sleep(0.01)

    async def propose() -> None:
        rng = random.Random(seed)
        while raft.role != Role.LEADER:
            await asyncio.sleep(0.001)
        print(f"ready term={raft.term} commit={raft.commit} last={raft.log.last_index()}")
        out.flush()
        while True:
            if raft.log.last_index() - table.applied_index > 256:
                await asyncio.sleep(0.001)
                continue
            start = raft.log.last_index() + 1
            batch = [expected_record(start + i) for i in range(rng.randint(1, 32))]
            assert raft.propose_batch(batch)[0][0] == start
            wake.set()
            await asyncio.sleep(0)

    raft.hup()
    wake.set()
    await asyncio.gather(drive(), tick(), propose())


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], int(sys.argv[2])))
