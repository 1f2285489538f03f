"""The node's partition driver, in process: a snapshot and the entries behind it in one Ready;
appends coalesced into one batch; append deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from tests.server.helpers import offer_empty_snapshot, one_node, until

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import NotLeader, ProposalRefused
from raftlog.node.core.messages import (
    AppendRequest,
    AppendResponse,
    HeartbeatResponse,
    PreVoteResponse,
    TimeoutNow,
    VoteResponse,
)
from raftlog.node.core.raft import MAX_APPLY_PER_READY, Role
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import Record, encode_record
from raftlog.node.server.app import build_app
from raftlog.node.server.node import Node
from raftlog.node.server.partition import (
    NotCommitted,
    PartitionDriver,
    PartlyAppended,
    ProducerBusy,
    SequenceConflict,
)
from raftlog.node.settings import NodeSettings
from raftlog.node.storage.errors import StorageFailed
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.journal import _segment_path, list_journal

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
async def _elected_by_hand(tmp_path: Path, **raft: object) -> AsyncIterator[PartitionDriver]:
    """n1 of three, elected by n2's pre-vote and vote (all it needs of three); n2 and n3 never
    answer after that, and without check-quorum n1 stays leader."""
    node = _single_node(tmp_path, "n1", PEERS, check_quorum=False, **raft)
    await node.start()
    try:
        d = node.drivers[0]
        await _elect_by_hand(d)
        yield d
    finally:
        await node.close()


async def _elect_by_hand(d: PartitionDriver) -> None:
    """n1 campaigns and n2's pre-vote and vote elect it (all it needs of three)."""
    d.call(d.raft.hup)
    await until(lambda: d.raft.role == Role.PRE_CANDIDATE, "pre-candidacy")
    d.step(PreVoteResponse("n2", "n1", d.raft.term + 1, True))
    await until(lambda: d.raft.role == Role.CANDIDATE, "candidacy")
    d.step(VoteResponse("n2", "n1", d.raft.term, True))
    await until(lambda: d.raft.role == Role.LEADER, "election")


@contextlib.asynccontextmanager
async def _follower_n2(tmp_path: Path) -> AsyncIterator[PartitionDriver]:
    """Partition 0's driver on n2 of three, durable, whose peers never answer."""
    node = Node(NodeSettings(insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path))
    await node.start()
    try:
        yield node.drivers[0]
    finally:
        await node.close()


def test_an_installed_snapshots_table_is_never_shown_above_the_mark(tmp_path):
    """Found by a review: the table was swapped in when the snapshot was installed, and the
    mark moved only after the pass's fsync, so a local key read between the two showed an
    applied index above the high-water mark."""

    async def run() -> None:
        async with _follower_n2(tmp_path) as d:
            with HeldSync(d.node) as hold:
                offer_empty_snapshot(d, 10, 2, set(PEERS))
                new = (Entry(11, 2, data=b"x"), Entry(12, 2, data=b"y"))
                d.step(AppendRequest("n1", "n2", 2, 10, 2, new, 10))
                await until(hold.held.is_set, "the pass's sync")
                assert d.storage.snapshot_meta().index == 10, "installed before the sync"
                assert d.table.applied_index <= d.high_water_mark == 10
            await until(lambda: d.storage.last_index() >= 12, "the entries written")
            assert d.failed is None

    asyncio.run(run())


def test_entries_committed_but_not_synced_here_are_never_read(tmp_path):
    """A follower's core commits what its leader says is committed as soon as it matches the
    entries; readers' mark moves only after this node's own sync. A read clamped one past the
    mark survived every test (a planted-bug review)."""

    async def run() -> None:
        async with _follower_n2(tmp_path) as d:
            offer_empty_snapshot(d, 10, 2, set(PEERS))
            await until(lambda: d.high_water_mark == 10, "the snapshot installed")
            with HeldSync(d.node) as hold:
                new = (Entry(11, 2, data=b"x"), Entry(12, 2, data=b"y"))
                d.step(AppendRequest("n1", "n2", 2, 10, 2, new, 12))
                await until(hold.held.is_set, "the pass's sync")
                assert d.raft.commit == 12 and d.high_water_mark == 10
                assert d.read_committed(11, 100) == []
            await until(lambda: d.high_water_mark == 12, "the mark after the sync")
            assert [e.index for e in d.read_committed(11, 100)] == [11, 12]

    asyncio.run(run())


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


class HeldSync:
    """The node's journal sync held (as a disk that hangs) until `release`, then done; leaving
    the `with` releases it, so the node can close."""

    def __init__(self, node: Node) -> None:
        self.held, self.release, self.returned = (threading.Event() for _ in range(3))
        self.real = node.journal.sync
        node.journal.sync = self._sync  # type: ignore[method-assign]

    def __enter__(self) -> HeldSync:
        return self

    def __exit__(self, *_: object) -> None:
        self.release.set()

    def _sync(self) -> None:
        self.held.set()
        self.release.wait(10)
        self.returned.set()
        self.real()


