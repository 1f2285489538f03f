"""The protocol every connection to a node's listeners starts on (`ListenerProtocol`): it takes
the two kinds of traffic that must not pay for aiohttp, single-partition appends (the fast path)
and peers' frame stream handshakes, and hands every other request to aiohttp.

aiohttp costs about 0.08 ms of CPU per request here (a null aiohttp server under 64 clients),
most of what a leader spends per append under load; a bare asyncio protocol answering the same
request costs about 0.01 ms. A request it recognises exactly, `POST /v1/partitions/<n>/records` over
HTTP/1.1 with one `Content-Length` and no header that changes how the body is framed or read,
is answered here by the same code as the aiohttp route (`app.append_body`), with the same
statuses, JSON bodies and `raftlog_request_seconds` observations. At the first request it does
not recognise, the connection passes for good, with that request's bytes, to aiohttp's own
protocol, which serves everything else (other routes, chunked bodies, `Expect`, other upgrades,
HTTP/1.0, malformed heads and their 400s). Any doubt goes to aiohttp.

On a listener that serves the peer plane, the same protocol accepts a peer's frame stream
handshake (`transport.frames`): with the cluster's token it answers 101 and the connection passes
to `peer_frames.FrameReceiver`; without it, 401 and the connection closes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

from raftlog.node.server.api_common import ApiError, partition_driver
from raftlog.node.server.app import append_body
from raftlog.node.server.connlimit import ConnectionLimit
from raftlog.node.server.http_errors import JsonErrors
from raftlog.node.server.node import Node
from raftlog.node.server.peer_frames import FrameReceiver
from raftlog.node.transport import frames

log = logging.getLogger("raftlog.api")

ROUTE = "/v1/partitions/{partition}/records"  # the aiohttp route's name in the metrics
MAX_HEAD = 8192  # a longer head is aiohttp's to judge (it answers 400 or 431)
MAX_HEADERS = 128  # aiohttp's limit: more is its 400
IDLE_S = 75.0  # a connection that sent nothing for this long and waits for no answer is closed
SWEEP_S = 1.0  # how late a head or body timeout may fire, at most (a sweep of the open ones)
_BARE_LF = re.compile(rb"(?<!\r)\n")  # a line not ended by CRLF: aiohttp's 400, at once

_REQUEST_LINE = re.compile(rb"POST /v1/partitions/(0|[1-9][0-9]{0,8})/records HTTP/1\.1")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110 token)
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # control characters; tab is allowed
# Headers that change how the body is framed, decoded or answered: aiohttp's.
_HANDED_OVER = frozenset(
    {b"transfer-encoding", b"expect", b"upgrade", b"content-encoding", b"trailer"}
)


def parse_head(head: bytes) -> tuple[int, int, bool] | None:
    """(partition, body length, close after the answer) of a request head this path serves;
    None for any other head, well-formed or not."""
    lines = head.split(b"\r\n")
    m = _REQUEST_LINE.fullmatch(lines[0])
    if m is None or len(lines) - 1 > MAX_HEADERS:
        return None
    length = None
    close = False
    hosts = 0
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            return None  # also obsolete line folding: a name starting with a space
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            return None
        name = name.lower()
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 12:
                return None  # a second length (smuggling), a sign, spaces, absurd sizes
            length = int(value)
        elif name == b"host":
            hosts += 1
        elif name in _HANDED_OVER:
            return None
        elif name == b"connection":
            options = {o.strip(b" \t").lower() for o in value.split(b",")}
            if not options <= {b"close", b"keep-alive"}:
                return None
            close = b"close" in options
    if length is None or hosts != 1:  # HTTP/1.1 requires exactly one Host (RFC 9112 3.2)
        return None
    return int(m.group(1)), length, close


class _Date:
    """The `Date` header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._text = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second, self._text = second, formatdate(second, usegmt=True).encode()
        return self._text


_date = _Date()
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_INTERNAL = b'{"error": "internal", "reason": "see the node\'s log"}'
_STOPPING = json.dumps(
    {"error": "stopping", "reason": "the node stopped; the outcome is unknown, retry"}
).encode()


