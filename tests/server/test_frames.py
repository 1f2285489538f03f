"""The peer frame stream's wire format: the handshake both ends agree on, and frames cut out of
a byte stream however it arrives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.node.transport.frames import (
    FrameTooLarge,
    Splitter,
    frame,
    handshake,
    parse_status,
    parse_upgrade,
)


def head_of(request: bytes) -> bytes:
    assert request.endswith(b"\r\n\r\n")
    return request[:-4]


def test_the_sender_handshake_is_what_the_receiver_accepts():
    assert parse_upgrade(head_of(handshake("127.0.0.1", 7001, "tok"))) == (b"Bearer tok", None)
    assert parse_upgrade(head_of(handshake("127.0.0.1", 7001, None))) == (b"", None)
    assert parse_upgrade(head_of(handshake("h", 7001, "t", "n2"))) == (b"Bearer t", b"n2")


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
    assert parse_upgrade(b"\r\n".join(GOOD)) == (b"", None)
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