def _sent_by(node: Node) -> list[Any]:
    """Every message the node's transport is given to send from now on (and still sends)."""
    sent: list[Any] = []
    real_send = node.transport.send

    def send(partition: int, messages: list[Any]) -> bool:
        sent.extend(messages)
        return real_send(partition, messages)

    node.transport.send = send  # type: ignore[method-assign]
    return sent


def test_an_append_is_answered_in_time_while_the_driver_is_stuck_in_a_sync(tmp_path):
    """A hung fsync holds the driver's loop and its ticks: the append still gets its timeout
    while the sync is held, from a backstop that does not need the driver."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            with HeldSync(d.node) as hold:
                with pytest.raises(TimeoutError):
                    await d.propose([b"stuck"], timeout=0.2)
                assert hold.held.is_set() and not hold.returned.is_set(), "answered while it hung"

    asyncio.run(run())


def test_an_append_told_it_timed_out_while_the_driver_was_stuck_is_not_appended_later(tmp_path):
    """An appender answered TimeoutError by the backstop before the driver took its records
    may retry them elsewhere: once the sync returns, the driver must drop them, not append
    them after all (they would be in the log twice)."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            with HeldSync(d.node) as hold:
                stuck = asyncio.ensure_future(d.propose([b"stuck"], timeout=0.2))
                await until(hold.held.is_set, "the driver stuck in the first append's sync")
                with pytest.raises(NotCommitted, match="not proposed in time"):
                    await d.propose([b"late"], timeout=0.2)  # never taken by the stuck driver
            d.node.journal.sync = hold.real  # type: ignore[method-assign]
            with contextlib.suppress(TimeoutError):
                await stuck
            done = await asyncio.wait_for(d.propose([b"after"]), 10)
            got = [e.data for e in d.raft.read_committed(1, done.last_index + 1)]
            assert b"after" in got and b"late" not in got, got

    asyncio.run(run())


def test_an_append_whose_index_a_new_leader_took_is_told_not_committed(tmp_path):
    """n1's entry at index 2 is replaced by n2's of a later term, committed in the same
    message: its appender must hear NotCommitted, never that its records landed."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path) as d:
            term = d.raft.term
            mine = asyncio.ensure_future(d.propose([b"mine"]))
            await until(lambda: d.raft.log.last_index() == 2, "the append written")
            theirs = encode_record(Record(b"k", b"theirs"))
            replaced = (Entry(1, term + 1, data=theirs), Entry(2, term + 1, data=theirs))
            d.step(AppendRequest("n2", "n1", term + 1, 0, 0, replaced, 2))
            with pytest.raises(NotCommitted, match="taken by term"):
                await asyncio.wait_for(mine, 10)
            assert d.raft.log.term(2) == term + 1

    asyncio.run(run())


def _rec(seq: int) -> bytes:
    return encode_record(Record(b"k", b"v%d" % seq, producer_id="p", sequence=seq))


def test_a_batch_cut_by_a_leader_change_is_told_partly_appended_and_its_retry_adds_the_rest(
    tmp_path,
):
    """Found by a review: a batch longer than one append message can be cut by a leader
    change, the new leader committing the records it had. Its appender was told the append
    did not happen (a retry without a producer id duplicated them), and the producer's retry
    of the same sequences was a `sequence_conflict` for good."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path) as d:
            term = d.raft.term
            d.step(AppendResponse("n2", "n1", term, True, 1))
            await until(lambda: d.table.applied_index >= 1, "the no-op applied")
            batch = [_rec(0), _rec(1), _rec(2)]
            mine = asyncio.ensure_future(d.propose_idempotent("p", 0, batch))
            await until(lambda: d.raft.log.last_index() == 4, "the batch written at 2..4")
            # n2 (the next term) had the no-op and the first two records, then its own no-op.
            had = (*d.raft.log.entries(1, 4), Entry(4, term + 1, EntryKind.NOOP))
            d.step(AppendRequest("n2", "n1", term + 1, 0, 0, had, 4))
            with pytest.raises(PartlyAppended, match=r"first 2 records .* indexes 2\.\.3"):
                await asyncio.wait_for(mine, 10)
            await until(lambda: d.table.applied_index >= 4, "the new leader's no-op applied")
            await _elect_by_hand(d)  # n1 leads again; the producer retries the whole batch
            d.step(AppendResponse("n2", "n1", d.raft.term, True, 5))
            await until(lambda: d.table.applied_index >= 5, "its no-op applied")
            retry = asyncio.ensure_future(d.propose_idempotent("p", 0, batch))
            await until(lambda: d.raft.log.last_index() == 6, "the rest written at 6")
            d.step(AppendResponse("n2", "n1", d.raft.term, True, 6))
            done = await asyncio.wait_for(retry, 10)
            assert (done.first_index, done.last_index, done.duplicate) == (2, 6, False)
            log = [e.data for e in d.raft.read_committed(1, 7)]
            assert [log.count(r) for r in batch] == [1, 1, 1], log
            again = await d.propose_idempotent("p", 0, batch)  # and once more: all in now
            assert (again.first_index, again.last_index, again.duplicate) == (2, 6, True)

    asyncio.run(run())


