"""The node's partition driver, in process: a snapshot and the entries behind it in one Ready;
appends coalesced into one batch; append deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.server.helpers import offer_empty_snapshot, until

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import ProposalRefused
from raftlog.node.core.messages import AppendRequest, PreVoteResponse, VoteResponse
from raftlog.node.core.raft import Role
from raftlog.node.core.types import Entry
from raftlog.node.record import Record, encode_record
from raftlog.node.server.node import Node
from raftlog.node.server.partition import PartitionDriver, ProducerBusy
from raftlog.node.settings import NodeSettings
from raftlog.node.storage.errors import StorageFailed

PEERS = {f"n{i}": f"http://127.0.0.1:{9 + i}" for i in (1, 2, 3)}  # nobody listens there


def test_entries_after_an_installed_snapshot_are_kept(tmp_path):
    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            # Both arrive before the driver's next turn, so one Ready carries both.
            offer_empty_snapshot(d, 10, 2, set(PEERS))
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


def _single_node(
    tmp_path, node_id: str = "n1", peers: dict[str, str] | None = None, **raft: object
) -> Node:
    return Node(
        NodeSettings(
            insecure_no_auth=True,
            raft=RaftConfig(**raft),
            node_id=node_id,
            peers=peers or {node_id: PEERS[node_id]},
            data_dir=tmp_path,
            tick_ms=5,
        )
    )


@contextlib.asynccontextmanager
async def _leading(tmp_path: Path) -> AsyncIterator[PartitionDriver]:
    """A single node's partition 0, once it leads and has applied its no-op."""
    node = _single_node(tmp_path)
    await node.start()
    try:
        d = node.drivers[0]
        await until(lambda: d.raft.role == Role.LEADER, "election")
        await until(lambda: d.table.applied_index >= d.raft.log.last_index(), "no-op")
        yield d
    finally:
        await node.close()


@contextlib.asynccontextmanager
async def _elected_by_hand(tmp_path: Path) -> AsyncIterator[PartitionDriver]:
    """n1 of three, elected by n2's pre-vote and vote (all it needs of three); n2 and n3 never
    answer after that, and without check-quorum n1 stays leader."""
    node = _single_node(tmp_path, "n1", PEERS, check_quorum=False)
    await node.start()
    try:
        d = node.drivers[0]
        d.call(d.raft.hup)
        await until(lambda: d.raft.role == Role.PRE_CANDIDATE, "pre-candidacy")
        d.step(PreVoteResponse("n2", "n1", d.raft.term + 1, True))
        await until(lambda: d.raft.role == Role.CANDIDATE, "candidacy")
        d.step(VoteResponse("n2", "n1", d.raft.term, True))
        await until(lambda: d.raft.role == Role.LEADER, "election")
        yield d
    finally:
        await node.close()


