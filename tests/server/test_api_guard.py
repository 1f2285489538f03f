"""The HTTP API in-process (one single-node cluster behind aiohttp's test server): bodies and
headers that used to reach a 500 are a client's mistake, a 4xx naming the field, or a 401."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from raftlog.node.core.raft import Role
from raftlog.node.server.app import build_app
from raftlog.node.server.http_errors import error_body
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings
from raftlog.node.storage.errors import StorageFailed

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


def _enospc(path: str) -> StorageFailed:
    return StorageFailed(path, "write", OSError(errno.ENOSPC, "No space left on device"))


def test_storage_faults_are_503s_naming_them_never_500s(tmp_path: Path) -> None:
    """A disk fault under a forced compaction, under a read that must first write the WAL's
    held records, and under a received snapshot chunk: each answered as what it is."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        async with s.post(APPEND, json={"value": "v"}) as r:
            assert r.status == 200
        auth = {"Authorization": f"Bearer {TOKEN}"}

        def full_snapshot(*_: object) -> str:
            raise OSError(errno.ENOSPC, "No space left on device")

        d.storage.write_snapshot_file = full_snapshot
        async with s.post("/v1/admin/partitions/0/compact", headers=auth) as r:
            got = await r.json()
            assert r.status == 503 and got["error"] == "storage_failed", got
        assert d.failed is not None  # the partition stopped writing, and says why

        def flush_fails(*_: object) -> None:  # as a read past the tail cache that flushes
            raise _enospc(d.storage.wal.path)

        d.storage.entries = flush_fails
        async with s.get("/v1/partitions/0/records?from=1&limit=10000") as r:
            got = await r.json()
            assert r.status == 503 and "read from another replica" in got["reason"], got

        def chunk_fails(*_: object) -> bool:
            raise OSError(errno.ENOSPC, "No space left on device")

        receiver = _Receiver(chunk_fails)
        d.storage.snapshots.receiver = lambda index, term: receiver
        path = "/peer/v1/partitions/0/snapshot?leader=n2&term=9&index=5&snap_term=1"
        headers = {**auth, "X-Offset": "0", "X-Crc32c": "0", "X-Total": "1"}
        async with s.post(path, data=b"x", headers=headers) as r:
            got = await r.json()
            assert r.status == 507 and "cannot write the snapshot" in got["reason"], got
        assert receiver.aborted  # its partial file goes: the next attempt starts whole

    asyncio.run(_with_node(tmp_path, body))


class _Receiver:
    """A snapshot receiver whose write fails as `write` does."""

    def __init__(self, write: Any) -> None:
        self.write = write
        self.received = 0
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_a_failed_partition_fails_liveness_reads_at_once_and_a_peer_reset_is_a_500(
    tmp_path: Path,
) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        auth = {"Authorization": f"Bearer {TOKEN}"}

        def reset() -> None:  # as a peer's or a store's connection reset would
            raise ConnectionResetError("reset by another peer")

        not_ready = d.node.not_ready
        d.node.not_ready = reset
        async with s.get("/readyz", headers=auth) as r:
            assert r.status == 500  # the client is there: not its 499
        d.node.not_ready = not_ready
        async with s.get("/healthz", headers=auth) as r:
            assert r.status == 200, await r.text()
        d.stop(_enospc(d.storage.wal.path))
        # Never writing again in this process: a liveness probe restarts it, which reopens it.
        async with s.get("/healthz", headers=auth) as r:
            got = await r.json()
            assert r.status == 503 and "[0] stopped writing" in got["reason"], got
        async with s.get("/readyz", headers=auth) as r:
            assert r.status == 503 and "[0] stopped writing" in (await r.json())["reason"]
        async with asyncio.timeout(2):  # not the append timeout (10 s)
            async with s.get("/v1/partitions/0/keys/k") as r:
                got = await r.json()
                assert r.status == 503 and got["error"] == "storage_failed", got

    asyncio.run(_with_node(tmp_path, body))


@pytest.mark.parametrize(
    ("fault", "error"),
    [(_enospc("wal"), "storage_failed"), (RuntimeError("a bug"), "partition_failed")],
)
def test_a_partition_stopping_under_a_linearizable_read_answers_it_503(
    tmp_path: Path, fault: Exception, error: str
) -> None:
    """The read waits on the leader's ReadIndex, and the partition stops meanwhile: the same
    503 as any call on a stopped partition (a bug's was a 500)."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        async def stops_meanwhile() -> int:
            d.stop(fault)
            raise fault

        d.linearizable_point = stops_meanwhile
        async with s.get("/v1/partitions/0/keys/k") as r:
            got = await r.json()
            assert r.status == 503 and got["error"] == error, got
            assert "ask another member" in got["reason"], got

    asyncio.run(_with_node(tmp_path, body))


@pytest.mark.parametrize(
    ("status", "message", "answer"),
    [
        (
            400,
            "Bad status line 'Invalid method encountered':\n\n  b'BREW /v1/status HTTP/1.1'\n"
            "     ^",
            {
                "error": "bad_request",
                "reason": "Bad status line 'Invalid method encountered'",
                "at": "b'BREW /v1/status HTTP/1.1'",
            },
        ),
        (400, "Missing Host header", {"error": "bad_request", "reason": "Missing Host header"}),
        (400, None, {"error": "bad_request", "reason": "the request is not valid HTTP/1.1"}),
        (413, "Request too large", {"error": "too_large", "reason": "Request too large"}),
        (418, "Odd request", {"error": "bad_request", "reason": "Odd request"}),
        # A server error says nothing of aiohttp's text (a traceback, the handler's state).
        (500, "Traceback: secret state", {"error": "internal", "reason": "see the node's log"}),
        (503, "Traceback: secret state", {"error": "internal", "reason": "see the node's log"}),
    ],
    ids=["caret", "one line", "no message", "413", "other 4xx", "500", "other 5xx"],
)
def test_aiohttps_own_errors_in_the_apis_json_shape(
    status: int, message: str | None, answer: dict[str, str]
) -> None:
    assert json.loads(error_body(status, message)) == answer


def test_the_offending_text_quoted_in_an_error_is_cut_short() -> None:
    # A head of several KiB quoted back whole would be an answer as large as the request.
    at = json.loads(error_body(400, "Bad header:\n" + "x" * 5000))["at"]
    assert at == "x" * 200