def test_a_producers_sequences_again_with_other_content_are_a_conflict_not_a_duplicate(tmp_path):
    """A producer id used again for other records (a Spark `writeId` reused for another
    day's rows) was answered as a duplicate, and its records were dropped; so was the part of
    a batch overlapping what is in the log."""

    def other(seq: int) -> bytes:
        return encode_record(Record(b"k", b"other%d" % seq, producer_id="p", sequence=seq))

    async def run() -> None:
        async with _leading(tmp_path) as d:
            await d.propose_idempotent("p", 0, [_rec(0), _rec(1)])
            assert (await d.propose_idempotent("p", 0, [_rec(0), _rec(1)])).duplicate
            with pytest.raises(SequenceConflict, match="sequence 1 of p is in the log"):
                await d.propose_idempotent("p", 0, [_rec(0), other(1)])
            with pytest.raises(SequenceConflict, match="sequence 0 of p is in the log"):
                await d.propose_idempotent("p", 0, [other(0), _rec(1), _rec(2)])
            done = await d.propose_idempotent("p", 1, [_rec(1), _rec(2)])  # overlaps, same
            assert not done.duplicate and done.last_index == done.first_index + 1
            log = [e.data for e in d.raft.read_committed(1, done.last_index + 1)]
            assert [log.count(_rec(i)) for i in range(3)] == [1, 1, 1]
            assert not [x for x in log if b"other" in x]

    asyncio.run(run())


def test_an_idempotent_append_never_proposed_in_time_gives_its_sequences_back(tmp_path):
    """Found by a review: answered by the backstop while the driver was stuck, the batch was
    never proposed, yet the producer's mark kept it in flight: every retry of sequence 0 was
    `producer_busy` for the rest of the term, and sequence 1 was taken with 0 never in."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            with HeldSync(d.node) as hold:
                stuck = asyncio.ensure_future(d.propose([b"stuck"], timeout=0.2))
                await until(hold.held.is_set, "the driver stuck in a sync")
                with pytest.raises(NotCommitted, match="not proposed in time"):
                    await d.propose_idempotent("p", 0, [_rec(0)], timeout=0.2)
            d.node.journal.sync = hold.real  # type: ignore[method-assign]
            with contextlib.suppress(TimeoutError):
                await stuck
            with pytest.raises(SequenceConflict, match="sent sequence 1, expected 0"):
                await d.propose_idempotent("p", 1, [_rec(1)], timeout=2)
            done = await asyncio.wait_for(d.propose_idempotent("p", 0, [_rec(0)]), 10)
            assert not done.duplicate
            log = [e.data for e in d.raft.read_committed(1, done.last_index + 1)]
            assert log.count(_rec(0)) == 1

    asyncio.run(run())


def test_a_producers_later_append_is_not_proposed_past_one_the_stalled_disk_expired(tmp_path):
    """Found by a hostile client: two appends of one producer (two connections) queued behind a
    stalled disk; the first expired unproposed (`not_committed`), the second was proposed once
    the disk came back, so sequence 1 was in the log without 0, and the retry of 0 was told
    `already_appended` (a record lost, silently to an `IdempotentProducer`)."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            with HeldSync(d.node) as hold:
                stuck = asyncio.ensure_future(d.propose([b"stuck"], timeout=0.2))
                await until(hold.held.is_set, "the driver stuck in a sync")
                first = asyncio.ensure_future(d.propose_idempotent("p", 0, [_rec(0)], 0.2))
                second = asyncio.ensure_future(d.propose_idempotent("p", 1, [_rec(1)], 30))
                with pytest.raises(NotCommitted, match="not proposed in time"):
                    await first
                with pytest.raises(NotCommitted, match="sequence 0 before it did not happen"):
                    await asyncio.wait_for(second, 5)
            d.node.journal.sync = hold.real  # type: ignore[method-assign]
            with contextlib.suppress(TimeoutError):
                await stuck
            with pytest.raises(SequenceConflict, match="sent sequence 1, expected 0"):
                await d.propose_idempotent("p", 1, [_rec(1)], timeout=2)
            done = await asyncio.wait_for(d.propose_idempotent("p", 0, [_rec(0), _rec(1)]), 10)
            log = [e.data for e in d.raft.read_committed(1, done.last_index + 1)]
            assert [log.count(_rec(0)), log.count(_rec(1))] == [1, 1]
            assert log.index(_rec(0)) < log.index(_rec(1))

    asyncio.run(run())


