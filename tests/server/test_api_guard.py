"""The HTTP API in-process (one single-node cluster behind aiohttp's test server): bodies and
headers that used to reach a 500 are a client's mistake, a 4xx naming the field, or a 401; and
the edges of each route's answer (bounds, base64, error fields, closing) that a client sees."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import struct
import time
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import ProposalRefused
from raftlog.node.core.raft import Role
from raftlog.node.routing import partition_for
from raftlog.node.server.app import LONG_POLL_CHECK_S, build_app
from raftlog.node.server.columnar import MAX_PAGE_BYTES
from raftlog.node.server.connlimit import ConnectionLimit
from raftlog.node.server.http_errors import error_body
from raftlog.node.server.listener import Connections, ListenerProtocol
from raftlog.node.server.node import Node
from raftlog.node.server.partition import AlreadyAppended, LeadershipLost
from raftlog.node.settings import NodeSettings
from raftlog.node.storage.errors import StorageFailed

TOKEN = "s3cret"
APPEND = "/v1/partitions/0/records"


async def _with_node(tmp_path: Path, body: Any, **more: Any) -> Any:
    (tmp_path / "tok").write_text(TOKEN)
    settings = NodeSettings(
        **{
            "node_id": "n1",
            "peers": {"n1": "http://127.0.0.1:9"},
            "data_dir": tmp_path / "d",
            "tick_ms": 5,
            "durable": False,
            "auth_token_file": tmp_path / "tok",
            **more,
        }
    )
    node = Node(settings)
    await node.start()
    srv = TestServer(build_app(node))
    # As `main.serve` runs aiohttp: bodies taken as sent, an early answer read a second more.
    await srv.start_server(auto_decompress=False, lingering_time=1.0)
    try:
        d = node.drivers[0]
        async with asyncio.timeout(10):
            # Leading, and its log applied (the bootstrap membership and its no-op): an admin
            # call sent sooner may be told the membership change before it is not applied yet.
            while any(
                x.raft.role != Role.LEADER or x.raft.log.applied < x.raft.log.last_index()
                for x in node.drivers.values()
            ):
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


@pytest.mark.parametrize(
    "tokens",
    [
        (f"Bearer {TOKEN}", "Bearer wrong"),
        ("Bearer wrong", f"Bearer {TOKEN}"),
        (f"Bearer {TOKEN}",) * 2,
    ],
)
def test_two_authorization_headers_are_a_400_naming_it_whichever_holds_the_token(
    tmp_path: Path, tokens: tuple[str, str]
) -> None:
    """Only the first was checked: a request whose first header held the token passed, whatever
    the second said (a proxy judging by the second would have let through a caller the node
    then took for a peer, or the other way round)."""

    async def run(s: ClientSession, srv: TestServer, d: Any) -> None:
        for path in (b"/v1/admin/partitions/0/holds", b"/peer/v1/partitions/0/snapshot"):
            rd, wr = await asyncio.open_connection("127.0.0.1", srv.port)
            heads = b"".join(b"Authorization: %s\r\n" % t.encode() for t in tokens)
            wr.write(
                b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + heads + b"Connection: close\r\n\r\n"
            )
            await wr.drain()
            reply = await rd.read()
            wr.close()
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.split(b"\r\n")[0] == b"HTTP/1.1 400 Bad Request", reply
            error = json.loads(body)
            assert (error["error"], error["field"]) == ("bad_request", "Authorization"), error
            assert "2 times" in error["reason"], error
        async with s.get(  # one header holding the token is taken as before
            "/v1/admin/partitions/0/holds", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as r:
            assert r.status == 200
        # A client route takes no token: two headers there are not judged.
        rd, wr = await asyncio.open_connection("127.0.0.1", srv.port)
        heads = b"".join(b"Authorization: %s\r\n" % t.encode() for t in tokens)
        wr.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + heads + b"Connection: close\r\n\r\n")
        await wr.drain()
        reply = await rd.read()
        wr.close()
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply[:300]

    asyncio.run(_with_node(tmp_path, run))


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


# =========================================================== answers as clients read them
async def _append(s: ClientSession, body: dict[str, Any]) -> dict[str, Any]:
    """Append `body`'s records; the answer once committed (a refusal fails the test)."""
    async with s.post(APPEND, json=body) as r:
        got = await r.json()
        assert r.status == 200, got
        return cast(dict[str, Any], got)


async def _read(s: ClientSession, query: str) -> dict[str, Any]:
    async with s.get(f"{APPEND}?{query}") as r:
        got = await r.json()
        assert r.status == 200, got
        return cast(dict[str, Any], got)


