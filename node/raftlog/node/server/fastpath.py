"""The client listener's fast path: single-partition appends answered without aiohttp's machinery.

aiohttp costs about 0.08 ms of CPU per request here (a null aiohttp server under 64 clients),
most of what a leader spends per append under load; a bare asyncio protocol answering the same
request costs about 0.01 ms. So each connection to the client listener starts on
`FastAppendProtocol`. A request it recognises exactly, `POST /v1/partitions/<n>/records` over
HTTP/1.1 with one `Content-Length` and no header that changes how the body is framed or read,
is answered here by the same code as the aiohttp route (`app.append_body`), with the same
statuses, JSON bodies and `raftlog_request_seconds` observations. At the first request it does
not recognise, the connection passes for good, with that request's bytes, to aiohttp's own
protocol, which serves everything else (other routes, chunked bodies, `Expect`, upgrades to the
peer stream, HTTP/1.0, malformed heads and their 400s). Any doubt goes to aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

import msgspec

from raftlog.node.server.api_common import ApiError, partition_driver
from raftlog.node.server.app import append_body
from raftlog.node.server.node import Node

log = logging.getLogger("raftlog.api")

ROUTE = "/v1/partitions/{partition}/records"  # the aiohttp route's name in the metrics
MAX_HEAD = 8192  # a longer head is aiohttp's to judge (it answers 400 or 431)
IDLE_S = 75.0  # an idle connection is closed after this, as aiohttp's keep-alive timeout does
SWEEP_S = 5.0

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
    if m is None:
        return None
    length = None
    close = False
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
        elif name in _HANDED_OVER:
            return None
        elif name == b"connection":
            options = {o.strip(b" \t").lower() for o in value.split(b",")}
            if not options <= {b"close", b"keep-alive"}:
                return None
            close = b"close" in options
    if length is None:
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


def response(status: int, body: bytes, content_type: bytes, close: bool) -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type,
        len(body),
        _date.now(),
    )
    return head + (b"Connection: close\r\n\r\n" if close else b"\r\n") + body


class Connections:
    """The fast path's open connections: closed when idle too long, and at shutdown."""

    def __init__(self) -> None:
        self.open: set[FastAppendProtocol] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            cutoff = loop.time() - IDLE_S
            for conn in [c for c in self.open if c.idle_since is not None]:
                if conn.idle_since is not None and conn.idle_since < cutoff:
                    conn.close()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.open):
            conn.close()


class FastAppendProtocol(asyncio.Protocol):
    """One client connection: fast appends in order, until the first request that is not one
    (see the module's docstring). Requests are answered one at a time, in order."""

    def __init__(
        self, node: Node, fallback: Callable[[], asyncio.Protocol], conns: Connections
    ) -> None:
        self.node = node
        self.fallback = fallback  # aiohttp's protocol factory (`web.Server`)
        self.conns = conns
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a request is being answered
        self.write_paused = False
        self.read_paused = False
        self.close_when_done = False
        self.idle_since: float | None = None  # loop time since nothing is in flight
        self.max_body = node.settings.max_request_bytes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's do not subclass asyncio.Transport, hence no isinstance).
        self.transport = t = cast(asyncio.Transport, transport)
        sock = t.get_extra_info("socket")
        if sock is not None:  # answers are small: never held back waiting for an ACK
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns.open.add(self)
        self.idle_since = asyncio.get_running_loop().time()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conns.open.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()
        elif len(self.buf) > self.max_body + MAX_HEAD and self.transport is not None:
            self.transport.pause_reading()  # a client sending ahead: wait for the answers
            self.read_paused = True

    def eof_received(self) -> bool:
        if self.busy:
            self.close_when_done = True  # half-closed after its request: answer, then close
            return True
        return False

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy:
            self._next()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _next(self) -> None:
        """Start answering the next complete request in the buffer, if any."""
        transport = self.transport
        if transport is None or self.write_paused or not self.buf:
            return
        if self.read_paused:
            transport.resume_reading()
            self.read_paused = False
        end = self.buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                self._hand_over()
            return
        parsed = parse_head(bytes(self.buf[:end]))
        if parsed is None or parsed[1] > self.max_body:
            self._hand_over()
            return
        partition, length, close = parsed
        start = end + 4
        if len(self.buf) < start + length:
            return  # the rest of the body is on its way
        body = bytes(self.buf[start : start + length])
        del self.buf[: start + length]
        self.busy = True
        self.idle_since = None
        asyncio.get_running_loop().create_task(self._answer(partition, body, close))

    async def _answer(self, partition: int, body: bytes, close: bool) -> None:
        started = time.perf_counter()
        content_type = b"application/json"
        try:
            answer = await append_body(self.node, partition_driver(self.node, partition), body)
            status = 200
        except ApiError as e:
            status, answer = e.status, msgspec.json.encode(e.body)
            content_type = b"application/json; charset=utf-8"
        except Exception:  # a bug: logged with its trace, answered without internals
            log.exception("POST /v1/partitions/%d/records failed", partition)
            status = 500
            answer = b'{"error": "internal", "reason": "see the node\'s log"}'
            content_type = b"application/json; charset=utf-8"
        self.node.metrics.request_latency(ROUTE, "POST", status).observe(
            time.perf_counter() - started
        )
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        close = close or self.close_when_done
        transport.write(response(status, answer, content_type, close))
        self.busy = False
        if close:
            transport.close()
            return
        self.idle_since = asyncio.get_running_loop().time()
        self._next()

    def _hand_over(self) -> None:
        """Give the connection, from the request at the head of the buffer on, to aiohttp."""
        transport = self.transport
        assert transport is not None and not self.busy
        self.conns.open.discard(self)
        self.transport = None
        proto = self.fallback()
        transport.set_protocol(proto)
        proto.connection_made(transport)
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            proto.data_received(data)