def test_a_failed_append_gives_its_producers_mark_back_once_not_over_a_retrys(tmp_path):
    """Found by a review: an append expired unproposed had its mark given back by the driver
    at once and again by its own call a turn later; a retry admitted in between lost its mark,
    so a second retry was admitted too, and the record went in twice."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            unproposed, retries = d._unproposed, list[asyncio.Future[Any]]()

            def retry_sent_meanwhile(prop: Any, e: Exception) -> None:
                if prop.producer == "p" and not retries:  # a retry's handler, run first
                    retries.append(asyncio.ensure_future(d.propose_idempotent("p", 0, [_rec(0)])))
                unproposed(prop, e)

            d._unproposed = retry_sent_meanwhile  # type: ignore[method-assign]
            with HeldSync(d.node) as hold:
                stuck = asyncio.ensure_future(d.propose([b"stuck"], timeout=0.2))
                await until(hold.held.is_set, "the driver stuck in a sync")
                with pytest.raises(NotCommitted):
                    await d.propose_idempotent("p", 0, [_rec(0)], 0.2)
                await asyncio.sleep(0)
                with pytest.raises(ProducerBusy):  # the first retry is in flight
                    await d.propose_idempotent("p", 0, [_rec(0)])
            d.node.journal.sync = hold.real  # type: ignore[method-assign]
            with contextlib.suppress(TimeoutError):
                await stuck
            done = await asyncio.wait_for(retries[0], 10)
            log = [e.data for e in d.raft.read_committed(1, done.last_index + 1)]
            assert log.count(_rec(0)) == 1

    asyncio.run(run())


def _membership_change_meets(
    tmp_path: Path, meanwhile: Callable[[PartitionDriver, int], None], wait_s: float = 10
) -> tuple[int, dict[str, Any]]:
    """The admin API's answer to an `add_learner` on n1 (elected by hand, its no-op committed)
    when `meanwhile(driver, term)` happens once the change is at index 2, not committed."""

    async def run() -> tuple[int, dict[str, Any]]:
        async with _elected_by_hand(tmp_path) as d:
            term = d.raft.term
            d.step(AppendResponse("n2", "n1", term, True, 1))
            await until(lambda: d.table.applied_index >= 1, "the no-op applied")
            srv = TestServer(build_app(d.node))
            await srv.start_server()
            try:
                async with ClientSession(str(srv.make_url(""))) as s:
                    body = {"op": "add_learner", "node": "n4", "url": "http://127.0.0.1:14"}
                    call = asyncio.ensure_future(
                        s.post("/v1/admin/partitions/0/members", json=body)
                    )
                    await until(lambda: d.raft.log.last_index() == 2, "the change at 2")
                    meanwhile(d, term)
                    r = await asyncio.wait_for(call, wait_s)
                    return r.status, await r.json()
            finally:
                await srv.close()

    return asyncio.run(run())


def test_a_membership_change_whose_index_a_new_leader_took_is_not_answered_done(tmp_path):
    """Found by a review: the admin call waited for the commit to pass the change's index and
    answered 200 with the change, whoever's entry the index then held."""

    def taken(d: PartitionDriver, term: int) -> None:
        had = (*d.raft.log.entries(1, 2), Entry(2, term + 1, EntryKind.NOOP))
        d.step(AppendRequest("n2", "n1", term + 1, 0, 0, had, 2))

    status, answer = _membership_change_meets(tmp_path, taken)
    assert (status, answer["error"]) == (503, "not_committed"), answer
    assert "index 2 was taken by term" in answer["reason"], answer


def test_a_membership_change_is_answered_leader_lost_when_its_leader_steps_down(tmp_path):
    """Found by reading: the admin call waited for the commit to pass the change's index, so a
    leader deposed before the change committed answered only at `append_timeout_s`, and then
    "timeout". It is told at once, as an appender is, with the new leader to ask."""

    def deposed(d: PartitionDriver, term: int) -> None:
        # n2 leads term + 1 and has not (yet) taken index 2 away.
        d.step(AppendRequest("n2", "n1", term + 1, 1, term, (), 1))

    # Well inside append_timeout_s (10 s), where the old code still waited.
    status, answer = _membership_change_meets(tmp_path, deposed, wait_s=3)
    assert (status, answer["error"]) == (503, "leader_lost"), answer
    assert answer["leader"] == "n2" and "outcome is unknown" in answer["reason"]


def test_a_membership_change_under_way_when_the_partition_stops_is_a_503_naming_why(tmp_path):
    """Found by a review: the change's waiter was failed with the partition's own error (a
    failed disk), which the admin call did not take for an answer: a 500."""

    def disk_failed(d: PartitionDriver, term: int) -> None:
        eio = OSError(5, "Input/output error")
        d.stop(StorageFailed(str(tmp_path / "journal"), "fdatasync", eio))

    status, answer = _membership_change_meets(tmp_path, disk_failed)
    assert (status, answer["error"]) == (503, "storage_failed"), answer


