"""The peer frame stream's wire format: the handshake both ends agree on, and frames cut out of
a byte stream however it arrives."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.node.core.messages import HeartbeatRequest
from raftlog.node.server.node import Node
from raftlog.node.server.peer_frames import FrameReceiver
from raftlog.node.transport.codec import Item, encode_frame
from raftlog.node.transport.frames import (
    MAX_HEAD,
    SWITCHED,
    FrameTooLarge,
    Link,
    Splitter,
    Upgrade,
    foreign_cluster,
    frame,
    handshake,
    parse_status,
    parse_upgrade,
)


def head_of(request: bytes) -> bytes:
    assert request.endswith(b"\r\n\r\n")
    return request[:-4]


def test_the_sender_handshake_is_what_the_receiver_accepts():
    assert parse_upgrade(head_of(handshake("127.0.0.1", 7001, "tok"))) == Upgrade(
        b"Bearer tok", None
    )
    assert parse_upgrade(head_of(handshake("127.0.0.1", 7001, None))) == Upgrade(b"", None)
    assert parse_upgrade(head_of(handshake("h", 7001, "t", "n2"))) == Upgrade(b"Bearer t", b"n2")
    assert parse_upgrade(head_of(handshake("h", 7001, "t", "n2", "ns/c"))) == Upgrade(
        b"Bearer t", b"n2", b"ns/c"
    )


def test_the_handshake_names_its_host_as_http_does():
    assert b"\r\nHost: 127.0.0.1:7001\r\n" in handshake("127.0.0.1", 7001, None)
    assert b"\r\nHost: n1.peers.ns.svc:7001\r\n" in handshake("n1.peers.ns.svc", 7001, None)
    assert b"\r\nHost: [::1]:7001\r\n" in handshake("::1", 7001, None)


def test_a_header_value_is_taken_without_the_spaces_and_tabs_around_it():
    head = b"\r\n".join([*GOOD, b"Authorization:\t Bearer t \t", b"Raftlog-Cluster:\tns/a\t"])
    assert parse_upgrade(head) == Upgrade(b"Bearer t", None, b"ns/a")


def test_a_side_that_names_no_cluster_is_not_judged():
    assert foreign_cluster(None, "ns/b") is None  # this member started before it was set
    assert foreign_cluster("ns/a", None) is None  # the caller did
    assert foreign_cluster("ns/a", "ns/a") is None
    reason = foreign_cluster("ns/a", "ns/b")
    assert reason is not None and "'ns/a'" in reason and "'ns/b'" in reason


GOOD = [
    b"GET /peer/v1/frames HTTP/1.1",
    b"Host: a:1",
    b"Connection: keep-alive, Upgrade",
    b"Upgrade: RaftLog-Frames/1",
]


@pytest.mark.parametrize(
    "lines",
    [
        [b"GET /peer/v1/partitions/0/snapshot HTTP/1.1", *GOOD[1:]],  # another route
        [b"GET /peer/v1/frames HTTP/1.0", *GOOD[1:]],
        [b"POST /peer/v1/frames HTTP/1.1", *GOOD[1:]],
        [GOOD[0], *GOOD[2:]],  # no Host
        [*GOOD, b"Host: b:2"],  # two
        [*GOOD[:3], b"Upgrade: websocket"],
        [*GOOD[:2], GOOD[3]],  # no Connection: Upgrade
        [*GOOD, b"Content-Length: 5"],
        [*GOOD, b"Transfer-Encoding: chunked"],
        [*GOOD, b"no colon here"],
    ],
)
def test_any_other_head_is_left_to_aiohttp(lines):
    assert parse_upgrade(b"\r\n".join(GOOD)) == Upgrade(b"", None)
    assert parse_upgrade(b"\r\n".join(lines)) is None


def test_status_lines():
    assert parse_status(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x") == 101
    assert parse_status(b"HTTP/1.1 404 Not Found") == 404
    assert parse_status(b"HTTP/1.0 401") == 401
    assert parse_status(b"SSH-2.0-OpenSSH") is None


@settings(deadline=None)  # a stall of the shared machine is not a failure of the splitter
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20),
)
def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut(payloads, cuts):
    stream = b"".join(frame(p) for p in payloads)
    splitter = Splitter(max_frame=300)
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        out += splitter.feed(stream[pos : pos + n])
        pos, i = pos + n, i + 1
    assert out == payloads
    assert splitter.buf == bytearray()


def test_a_frame_over_the_limit_is_refused_from_its_length_alone():
    splitter = Splitter(max_frame=10)
    assert splitter.feed(frame(b"x" * 10)) == [b"x" * 10]
    with pytest.raises(FrameTooLarge, match="11 bytes"):
        splitter.feed((11).to_bytes(4, "big"))  # before any of its body arrives


def answered(*pieces: bytes) -> Link:
    """A sending end's link that got the peer's answer in `pieces`, then was paused and
    resumed as its kernel buffer filled and drained."""

    async def run() -> Link:
        link = Link(handshake("h", 1, None), lambda: None)
        for piece in pieces:
            link.data_received(piece)
        return link

    return asyncio.run(run())


def test_a_link_is_writable_once_switched_and_not_while_its_writes_are_paused():
    link = answered(SWITCHED)
    assert link.answered.result() == 101 and link.writable
    link.pause_writing()  # the peer stopped reading: messages queue instead
    assert not link.writable
    link.resume_writing()
    assert link.writable


def test_a_101_to_another_protocol_is_not_a_frame_stream():
    link = answered(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
    with pytest.raises(ConnectionError, match="another protocol"):
        link.answered.result()
    assert not link.writable


def test_an_answer_without_an_end_is_refused_once_longer_than_a_head_may_be():
    # A peer port that streams bytes and never ends its head: the link gives up rather than
    # buffer without bound.
    link = answered(*[b"x" * 1024] * (MAX_HEAD // 1024 + 1))
    with pytest.raises(ConnectionError, match="no end"):
        link.answered.result()


class StubSocket:
    """The accepted connection of a peer at 10.1.2.3."""

    def get_extra_info(self, name: str) -> object:
        return ("10.1.2.3", 4567) if name == "peername" else None

    def is_closing(self) -> bool:
        return False


class StubTransport:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def seen_at(self, name: str, address: str) -> None:
        self.seen.append((name, address))


def test_a_peers_stream_tells_where_the_peer_is_now():
    """The address a peer's frame stream comes from is where it is now (a restarted pod at
    a new address, its name still resolving to the old one): the transport is told, once."""
    transport = StubTransport()
    stepped: list[Item] = []
    node = SimpleNamespace(
        settings=SimpleNamespace(max_request_bytes=1 << 20),
        transport=SimpleNamespace(seen=transport.seen_at),
        step_streamed=lambda items, source: stepped.extend(items),
    )

    async def run() -> None:
        receiver = FrameReceiver(cast(Node, node), set())
        receiver.connection_made(cast(asyncio.Transport, StubSocket()))
        beat = HeartbeatRequest("n2", "n1", 3, 0)
        receiver.data_received(frame(encode_frame([(0, beat)])) * 2)

    asyncio.run(run())
    assert transport.seen == [("n2", "10.1.2.3")]
    assert len(stepped) == 2