def test_the_retry_of_a_long_batch_is_answered_with_its_indexes_and_checked_whole(
    tmp_path: Path,
) -> None:
    """Found by a hostile client: a producer's last 64 records were remembered, so the retry
    of a 100-record batch after a lost answer was 409 `already_appended` (an error for records
    in the log once), and only its last 64 records were compared with the log."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        records = [{"key": "k", "value": f"v{i}"} for i in range(100)]
        batch = {"records": records, "producer_id": "long", "sequence": 0}
        first = await _append(s, batch)
        await _append(s, {"value": "between"})  # another writer's record after it
        again = await _append(s, batch)
        assert again["duplicate"] and (again["first_index"], again["last_index"]) == (
            first["first_index"],
            first["last_index"],
        )
        other = [dict(r) for r in records]
        other[10]["value"] = "another day's row"
        async with s.post(APPEND, json={**batch, "records": other}) as r:
            got = await r.json()
            assert (r.status, got["error"]) == (409, "sequence_conflict"), got
            assert "sequence 10 of long" in got["reason"], got

    asyncio.run(_with_node(tmp_path, body))


def test_a_json_read_gives_what_is_not_text_as_base64(tmp_path: Path) -> None:
    """Keys, values and Kafka header values that are not UTF-8 come back as `*_b64` fields,
    the text ones as text: what the client appended, byte for byte."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        record = {
            "key_b64": "/w==",
            "value_b64": "/v8=",
            "headers": [{"key": "h", "value_b64": "gA=="}, {"key": "t", "value": "x"}],
            "timestamp_ms": 7,
        }
        index = (await _append(s, record))["first_index"]
        got = (await _read(s, f"from={index}&limit=1"))["records"]
        assert got == [
            {
                "index": index,
                "term": d.raft.term,
                "key_b64": "/w==",
                "value_b64": "/v8=",
                "headers": [{"key": "h", "value_b64": "gA=="}, {"key": "t", "value": "x"}],
                "timestamp_ms": 7,
            }
        ]

    asyncio.run(_with_node(tmp_path, body))


def test_a_records_answer_fits_max_bytes_exactly_and_one_byte_less_holds_one_record_fewer(
    tmp_path: Path,
) -> None:
    """`max_bytes` bounds the records as sent, the comma between two records included."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        await _append(s, {"records": [{"value": "a" * 50}, {"value": "b" * 60}]})
        whole = await _read(s, "from=1&limit=100")
        records = [r for r in whole["records"] if r.get("value") in ("a" * 50, "b" * 60)]
        first = records[0]["index"]
        sizes = [len(json.dumps(r, separators=(",", ":"))) for r in records]
        exact = sizes[0] + 1 + sizes[1]
        got = await _read(s, f"from={first}&max_bytes={exact}")
        assert [r["index"] for r in got["records"]] == [first, first + 1]
        got = await _read(s, f"from={first}&max_bytes={exact - 1}")
        assert [r["index"] for r in got["records"]] == [first]
        assert got["next"] == first + 1

    asyncio.run(_with_node(tmp_path, body))


def test_an_empty_key_is_a_key_to_route_by(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        async with s.post("/v1/records", json={"key": "", "value": "v"}) as r:
            got = await r.json()
            assert r.status == 200, got
        assert got["partition"] == partition_for(b"", 2)
        async with s.post("/v1/records", json={"value": "v"}) as r:
            got = await r.json()
            assert (r.status, got["field"]) == (400, "records[0].key"), got

    asyncio.run(_with_node(tmp_path, body, partitions=2))


def test_a_keys_partition_is_its_crc32c_modulo_the_partition_count() -> None:
    """What every client computes too: CRC32C (0xE3069283 for "123456789", its check value)."""
    assert partition_for(b"123456789", 1000) == 0xE3069283 % 1000
    assert partition_for(b"123456789", 1) == 0
    with pytest.raises(ValueError, match="partitions: must be at least 1, got 0"):
        partition_for(b"k", 0)


def test_a_stopped_partition_says_so_in_its_metrics_and_to_appends(
    tmp_path: Path,
) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        failed = 'raftlog_partition_failed{partition="0"}'
        async with s.get("/metrics") as r:
            assert f"{failed} 0.0" in await r.text()
        d.stop(RuntimeError("a bug"))
        async with s.get("/metrics") as r:
            assert f"{failed} 1.0" in await r.text()
        for record in ({"value": "v"}, {"value": "v", "producer_id": "p", "sequence": 0}):
            async with s.post(APPEND, json=record) as r:
                got = await r.json()
                assert r.status == 503 and got["error"] == "partition_failed", got
                assert got["reason"] == "a bug; ask another member", got

    asyncio.run(_with_node(tmp_path, body))


def test_what_the_leader_says_of_an_append_is_answered_as_what_it_is(tmp_path: Path) -> None:
    """A refusal is a 503 to retry; a lost leadership names the leader and its client URL; a
    retry of sequences appended long ago is a 409 naming the sequence."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        async def refuses(*_: object) -> None:
            raise ProposalRefused("a leadership transfer is under way")

        d.propose = refuses
        async with s.post(APPEND, json={"value": "v"}) as r:
            got = await r.json()
        assert r.status == 503, got
        assert got == {"error": "refused", "reason": "a leadership transfer is under way"}

        got = await _leader_lost(s, d)
        assert (got["leader"], got["leader_url"]) == ("n1", "http://127.0.0.1:9"), got

        async def long_ago(*_: object) -> None:
            raise AlreadyAppended("sequences 0..0 of p were appended long ago")

        d.propose_idempotent = long_ago
        async with s.post(APPEND, json={"value": "v", "producer_id": "p", "sequence": 0}) as r:
            got = await r.json()
        assert r.status == 409 and got["error"] == "already_appended", got
        assert got["field"] == "sequence", got

    asyncio.run(_with_node(tmp_path, body))


