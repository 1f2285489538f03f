"""The HTTP API in-process (one single-node cluster behind aiohttp's test server): bodies and
headers that used to reach a 500 are a client's mistake, a 4xx naming the field, or a 401."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from raftlog.node.core.raft import Role
from raftlog.node.server.app import build_app
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings

TOKEN = "s3cret"
APPEND = "/v1/partitions/0/records"


async def _with_node(tmp_path: Path, body: Any) -> Any:
    (tmp_path / "tok").write_text(TOKEN)
    settings = NodeSettings(
        node_id="n1",
        peers={"n1": "http://127.0.0.1:9"},
        data_dir=tmp_path / "d",
        tick_ms=5,
        durable=False,
        auth_token_file=tmp_path / "tok",
    )
    node = Node(settings)
    await node.start()
    srv = TestServer(build_app(node))
    await srv.start_server()
    try:
        d = node.drivers[0]
        async with asyncio.timeout(10):
            while d.raft.role != Role.LEADER:
                await asyncio.sleep(0.01)
        async with ClientSession(str(srv.make_url(""))) as s:
            return await body(s, srv, d)
    finally:
        await srv.close()
        await node.close()


BAD_BODIES = [
    (b'{"key": "k", "value": "a", "headers": {"h": "\\ud800"}}', "records[0].headers"),
    (b'{"records": [{"key": "k", "headers": {"h": "\\ud800"}}]}', "records[0].headers"),
    (b'{"key": "k", "value": "a", "producer_id": "\\ud800", "sequence": 0}', "producer_id"),
    (b'{"key": "k", "timestamp_ms": 18446744073709551616}', "records[0].timestamp_ms"),
    (b'{"key": "k", "timestamp_ms": 9223372036854775808}', "records[0].timestamp_ms"),
    (b"[" * 5000 + b"]" * 5000, "body"),
    (b'{"records": ' + b"[" * 5000 + b"]" * 5000 + b"}", "body"),
]


def test_bad_append_bodies_are_named_400s_and_change_nothing(tmp_path: Path) -> None:
    async def run(s: ClientSession, srv: TestServer, d: Any) -> None:
        before = d.raft.log.last_index()
        for path in (APPEND, "/v1/records"):  # by partition, and routed by key
            for raw, field in BAD_BODIES:
                headers = {"Content-Type": "application/json"}
                async with s.post(path, data=raw, headers=headers) as r:
                    reply = await r.json()
                assert (r.status, reply.get("field")) == (400, field), (path, raw[:60], reply)
                assert reply["error"] == "bad_request" and reply["reason"]
        assert d.raft.log.last_index() == before

    asyncio.run(_with_node(tmp_path, run))


@pytest.mark.parametrize("value", [b"Bearer \xff", b"Bearer s3cret\xff", b"\xc3\xa9"])
def test_a_non_ascii_token_is_a_401_not_a_500(tmp_path: Path, value: bytes) -> None:
    async def run(s: ClientSession, srv: TestServer, d: Any) -> None:
        for path in (b"/v1/admin/partitions/0/holds", b"/peer/v1/partitions/0/snapshot"):
            rd, wr = await asyncio.open_connection("127.0.0.1", srv.port)
            wr.write(
                b"GET "
                + path
                + b" HTTP/1.1\r\nHost: x\r\nAuthorization: "
                + value
                + b"\r\nConnection: close\r\n\r\n"
            )
            await wr.drain()
            reply = await rd.read()
            wr.close()
            assert reply.split(b"\r\n")[0] == b"HTTP/1.1 401 Unauthorized", reply
            assert b'"unauthorized"' in reply
        async with s.get(
            "/v1/admin/partitions/0/holds", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as r:
            assert r.status == 200

    asyncio.run(_with_node(tmp_path, run))
