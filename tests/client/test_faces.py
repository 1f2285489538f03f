"""The two faces of the client, `AsyncClient` (aiohttp) and `Client` (blocking http.client),
against a scripted HTTP server on 127.0.0.1: the same requests on the wire, the same results,
the same errors."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp.abc
import msgspec
import pytest
import trustme

from raftlog.client import (
    NO_ANSWER,
    AsyncClient,
    Client,
    ClientError,
    IdempotentProducer,
    RetryPolicy,
)
from raftlog.client.retry import CONNECT_TIMEOUT_S
from raftlog.node.routing import partition_for


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
    def __init__(
        self,
        script: Script,
        wait_s: float = 0.0,
        keep_alive_once: bool = False,
        tls: ssl.SSLContext | None = None,
        closes: bool = False,
    ):
        """`tls`: serve https with it. `closes`: each answer says `Connection: close`, and
        closes."""
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
                if closes:
                    self.send_header("Connection", "close")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)  # (a client that timed out is gone)
                # Kept alive as far as the client knows, yet closed: a node that restarted.
                self.close_connection = keep_alive_once or closes

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                """Silent: the test reads `seen`."""

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:  # (a failed handshake ends that connection, not the server)
            self.http.socket = tls.wrap_socket(self.http.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.http.server_address[1]}"
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


def test_both_faces_ask_for_the_records_page_they_were_asked_for(serve):
    page = {"partition": 2, "high_water_mark": 9, "records": [], "next": 5}
    server = serve(lambda seen, n: answer(200, page))
    got = with_both(server.url, lambda c: c.read(2, 5, 10, min_index=7, wait_ms=250))
    assert got == [page] * 2
    path = "/v1/partitions/2/records?from=5&limit=10&min_index=7&wait_ms=250"
    assert [s.path for s in server.seen] == [path] * 2


def test_both_faces_append_keyed_records_to_their_partition_and_refuse_a_mix(serve):
    keys = {partition_for(k.encode(), 4): k for k in ("a", "b", "c", "d", "e", "f", "g")}
    assert len(keys) >= 2
    (p, key), (other, other_key) = sorted(keys.items())[:2]
    appended = {"partition": p, "first_index": 3, "last_index": 4, "term": 1}

    def script(seen: Seen, n: int) -> tuple[int, str, bytes]:
        if seen.path == "/v1/status":
            return answer(200, {"node": "n1", "partitions": [{"partition": i} for i in range(4)]})
        return answer(200, appended)

    server = serve(script)
    same = [{"key": key, "value": "1"}, {"key": key, "value": "2"}]
    got = with_both(server.url, lambda c: c.append_keyed(same))
    assert [(r.partition, r.first_index) for r in got] == [(p, 3)] * 2
    assert [s.path for s in server.seen if s.method == "POST"] == [
        f"/v1/partitions/{p}/records"
    ] * 2
    mixed = [{"key": key, "value": "1"}, {"key": other_key, "value": "2"}]
    refused = rf"the keys map to partitions \[{p}, {other}\]; append them apart"
    with Client([server.url]) as c, pytest.raises(ValueError, match=refused):
        c.append_keyed(mixed)

    async def on_async() -> None:
        async with AsyncClient([server.url]) as c:
            await c.append_keyed(mixed)

    with pytest.raises(ValueError, match=refused):
        asyncio.run(on_async())
    assert len([s for s in server.seen if s.method == "POST"]) == 2, "nothing sent for a mix"
    # The key's bytes as the node takes them: `key_b64` routes as the same bytes as `key`.
    b64 = [{"key_b64": base64.b64encode(key.encode()).decode(), "value": "3"}]
    with Client([server.url]) as c:
        assert c.append_keyed(b64).partition == p
        # Found by a review: a record without a key was a bare KeyError: 'key'.
        bads: list[tuple[dict[str, Any], str]] = [
            ({"value": "v"}, r"records\[1\]\.key: is required to route a record by key"),
            ({"key": 5}, r"records\[1\]\.key: must be a string or null$"),
            ({"key_b64": "#"}, r"records\[1\]\.key_b64: is not valid base64"),
            ({"key_b64": "é"}, r"records\[1\]\.key_b64: is not valid base64"),
            ({"key_b64": 5}, r"records\[1\]\.key_b64: must be a base64 string"),
            ({"key": "\ud800"}, r"records\[1\]\.key: is not valid Unicode text"),
            ({"key": "k", "key_b64": "aw=="}, r"records\[1\]\.key: give key or key_b64, not both"),
        ]
        for bad, said in bads:
            with pytest.raises(ValueError, match=said):
                c.append_keyed([same[0], bad])


def test_both_faces_route_keys_by_a_partition_count_asked_again_once_old(serve):
    """Found by a review: the partition count keys were routed by was asked once per client,
    so a long-lived client never routed a key to partitions added to the cluster later, while
    new clients did (one key in two partitions, for good). It is asked again once older than
    `metadata_max_age_s` (Kafka's metadata.max.age.ms)."""
    key = next(
        k
        for k in map(str, range(100))
        if partition_for(k.encode(), 2) != partition_for(k.encode(), 4)
    )
    count = [2]

    def script(seen: Seen, n: int) -> tuple[int, str, bytes]:
        if seen.path == "/v1/status":
            parts = [{"partition": i} for i in range(count[0])]
            return answer(200, {"node": "n1", "partitions": parts})
        p = int(seen.path.split("/")[3])
        return answer(200, {"partition": p, "first_index": 1, "last_index": 1, "term": 1})

    def three_appends(append: Callable[[], Any], sleep: Callable[[], Any]) -> list[int]:
        count[0] = 2
        first = append().partition
        count[0] = 4  # partitions raised
        second = append().partition  # within the age: the count known
        sleep()
        return [first, second, append().partition]

    server = serve(script)
    want = [partition_for(key.encode(), 2)] * 2 + [partition_for(key.encode(), 4)]
    records = [{"key": key, "value": "v"}]
    with Client([server.url], metadata_max_age_s=0.5) as c:
        got = three_appends(lambda: c.append_keyed(records), lambda: time.sleep(0.6))
    assert got == want

    async def on_async() -> list[int]:
        async with AsyncClient([server.url], metadata_max_age_s=0.5) as c:
            out = []
            for step in (0, 1, 2):
                if step == 1:
                    count[0] = 4
                if step == 2:
                    await asyncio.sleep(0.6)
                out.append((await c.append_keyed(records)).partition)
            return out

    count[0] = 2
    assert asyncio.run(on_async()) == want
    statuses = [s for s in server.seen if s.path == "/v1/status"]
    assert len(statuses) == 4, "asked once when new and once when old, by each face"


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
        assert str(e) == f"{server.url}: HTTP 500 internal: see the node's log"
    assert len(server.seen) == 6, "no answer and a 503 retried, the 500 not"


def test_a_call_without_an_answer_in_its_timeout_is_no_answer(serve):
    # The answer comes after 2 s: within the clients' default timeout (15 s), not the one set.
    server = serve(lambda seen, n: answer(200, {}), wait_s=2.0)
    per_call = with_both(server.url, lambda c: c.status(server.url, timeout_s=0.3))
    per_client = with_both(server.url, lambda c: c.status(server.url), timeout_s=0.3)
    for e in per_call + per_client:
        assert isinstance(e, ClientError) and e.status == NO_ANSWER and e.retryable
        # Found by a review: a timeout's own message is empty ("no answer: TimeoutError: ").
        assert "timed out after 0.3 s (" in e.reason, e.reason


def test_a_call_given_its_own_timeout_waits_that_long_whatever_the_clients(serve):
    """A snapshot install answers once the snapshot is streamed, an archive flush once it is
    archived: they take a timeout of their own, longer than the client's."""

    def script(seen: Seen, n: int) -> tuple[int, str, bytes]:
        time.sleep(0.6)
        return answer(200, {"path": seen.path})

    server = serve(script)
    install = with_both(
        server.url,
        lambda c: c.install_snapshot(0, "n2", endpoint=server.url, timeout_s=10),
        timeout_s=0.2,
    )
    flush = with_both(
        server.url, lambda c: c.archive_flush(0, endpoint=server.url, timeout_s=10), timeout_s=0.2
    )
    assert install == [{"path": "/v1/admin/partitions/0/snapshot-install"}] * 2
    assert flush == [{"path": "/v1/admin/partitions/0/archive"}] * 2


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


def test_both_faces_send_plain_appends_only_when_made_not_idempotent(serve):
    appended = {"partition": 0, "first_index": 1, "last_index": 1, "term": 1}
    server = serve(lambda seen, n: answer(200, appended))
    records = [{"value": "v"}]
    with_both(server.url, lambda c: c.append(0, records), idempotent=False)
    assert [json.loads(s.body) for s in server.seen] == [{"records": records}] * 2
    server.seen.clear()
    with_both(server.url, lambda c: c.append(0, records))
    bodies = [json.loads(s.body) for s in server.seen]
    assert [(b["records"], b["sequence"]) for b in bodies] == [(records, 0)] * 2
    assert all(b["producer_id"].startswith("client-") for b in bodies)


def test_both_faces_retry_under_the_policy_given_pausing_between_tries(serve):
    times: list[float] = []

    def busy(seen: Seen, n: int) -> tuple[int, str, bytes]:
        times.append(time.monotonic())
        return answer(503, {"error": "busy", "reason": "try later"})

    server = serve(busy)
    # retries=8 given too: an explicit policy is the one that counts.
    policy = RetryPolicy(retries=2, base_s=0.2, cap_s=0.2)  # pauses of 0.1 s to 0.3 s
    got = with_both(server.url, lambda c: c.read(0), retries=8, retry=policy)
    for e in got:
        assert isinstance(e, ClientError) and e.status == 503 and e.error == "busy"
    assert len(times) == 6, "three tries each"
    gaps = [b - a for a, b in (times[0:2], times[1:3], times[3:5], times[4:6])]
    assert all(gap >= 0.1 for gap in gaps), gaps


def test_the_blocking_client_applies_each_calls_timeout_to_a_kept_alive_connection(serve):
    def script(seen: Seen, n: int) -> tuple[int, str, bytes]:
        if n == 1:
            time.sleep(1.0)  # the second call's answer comes late
        return answer(200, {"node": "n1"})

    server = serve(script)
    with Client([server.url], retries=0) as c:
        assert c.status(server.url) == {"node": "n1"}  # the connection is kept
        with pytest.raises(ClientError) as late:
            c.status(server.url, timeout_s=0.3)
    assert late.value.status == NO_ANSWER and "timed out" in str(late.value)


def test_the_connect_timeout_bounds_opening_a_connection_not_the_answer(serve):
    def script(seen: Seen, n: int) -> tuple[int, str, bytes]:
        time.sleep(0.6)  # a node slower to answer than to accept
        return answer(200, {"node": "n1"})

    server = serve(script)
    got = with_both(server.url, lambda c: c.status(server.url), connect_timeout_s=0.2, retries=0)
    assert got == [{"node": "n1"}] * 2


def test_both_faces_say_a_connection_was_not_made_in_time():
    """A listener whose backlog is full drops new connections' SYNs: the connect timeout ends
    the try, and the error says that it was the connection, not the answer, that was late."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        fillers = [socket.socket() for _ in range(3)]
        for f in fillers:
            f.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                f.connect(listener.getsockname())
        try:
            url = f"http://127.0.0.1:{listener.getsockname()[1]}"
            got = with_both(url, lambda c: c.status(url), connect_timeout_s=0.3, retries=0)
        finally:
            for f in fillers:
                f.close()
    for e in got:
        assert isinstance(e, ClientError) and e.status == NO_ANSWER, e
    assert "Connection timeout" in got[0].reason, got[0].reason  # aiohttp's own words
    assert "connecting (TCP, and TLS for https) took over 0.3 s" in got[1].reason, got[1].reason


class Hosts(aiohttp.abc.AbstractResolver):
    """A resolver of made-up names, counting what it is asked."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = hosts
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        self.asked.append(host)
        return [
            {"hostname": host, "host": self.hosts[host], "port": port, "family": family,
             "proto": 0, "flags": socket.AI_NUMERICHOST}
        ]  # fmt: skip

    async def close(self) -> None:
        """Nothing to release: the names are a dict."""


def test_the_async_client_asks_its_resolver_on_every_connection_and_reuses_after_close(serve):
    # Each answer closes its connection, so each call opens one.
    server = serve(lambda seen, n: answer(200, {"n": n}), closes=True)
    hosts = Hosts({"node.test": "127.0.0.1"})
    url = server.url.replace("127.0.0.1", "node.test")
    client = AsyncClient([url], resolver=hosts, retries=0)

    async def twice() -> list[Any]:
        async with client:  # closed at the end of each run: the next run opens another session
            return [await client.status(url), await client.status(url)]

    assert asyncio.run(twice()) == [{"n": 0}, {"n": 1}]
    assert asyncio.run(twice()) == [{"n": 2}, {"n": 3}]
    assert hosts.asked == ["node.test"] * 4, "no DNS cache in front of the resolver"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, str]:
    """A certificate authority, and the file of its certificate."""
    authority = trustme.CA()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    return authority, str(ca_file)