def test_a_read_waiting_for_records_from_past_the_mark_answers_the_first_one_committed(
    tmp_path: Path,
) -> None:
    """`wait_ms` with `from` past the high-water mark: a long poll, answered by the append."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        nxt = (await _append(s, {"value": "early"}))["last_index"] + 1  # past the no-op
        read = asyncio.create_task(_read(s, f"from={nxt}&wait_ms=20000"))
        # The append is sent once the read waits (or, were it not to, once it answered).
        async with asyncio.timeout(10):
            while not len(d.marked) and not read.done():
                await asyncio.sleep(0.005)
        async with s.post(APPEND, json={"value": "late"}) as r:
            assert r.status == 200
        got = await read
        assert [r["value"] for r in got["records"]] == ["late"], got

    asyncio.run(_with_node(tmp_path, body))


def test_long_polls_whose_clients_reset_their_connections_end_and_leave_nothing_waiting(
    tmp_path: Path,
) -> None:
    """Found by a hostile client: aiohttp does not cancel a handler whose connection was reset,
    so thousands of long polls (`wait_ms=60000` for an index far ahead) lived on outside the
    connection cap, each checked on every commit: appends took 338 ms at 8,000 of them."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        # As `main.serve` runs aiohttp: TestServer cancels the handlers of connections lost.
        runner = web.AppRunner(build_app(d.node), access_log=None)
        await runner.setup()
        site = web.SockSite(runner, socket.create_server(("127.0.0.1", 0)))
        await site.start()
        port = site._sock.getsockname()[1]
        try:
            await polls_reset(port, d)
        finally:
            await runner.cleanup()
        assert (await _append(s, {"value": "after"}))["last_index"] > 0

    async def polls_reset(port: int, d: Any) -> None:
        polls = []
        for _ in range(20):
            _, wr = await asyncio.open_connection("127.0.0.1", port)
            wr.write(
                b"GET /v1/partitions/0/records?from=4000000000&wait_ms=60000 HTTP/1.1\r\n"
                b"Host: t\r\n\r\n"
            )
            polls.append(wr)
        async with asyncio.timeout(10):
            while len(d.marked) < 20:
                await asyncio.sleep(0.01)
        for wr in polls:  # reset, as a client that went away without a word
            sock = wr.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            wr.close()
        async with asyncio.timeout(5 * LONG_POLL_CHECK_S):  # not the polls' 60 s
            while len(d.marked):
                await asyncio.sleep(0.05)

    asyncio.run(_with_node(tmp_path, body))


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=10001", "limit"),
        ("limit=0", "limit"),
        ("max_bytes=0", "max_bytes"),
        ("from=%2B5", "from"),  # "+5": int() takes it, the API does not
        ("from=1_0", "from"),
    ],
)
def test_read_bounds_out_of_range_are_400s_naming_them(
    tmp_path: Path, query: str, field: str
) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        async with s.get(f"{APPEND}?{query}") as r:
            got = await r.json()
            assert (r.status, got["field"]) == (400, field), got

    asyncio.run(_with_node(tmp_path, body))


