"""The two faces of the client, `AsyncClient` (aiohttp) and `Client` (blocking http.client),
against a scripted HTTP server on 127.0.0.1: the same requests on the wire, the same results,
the same errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest

from raftlog.client import NO_ANSWER, AsyncClient, Client, ClientError


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


# What the server does with the n-th request: (status, content type, body) to answer, None to
# close the connection unanswered, a float to wait that long first.
Script = Callable[[Seen, int], tuple[int, str, bytes] | None]


class Server:
    def __init__(self, script: Script, wait_s: float = 0.0, keep_alive_once: bool = False):
        self.seen: list[Seen] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(self.command, self.path, dict(self.headers), self.rfile.read(length))
                n = len(server.seen)
                server.seen.append(seen)
                time.sleep(wait_s)
                got = script(seen, n)
                if got is None:
                    self.close_connection = True
                    return
                status, ctype, body = got
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)  # (a client that timed out is gone)
                # Kept alive as far as the client knows, yet closed: a node that restarted.
                self.close_connection = keep_alive_once

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                """Silent: the test reads `seen`."""

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(script: Script, **kw: Any) -> Server:
        started.append(Server(script, **kw))
        return started[-1]

    yield start
    for s in started:
        s.close()


def answer(status: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()


def with_both(url: str, call: Callable[[Any], Any], **kw: Any) -> list[Any]:
    """`call(client)` made with each face (its result, or the ClientError it raised)."""

    def outcome(make: Callable[[], Any]) -> Any:
        try:
            return make()
        except ClientError as e:
            return e

    async def on_async() -> Any:
        async with AsyncClient([url], **kw) as c:
            return await call(c)

    with Client([url], **kw) as c:
        blocking = outcome(lambda: call(c))
    return [outcome(lambda: asyncio.run(on_async())), blocking]


def test_both_faces_send_the_same_requests_and_read_the_same_answers(serve):
    appended = {"partition": 3, "first_index": 7, "last_index": 8, "term": 2}
    server = serve(lambda seen, n: answer(200, appended))
    records = [{"key": "k", "value": "ü"}, {"value": None}]
    got = with_both(
        server.url, lambda c: c.append(3, records, producer_id="p", sequence=5), token="t0k"
    )
    assert [(r.first_index, r.last_index, r.term) for r in got] == [(7, 8, 2)] * 2
    assert len(server.seen) == 2
    for seen in server.seen:
        assert (seen.method, seen.path) == ("POST", "/v1/partitions/3/records")
        assert seen.headers["Authorization"] == "Bearer t0k"
        assert seen.headers["Content-Type"] == "application/json"
        assert json.loads(seen.body) == {"records": records, "producer_id": "p", "sequence": 5}


def test_both_faces_decode_pages_and_encode_queries_alike(serve):
    page = msgspec.msgpack.encode({"next": 11, "count": 1})
    server = serve(lambda seen, n: (200, "application/vnd.raftlog.columns+msgpack", page))
    got = with_both(server.url, lambda c: c.columns(server.url, 1, 10, 20, 5))
    assert got == [{"next": 11, "count": 1}] * 2
    path = "/v1/partitions/1/columns?from=10&to=20&limit=5&min_index=19"
    assert [s.path for s in server.seen] == [path] * 2


def test_both_faces_retry_a_connection_closed_unanswered_then_raise_a_refusal(serve):
    def script(seen: Seen, n: int) -> tuple[int, str, bytes] | None:
        if n % 3 == 0:
            return None  # the node went down mid-request
        if n % 3 == 1:
            return answer(503, {"error": "no_leader", "reason": "an election"})
        return answer(500, {"error": "internal", "reason": "see the node's log"})

    server = serve(script)
    got = with_both(server.url, lambda c: c.read(0, 1, 10))
    for e in got:
        assert isinstance(e, ClientError) and (e.status, e.error) == (500, "internal")
        assert e.url == server.url and not e.retryable
    assert len(server.seen) == 6, "no answer and a 503 retried, the 500 not"


def test_a_call_without_an_answer_in_its_timeout_is_no_answer(serve):
    # The answer comes after 2 s: within the clients' default timeout (15 s), not the one set.
    server = serve(lambda seen, n: answer(200, {}), wait_s=2.0)
    per_call = with_both(server.url, lambda c: c.status(server.url, timeout_s=0.3))
    per_client = with_both(server.url, lambda c: c.status(server.url), timeout_s=0.3)
    for e in per_call + per_client:
        assert isinstance(e, ClientError) and e.status == NO_ANSWER and e.retryable


def test_the_blocking_client_reconnects_once_to_a_node_that_closed_a_kept_alive_connection(
    serve,
):
    server = serve(lambda seen, n: answer(200, {"node": "n1", "n": n}), keep_alive_once=True)
    with Client([server.url], retries=0) as c:
        assert c.status(server.url)["n"] == 0
        assert c.status(server.url)["n"] == 1, "the closed connection was replaced at once"
    assert len(server.seen) == 2


@pytest.fixture
def silent_address() -> Iterator[str]:
    """An address where connections never open: a listener whose accept queue is full, so the
    kernel drops every further SYN (as for a machine gone, or a network dropping its packets)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    queued = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(address)
        queued.append(s)
    probe = socket.socket()
    probe.settimeout(0.5)
    with pytest.raises(TimeoutError):  # the premise: a connection there does not open
        probe.connect(address)
    probe.close()
    yield f"http://{address[0]}:{address[1]}"
    for s in [*queued, listener]:
        s.close()


def test_both_faces_give_up_on_an_address_that_answers_nothing_and_try_the_next(
    serve, silent_address
):
    # The call's timeout (60 s) is far longer than the wait allowed here (20 s): the read must
    # leave the silent address after its connect timeout, not its call timeout.
    page = {"records": [], "next": 1, "high_water_mark": 0}
    server = serve(lambda seen, n: answer(200, page))
    results: list[Any] = []

    def both() -> None:
        results.extend(
            with_both(
                silent_address,
                lambda c: c.read(0, 1, 10),
                timeout_s=60,
                connect_timeout_s=0.5,
                retries=1,
            )
        )

    async def read_async() -> Any:
        async with AsyncClient(
            [silent_address, server.url], timeout_s=60, connect_timeout_s=0.5
        ) as c:
            return await c.read(0, 1, 10)

    def through_next() -> None:
        results.append(asyncio.run(read_async()))
        with Client([silent_address, server.url], timeout_s=60, connect_timeout_s=0.5) as c:
            results.append(c.read(0, 1, 10))

    for work in (both, through_next):
        t = threading.Thread(target=work, daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive(), f"{work.__name__}: still waiting on the silent address"
    alone, via_next = results[:2], results[2:]
    for e in alone:  # the silent address only: no answer, named, after the retries
        assert isinstance(e, ClientError) and e.status == NO_ANSWER and e.url == silent_address
        assert "Timeout" in str(e), str(e)
    assert via_next == [page, page]
    assert len(server.seen) >= 2
