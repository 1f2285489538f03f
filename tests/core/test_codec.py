"""Peer frames (`transport.codec`): every message type survives the round trip, entries keep
their exact fields, and a frame a peer got wrong is refused with a reason, never half-read."""

from __future__ import annotations

import msgspec
import pytest

from raftlog.node.core.errors import InvalidMessage
from raftlog.node.core.messages import (
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    InstallSnapshot,
    Message,
    VoteRequest,
)
from raftlog.node.core.types import Entry, EntryKind, Membership, SnapshotMeta
from raftlog.node.transport.codec import decode_frame, encode_frame, size_hint
from raftlog.node.transport.peers import PeerSender

ENTRIES = (
    Entry(7, 3, EntryKind.NORMAL, b"\x00\xffrecord"),
    Entry(8, 3, EntryKind.NOOP),
    Entry(9, 4, EntryKind.CONFIG, b'{"voters": ["a"]}'),
)


def test_messages_round_trip_exactly() -> None:
    items: list[tuple[int, Message]] = [
        (0, AppendRequest("a", "b", 4, 6, 3, ENTRIES, 8, True)),
        (1, AppendRequest("a", "c", 4, 9, 4, (), 9)),
        (0, AppendResponse("b", "a", 4, True, 9, commit=8)),
        (2, HeartbeatRequest("a", "b", 4, 8, ctx=5)),
        (0, VoteRequest("a", "b", 5, 9, 4)),
        (0, InstallSnapshot("a", "b", 4, SnapshotMeta(9, 4, Membership.of(["a", "b"])))),
    ]
    got = decode_frame(encode_frame(items))
    assert got == items
    entries = got[0][1].entries  # type: ignore[union-attr]
    assert [type(e.kind) for e in entries] == [EntryKind] * 3
    assert [type(e.data) for e in entries] == [bytes] * 3


def test_entries_are_immutable_hashable_values() -> None:
    e = Entry(1, 2, data=b"x")
    assert e == Entry(1, 2, EntryKind.NORMAL, b"x") and hash(e) == hash(Entry(1, 2, data=b"x"))
    assert e.size == 25
    with pytest.raises(AttributeError):
        e.index = 5  # type: ignore[misc]


def _frame_with_entries(entries: list[object]) -> bytes:
    good = msgspec.msgpack.decode(encode_frame([(0, AppendRequest("a", "b", 4, 6, 3, (), 6))]))
    good[0][7] = entries  # the entries field of the AppendRequest
    return msgspec.msgpack.encode(good)


@pytest.mark.parametrize(
    "entries",
    [
        [[7, 3, 9, b"x"]],  # no such kind
        [[True, 3, 0, b"x"]],  # a bool is not an index
        [[7, "3", 0, b"x"]],
        [[7, 3, 0, "text, not bytes"]],
        [[7, 3, 0, b"x", 1]],  # one too many
        [[7, 3]],  # Entry's defaults must not fill in a short entry
        [[7, 3, 0]],
        [[7, 3, 0, b"x"], [8, 3]],
        [[7, 3, 0, "eA=="]],  # a str is not base64 for bytes
        [{"index": 7, "term": 3}],
        [None],
        [7],
        "not a list",
    ],
)
def test_malformed_entries_are_refused_with_a_reason(entries: list[object]) -> None:
    with pytest.raises(InvalidMessage) as e:
        decode_frame(_frame_with_entries(entries))
    assert "AppendRequest" in e.value.reason


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ([0, 5, "b", "a", 4, True, 9, 0, 0], "AppendResponse has 8 fields, got 7"),
        ([0, 5, "b", "a", 4, True, 9, 0, 0, 8, 1], "AppendResponse has 8 fields, got 9"),
        ([0, 9, "a", "b", 4, [9, 4, ["a"]]], "malformed InstallSnapshot"),  # meta of 3
        ([0, 9, "a", "b", 4, 17], "malformed InstallSnapshot"),  # meta not a list
        ([0, 9, "a", "b", 4, [9, "x", ["a"], []]], "malformed InstallSnapshot"),
        ([0, 99, "a"], "unknown message type 99"),
        (["0", 5, "b"], "partition and type must be integers"),
        ([0], "each message is [partition, type, fields...]"),
        # A negative type must not index the types from the end (the last one's shape).
        ([0, -1, "a", "b", 4], "unknown message type -1"),
        ([-1, 255, ""], "a ping is [-1, 255, node name]"),  # a ping names its node
        ([0, 6, ["a"], "b", 4, 0, 0, False], "must be a node name"),  # the sender a list
        ([0, 9, "a", "b", 4, [float("inf"), 1, ["a"], []]], "malformed InstallSnapshot"),
    ],
)
def test_malformed_messages_are_refused_naming_what_is_wrong(
    item: list[object], reason: str
) -> None:
    with pytest.raises(InvalidMessage) as e:
        decode_frame(msgspec.msgpack.encode([item]))
    assert reason in e.value.reason


@pytest.mark.parametrize("frame", [{"0": [0, 5]}, 7, "frame", None])
def test_a_frame_that_is_not_a_list_of_messages_is_refused(frame: object) -> None:
    # Anything else must be an InvalidMessage (the stream is closed), never an error the
    # receiving protocol callback does not expect.
    with pytest.raises(InvalidMessage, match="must be a list of messages"):
        decode_frame(msgspec.msgpack.encode(frame))


def test_each_field_lands_in_its_place() -> None:
    """Fields are read by position: every one distinct, so a shift would show."""
    m = AppendRequest("a", "b", 11, 12, 10, (Entry(13, 11, data=b"z"),), 12, True)
    r = AppendResponse("b", "a", 21, False, 22, 23, 24, 25)
    snap = InstallSnapshot("a", "b", 31, SnapshotMeta(32, 30, Membership.of(["a"], ("c",))))
    assert decode_frame(encode_frame([(3, m), (4, r), (5, snap)])) == [(3, m), (4, r), (5, snap)]


def test_queued_messages_go_out_in_frames_a_peer_takes_in_order() -> None:
    """A sender's queue (messages held while its stream was down) leaves in frames of at most
    its budget, or one message alone, oldest first: a peer refuses a frame over its limit."""
    sender = PeerSender("b", "http://127.0.0.1:1", None, frame_budget=4096)
    big = tuple(Entry(i, 1, EntryKind.NORMAL, b"x" * 1000) for i in range(1, 4))
    messages: list[tuple[int, Message]] = [
        (0, AppendRequest("a", "b", 1, 0, 0, big, 0)),  # 3 x 1,024 + 64 bytes
        (1, HeartbeatRequest("a", "b", 1, 0)),
        (0, AppendRequest("a", "b", 1, 3, 1, (Entry(4, 1, EntryKind.NORMAL, b"y" * 9000),), 0)),
        *[(p, HeartbeatRequest("a", "b", 1, p)) for p in range(70)],
    ]
    sender.queue.extend(messages)
    frames = []
    while sender.queue:
        frames.append(decode_frame(sender._take()))
    assert [item for f in frames for item in f] == messages
    for f in frames:
        assert sum(size_hint(m) for _, m in f) <= 4096 or len(f) == 1
    assert [len(f) for f in frames][:3] == [2, 1, 64]  # the 9,000-byte append alone