def node_tls(authority: trustme.CA, client_certs: bool = False) -> ssl.SSLContext:
    """A node's TLS: a certificate for 127.0.0.1 and node.test; with `client_certs`, it asks
    its callers for one of the authority's."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1", "node.test").configure_cert(context)
    if client_certs:
        authority.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def test_both_faces_verify_a_node_against_the_ca_file_and_refuse_what_they_cannot(serve, ca):
    authority, ca_file = ca
    server = serve(lambda seen, n: answer(200, {"node": "n1"}), tls=node_tls(authority))
    assert server.url.startswith("https://")
    assert (
        with_both(server.url, lambda c: c.status(server.url), ca_file=ca_file)
        == [{"node": "n1"}] * 2
    )
    refused = with_both(server.url, lambda c: c.status(server.url), retries=0)

    async def through_resolver() -> Any:  # a connector of its own, verifying all the same
        url = server.url.replace("127.0.0.1", "node.test")
        async with AsyncClient(resolver=Hosts({"node.test": "127.0.0.1"})) as c:
            return await c.status(url)

    with pytest.raises(ClientError) as by_name:
        asyncio.run(through_resolver())
    for e in [*refused, by_name.value]:
        assert isinstance(e, ClientError) and e.status == NO_ANSWER
        assert "CERTIFICATE_VERIFY_FAILED" in str(e), str(e)


def test_both_clients_take_the_defaults_the_readme_gives():
    """Found by planted bugs: `AsyncClient` with 3 retries (it gave up within an election
    while `Client` rode it out) or a 30 s connect bound (above the 15 s call timeout: an address
    where nothing answers cost a whole call) passed every test."""
    blocking = inspect.signature(Client.__init__).parameters
    asynchronous = inspect.signature(AsyncClient.__init__).parameters
    for name in set(blocking) & set(asynchronous) - {"self", "endpoints"}:
        assert blocking[name].default == asynchronous[name].default, name
    assert asynchronous["retries"].default == RetryPolicy().retries == 8
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    for name, value in (("timeout_s", 15), ("connect_timeout_s", 3)):
        assert asynchronous[name].default == value and f"`{name}` ({value} s)" in readme, name
    assert CONNECT_TIMEOUT_S == 3


def test_an_idempotent_producer_numbers_its_records_and_retries_a_failed_append_as_it_was(
    serve,
):
    def script(seen: Seen, n: int) -> tuple[int, str, bytes]:
        body = json.loads(seen.body)
        if n == 1:  # an unknown outcome the client gave up on: the caller retries the append
            return answer(503, {"error": "timeout", "reason": "not committed in time"})
        if n == 3:  # a refusal: not appended, and nothing to retry (found by a review)
            return answer(400, {"error": "bad_request", "reason": "no", "field": "records"})
        if [r["value"] for r in body["records"]] == ["y", "z"]:  # in the log, indexes forgotten
            return answer(409, {"error": "already_appended", "reason": "in the log already"})
        count = len(body["records"])
        return answer(200, {"partition": 0, "first_index": 1, "last_index": count, "term": 1})

    server = serve(script)

    async def run() -> None:
        async with AsyncClient([server.url], retries=0) as c:
            producer = IdempotentProducer(c, "p1")
            await producer.append(0, [{"value": "a"}, {"value": "b"}])
            with pytest.raises(ClientError):
                await producer.append(0, [{"value": "c"}])
            with pytest.raises(ValueError, match="retry it with the same records"):
                await producer.append(0, [{"value": "d"}])
            await producer.append(0, [{"value": "c"}])
            with pytest.raises(ClientError, match=r"\(field records\)"):
                await producer.append(0, [{"value": "e"}])
            await producer.append(0, [{"value": "x"}])  # other records, the same sequence
            # Its sequences are used (found by a planted bug: a producer that stayed on them
            # was refused for good).
            with pytest.raises(ClientError, match="already_appended"):
                await producer.append(0, [{"value": "y"}, {"value": "z"}])
            await producer.append(0, [{"value": "w"}])
            await producer.append(1, [{"value": "f"}])
            # Concurrent appends go one at a time, in the order they were called.
            await asyncio.gather(*(producer.append(2, [{"value": f"g{i}"}]) for i in range(4)))

    asyncio.run(run())
    sent = [(s.path.split("/")[3], json.loads(s.body)) for s in server.seen]
    assert {b["producer_id"] for _, b in sent} == {"p1"}
    assert [(p, b["sequence"], [r["value"] for r in b["records"]]) for p, b in sent] == [
        ("0", 0, ["a", "b"]),
        ("0", 2, ["c"]),
        ("0", 2, ["c"]),  # the retry: the sequence the failed try had
        ("0", 3, ["e"]),
        ("0", 3, ["x"]),
        ("0", 4, ["y", "z"]),
        ("0", 6, ["w"]),
        ("1", 0, ["f"]),
        *(("2", i, [f"g{i}"]) for i in range(4)),
    ]


def test_the_async_client_shows_its_certificate_to_a_node_that_asks_for_one(serve, ca, tmp_path):
    authority, ca_file = ca
    tls = node_tls(authority, client_certs=True)
    server = serve(lambda seen, n: answer(200, {"node": "n1"}), tls=tls)
    leaf = authority.issue_cert("operator")
    cert_file, key_file = tmp_path / "client.pem", tmp_path / "client.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert_file))
    leaf.private_key_pem.write_to_path(str(key_file))

    async def status(**kw: Any) -> Any:
        async with AsyncClient(ca_file=ca_file, retries=0, **kw) as c:
            return await c.status(server.url)

    assert asyncio.run(status(cert_file=str(cert_file), key_file=str(key_file))) == {"node": "n1"}
    with pytest.raises(ClientError) as refused:
        asyncio.run(status())
    assert refused.value.status == NO_ANSWER


def test_both_faces_take_an_answer_that_is_not_http_for_no_answer():
    listener = socket.create_server(("127.0.0.1", 0))

    def garble() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                conn.recv(65536)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    threading.Thread(target=garble, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        got = with_both(url, lambda c: c.status(url), retries=0)
    finally:
        listener.close()
    for e in got:
        assert isinstance(e, ClientError) and e.status == NO_ANSWER and e.url == url, e


def test_both_faces_take_only_a_2xx_for_success_and_find_the_leader_of_the_partition(serve):
    def script(seen: Seen, n: int) -> tuple[int, str, bytes]:
        if seen.path == "/v1/status":
            parts = [{"partition": 0, "role": "follower"}, {"partition": 1, "role": "leader"}]
            return answer(200, {"node": "n1", "partitions": parts})
        return answer(300, {"error": "multiple_choices", "reason": "a proxy's answer"})

    server = serve(script)
    for e in with_both(server.url, lambda c: c.holds(server.url, 0)):
        assert isinstance(e, ClientError) and e.status == 300, e
    assert with_both(server.url, lambda c: c.leader(1)) == [server.url] * 2
    for e in with_both(server.url, lambda c: c.leader(0)):
        assert isinstance(e, ClientError) and (e.status, e.error) == (503, "no_leader"), e
