"""Real single-voter partitions appending as fast as they can, to be killed with SIGKILL.

Run as `python -m tests.storage.crash_child DIR SEED MODE` from the repository's root. MODE `wal`:
one partition in DIR/p0 whose WAL syncs itself. MODE `journal`: PARTITIONS partitions in DIR/p0..
sharing the node's journal in DIR/journal (one group commit for all, checkpointed every
CHECKPOINT_BYTES), as a node runs them. It recovers DIR, becomes leader of each, and proposes
batches of records whose bytes are a function of their index (`expected_record`). After each entry
is committed (its batch and the commit record fsynced) it prints `ack PARTITION INDEX TERM KIND`.
It snapshots and compacts often, so kills land in every path: appends, group-commit fsyncs, segment
roll-over, journal checkpoints, snapshot writes and segment deletion.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys

from tests.core.helpers import snapshot_and_compact

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.raft import Raft, Role
from raftlog.node.core.types import Membership
from raftlog.node.record import Record, encode_record
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.group_commit import GroupCommit
from raftlog.node.storage.journal import Journal

CONFIG = RaftConfig(compact_every_operations=150, compact_number_entries=40)
SEGMENT_BYTES = 16 * 1024
PARTITIONS = 3
CHECKPOINT_BYTES = 64 * 1024


def expected_record(index: int) -> bytes:
    key = b"k%d" % (index % 37)
    if index % 11 == 0:
        return encode_record(Record(key=key))  # a tombstone
    size = (index * 7919) % 300 + 1
    digest = hashlib.sha256(b"%d" % index).digest()
    return encode_record(Record(key=key, value=(digest * (size // 32 + 1))[:size]))


def open_partitions(path: str, mode: str) -> tuple[dict[int, DurableStorage], Journal | None]:
    """The partitions in `path` as the child (and the test's audit) opens them."""
    members = Membership.of(["n1"])
    if mode == "wal":
        p0 = os.path.join(path, "p0")
        return {0: DurableStorage(p0, bootstrap=members, segment_bytes=SEGMENT_BYTES)}, None
    journal = Journal(os.path.join(path, "journal"), checkpoint_bytes=CHECKPOINT_BYTES)
    storages = {
        p: DurableStorage(
            os.path.join(path, f"p{p}"),
            bootstrap=members,
            segment_bytes=SEGMENT_BYTES,
            journal=journal.partition(p),
        )
        for p in range(PARTITIONS)
    }
    return storages, journal


async def run(path: str, seed: int, mode: str) -> None:
    storages, journal = open_partitions(path, mode)
    if journal is not None:
        journal.start({p: s.wal for p, s in storages.items()})
        group = GroupCommit(journal.sync)
    else:
        group = GroupCommit(storages[0].sync)
    rafts = {p: Raft("n1", CONFIG, s, seed=seed + p) for p, s in storages.items()}
    tables = {p: KeyedTable.restore(s.snapshot_data()) for p, s in storages.items()}
    wakes = {p: asyncio.Event() for p in storages}
    out = sys.stdout

    async def durable() -> None:
        await group.durable(group.wrote())

    async def drive(p: int) -> None:
        raft, storage, table, wake = rafts[p], storages[p], tables[p], wakes[p]
        while True:
            if not raft.has_ready():
                await wake.wait()
                wake.clear()
                continue
            rd = raft.ready()
            storage.write(rd.hard_state, rd.entries)
            if rd.entries or rd.hard_state is not None:
                await durable()
            if rd.committed:
                for e in rd.committed:
                    table.apply(e)
                acks = (f"ack {p} {e.index} {e.term} {int(e.kind)}\n" for e in rd.committed)
                out.write("".join(acks))
                out.flush()
            raft.advance(rd)
            snapshot_and_compact(storage, raft, table, CONFIG)

    async def checkpoints() -> None:
        while journal is not None:
            if journal.due():
                await journal.checkpoint(lambda: {p: s.wal for p, s in storages.items()}, durable)
            await asyncio.sleep(0.005)

    async def tick() -> None:
        while True:
            for p, raft in rafts.items():
                raft.tick()
                wakes[p].set()
            await asyncio.sleep(0.01)

    async def propose() -> None:
        rng = random.Random(seed)
        while any(r.role != Role.LEADER for r in rafts.values()):
            await asyncio.sleep(0.001)
        states = (f"p{p}:term={r.term},commit={r.commit}" for p, r in rafts.items())
        print("ready " + " ".join(states))
        out.flush()
        while True:
            p = rng.randrange(len(rafts))
            raft = rafts[p]
            if raft.log.last_index() - tables[p].applied_index > 256:
                await asyncio.sleep(0.001)
                continue
            start = raft.log.last_index() + 1
            batch = [expected_record(start + i) for i in range(rng.randint(1, 32))]
            assert raft.propose_batch(batch)[0][0] == start
            wakes[p].set()
            await asyncio.sleep(0)

    for raft in rafts.values():
        raft.hup()
    for wake in wakes.values():
        wake.set()
    await asyncio.gather(*(drive(p) for p in rafts), checkpoints(), tick(), propose())


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