def response(
    status: int, body: bytes, content_type: bytes, close: bool, headers: bytes = b""
) -> bytes:
    """An answer; `headers` are more header lines, each ending in CRLF."""
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type,
        len(body),
        _date.now(),
        headers,
    )
    return head + (b"Connection: close\r\n\r\n" if close else b"\r\n") + body


class Connections:
    """The fast path's open connections and the answers under way: a connection silent for
    IDLE_S while it waits for no answer is closed; at shutdown, each is closed once its answer
    under way is written (`drain`)."""

    def __init__(
        self,
        head_timeout_s: float = 10.0,
        body_timeout_s: float = 30.0,
        frame_timeout_s: float = 10.0,
    ) -> None:
        # A request's head must be complete this long after its first byte, and its body this
        # long after its head, however the bytes trickle in (a byte every few seconds kept a
        # connection, and a buffered body, forever): answered 408 and closed.
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        # A peer's frame stream holding part of a frame must complete one this long after
        # (`FrameReceiver.overdue`), or it is closed.
        self.frame_timeout_s = frame_timeout_s
        self.open: set[ListenerProtocol] = set()
        self.answers: set[asyncio.Task[None]] = set()
        self.streams: set[FrameReceiver] = set()  # peers' frame streams
        self.draining = False
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        every = min(
            SWEEP_S, self.head_timeout_s / 10, self.body_timeout_s / 10, self.frame_timeout_s / 10
        )
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            for conn in [c for c in self.open if not c.busy]:
                if conn.overdue(now):
                    conn.time_out()
                elif conn.last_data < now - IDLE_S:
                    conn.close()
            for stream in [s for s in self.streams if s.overdue(now, self.frame_timeout_s)]:
                stream.time_out(self.frame_timeout_s)

    async def drain(self, timeout: float) -> None:
        """Stop taking requests; close each connection once its answer under way is written,
        waiting up to `timeout` for them (an append in flight may still commit: its client is
        told), then close the rest."""
        self.draining = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.open):
            if not conn.busy:
                conn.close()
        if self.answers:
            await asyncio.wait(list(self.answers), timeout=timeout)
        for conn in list(self.open):
            conn.close()

    def close_streams(self) -> None:
        """Close the peers' frame streams (last: appends under way need them to commit)."""
        for stream in list(self.streams):
            stream.close()


