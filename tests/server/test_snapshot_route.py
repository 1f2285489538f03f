"""A snapshot reaches a restarted peer whose name still resolves to its old address (or not at
all): the stream falls back to the address the peer last connected from, for the same name."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from raftlog.node.core.types import Membership, SnapshotMeta
from raftlog.node.storage.snapshots import encode_snapshot
from raftlog.node.transport.peers import Transport

META = SnapshotMeta(7, 2, Membership(frozenset({"n1", "n2"})))
DATA = os.urandom(5000)


class Target:
    def __init__(self) -> None:
        self.hosts: list[str] = []
        self.data = b""

    async def progress(self, request: web.Request) -> web.Response:
        self.hosts.append(request.headers["Host"])
        return web.json_response({"received": len(self.data)})

    async def chunk(self, request: web.Request) -> web.Response:
        self.hosts.append(request.headers["Host"])
        assert int(request.headers["X-Offset"]) == len(self.data)
        self.data += await request.read()
        return web.Response(status=204)


async def stream(name_url: str, seen: str | None, target: Target) -> int:
    t = Transport("n1", {"n2": name_url}, None)
    t.snapshot_chunk_bytes = 1000
    await t.start()
    try:
        if seen is not None:
            t.ping({"n2"})  # a sender for n2, as the peer's own connection makes one
            t.seen("n2", seen)
        return await t.send_snapshot("n2", 0, "n1", 3, META, DATA)
    finally:
        await t.close()


async def serve(target: Target) -> TestServer:
    app = web.Application()
    app.router.add_get("/peer/v1/partitions/{p}/snapshot", target.progress)
    app.router.add_post("/peer/v1/partitions/{p}/snapshot", target.chunk)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    return srv


@pytest.mark.parametrize(
    "name",
    [
        "n2.invalid",  # the name does not resolve (a negative cache)
        "127.0.0.9",  # the old address: nobody listens there any more
    ],
)
def test_a_peer_at_a_new_address_gets_the_snapshot_there(name: str) -> None:
    async def run() -> None:
        target = Target()
        srv = await serve(target)
        port = srv.port
        try:
            sent = await stream(f"http://{name}:{port}", "127.0.0.1", target)
        finally:
            await srv.close()
        assert sent == len(encode_snapshot(META, DATA))
        assert target.data == encode_snapshot(META, DATA)
        assert set(target.hosts) == {f"{name}:{port}"}  # called by its name throughout

    asyncio.run(run())


def test_without_a_seen_address_the_failure_is_the_caller_s() -> None:
    async def run() -> None:
        target = Target()
        srv = await serve(target)
        try:
            with pytest.raises(OSError):
                await stream(f"http://n2.invalid:{srv.port}", None, target)
        finally:
            await srv.close()
        assert target.hosts == []

    asyncio.run(run())


class Source:
    """A follower source's `send-snapshot` route: counts the asks, answers with `status`."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.asks: list[str] = []

    async def send(self, request: web.Request) -> web.Response:
        self.asks.append(request.headers["Host"])
        body = await request.json()
        assert body["target"] == "n3"
        return web.json_response({"sent_bytes": 1}, status=self.status)


async def ask(name_url: str, seen: str | None) -> None:
    t = Transport("n1", {"n2": name_url, "n3": "http://127.0.0.1:1"}, None)
    await t.start()
    try:
        if seen is not None:
            t.ping({"n2"})
            t.seen("n2", seen)
        await t.request_snapshot_send("n2", 0, "n3", "n1", 3, 10)
    finally:
        await t.close()


async def serve_source(source: Source) -> TestServer:
    app = web.Application()
    app.router.add_post("/peer/v1/partitions/{p}/send-snapshot", source.send)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    return srv


@pytest.mark.parametrize("name", ["n2.invalid", "127.0.0.9"])
def test_a_source_at_a_new_address_is_asked_there_once(name: str) -> None:
    async def run() -> None:
        source = Source()
        srv = await serve_source(source)
        port = srv.port
        try:
            await ask(f"http://{name}:{port}", "127.0.0.1")
        finally:
            await srv.close()
        assert source.asks == [f"{name}:{port}"]

    asyncio.run(run())


def test_an_ask_that_reached_the_source_is_not_sent_again() -> None:
    """The source answered (here with an error): no second ask at another address."""

    async def run() -> None:
        source = Source(status=502)
        srv = await serve_source(source)
        port = srv.port
        try:
            with pytest.raises(RuntimeError, match="HTTP 502"):
                await ask(f"http://127.0.0.1:{port}", "127.0.0.2")
        finally:
            await srv.close()
        assert source.asks == [f"127.0.0.1:{port}"]

    asyncio.run(run())


def test_a_source_that_refuses_the_ask_with_a_4xx_has_not_streamed_it() -> None:
    """A source that is not eligible (409) streamed nothing: the leader falls back to its
    own snapshot only if the ask raises."""

    async def run() -> None:
        source = Source(status=409)
        srv = await serve_source(source)
        try:
            with pytest.raises(RuntimeError, match="HTTP 409"):
                await ask(f"http://127.0.0.1:{srv.port}", None)
        finally:
            await srv.close()

    asyncio.run(run())


def silent_listener(host: str, port: int) -> list[socket.socket]:
    """A listener at `host:port` whose accept queue is full, so the kernel drops every further
    SYN there: an old address whose packets go nowhere. Its sockets, to close."""
    listener = socket.socket()
    listener.bind((host, port))
    listener.listen(0)
    queued = [listener]
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect((host, port))
        queued.append(s)
    probe = socket.socket()
    probe.settimeout(0.5)
    with pytest.raises(TimeoutError):  # the premise: a connection there does not open
        probe.connect((host, port))
    probe.close()
    return queued


def test_a_source_whose_old_address_drops_packets_is_asked_at_its_new_one() -> None:
    """The ask's own timeout is the snapshot's (600 s); its connection gives up as any peer
    request's does (`REQUEST_CONNECT_S`), so the next route is tried, not after 600 s."""

    async def run() -> None:
        source = Source()
        srv = await serve_source(source)
        port = srv.port
        assert port is not None
        held = silent_listener("127.0.0.9", port)
        try:
            await asyncio.wait_for(ask(f"http://127.0.0.9:{port}", "127.0.0.1"), 60)
        finally:
            await srv.close()
            for s in held:
                s.close()
        assert source.asks == [f"127.0.0.9:{port}"]  # by its name, at the address that answers

    asyncio.run(run())
