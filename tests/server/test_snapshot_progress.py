"""Whoever streams a snapshot shows how far it is: the transport keeps each stream's bytes sent
(what the target holds) of its total from start to end, and the node's `/v1/status` and
`/metrics` show them, per partition and target.

The target is a real aiohttp server that answers each chunk only when the test lets it, so
every step of a stream is seen; the sender is the real transport, and for the status a real
one-node leader, asked through its peer endpoint as a leader asks a follower source."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from tests.server.helpers import compacting_node, until

from raftlog.node.core.raft import Role
from raftlog.node.core.types import Membership, SnapshotMeta
from raftlog.node.record import Record, encode_record
from raftlog.node.server.app import build_app
from raftlog.node.storage.snapshots import encode_snapshot
from raftlog.node.transport.peers import Transport

CHUNK = 1000


@dataclass
class HeldTarget:
    """A peer's snapshot routes that take each chunk only once `release` is called: `offsets`
    are those of the chunks it has seen; `fail_at`: the chunk at that offset is refused."""

    received: int = 0  # what it says it already holds
    fail_at: int | None = None
    fail_status: int = 500  # the answer to the chunk at `fail_at`
    offsets: list[int] = field(default_factory=list)
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()

    async def progress(self, request: web.Request) -> web.Response:
        return web.json_response({"received": self.received})

    async def seen(self, n: int) -> None:
        """Wait until the `n`th chunk has arrived (and waits for `release`)."""
        await until(lambda: len(self.offsets) >= n, f"chunk {n} arriving")

    async def chunk(self, request: web.Request) -> web.Response:
        offset = int(request.headers["X-Offset"])
        await request.read()
        self.offsets.append(offset)
        async with asyncio.timeout(10):  # broken code fails instead of hanging
            await self.gate.acquire()
        if offset == self.fail_at:
            return web.json_response({"reason": "refused"}, status=self.fail_status)
        return web.Response(status=204)


@asynccontextmanager
async def held_target(target: HeldTarget) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/peer/v1/partitions/{p}/snapshot", target.progress)
    app.router.add_post("/peer/v1/partitions/{p}/snapshot", target.chunk)
    srv = TestServer(app)
    await srv.start_server()
    try:
        yield str(srv.make_url("")).rstrip("/")
    finally:
        target.release(100)
        await srv.close()


META = SnapshotMeta(7, 2, Membership(frozenset({"n1", "n2"})))
DATA = os.urandom(4321)
RAW = len(encode_snapshot(META, DATA))


def sends(t: Transport) -> list[tuple[str, int, int, int]]:
    return [(s.target, s.sent_bytes, s.total_bytes, s.resumed_from) for s in t.snapshot_sends_of(0)]


def with_transport(target: HeldTarget, body: Callable[[Transport], Awaitable[None]]) -> None:
    async def run() -> None:
        async with held_target(target) as url:
            t = Transport("n1", {"n2": url}, None)
            t.snapshot_chunk_bytes = CHUNK
            await t.start()
            try:
                await body(t)
            finally:
                await t.close()

    asyncio.run(run())


def test_a_stream_reports_its_bytes_from_start_to_end() -> None:
    target = HeldTarget()

    async def body(t: Transport) -> None:
        stream = asyncio.create_task(t.send_snapshot("n2", 0, "n1", 3, META, DATA))
        seen = []
        for step in range(RAW // CHUNK + 1):
            await target.seen(step + 1)
            seen.append(sends(t))
            target.release()
        assert await stream == RAW
        assert seen == [[("n2", step * CHUNK, RAW, 0)] for step in range(RAW // CHUNK + 1)]
        assert t.snapshot_sends_of(0) == [] and t.snapshot_sends == {}  # gone once finished

    with_transport(target, body)


def test_a_resumed_stream_starts_from_what_the_target_holds() -> None:
    target = HeldTarget(received=2 * CHUNK)

    async def body(t: Transport) -> None:
        stream = asyncio.create_task(t.send_snapshot("n2", 0, "n1", 3, META, DATA))
        await until(lambda: target.offsets == [2 * CHUNK], "the first chunk after the resume")
        assert sends(t) == [("n2", 2 * CHUNK, RAW, 2 * CHUNK)]
        target.release()
        await target.seen(2)
        assert sends(t) == [("n2", 3 * CHUNK, RAW, 2 * CHUNK)]
        shown = t.snapshot_sends_of(0)[0].as_json()
        assert {k: v for k, v in shown.items() if k != "elapsed_s"} == {
            "target": "n2",
            "snapshot_index": 7,
            "sent_bytes": 3 * CHUNK,
            "total_bytes": RAW,
            "resumed_from_bytes": 2 * CHUNK,
        }
        assert isinstance(shown["elapsed_s"], float) and shown["elapsed_s"] >= 0
        target.release(10)
        assert await stream == RAW
        assert sends(t) == []

    with_transport(target, body)


def test_a_failed_stream_leaves_no_progress_behind() -> None:
    target = HeldTarget(fail_at=CHUNK)

    async def body(t: Transport) -> None:
        stream = asyncio.create_task(t.send_snapshot("n2", 0, "n1", 3, META, DATA))
        await target.seen(1)
        target.release()
        await target.seen(2)
        assert sends(t) == [("n2", CHUNK, RAW, 0)]
        target.release()
        with pytest.raises(RuntimeError, match="HTTP 500"):
            await stream
        assert sends(t) == []

    with_transport(target, body)


def test_a_chunk_the_target_refuses_with_a_4xx_fails_the_stream() -> None:
    # A stale leader's chunk (409) or one the target cannot take: the stream has not
    # installed anything, and must not be reported to the core as sent.
    target = HeldTarget(fail_at=0, fail_status=409)

    async def body(t: Transport) -> None:
        stream = asyncio.create_task(t.send_snapshot("n2", 0, "n1", 3, META, DATA))
        await target.seen(1)
        target.release()
        with pytest.raises(RuntimeError, match="HTTP 409"):
            await stream

    with_transport(target, body)


def test_a_target_that_holds_the_whole_snapshot_is_not_sent_it_again() -> None:
    # Its answer to the last chunk was lost: the next stream resumes at the end, not at 0.
    target = HeldTarget(received=RAW)

    async def body(t: Transport) -> None:
        target.release(10)
        assert await t.send_snapshot("n2", 0, "n1", 3, META, DATA) == RAW
        assert target.offsets == [RAW]

    with_transport(target, body)


def test_an_older_stream_ending_leaves_a_newer_ones_progress_to_the_same_target() -> None:
    target = HeldTarget()

    async def body(t: Transport) -> None:
        older = asyncio.create_task(
            t.send_snapshot("n2", 0, "n1", 3, META, DATA, chunk_bytes=RAW)  # one chunk
        )
        await target.seen(1)
        newer = asyncio.create_task(t.send_snapshot("n2", 0, "n1", 4, META, DATA))
        await target.seen(2)
        target.release()  # the older one's only chunk: it ends
        assert await older == RAW
        assert sends(t) == [("n2", 0, RAW, 0)]  # the newer one's, still shown
        target.release(10)
        assert await newer == RAW
        assert sends(t) == []

    with_transport(target, body)


SENDING = 'raftlog_snapshot_send_{}_bytes{{partition="0",target="n2"}} {}.0'


def test_the_node_status_and_metrics_show_a_stream_while_it_runs(tmp_path: Any) -> None:
    """A one-node leader is asked, on its peer endpoint, to stream its snapshot to n2 (as a
    leader asks a follower source): its `/v1/status` and `/metrics` follow the stream."""
    target = HeldTarget()

    async def stream(s: ClientSession, term: int) -> list[list[dict[str, Any]]]:
        """Ask for the stream; the partition's `snapshot_sends` at each chunk, until the end."""

        async def get(path: str) -> Any:
            async with s.get(path) as r:
                return await (r.json() if path == "/v1/status" else r.text())

        assert (await get("/v1/status"))["partitions"][0]["snapshot_sends"] == []
        body = {"target": "n2", "leader": "n1", "term": term, "required": 1}
        asked = asyncio.create_task(s.post("/peer/v1/partitions/0/send-snapshot", json=body))
        shown: list[list[dict[str, Any]]] = []
        while not shown or len(shown) * CHUNK < shown[0][0]["total_bytes"]:
            await target.seen(len(shown) + 1)
            shown.append((await get("/v1/status"))["partitions"][0]["snapshot_sends"])
            if len(shown) == 2:
                text = await get("/metrics")
                assert SENDING.format("sent", shown[-1][0]["sent_bytes"]) in text, text
                assert SENDING.format("size", shown[-1][0]["total_bytes"]) in text, text
            target.release()
        reply = await asked
        assert reply.status == 200, await reply.text()
        assert (await reply.json())["sent_bytes"] == shown[0][0]["total_bytes"]
        assert (await get("/v1/status"))["partitions"][0]["snapshot_sends"] == []  # finished
        assert "raftlog_snapshot_send_sent_bytes{" not in await get("/metrics")
        return shown

    async def run() -> list[list[dict[str, Any]]]:
        node = compacting_node(tmp_path / "n1")
        await node.start()
        srv = TestServer(build_app(node))
        await srv.start_server()
        d = node.drivers[0]
        try:
            await until(lambda: d.raft.role == Role.LEADER, "election")
            for i in range(0, 200, 10):  # a table of a few KiB: several chunks of CHUNK
                await d.propose(
                    [encode_record(Record(b"k%d" % j, b"v" * 50)) for j in range(i, i + 10)]
                )
            async with held_target(target) as url, ClientSession(str(srv.make_url(""))) as s:
                node.transport.add_peer("n2", url)
                node.transport.snapshot_chunk_bytes = CHUNK
                shown = await stream(s, d.raft.term)
            assert d.counters.snapshots_sent == 1
            return shown
        finally:
            await srv.close()
            await node.close()

    shown = asyncio.run(run())
    total = shown[0][0]["total_bytes"]
    assert len(shown) >= 4  # several chunks
    assert [[(x["target"], x["sent_bytes"], x["total_bytes"]) for x in each] for each in shown] == [
        [("n2", k * CHUNK, total)] for k in range(len(shown))
    ]