def test_a_read_answers_at_most_limit_records_however_many_pages_it_takes(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        records = [{"value": f"v{i}"} for i in range(150)]
        first = (await _append(s, {"records": records}))["first_index"]
        got = await _read(s, f"from={first}&limit=100")
        assert [r["value"] for r in got["records"]] == [f"v{i}" for i in range(100)]
        assert got["next"] == first + 100

    asyncio.run(_with_node(tmp_path, body))


def test_index_for_time_names_what_it_needs_and_what_was_compacted(tmp_path: Path) -> None:
    """`timestamp_ms` is required; a replica behind `min_index` says so; past a compaction,
    the answer says a record at or after the time may have been compacted."""
    every = RaftConfig(compact_every_operations=50, compact_number_entries=0)

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        path = "/v1/partitions/0/index-for-time"
        async with s.get(path) as r:
            got = await r.json()
            assert (r.status, got["field"]) == (400, "timestamp_ms"), got
        async with s.get(f"{path}?timestamp_ms=0&min_index={d.raft.commit + 5}") as r:
            got = await r.json()
            assert r.status == 503 and got["error"] == "behind", got
            assert got["high_water_mark"] == d.raft.commit, got
        records = [{"value": "v", "timestamp_ms": 1000 + i} for i in range(120)]
        await _append(s, {"records": records})
        await d.compact_now()
        floor = d.storage.compaction_floor()
        kept = (await _append(s, {"value": "kept", "timestamp_ms": 5000}))["first_index"]
        assert 1 < floor <= kept
        async with s.get(f"{path}?timestamp_ms=0") as r:
            got = await r.json()
        assert r.status == 200, got
        assert (got["index"], got["compacted"], got["compaction_floor"]) == (kept, True, floor)
        async with s.get(f"{path}?timestamp_ms=5000") as r:
            got = await r.json()
        assert got["index"] == kept, got

    asyncio.run(_with_node(tmp_path, body, segment_bytes=4096, raft=every))


def test_a_key_read_gives_a_value_that_is_not_text_as_base64(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        await _append(s, {"key": "bin", "value_b64": "/w=="})
        async with s.get("/v1/partitions/0/keys/bin") as r:
            got = await r.json()
        assert r.status == 200 and got["found"], got
        assert got["value_b64"] == "/w==" and "value" not in got, got

    asyncio.run(_with_node(tmp_path, body))


def test_peer_snapshot_calls_name_what_is_missing_or_whose_leader_they_are_not(
    tmp_path: Path,
) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with s.get(
            "/peer/v1/partitions/0/snapshot?term=1&index=5&snap_term=1", headers=auth
        ) as r:
            got = await r.json()
            assert (r.status, got["field"]) == (400, "leader"), got
        path = "/peer/v1/partitions/0/send-snapshot"
        for leader, term in (("n1", d.raft.term + 1), ("n9", d.raft.term)):
            ask = {"target": "n2", "leader": leader, "term": term, "required": 1}
            async with s.post(path, json=ask, headers=auth) as r:
                got = await r.json()
                assert r.status == 409 and got["error"] == "not_my_leader", (leader, got)

    asyncio.run(_with_node(tmp_path, body))


def test_an_append_of_more_than_a_mebibyte_is_taken_up_to_max_request_bytes(tmp_path: Path) -> None:
    """aiohttp's own limit on a body (1 MiB) is not the node's: max_request_bytes is."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        records = {"records": [{"value": "a" * 700_000}, {"value": "b" * 700_000}]}
        got = await _append(s, records)
        assert got["last_index"] == got["first_index"] + 1

    asyncio.run(_with_node(tmp_path, body))


async def _raw(srv: TestServer, request: bytes) -> bytes:
    """Send `request` on a new connection; what the node answers until it closes it."""
    rd, wr = await asyncio.open_connection("127.0.0.1", srv.port)
    try:
        wr.write(request)
        await wr.drain()
        async with asyncio.timeout(10):  # the node closes: a connection left open fails here
            return await rd.read()
    finally:
        wr.close()


def test_requests_refused_from_their_head_close_the_connection(tmp_path: Path) -> None:
    """An encoded body (415) and a body past max_request_bytes (413) are not read: the answer
    says the connection closes, and it does (the unread body is never taken as a request)."""
    limit = 65536

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        head = b"POST /v1/partitions/0/records HTTP/1.1\r\nHost: t\r\n"
        gzip = await _raw(srv, head + b"Content-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}")
        assert gzip.startswith(b"HTTP/1.1 415 "), gzip
        assert b"\r\nConnection: close\r\n" in gzip, gzip
        big = await _raw(srv, head + b"Content-Length: %d\r\n\r\n{" % (limit + 1))
        assert big.startswith(b"HTTP/1.1 413 "), big
        assert b"\r\nConnection: close\r\n" in big and b'"field": "Content-Length"' in big, big

    asyncio.run(_with_node(tmp_path, body, max_request_bytes=limit))


def test_no_route_says_100_continue_to_a_request_it_refuses_from_its_head(tmp_path: Path) -> None:
    """`Expect: 100-continue` on every route, with an encoded body (415) and no token (401 on
    the peer and admin routes), the body sent at once: the final answer comes first. aiohttp's
    expectation handler said `100 Continue` before the guard's checks, asking for a body they
    then refused unread."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        app = srv.app
        assert app is not None
        args = {"partition": "0", "holder": "h", "follower": "n2", "key": "k"}
        seen = set()
        for route in app.router.routes():
            info = route.get_info()
            path = info.get("path") or info["formatter"].format(**args)
            head = b"%s %s HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n" % (
                route.method.encode(),
                path.encode(),
            )
            got = await _raw(
                srv,
                head
                + b"Content-Encoding: gzip\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            )
            guarded = path.startswith(("/peer/", "/v1/admin/"))
            want = b"HTTP/1.1 401 " if guarded else b"HTTP/1.1 415 "
            assert got.startswith(want), (route.method, path, got[:200])
            seen.add((route.method, path))
        assert len(seen) > 25, seen

    asyncio.run(_with_node(tmp_path, body))


def test_a_transfer_coding_besides_chunked_is_a_501_naming_it_and_the_body_is_not_taken(
    tmp_path: Path,
) -> None:
    """aiohttp reads `Transfer-Encoding: gzip, chunked` as chunked and passes the body on still
    gzipped: it was refused as JSON it is not (400), naming the wrong thing. Plain chunked (in
    any case) is read as before."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        head = b"POST /v1/partitions/0/records HTTP/1.1\r\nHost: t\r\n"
        chunk = b'{"value": "te"}'
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk)
        for coding in (b"gzip, chunked", b"deflate,chunked", b"x-custom, Chunked"):
            answer = await _raw(srv, head + b"Transfer-Encoding: " + coding + b"\r\n\r\n" + chunked)
            assert answer.startswith(b"HTTP/1.1 501 "), answer
            assert b"\r\nConnection: close\r\n" in answer, answer
            assert b'"field": "Transfer-Encoding"' in answer and b"unsupported_encoding" in answer
        before = d.raft.log.last_index()
        plain = head + b"Transfer-Encoding: Chunked\r\nConnection: close\r\n\r\n" + chunked
        answer = await _raw(srv, plain)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert d.raft.log.last_index() == before + 1, "only the plain chunked body was appended"

    asyncio.run(_with_node(tmp_path, body))


def test_a_body_of_exactly_max_request_bytes_is_taken(tmp_path: Path) -> None:
    limit = 65536

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        shell = b'{"value": ""}'
        exact = shell[:-2] + b"a" * (limit - len(shell)) + shell[-2:]
        assert len(exact) == limit
        async with s.post(APPEND, data=exact) as r:
            assert r.status == 200, await r.text()
        async with s.post(APPEND, data=exact[:-2] + b'a"}') as r:
            got = await r.json()
            assert (r.status, got["field"]) == (413, "Content-Length"), got

    asyncio.run(_with_node(tmp_path, body, max_request_bytes=limit))


def test_content_codings_are_case_insensitive(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        for coding in ("Identity", "IDENTITY"):
            headers = {"Content-Encoding": coding}
            async with s.post(APPEND, data=b'{"value": "v"}', headers=headers) as r:
                assert r.status == 200, (coding, await r.text())
        async with s.post(APPEND, data=b"{}", headers={"Content-Encoding": "Gzip"}) as r:
            assert r.status == 415

    asyncio.run(_with_node(tmp_path, body))


def test_a_body_sent_too_slowly_is_a_408_and_the_connection_closes(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        head = b"POST /v1/partitions/0/records HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"
        answer = await _raw(srv, head + b'{"value": ')  # and nothing more
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"\r\nConnection: close\r\n" in answer and b'"error": "timeout"' in answer, answer

    asyncio.run(_with_node(tmp_path, body, request_body_timeout_s=0.2))


def test_errors_without_a_field_name_none(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        async with s.post("/v1/partitions/7/records", json={"value": "v"}) as r:
            got = await r.json()
        assert r.status == 404, got
        assert got == {
            "error": "unknown_partition",
            "reason": "partition 7 does not exist (0..0)",
        }

    asyncio.run(_with_node(tmp_path, body))


def test_a_method_not_allowed_names_the_allowed_ones_in_its_allow_header(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        async with s.delete(APPEND) as r:
            got = await r.json()
            assert r.status == 405 and got["error"] == "method_not_allowed", got
            assert set(r.headers["Allow"].split(",")) == {"GET", "HEAD", "POST"}, r.headers

    asyncio.run(_with_node(tmp_path, body))


def test_an_admin_body_nested_too_deep_is_a_400_naming_the_body(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        deep = b"[" * 100_000 + b"]" * 100_000
        for method, path in (
            ("PUT", "/v1/admin/partitions/0/holds/reader"),
            ("POST", "/v1/admin/peers"),
            ("POST", "/v1/admin/partitions/0/members"),
        ):
            async with s.request(method, path, data=deep, headers=auth) as r:
                got = await r.json()
                assert (r.status, got.get("field")) == (400, "body"), (path, got)

    asyncio.run(_with_node(tmp_path, body))


async def _leader_lost(s: ClientSession, d: Any) -> dict[str, Any]:
    """The answer to an append whose partition's leadership was lost while it waited."""

    async def loses(*_: object) -> None:
        raise LeadershipLost("n1 stepped down")

    d.propose = loses
    async with s.post(APPEND, json={"value": "v"}) as r:
        got: dict[str, Any] = await r.json()
    assert r.status == 503 and got["error"] == "leader_lost", got
    return got


def test_a_lost_leaderships_hint_is_the_leaders_client_url_when_peers_have_their_own_port(
    tmp_path: Path,
) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        got = await _leader_lost(s, d)
        assert (got["leader"], got["leader_url"]) == ("n1", "http://127.0.0.1:7001"), got

    split = {"port": 7001, "peer_port": 7002, "peers": {"n1": "http://127.0.0.1:7002"}}
    asyncio.run(_with_node(tmp_path, body, **split))


ADMIN = "/v1/admin/partitions/0"


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", f"{ADMIN}/members", {"op": "", "node": "n9", "url": "http://n9:1"}, "op"),
        ("POST", f"{ADMIN}/members", {"op": "demote", "node": "n9", "url": "http://n9:1"}, "op"),
        ("POST", f"{ADMIN}/transfer", {"target": ""}, "target"),
        ("POST", f"{ADMIN}/snapshot-install", {"target": "n2", "source": ""}, "source"),
        ("POST", f"{ADMIN}/snapshot-install", {"target": "n2", "source": ["n1"]}, "source"),
        ("POST", "/v1/admin/peers", {"n2": "ftp://n2:1"}, "n2"),
        ("POST", "/v1/admin/peer-addresses", {"n1": "10.0.0.1"}, "n1"),  # itself
        ("POST", "/v1/admin/peer-addresses", {"n2": "0.0.0.0"}, "n2"),
        ("POST", "/v1/admin/peer-addresses", {"n2": "::"}, "n2"),
        ("POST", "/v1/admin/peer-addresses", {"n2": "fe80::1%eth0"}, "n2"),
        ("PUT", f"{ADMIN}/holds/h", {"min_index": 1, "colour": "red"}, "colour"),
    ],
)
def test_admin_requests_that_could_not_be_meant_are_400s_naming_the_field(
    tmp_path: Path, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    async def run(s: ClientSession, srv: TestServer, d: Any) -> None:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with s.post("/v1/admin/peers", json={"n2": "http://n2:1"}, headers=auth) as r:
            assert r.status == 200  # n2 is a peer (not a member) from here on
        async with s.request(method, path, json=body, headers=auth) as r:
            got = await r.json()
            assert (r.status, got.get("field")) == (400, field), got
        async with s.get("/v1/admin/peer-addresses", headers=auth) as r:
            assert (await r.json())["addresses"] == {}  # nothing was taken
        async with s.get(f"{ADMIN}/holds", headers=auth) as r:
            assert (await r.json())["holds"] == []

    asyncio.run(_with_node(tmp_path, run))


def test_admin_requests_change_what_they_say_and_answer_it(tmp_path: Path) -> None:
    """A learner added with its URL (unknown here before), a peer's address as given in its
    shortest form, a hold kept for 60 s unless told, and a hold deleted only once."""

    async def run(s: ClientSession, srv: TestServer, d: Any) -> None:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        add = {"op": "add_learner", "node": "n9", "url": "http://n9:1"}
        async with s.post(f"{ADMIN}/members", json=add, headers=auth) as r:
            got = await r.json()
            assert r.status == 200, got
        assert (got["voters"], got["learners"]) == (["n1"], ["n9"])
        async with s.post("/v1/admin/peer-addresses", json={"n9": "::0001"}, headers=auth) as r:
            got = await r.json()
            assert r.status == 200 and got["addresses"] == {"n9": "::1"}, got
        async with s.put(f"{ADMIN}/holds/h", json={"min_index": 1}, headers=auth) as r:
            got = await r.json()
            assert r.status == 200, got
        assert 30 <= got["expires_at"] - time.time() <= 60, got  # ttl_seconds' default
        async with s.delete(f"{ADMIN}/holds/h", headers=auth) as r:
            assert r.status == 204
        async with s.delete(f"{ADMIN}/holds/h", headers=auth) as r:
            got = await r.json()
            assert r.status == 404 and got["error"] == "unknown_hold", got

    asyncio.run(_with_node(tmp_path, run))


def test_a_refused_membership_change_leaves_the_members_address_as_it_was(tmp_path: Path) -> None:
    async def run(s: ClientSession, srv: TestServer, d: Any) -> None:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        again = {"op": "add_learner", "node": "n1", "url": "http://elsewhere:1"}  # a voter
        async with s.post(f"{ADMIN}/members", json=again, headers=auth) as r:
            got = await r.json()
            assert r.status == 409 and got["error"] == "refused", got
        async with s.get("/v1/admin/peers", headers=auth) as r:
            assert (await r.json())["peers"] == {"n1": "http://127.0.0.1:9"}

    asyncio.run(_with_node(tmp_path, run))


def test_a_member_that_does_not_lead_answers_leader_only_calls_421(tmp_path: Path) -> None:
    """n1 of three, the other two never reachable: it never leads. A snapshot install asked of
    it is the leader's to decide, even one naming n1 itself as the target; and its metrics do
    not count it a leader while it stands for election."""

    async def run() -> None:
        (tmp_path / "tok").write_text(TOKEN)
        settings = NodeSettings(
            node_id="n1",
            peers={
                "n1": "http://127.0.0.1:9",
                "n2": "http://127.0.0.1:10",
                "n3": "http://127.0.0.1:11",
            },
            data_dir=tmp_path / "d",
            tick_ms=5,
            durable=False,
            auth_token_file=tmp_path / "tok",
        )
        node = Node(settings)
        await node.start()
        srv = TestServer(build_app(node))
        await srv.start_server()
        auth = {"Authorization": f"Bearer {TOKEN}"}
        try:
            async with ClientSession(str(srv.make_url(""))) as s:
                for target in ("n1", "n2"):
                    ask = {"target": target}
                    async with s.post(f"{ADMIN}/snapshot-install", json=ask, headers=auth) as r:
                        got = await r.json()
                        assert r.status == 421 and got["error"] == "not_leader", (target, got)
                        assert got["leader"] is None, got
            # Standing for election is not leading: its metrics say so (read in one step).
            d = node.drivers[0]
            async with asyncio.timeout(10):
                while d.raft.role == Role.FOLLOWER:
                    await asyncio.sleep(0.001)
            assert d.raft.role != Role.LEADER
            assert 'raftlog_is_leader{partition="0"} 0.0' in node.metrics.render().decode()
        finally:
            await srv.close()
            await node.close()

    asyncio.run(run())


def test_reads_that_could_not_be_held_now_are_503_busy_with_a_retry_after(tmp_path: Path) -> None:
    """While answers waiting for slow readers fill max_answer_buffer_bytes, a read that may
    need more is refused before it is read: records, columns and WAL pages alike."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        budget = d.node.answers
        budget.held = budget.limit  # as if slow readers held that much
        for path in (
            "/v1/partitions/0/records?max_bytes=1048576",
            "/v1/partitions/0/columns?max_bytes=1048576",
            "/v1/partitions/0/columns?format=wal&max_bytes=1048576",
        ):
            async with s.get(path) as r:
                got = await r.json()
                assert r.status == 503 and got["error"] == "busy", (path, got)
                assert r.headers["Retry-After"] == "1", path
        budget.held = 0
        async with s.get("/v1/partitions/0/records?max_bytes=1048576") as r:
            assert r.status == 200

    asyncio.run(_with_node(tmp_path, body))


def test_an_append_under_way_when_the_node_stops_is_answered_then_its_connection_closed(
    tmp_path: Path,
) -> None:
    """The client listener's fast path at shutdown (`Connections.drain`): an idle connection
    is closed at once; one whose append is under way gets its answer, saying the connection
    closes, and is closed after it."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        entered, release = asyncio.Event(), asyncio.Event()
        propose = d.propose

        async def held(records: list[bytes], timeout: float) -> Any:
            entered.set()
            await release.wait()
            return await propose(records, timeout)

        d.propose = held
        conns = Connections()
        limit = ConnectionLimit(
            "client", 8, "max_client_connections", d.node.metrics.connections_refused
        )
        server = await asyncio.get_running_loop().create_server(
            lambda: ListenerProtocol(d.node, asyncio.Protocol, conns, limit), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        try:
            idle_rd, idle_wr = await asyncio.open_connection("127.0.0.1", port)
            rd, wr = await asyncio.open_connection("127.0.0.1", port)
            append = b'{"value": "v"}'
            wr.write(
                b"POST /v1/partitions/0/records HTTP/1.1\r\nHost: t\r\nContent-Length: %d"
                b"\r\n\r\n%s" % (len(append), append)
            )
            await asyncio.wait_for(entered.wait(), 10)
            drain = asyncio.create_task(conns.drain(timeout=10))
            assert await asyncio.wait_for(idle_rd.read(), 10) == b""  # closed at once
            release.set()
            answer = await asyncio.wait_for(rd.read(), 10)  # to the end: the node closes
            await drain
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
            assert b"\r\nConnection: close\r\n" in answer, answer
            idle_wr.close()
            wr.close()
        finally:
            server.close()

    asyncio.run(_with_node(tmp_path, body))


def test_a_bulk_read_the_disk_fails_is_a_503_saying_to_read_elsewhere(tmp_path: Path) -> None:
    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        await _append(s, {"records": [{"value": "v"}] * 10})

        def eio(*_: object) -> None:
            raise OSError(errno.EIO, "Input/output error")

        d.storage.read_raw = eio
        for fmt in ("columns", "wal"):
            async with s.get(f"/v1/partitions/0/columns?format={fmt}") as r:
                got = await r.json()
                assert r.status == 503 and got["error"] == "storage_failed", (fmt, got)
                assert "read from another replica" in got["reason"], got

    asyncio.run(_with_node(tmp_path, body))


def test_a_bulk_page_holds_at_most_16_mib_of_records_whatever_max_bytes_asks(
    tmp_path: Path,
) -> None:
    """`max_bytes` up to 64 MiB is taken, but a column or WAL page stops at MAX_PAGE_BYTES of
    records (and the one that crosses it): the rest is read from `next`."""

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        indexes = []
        for i in range(20):  # 20 MB of records
            indexes.append((await _append(s, {"value": chr(97 + i) * 1_000_000}))["first_index"])
        first, cap, ask = indexes[0], MAX_PAGE_BYTES, 64 << 20
        async with s.get(f"/v1/partitions/0/columns?from={first}&max_bytes={ask}") as r:
            page = msgspec.msgpack.decode(await r.read())
        assert 16 <= page["count"] <= 17, page["count"]
        assert len(page["value_data"]) <= cap + 1_000_000
        async with s.get(f"/v1/partitions/0/columns?format=wal&from={first}&max_bytes={ask}") as r:
            wal = msgspec.msgpack.decode(await r.read())
        assert first + 16 <= wal["next"] <= first + 17, wal["next"]
        assert len(wal["records"]) <= cap + 1_100_000

    asyncio.run(_with_node(tmp_path, body))


def test_metrics_tell_the_snapshot_index_from_the_compaction_floor(tmp_path: Path) -> None:
    every = RaftConfig(compact_every_operations=50, compact_number_entries=0)

    async def body(s: ClientSession, srv: TestServer, d: Any) -> None:
        await _append(s, {"records": [{"value": "v"}] * 120})
        await d.compact_now()
        snap, floor = d.storage.snapshot_meta().index, d.storage.compaction_floor()
        assert snap != floor
        async with s.get("/metrics") as r:
            text = await r.text()
        assert f'raftlog_snapshot_index{{partition="0"}} {float(snap)}' in text
        assert f'raftlog_compaction_floor{{partition="0"}} {float(floor)}' in text

    asyncio.run(_with_node(tmp_path, body, segment_bytes=4096, raft=every))