def test_a_follower_answers_an_append_only_once_its_entries_are_synced(tmp_path):
    """An AppendResponse says "durable here" and the leader counts it for commit: sent while
    the follower's fsync still runs, a crash then would lose a committed entry."""

    async def run() -> None:
        node = _single_node(tmp_path, "n2", PEERS)
        await node.start()
        try:
            d = node.drivers[0]
            sent = _sent_by(node)
            with HeldSync(node) as hold:
                entries = (Entry(1, 2, data=b"x"), Entry(2, 2, data=b"y"))
                d.step(AppendRequest("n1", "n2", 2, 0, 0, entries, 0))
                await until(hold.held.is_set, "the entries' sync")  # `begin`'s sends are out
                assert not [m for m in sent if isinstance(m, AppendResponse)], sent
            await until(lambda: any(isinstance(m, AppendResponse) for m in sent), "the answer")
        finally:
            await node.close()

    asyncio.run(run())


def test_compaction_keeps_the_lowest_of_the_retention_floors(tmp_path):
    """A reader's hold and the archive's floor both keep entries: compaction stops at the
    lower of them (the archive still needs 21 on, whatever the hold at 31 says)."""

    async def run() -> None:
        node = _single_node(tmp_path, compact_number_entries=0)
        await node.start()
        try:
            d = node.drivers[0]
            await until(lambda: d.raft.role == Role.LEADER, "election")
            await d.propose([b"%d" % i for i in range(50)])
            d.storage.holds.set("reader", 31, 600)
            d.archive_floor = 21
            done = await d.compact_now()
            assert done is not None and done.floor == 21 == d.storage.first_index()
        finally:
            await node.close()

    asyncio.run(run())


def test_a_retry_of_a_producers_append_still_in_flight_is_told_busy(tmp_path):
    """The same sequences again while the first copy is in flight (not yet committed): a
    retryable `producer_busy`, not a conflict the client would give up on."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            real = d.propose
            release = asyncio.Event()

            async def held(records: list[bytes], *args: Any) -> Any:
                await release.wait()
                return await real(records, *args)

            d.propose = held  # type: ignore[method-assign,assignment]
            batch = [encode_record(Record(b"k", b"v", producer_id="p", sequence=s)) for s in (0, 1)]
            first = asyncio.ensure_future(d.propose_idempotent("p", 0, batch))
            await asyncio.sleep(0)  # the first copy is in flight
            with pytest.raises(ProducerBusy, match="in flight"):
                await d.propose_idempotent("p", 0, batch)
            release.set()
            assert not (await asyncio.wait_for(first, 10)).duplicate

    asyncio.run(run())


def test_a_new_leader_whose_no_op_committed_but_is_not_applied_takes_no_producers_append(
    tmp_path,
):
    """Between the commit of its no-op and its apply (the pass waits for an fsync meanwhile)
    the table may still lack a producer's last sequences: `producer_busy`, not a guess."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path) as d:
            held, release = threading.Event(), threading.Event()
            real = d.node.journal.sync

            def hung() -> None:
                held.set()
                release.wait(10)
                real()

            d.node.journal.sync = hung  # type: ignore[method-assign]

            # An entry and n2's answer in the inbox together, with no turn of the loop between
            # them: one pass takes both and syncs before it applies. A proposal from a task (as
            # before) could miss the pass that took the answer, when a tick had one due first,
            # and that pass applied the no-op at once (once in a CI run).
            def other() -> None:
                d.raft.propose(b"other")

            d.call(other)
            d.step(AppendResponse("n2", "n1", d.raft.term, True, d.raft.log.last_index()))
            await until(held.is_set, "the pass in its sync")
            assert d.raft.commit == 1 and d.table.applied_index == 0
            batch = [encode_record(Record(b"k", b"v", producer_id="p", sequence=0))]
            try:
                with pytest.raises(ProducerBusy, match="still applying"):
                    await asyncio.wait_for(d.propose_idempotent("p", 0, batch, timeout=1), 5)
            finally:
                release.set()

    asyncio.run(run())


def test_a_linearizable_read_waiting_on_a_leader_that_steps_down_is_told_not_leader(tmp_path):
    """n2 and n3 never confirm the read point; a higher term deposes n1: the read must be
    answered at once (NotLeader, the client retries at the new leader), not left waiting."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path) as d:
            term = d.raft.term
            d.step(AppendResponse("n2", "n1", term, True, d.raft.log.last_index()))
            await until(lambda: d.raft.commit == d.raft.log.last_index(), "the no-op committed")
            read = asyncio.ensure_future(d.linearizable_point())
            await until(lambda: bool(d._reads), "the read asked")
            d.step(AppendRequest("n3", "n1", term + 1, 0, 0, (), 0))
            with pytest.raises(NotLeader):
                await asyncio.wait_for(read, 10)

    asyncio.run(run())


def test_a_linearizable_read_point_is_answered_once_the_table_applied_it(tmp_path):
    """A read point is the commit when asked, and the core hands committed entries out at most
    `MAX_APPLY_PER_READY` a pass: after a large commit the point is confirmed before the table
    has applied it. Answered then, a key read saw the table from before (a planted bug that
    dropped the wait survived every test)."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path) as d:
            term = d.raft.term
            d.step(AppendResponse("n2", "n1", term, True, d.raft.log.last_index()))
            await until(lambda: d.raft.commit == d.raft.log.last_index(), "the no-op committed")
            many = 12 * MAX_APPLY_PER_READY

            def propose() -> None:
                d.raft.propose_batch([b"x"] * many)

            d.call(propose)
            await until(lambda: d.storage.last_index() >= many + 1, "the entries written", 60)
            last = d.storage.last_index()
            d.step(AppendResponse("n2", "n1", term, True, last))  # commits `many` at once
            read = asyncio.ensure_future(d.linearizable_point())
            await until(lambda: bool(d._reads), "the read asked")
            d.step(HeartbeatResponse("n2", "n1", term, ctx=max(d._reads)))
            point = await asyncio.wait_for(read, 30)
            assert point == last
            assert d.table.applied_index >= point, (d.table.applied_index, point)

    asyncio.run(run())