class ListenerProtocol(asyncio.Protocol):
    """One connection: fast appends in order (`appends`), or a peer's frame stream (`frames`),
    until the first request that is neither (see the module's docstring). Requests are answered
    one at a time, in order."""

    def __init__(
        self,
        node: Node,
        fallback: Callable[[], asyncio.Protocol],
        conns: Connections,
        admission: ConnectionLimit,
        appends: bool = True,
        frames: bool = False,
    ) -> None:
        self.node = node
        self.fallback = fallback  # aiohttp's protocol factory (`web.Server`)
        self.conns = conns
        self.admission = admission
        self.appends = appends
        self.frames = frames
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a request is being answered
        self.write_paused = False
        self.read_paused = False
        self.ended = False  # the client shut its side: answer what it sent, then close
        self.last_data = 0.0  # loop time of the last bytes received (or of the connection)
        self.max_body = node.settings.max_request_bytes
        self.limit = self.max_body + MAX_HEAD  # bytes buffered before reading pauses
        self.head: tuple[int, int, int, bool] | None = None  # (body start, p, length, close)
        self.scanned = 0  # where the search for the end of the head resumes
        self.since = 0.0  # loop time the request being read began (its head, then its body)
        self.taken = 0  # bytes of `node.bodies` the request being read or answered holds

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's do not subclass asyncio.Transport, hence no isinstance).
        t = cast(asyncio.Transport, transport)
        if self.conns.draining:
            t.close()
            return
        if not self.admission.admit(t):
            return  # answered 503 and closed: the listener is full
        self.transport = t
        frames.small_writes_and_keepalive(t)  # answers are small; clients may vanish
        self.conns.open.add(self)
        self.last_data = asyncio.get_running_loop().time()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conns.open.discard(self)
        if not self.busy:  # else its answer, still to come, lets the body go (`_respond`)
            self._release()
        if self.transport is not None:
            self.admission.release(self.transport)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.last_data = asyncio.get_running_loop().time()
        if not self.busy:
            self._next()
        self._flow()

    def eof_received(self) -> bool:
        # Half-closed after its requests (`printf ... | nc`): each one complete is answered, in
        # order, then the connection closes; an unfinished one can never be, so none waits.
        self.ended = True
        return self.busy or self.write_paused

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy:
            self._go_on()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _flow(self) -> None:
        """Read no more while this much waits in the buffer (a client sending ahead of its
        answers, or not reading them): the kernel's buffers then push back on it."""
        transport = self.transport
        if transport is None:
            return
        if len(self.buf) > self.limit:
            if not self.read_paused:
                transport.pause_reading()
                self.read_paused = True
        elif self.read_paused:
            transport.resume_reading()
            self.read_paused = False

    def overdue(self, now: float) -> bool:
        """A request read for longer than its head or body may take."""
        if self.head is not None:
            return now - self.since > self.conns.body_timeout_s
        return bool(self.buf) and self.since > 0 and now - self.since > self.conns.head_timeout_s

    def time_out(self) -> None:
        transport = self.transport
        if transport is None:
            return
        body = b'{"error": "timeout", "reason": "the request was not sent in time"}'
        transport.write(
            b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        transport.close()

    def _next(self) -> None:
        """Start answering the next complete request in the buffer, if any."""
        if self.transport is None or self.write_paused or self.conns.draining or not self.buf:
            return
        if self.since == 0.0:
            self.since = asyncio.get_running_loop().time()
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n", self.scanned, MAX_HEAD + 4)
            if end < 0:
                if len(self.buf) > MAX_HEAD or _BARE_LF.search(self.buf, self.scanned):
                    self._hand_over()
                else:
                    self.scanned = max(0, len(self.buf) - 3)
                return
            head = bytes(self.buf[:end])
            parsed = parse_head(head) if self.appends else None
            if parsed is None and self.frames:
                upgrade = frames.parse_upgrade(head)
                if upgrade is not None:
                    self._upgrade(upgrade, end + 4)
                    return
            if parsed is None or parsed[1] > self.max_body:
                self._hand_over()
                return
            if not self.node.bodies.take(parsed[1]):
                busy = json.dumps(self.node.bodies.busy(parsed[1])).encode()
                kind = b"application/json; charset=utf-8"
                self._respond(503, busy, kind, True, 0.0, headers=b"Retry-After: 1\r\n")
                return
            self.taken = parsed[1]
            self.head = (end + 4, *parsed)
            self.since = asyncio.get_running_loop().time()  # the body's time starts
        start, partition, length, close = self.head
        if len(self.buf) < start + length:
            return  # the rest of the body is on its way
        body = bytes(self.buf[start : start + length])
        del self.buf[: start + length]
        self.head, self.scanned, self.since = None, 0, 0.0
        self.busy = True
        task = asyncio.get_running_loop().create_task(self._answer(partition, body, close))
        self.conns.answers.add(task)
        task.add_done_callback(self.conns.answers.discard)

    async def _answer(self, partition: int, body: bytes, close: bool) -> None:
        started = time.perf_counter()
        status, answer = 500, _INTERNAL
        content_type = b"application/json; charset=utf-8"
        try:
            answer = await append_body(self.node, partition_driver(self.node, partition), body)
            status, content_type = 200, b"application/json"
        except asyncio.CancelledError:  # the node is stopping past `Connections.drain`'s wait
            status, answer = 503, _STOPPING
            raise
        except ApiError as e:
            # As aiohttp's json_response encodes it (ASCII: a lone surrogate named in a field
            # is escaped, not an encoding error).
            status, answer = e.status, json.dumps(e.body).encode()
        except Exception:  # a bug: logged with its trace, answered without internals
            log.exception("POST /v1/partitions/%d/records failed", partition)
        finally:
            self._respond(status, answer, content_type, close, time.perf_counter() - started)

    def _respond(
        self,
        status: int,
        answer: bytes,
        content_type: bytes,
        close: bool,
        took: float,
        route: tuple[str, str] = (ROUTE, "POST"),
        headers: bytes = b"",
    ) -> None:
        self.node.metrics.request_latency(*route, status).observe(took)
        transport = self.transport
        self.busy = False
        self._release()
        if transport is None or transport.is_closing():
            return
        close = close or self.conns.draining or (self.ended and not self.buf)
        transport.write(response(status, answer, content_type, close, headers))
        if close:
            transport.close()
            return
        self._go_on()

    def _go_on(self) -> None:
        """Take the next request, if complete; once the client has shut its side, close when
        none is left to answer (what remains of the buffer can never be completed)."""
        self._next()
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # closed, or handed over (to aiohttp, which answers what it was given)
        if self.ended and not self.busy and not self.write_paused:
            transport.close()
            return
        self._flow()

    def _release(self) -> None:
        if self.taken:
            self.node.bodies.release(self.taken)
            self.taken = 0

    def _upgrade(self, upgrade: frames.Upgrade, start: int) -> None:
        """Accept a peer's frame stream whose handshake head ends at `start`: the connection
        passes to a `FrameReceiver` with the bytes after the head (401 without the token; 421
        when it is meant for another node, which an address now this pod's once was, or comes
        from another cluster's)."""
        transport = self.transport
        assert transport is not None and not self.busy
        started = time.perf_counter()
        token = self.node.token
        kind = b"application/json; charset=utf-8"
        if token and not hmac.compare_digest(upgrade.auth, f"Bearer {token}".encode()):
            body = b'{"error": "unauthorized", "reason": "a valid bearer token is required"}'
            took = time.perf_counter() - started
            self._respond(401, body, kind, True, took, (frames.PATH, "GET"))
            return
        me = self.node.id.encode()
        theirs = None if upgrade.cluster is None else upgrade.cluster.decode(errors="replace")
        peer = transport.get_extra_info("peername")
        foreign = self.node.foreign_caller(theirs, "a peer frame stream", peer)
        if foreign is not None or (upgrade.node is not None and upgrade.node != me):
            named = "?" if upgrade.node is None else upgrade.node.decode(errors="replace")
            reason = foreign or f"this is node {self.node.id}, not {named}"
            body = json.dumps({"error": "misdirected", "reason": reason}).encode()
            took = time.perf_counter() - started
            self._respond(421, body, kind, True, took, (frames.PATH, "GET"))
            return
        self.node.metrics.request_latency(frames.PATH, "GET", 101).observe(
            time.perf_counter() - started
        )
        self.conns.open.discard(self)
        self.transport = None
        transport.write(frames.SWITCHED)
        if self.read_paused:
            transport.resume_reading()
        proto = FrameReceiver(self.node, self.conns.streams)
        transport.set_protocol(proto)
        proto.connection_made(transport)
        data, self.buf = bytes(self.buf[start:]), bytearray()
        if data:
            proto.data_received(data)

    def _hand_over(self) -> None:
        """Give the connection, from the request at the head of the buffer on, to aiohttp."""
        transport = self.transport
        assert transport is not None and not self.busy
        self.conns.open.discard(self)
        self.transport = None
        if self.read_paused:
            transport.resume_reading()  # aiohttp's own flow control takes over
        proto = self.fallback()
        if transport.get_extra_info("sslcontext") is None:
            proto = _AnswersAfterHalfClose(proto)
        transport.set_protocol(proto)
        proto.connection_made(transport)
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            proto.data_received(data)
        if self.ended and not proto.eof_received():  # the end, read here, is aiohttp's too
            transport.close()


class _AnswersAfterHalfClose(asyncio.Protocol):
    """aiohttp's protocol, except that a client's half-close (its request sent, then its side
    shut) leaves the connection open for the answer: aiohttp closes it at once, so an HTTP/1.0
    append sent by `printf ... | nc` committed and was never answered. The connection closes
    once the requests sent are answered (`JsonErrors.client_done`). (TLS cannot keep a
    half-closed connection: asyncio ignores the request there.)"""

    def __init__(self, inner: asyncio.Protocol) -> None:
        self.inner = inner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool:
        if isinstance(self.inner, JsonErrors):
            return self.inner.client_done()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
