"""A snapshot reaches a restarted peer whose name still resolves to its old address (or not at
all): the stream falls back to the address the peer last connected from, for the same name."""

from __future__ import annotations

import asyncio
import os

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