def test_a_leader_whose_storage_fails_hands_over_to_a_follower(tmp_path):
    """Stopped, the leader sends its most caught-up voter a TimeoutNow at once: followers of
    a quiesced partition run no election timer and would otherwise wait for a wake."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path) as d:
            sent = _sent_by(d.node)

            def full() -> None:
                raise StorageFailed(str(tmp_path / "journal"), "write", OSError(28, "No space"))

            d.node.journal.sync = full  # type: ignore[method-assign]
            with pytest.raises(StorageFailed):  # answered, not left waiting
                await asyncio.wait_for(d.propose([b"lost"]), 10)
            assert [type(m).__name__ for m in sent if isinstance(m, TimeoutNow)] == ["TimeoutNow"]

    asyncio.run(run())


def test_a_pass_with_entries_in_one_partition_and_a_commit_alone_in_another_syncs(tmp_path):
    """One pass, two partitions: p1's Ready holds only a commit, p0's holds entries. The
    pass's fsync covers p0's entries: its appender is answered only after it."""

    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True,
                node_id="n1",
                peers={"n1": PEERS["n1"]},
                data_dir=tmp_path,
                tick_ms=5,
                partitions=2,
            )
        )
        await node.start()
        gates = [threading.Event(), threading.Event()]
        held = [threading.Event(), threading.Event()]
        try:
            d0, d1 = node.drivers[0], node.drivers[1]
            await until(lambda: d0.raft.role == d1.raft.role == Role.LEADER, "elections")
            await until(lambda: d0.table.applied_index >= 1 <= d1.table.applied_index, "no-ops")
            real = node.journal.sync
            syncs = [0]

            def gated() -> None:
                n = syncs[0]
                syncs[0] += 1
                if n < len(gates):
                    held[n].set()
                    gates[n].wait(10)
                real()

            node.journal.sync = gated  # type: ignore[method-assign]
            first = asyncio.ensure_future(d1.propose([b"p1"]))  # its entries, then its commit
            await until(held[0].is_set, "p1's entries in their sync")
            second = asyncio.ensure_future(d0.propose([b"p0"]))  # p0's entries: the next pass
            await asyncio.sleep(0)
            gates[0].set()
            await until(lambda: held[1].is_set() or second.done(), "the next pass")
            assert held[1].is_set() and not second.done(), "p0's append answered unsynced"
            gates[1].set()
            await asyncio.wait_for(asyncio.gather(first, second), 10)
        finally:
            for g in gates:
                g.set()
            await node.close()

    asyncio.run(run())


def test_a_snapshot_stream_that_fails_is_reported_failed_to_the_core(tmp_path):
    """n3 is behind the compaction floor and unreachable: the leader's stream to it fails,
    and the core must hear so (its `snapshot_failed` event, and a back-off before the next
    try), not that it was sent."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path, compact_number_entries=0) as d:
            await _n3_behind_the_floor(d)
            await until(lambda: d.counters.events.get("snapshot_failed", 0) >= 1, "the report")

    asyncio.run(run())


async def _n3_behind_the_floor(d: PartitionDriver) -> None:
    """n2 acknowledges 20 entries, the leader compacts them, and n3 answers from index 0: it
    needs a snapshot (and, at its address, nobody listens)."""
    term = d.raft.term
    await until(lambda: d.raft.log.last_index() == 1, "the no-op")
    written = asyncio.ensure_future(d.propose([b"%d" % i for i in range(20)]))
    await until(lambda: d.raft.log.last_index() == 21, "the entries written")
    d.step(AppendResponse("n2", "n1", term, True, 21))
    await asyncio.wait_for(written, 10)
    assert await d.compact_now() is not None and d.storage.first_index() > 2
    d.step(HeartbeatResponse("n3", "n1", term))  # n3 answers, from far behind
    d.step(AppendResponse("n3", "n1", term, False, 21, hint_index=0, hint_term=0))


