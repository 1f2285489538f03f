"""The peer frame stream's wire format: an HTTP/1.1 Upgrade, then length-prefixed frames.

A node streams Raft messages to a peer over one connection, on the peer's own port, behind the
same token and TLS as every peer call:

    GET /peer/v1/frames HTTP/1.1
    Host: <host:port>
    Authorization: Bearer <token>        (when the cluster has a token)
    Raftlog-Node: <the node meant>       (the peer's name)
    Raftlog-Cluster: <its cluster>       (when the cluster is named)
    Connection: Upgrade
    Upgrade: raftlog-frames/1

The peer answers `101 Switching Protocols` (or 401 without the token, 421 when it is another
node than the one meant: a stale address now another pod's, or a member of another cluster;
and closes), then reads frames: a 4-byte
big-endian length, then that many bytes of `codec` MessagePack. Nothing is sent back. Unlike a
WebSocket there is no masking and no per-message header to build, and both ends handle a frame
in the protocol callback that carries its bytes: no task wakes on either side to move it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Callable
from typing import NamedTuple, cast

PATH = "/peer/v1/frames"
CLUSTER_HEADER = "Raftlog-Cluster"  # the sender's cluster, on every peer call (`settings.cluster`)
UPGRADE = b"raftlog-frames/1"
MAX_HEAD = 8192
LENGTH_BYTES = 4
SWITCHED = (
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + UPGRADE + b"\r\n\r\n"
)
_REQUEST_LINE = b"GET " + PATH.encode() + b" HTTP/1.1"
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: .*)?")


def handshake(
    host: str, port: int, token: str | None, node: str | None = None, cluster: str | None = None
) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    meant = f"Raftlog-Node: {node}\r\n" if node else ""
    if cluster:
        meant += f"{CLUSTER_HEADER}: {cluster}\r\n"
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    return (
        f"GET {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}{meant}"
        "Connection: Upgrade\r\nUpgrade: raftlog-frames/1\r\n\r\n"
    ).encode()


class Upgrade(NamedTuple):
    """A frame stream's handshake: its `Authorization` value (b"" when absent), the node it
    is meant for and the sender's cluster (None when the sender did not say)."""

    auth: bytes
    node: bytes | None
    cluster: bytes | None = None


def parse_upgrade(head: bytes) -> Upgrade | None:
    """A frame stream's handshake head; None for any other head, which is aiohttp's to answer
    (another route, or this path's 404)."""
    lines = head.split(b"\r\n")
    if lines[0] != _REQUEST_LINE:
        return None
    fields: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        name = name.lower()
        if not sep or name in fields:
            return None  # a malformed line, or a header given twice: aiohttp judges it
        fields[name] = value.strip(b" \t")
    connection = {o.strip(b" \t").lower() for o in fields.get(b"connection", b"").split(b",")}
    if (
        b"upgrade" not in connection
        or fields.get(b"upgrade", b"").lower() != UPGRADE
        or b"host" not in fields
        or fields.get(b"content-length", b"0") != b"0"
        or b"transfer-encoding" in fields
    ):
        return None
    return Upgrade(
        fields.get(b"authorization", b""),
        fields.get(b"raftlog-node"),
        fields.get(CLUSTER_HEADER.lower().encode()),
    )


def foreign_cluster(mine: str | None, theirs: str | None) -> str | None:
    """Why a peer call from cluster `theirs` is refused by a member of `mine` (421), or None.
    A side that names no cluster is not judged: members started before it was set."""
    if mine is None or theirs is None or theirs == mine:
        return None
    return f"this node is of cluster {mine!r}, the caller of cluster {theirs!r}"


def parse_status(head: bytes) -> int | None:
    """The status code of an HTTP response head; None when it is not one."""
    m = _STATUS_LINE.fullmatch(head.split(b"\r\n", 1)[0])
    return int(m.group(1)) if m else None


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(LENGTH_BYTES, "big") + payload


DEAD_PEER_S = 5  # unacknowledged data, or keep-alive probes unanswered, this long: closed


def small_writes_and_keepalive(transport: asyncio.BaseTransport) -> None:
    """Small messages are never held back waiting for an ACK (TCP_NODELAY), and keep-alive
    probes find a far end that vanished, as aiohttp has them on its connections."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def find_dead_peer_soon(transport: asyncio.BaseTransport) -> None:
    """A peer link's far end that vanished is found within about DEAD_PEER_S: data it never
    acknowledges (TCP_USER_TIMEOUT) or keep-alive probes it never answers close the link, and
    the sender reconnects. A restarted pod comes back at another address and the old link's
    packets go nowhere, with no reset: without this the sender wrote into it for as long as the
    kernel retransmits, and the restarted member knew no leader, not ready, for that long
    (measured on Kubernetes: 29 s from its start)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_S * 1000)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, DEAD_PEER_S - 2)


class FrameTooLarge(Exception):
    pass


class Splitter:
    """Cuts a byte stream into frames as its pieces arrive."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames completed by `data`, in order; raises FrameTooLarge for a length above
        `max_frame` (the stream cannot be resynchronised after that)."""
        buf = self.buf
        buf += data
        out: list[bytes] = []
        start = 0
        while len(buf) - start >= LENGTH_BYTES:
            n = int.from_bytes(buf[start : start + LENGTH_BYTES], "big")
            if n > self.max_frame:
                raise FrameTooLarge(f"a frame of {n} bytes (the limit is {self.max_frame})")
            end = start + LENGTH_BYTES + n
            if len(buf) < end:
                break
            out.append(bytes(buf[start + LENGTH_BYTES : end]))
            start = end
        if start:
            del buf[:start]
        return out


class Link(asyncio.Protocol):
    """The sending end of a frame stream: writes go straight to the socket from the caller (no
    task between the driver and the socket). `on_change` is called when the link is switched,
    lost, or its writes are paused or resumed (the kernel's buffer for this peer is full)."""

    def __init__(self, handshake: bytes, on_change: Callable[[], None]) -> None:
        self.handshake = handshake
        self.on_change = on_change
        self.transport: asyncio.Transport | None = None
        self.answered: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        # Retrieved here: an answer that came after its waiter gave up is not an error to log.
        self.answered.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.head = bytearray()
        self.switched = False
        self.paused = False
        self.lost = False

    @property
    def writable(self) -> bool:
        return self.switched and not self.paused and not self.lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)
        small_writes_and_keepalive(t)
        find_dead_peer_soon(t)
        t.write(self.handshake)

    def data_received(self, data: bytes) -> None:
        if self.answered.done():
            return  # the peer sends nothing after its answer
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD:
                self.answered.set_exception(ConnectionError("the peer's answer has no end"))
            return
        head = bytes(self.head[:end])
        status = parse_status(head)
        if status is None:
            self.answered.set_exception(ConnectionError("the peer did not answer in HTTP"))
            return
        if status == 101 and b"\r\nupgrade: " + UPGRADE not in head.lower():
            self.answered.set_exception(ConnectionError("101 to another protocol than frames"))
            return
        self.switched = status == 101
        self.answered.set_result(status)
        self.on_change()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.answered.done():
            self.answered.set_exception(exc or ConnectionResetError("closed before answering"))
        self.on_change()

    def pause_writing(self) -> None:
        self.paused = True
        self.on_change()

    def resume_writing(self) -> None:
        self.paused = False
        self.on_change()

    def write(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(frame(payload))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
