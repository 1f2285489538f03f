"""The peer frame stream (the one way Raft messages travel between peers) against real nodes: its
handshake wants the cluster's token, a message for a partition the node lacks is dropped and
logged, a bad frame closes the stream and changes nothing, and large records still get through."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from tests.e2e.node_metrics import requests_counted
from tests.e2e.raw_frame_stream import open_frame_stream

from raftlog.client import Client
from raftlog.harness.local import LocalCluster
from raftlog.node.core.messages import HeartbeatRequest
from raftlog.node.transport.codec import encode_frame
from raftlog.node.transport.frames import frame, handshake

pytestmark = [pytest.mark.e2e]

TOKEN = "frames-token"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("frames")
    (d / "token").write_text(TOKEN + "\n")
    with LocalCluster(d, replicas=1, partitions=1, auth_token_file=d / "token", durable=False) as c:
        c.wait_ready()
        yield c


def closed_by_peer(s: socket.socket) -> bool:
    """True once the node closed the stream (EOF or reset) within 5 s."""
    s.settimeout(5)
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True


def counted(c: LocalCluster, name: str, status: int) -> float:
    return requests_counted(c, name, "GET", "/peer/v1/frames", status)


def last_index(c: LocalCluster) -> int:
    return int(c.status("n1")["partitions"][0]["last_index"])


def test_the_handshake_wants_the_token(node):
    port = node.nodes["n1"].port
    refused = counted(node, "n1", 401)
    for token in (None, "wrong"):
        s, status, head = open_frame_stream("127.0.0.1", port, token)
        with s:
            assert status == 401, head
            assert closed_by_peer(s)
    assert counted(node, "n1", 401) == refused + 2
    accepted = counted(node, "n1", 101)
    s, status, head = open_frame_stream("127.0.0.1", port, TOKEN)
    with s:
        assert status == 101
        assert b"upgrade: raftlog-frames/1" in head.lower()
    assert counted(node, "n1", 101) == accepted + 1


def test_a_stream_meant_for_another_node_is_refused_naming_both(node):
    """An old address of a restarted peer may be another member's pod now: the sender says
    which node it means, and this one refuses (421) rather than take messages for another."""
    port = node.nodes["n1"].port
    refused = counted(node, "n1", 421)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(handshake("127.0.0.1", port, TOKEN, "n7"))
        answer = b""
        while piece := s.recv(4096):  # the answer, then the node closes
            answer += piece
    assert answer.startswith(b"HTTP/1.1 421 "), answer
    assert b"this is node n1, not n7" in answer, answer
    assert counted(node, "n1", 421) == refused + 1
    s, status, head = open_frame_stream("127.0.0.1", port, TOKEN, "n1")
    with s:
        assert status == 101, head


@pytest.mark.parametrize(
    "bad",
    [
        frame(b"\xc1 not msgpack"),
        frame(b"\x91\x05"),  # MessagePack, but [5] is not a message
        frame(b"\x91" * 100_000 + b"\xc0"),  # nested too deep for any message
        frame(b"\x92\x00" + b"\x91" * 5000 + b"\xc0"),
        (1 << 30).to_bytes(4, "big"),  # a length past max_request_bytes: refused before its body
    ],
    ids=["not-msgpack", "not-a-message", "nested", "nested-in-an-item", "too-large"],
)
def test_a_bad_frame_closes_the_stream_and_changes_nothing(node, bad):
    before = last_index(node)
    s, status, _ = open_frame_stream("127.0.0.1", node.nodes["n1"].port, TOKEN)
    with s:
        assert status == 101
        # Good frames first, in one write with the bad one: an empty frame, and a message for a
        # partition the node does not have (dropped and logged, the stream stays up).
        unknown = encode_frame([(7, HeartbeatRequest("nx", "n1", 0, 0))])
        s.sendall(frame(encode_frame([])) + frame(unknown))
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(1)  # still open: nothing to read, no EOF
        s.sendall(bad)
        assert closed_by_peer(s)
    assert last_index(node) == before
    assert node.status("n1")["partitions"][0]["role"] == "leader"
    text = Path(node.nodes["n1"].log_path).read_text()
    assert "a message for unknown partition 7 dropped" in text
    assert "bad frame" in text


def test_a_restarted_follower_catches_up_on_large_records(tmp_path):
    """20 records of 900 KB written while a follower is down: the messages queued for it leave in
    frames of at most half its `max_request_bytes`, and the leader's appends carry at most
    `max_append_bytes` (1 MiB) of entries, so it takes every frame and catches up. (One queued
    frame of everything, and appends of up to 64 entries, once made 18 MB to 860 MB frames it
    refused, forever.) `test_codec` and `test_raft_core` check each bound alone."""
    with LocalCluster(tmp_path, replicas=3, partitions=1, durable=False) as c:
        c.wait_ready()
        leader = c.leader(0)
        assert leader is not None
        behind = next(n for n in c.nodes if n != leader)
        c.kill(behind)
        # Through the client, which follows a leader that moves (an election under load).
        with Client([node.url for name, node in c.nodes.items() if name != behind]) as client:
            for _ in range(20):
                last = client.append(0, [{"value": "x" * 900_000}]).last_index
        c.start(behind)
        deadline = time.monotonic() + 30
        while True:
            try:
                if c.status(behind)["partitions"][0]["last_index"] >= last:
                    break
            except (OSError, RuntimeError):
                pass  # still starting
            assert time.monotonic() < deadline, "the follower never caught up"
            time.sleep(0.2)
        for name in c.nodes:
            assert "bad frame" not in Path(c.nodes[name].log_path).read_text(), name