def test_one_snapshot_stream_at_a_time_to_a_target(tmp_path):
    """The core asks again after its back-off while a slow stream to n3 is still under way:
    the driver does not start a second one beside it."""

    async def run() -> None:
        async with _elected_by_hand(tmp_path, compact_number_entries=0) as d:
            streams, release = [0], asyncio.Event()

            async def slow(*args: Any, **kwargs: Any) -> int:
                streams[0] += 1
                await release.wait()
                raise ConnectionError("the test ends it")

            d.node.transport.send_snapshot = slow  # type: ignore[method-assign]
            await _n3_behind_the_floor(d)
            await until(lambda: d.raft.progress["n3"].snapshot_attempt >= 3, "asked again")
            assert streams == [1]
            release.set()

    asyncio.run(run())


def test_the_node_checkpoints_its_journal_again_and_again_as_it_fills(tmp_path):
    """Each `journal_checkpoint_bytes` journaled starts a checkpoint (one at a time), so the
    journal, and what a restart replays, stays about that size however much is written."""

    async def run() -> None:
        node = Node(one_node(tmp_path, journal_checkpoint_bytes=64 * 1024))
        await node.start()
        try:
            d = node.drivers[0]
            await until(lambda: d.raft.role == Role.LEADER, "election")
            for _ in range(200):  # 16 KiB a batch: about 4 a checkpoint
                await d.propose([b"x" * 1024] * 16)
                if node.journal.checkpoints >= 3:
                    break
            assert node.journal.checkpoints >= 3
            assert len(list_journal(str(tmp_path / "journal"))) <= 2
        finally:
            await node.close()

    asyncio.run(run())