def test_appends_coalesced_in_one_turn_keep_their_order_and_their_own_indexes(tmp_path):
    """Proposals that arrive together become one Raft batch (one write, one fsync), and each
    appender is answered with exactly its own contiguous indexes, in arrival order."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            start = d.raft.log.last_index() + 1
            syncs = d.group.fsyncs
            sizes = [1 + (i * 7) % 5 for i in range(40)]
            batches = [[b"%d-%d" % (i, j) for j in range(n)] for i, n in enumerate(sizes)]
            done = await asyncio.gather(*(d.propose(b) for b in batches))
            assert d.group.fsyncs - syncs < len(batches) / 4  # coalesced, not one per append
            index = start
            for b, a in zip(batches, done, strict=True):
                assert (a.first_index, a.last_index) == (index, index + len(b) - 1)
                assert not a.duplicate
                index += len(b)
            got = d.raft.read_committed(start, index)
            assert [e.data for e in got] == [r for b in batches for r in b]

    asyncio.run(run())


def test_an_append_not_committed_in_time_is_told_timeout_and_others_are_not(tmp_path):
    """The driver checks append deadlines on its ticks (no timer per append)."""

    async def run() -> None:
        # n2 and n3 never answer; without check-quorum n1 stays leader (a deposed leader would
        # answer at once, `leader_lost`), so only the deadline can answer.
        async with _elected_by_hand(tmp_path) as d:
            started = time.monotonic()
            slow = asyncio.ensure_future(d.propose([b"never"], timeout=0.1))
            patient = asyncio.ensure_future(d.propose([b"later"], timeout=60))
            finished, _ = await asyncio.wait({slow}, timeout=10)
            assert slow in finished, "the deadline was never checked"
            with pytest.raises(TimeoutError, match="not committed in time"):
                slow.result()
            assert time.monotonic() - started >= 0.1
            assert not patient.done()
            patient.cancel()

    asyncio.run(run())


def test_an_append_is_answered_in_time_while_the_driver_is_stuck_in_a_sync(tmp_path):
    """A hung fsync holds the driver's loop and its ticks: the append still gets its timeout
    while the sync is held, from a backstop that does not need the driver."""

    async def run() -> None:
        node = _single_node(tmp_path, "n1", {"n1": PEERS["n1"]})
        await node.start()
        held, release, returned = threading.Event(), threading.Event(), threading.Event()
        try:
            d = node.drivers[0]
            await until(lambda: d.raft.role == Role.LEADER, "election")
            real = node.journal.sync

            def hung() -> None:
                held.set()
                release.wait(10)
                returned.set()
                real()

            node.journal.sync = hung  # type: ignore[method-assign]
            with pytest.raises(TimeoutError):
                await d.propose([b"stuck"], timeout=0.2)
            assert held.is_set() and not returned.is_set(), "answered while the sync hung"
        finally:
            release.set()
            await node.close()

    asyncio.run(run())


def test_a_leader_whose_storage_fails_steps_down_and_is_not_ready(tmp_path):
    """A failed fsync stops the partition: its appender is told, and the node claims neither
    the leadership its peers will replace nor readiness."""

    async def run() -> None:
        node = _single_node(tmp_path)
        await node.start()
        try:
            d = node.drivers[0]
            await until(lambda: d.raft.role == Role.LEADER, "election")
            assert node.not_ready() is None and node.not_live() is None

            def full() -> None:
                raise StorageFailed(str(tmp_path / "journal"), "write", OSError(28, "No space"))

            node.journal.sync = full  # type: ignore[method-assign]
            with pytest.raises(StorageFailed, match="ENOSPC"):
                await d.propose([b"lost"])
            assert d.raft.role == Role.FOLLOWER and d.raft.leader is None
            reason = node.not_ready()
            assert reason is not None and "[0] stopped writing" in reason and "ENOSPC" in reason
            assert node.not_live() == reason  # restarted by a liveness probe: reopened
        finally:
            await node.close()

    asyncio.run(run())


def test_a_producers_append_refused_by_the_leader_may_be_sent_again(tmp_path):
    """Refused (a transfer under way, say), the batch is not in the log: its sequences are free
    again, and the same append sent again lands (not `producer_busy` for the rest of the
    term)."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            real, refused = d.propose, list[list[bytes]]()

            async def refuse_once(records: list[bytes], timeout: float = float("inf")) -> Any:
                if not refused:
                    refused.append(records)
                    raise ProposalRefused("leadership is being transferred")
                return await real(records, timeout)

            d.propose = refuse_once  # type: ignore[method-assign]
            batch = [encode_record(Record(b"k", b"v", producer_id="p", sequence=0))]
            with pytest.raises(ProposalRefused):
                await d.propose_idempotent("p", 0, batch)
            done = await asyncio.wait_for(d.propose_idempotent("p", 0, batch), 10)
            assert not done.duplicate and d.table.last_sequence("p") == 0

    asyncio.run(run())


def test_a_new_leader_takes_no_producers_append_before_its_log_is_applied(tmp_path):
    """Until its own term's first entry is applied, its table may lack a producer's last
    sequences (committed under the leader before): `producer_busy`, retried, not a guess."""

    async def run() -> None:
        # n2 and n3 never answer after the election: n1's no-op never commits.
        async with _elected_by_hand(tmp_path) as d:
            batch = [encode_record(Record(b"k", b"v", producer_id="p", sequence=0))]
            with pytest.raises(ProducerBusy, match="still applying"):
                await d.propose_idempotent("p", 0, batch, timeout=1)

    asyncio.run(run())