def test_a_partition_stopped_while_its_sync_runs_answers_nothing_after_it(tmp_path):
    """Stopped while the pass's sync ran in the fsync thread (a failed checkpoint stops every
    partition, from its own task): the pass does not finish it, so a follower that stopped
    writing acknowledges nothing more."""

    async def run() -> None:
        # Every sync in the fsync thread: the loop runs on while one is held.
        node = Node(
            NodeSettings(
                insecure_no_auth=True,
                node_id="n2",
                peers=PEERS,
                data_dir=tmp_path,
                tick_ms=5,
                fsync_in_loop_below_ms=0,
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            sent = _sent_by(node)
            with HeldSync(node) as hold:
                d.step(AppendRequest("n1", "n2", 2, 0, 0, (Entry(1, 2, data=b"x"),), 0))
                await until(hold.held.is_set, "the pass's sync")
                eio = OSError(5, "Input/output error")
                d.stop(StorageFailed(str(tmp_path / "journal"), "checkpoint fdatasync", eio))
            await until(hold.returned.is_set, "the sync done")
            await asyncio.sleep(0.1)  # the pass's end, and the next
            assert not [m for m in sent if isinstance(m, AppendResponse)], sent
        finally:
            await node.close()

    asyncio.run(run())


def test_a_follower_whose_fsync_fails_never_answers_the_append(tmp_path):
    """Its entries are not durable: the partition stops, and no AppendResponse (which says
    "durable here") goes to the leader."""

    async def run() -> None:
        node = _single_node(tmp_path, "n2", PEERS)
        await node.start()
        try:
            d = node.drivers[0]
            sent = _sent_by(node)

            def full() -> None:
                raise StorageFailed(str(tmp_path / "journal"), "write", OSError(28, "No space"))

            node.journal.sync = full  # type: ignore[method-assign]
            entries = (Entry(1, 2, data=b"x"), Entry(2, 2, data=b"y"))
            d.step(AppendRequest("n1", "n2", 2, 0, 0, entries, 0))
            await until(lambda: d.failed is not None, "the partition stopped")
            assert not [m for m in sent if isinstance(m, AppendResponse)], sent
        finally:
            await node.close()

    asyncio.run(run())


def test_a_commit_index_that_cannot_be_written_out_is_never_shown(tmp_path):
    """A pass with a commit index alone writes it to the journal's file before readers see
    it; when that write fails, the partition stops and nothing above the old mark applies."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            applied = d.table.applied_index

            def failing() -> bool:
                raise StorageFailed(str(tmp_path / "journal"), "write", OSError(5, "I/O error"))

            d.node.journal.write_out = failing  # type: ignore[method-assign]
            with pytest.raises(StorageFailed):
                await asyncio.wait_for(d.propose([b"unwritten commit"]), 10)
            assert d.failed is not None and d.table.applied_index == applied

    asyncio.run(run())


def test_with_no_fsync_in_the_loop_a_commit_index_alone_is_written_off_it(tmp_path):
    """Found by a fault helper: with `fsync_in_loop_below_ms` 0 a pass with a commit index
    alone still wrote it to the journal's file in the event loop, and a frozen file system
    (`fsfreeze`) held the whole node in that write(2). It goes to the fsync thread."""

    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True, node_id="n1", peers={"n1": PEERS["n1"]},
                data_dir=tmp_path, tick_ms=5, fsync_in_loop_below_ms=0,
            )
        )  # fmt: skip
        await node.start()
        try:
            d = node.drivers[0]
            await until(lambda: d.raft.role == Role.LEADER, "election")
            await until(lambda: d.table.applied_index >= d.raft.log.last_index(), "no-op")
            on_loop: list[bool] = []
            write_out = node.journal.write_out

            def watched() -> bool:
                on_loop.append(threading.current_thread() is threading.main_thread())
                return write_out()

            node.journal.write_out = watched  # type: ignore[method-assign]
            await asyncio.wait_for(d.propose([b"its commit written alone"]), 10)
            assert on_loop and not any(on_loop), on_loop
        finally:
            await node.close()

    asyncio.run(run())


def test_a_partition_stopped_by_a_bug_never_campaigns_again(tmp_path):
    """Stopped for a failure that is not its disk's (a bug caught by the loop), it steps down
    and the node's passes leave it alone: its ticks must not make it a leader again."""

    async def run() -> None:
        async with _leading(tmp_path) as d:
            d.stop(RuntimeError("a bug"))
            assert d.raft.role == Role.FOLLOWER
            ticks = d.node.ticks
            timeout = d.config.election_ticks * 2
            await until(lambda: d.node.ticks > ticks + 3 * timeout, "election timeouts")
            assert d.raft.role == Role.FOLLOWER and d.raft.leader is None

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
            with pytest.raises(StorageFailed, match="ENOSPC"):  # answered, not left waiting
                await asyncio.wait_for(d.propose([b"lost"]), 10)
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

            async def refuse_once(records: list[bytes], *args: Any) -> Any:
                if not refused:
                    refused.append(records)
                    raise ProposalRefused("leadership is being transferred")
                return await real(records, *args)

            d.propose = refuse_once  # type: ignore[method-assign,assignment]
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


class _SyncFails(FileOps):
    """A disk whose every fdatasync fails (EIO)."""

    def fdatasync(self, fd: int) -> None:
        raise OSError(5, "Input/output error")


class _DirSyncFails(FileOps):
    """A disk on which a directory's fsync fails (EIO): the step of a journal checkpoint that
    makes the WALs' new files reachable."""

    def fsync_dir(self, path: str) -> None:
        raise OSError(5, "Input/output error")


@pytest.mark.parametrize(
    ("disk", "fault"),
    [(_SyncFails, "storage failed: write of"), (_DirSyncFails, "checkpoint fdatasync")],
    ids=["sync", "checkpoint"],
)
def test_a_failed_journal_stops_the_idle_partitions_too(tmp_path, disk, fault):
    """The journal failed under one partition's writes, in a sync or in a checkpoint that could
    not make the WALs durable. It takes no write now, and it is every partition's, so a
    quiesced idle one stops as well (it steps down, and the node says it is not live, to be
    restarted) instead of leading until its own next write finds out."""

    async def run() -> None:
        node = Node(one_node(tmp_path, partitions=2, journal_checkpoint_bytes=64 * 1024))
        await node.start()
        try:
            busy, idle = node.drivers[0], node.drivers[1]
            await until(lambda: busy.raft.role == idle.raft.role == Role.LEADER, "elected")
            await until(lambda: idle.raft.quiesced, "p1 quiesced")
            node.journal.ops = disk()
            with contextlib.suppress(StorageFailed, NotLeader):  # p0 stops: the journal failed
                for _ in range(200):  # 16 KiB a batch: a checkpoint is due after about 4
                    await busy.propose([b"x" * 1024] * 16)
            await until(lambda: node.journal.failed is not None, "the journal failed")
            await until(lambda: idle.failed is not None, "the idle partition stopped")
            assert idle.failed is node.journal.failed and idle.raft.role != Role.LEADER
            reason = node.not_live()
            assert reason is not None and reason.startswith("partitions [0, 1] stopped writing")
            assert fault in reason
        finally:
            await node.close()

    asyncio.run(run())


def test_a_checkpoint_that_left_the_journal_whole_is_tried_again_later_not_every_tick(
    tmp_path, caplog
):
    """A new segment that could not be created (a directory in its place; a full disk alike)
    loses nothing: the partition goes on writing, and the checkpoint is tried again after
    `CHECKPOINT_RETRY_S`, not on each of the clock's ticks (every 5 ms here), each logged."""

    async def run() -> None:
        node = Node(one_node(tmp_path, journal_checkpoint_bytes=64 * 1024))
        await node.start()
        try:
            d = node.drivers[0]
            await until(lambda: d.raft.role == Role.LEADER, "election")
            journal = str(tmp_path / "journal")
            Path(_segment_path(journal, list_journal(journal)[-1] + 1)).mkdir()
            while not node.journal.due():
                await d.propose([b"x" * 1024] * 16)
            await until(lambda: "journal checkpoint failed" in caplog.text, "a failed checkpoint")
            await asyncio.sleep(0.3)  # 60 ticks
            assert caplog.text.count("journal checkpoint failed") == 1, caplog.text
            assert "tried again in 5 s" in caplog.text
            await d.propose([b"after"])
            assert d.failed is None and node.journal.failed is None
        finally:
            await node.close()

    asyncio.run(run())
