"""Validation of peer messages before they reach the state machine.

A malformed or oversized message is rejected with the field and the reason; it never crashes the
partition and never changes its log.
"""

from __future__ import annotations

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import InvalidMessage
from raftlog.node.core.messages import (
    MESSAGE_TYPES,
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    PreVoteRequest,
    VoteRequest,
)
from raftlog.node.core.types import Entry, EntryKind, Membership

# The largest term or index a message may carry, as the peer HTTP calls take (`int_param`): no
# cluster gets near it, and a term taken past it could never be raised again (a campaign's
# term + 1 no longer fits the codec's 64 bits), so one frame would end the partition for good.
MAX_NUMBER = 2**62


def _non_negative_int(value: object, field: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidMessage(field, f"must be an integer, got {type(value).__name__}")
    if value < 0:
        raise InvalidMessage(field, f"must not be negative, got {value}")
    if value > MAX_NUMBER:
        raise InvalidMessage(field, f"must be at most {MAX_NUMBER}, got {value}")


def validate_message(m: object, node_id: str, config: RaftConfig) -> Message:
    """Returns the message when it is well formed; raises InvalidMessage otherwise."""
    if not isinstance(m, MESSAGE_TYPES):
        raise InvalidMessage("type", f"unknown message type {type(m).__name__}")
    msg: Message = m  # type: ignore[assignment]
    if not isinstance(msg.src, str) or not msg.src:
        raise InvalidMessage("src", "must be a non-empty node id")
    if msg.dst != node_id:
        raise InvalidMessage("dst", f"addressed to {msg.dst!r}, this node is {node_id!r}")
    if msg.src == node_id:
        raise InvalidMessage("src", "a node does not send messages to itself")
    # The hot messages take one test of plain ints first; only a failure (or an int subclass)
    # takes the checks that name the field. Field by field, validation was a sixth of the
    # core's time per message at 16 partitions (bench/partitions.py, bench/RESULTS.md).
    if type(msg) is AppendResponse:
        if not (
            type(msg.term) is int
            and type(msg.index) is int
            and type(msg.hint_index) is int
            and type(msg.hint_term) is int
            and type(msg.commit) is int
            and min(msg.term, msg.index, msg.hint_index, msg.hint_term, msg.commit) >= 0
            and max(msg.term, msg.index, msg.hint_index, msg.hint_term, msg.commit) <= MAX_NUMBER
        ):
            _non_negative_int(msg.term, "term")
            _non_negative_int(msg.index, "index")
            _non_negative_int(msg.hint_index, "hint_index")
            _non_negative_int(msg.hint_term, "hint_term")
            _non_negative_int(msg.commit, "commit")
        return msg
    _non_negative_int(msg.term, "term")
    if isinstance(msg, PreVoteRequest | VoteRequest):
        _non_negative_int(msg.last_index, "last_index")
        _non_negative_int(msg.last_term, "last_term")
        if msg.last_term > msg.term:
            raise InvalidMessage("last_term", f"{msg.last_term} is above the term {msg.term}")
    elif isinstance(msg, AppendRequest):
        _validate_append(msg, config)
    elif isinstance(msg, HeartbeatRequest | HeartbeatResponse):
        _non_negative_int(msg.ctx, "ctx")
        if isinstance(msg, HeartbeatRequest):
            _non_negative_int(msg.commit, "commit")
            if not isinstance(msg.quiesce, bool):
                raise InvalidMessage("quiesce", "must be true or false")
    elif isinstance(msg, AppendResponse):  # a subclass (the plain type returned above)
        _non_negative_int(msg.index, "index")
        _non_negative_int(msg.hint_index, "hint_index")
        _non_negative_int(msg.hint_term, "hint_term")
        _non_negative_int(msg.commit, "commit")
    elif isinstance(msg, InstallSnapshot):
        meta = msg.meta
        _non_negative_int(meta.index, "meta.index")
        _non_negative_int(meta.term, "meta.term")
        if meta.term > msg.term:
            raise InvalidMessage("meta.term", f"{meta.term} is above the sender's term {msg.term}")
        if not isinstance(meta.membership, Membership) or not meta.membership.voters:
            raise InvalidMessage("meta.membership", "a snapshot must name at least one voter")
    return msg


def _validate_append(m: AppendRequest, config: RaftConfig) -> None:
    _non_negative_int(m.prev_index, "prev_index")
    _non_negative_int(m.prev_term, "prev_term")
    _non_negative_int(m.commit, "commit")
    if m.prev_term > m.term:
        raise InvalidMessage("prev_term", f"{m.prev_term} is above the sender's term {m.term}")
    if not isinstance(m.entries, tuple):
        raise InvalidMessage("entries", "must be a tuple of entries")
    if len(m.entries) > config.max_message_entries:
        raise InvalidMessage(
            "entries",
            f"{len(m.entries)} entries exceed max_message_entries={config.max_message_entries}",
        )
    # One test per entry first (plain types, contiguous, terms in order); any failure, or a
    # config entry (its membership decoded), takes the loop below that names the entry.
    expected, prev_term, size, plain = m.prev_index + 1, m.prev_term, 0, True
    for e in m.entries:
        if not (
            type(e) is Entry
            and e.index == expected
            and type(e.term) is int
            and prev_term <= e.term <= m.term
            and type(e.data) is bytes
            and e.kind is EntryKind.NORMAL
        ):
            plain = False
            break
        expected += 1
        prev_term = e.term
        size += len(e.data)
    if not plain:
        size = _check_entries(m)
    else:
        size += 24 * len(m.entries)  # Entry.size
    if size > config.max_message_bytes:
        raise InvalidMessage(
            "entries", f"{size} bytes exceed max_message_bytes={config.max_message_bytes}"
        )


def _check_entries(m: AppendRequest) -> int:
    """Every entry checked, naming the first that is not well formed; their size in bytes."""
    size = 0
    prev_term = m.prev_term
    for i, e in enumerate(m.entries):
        where = f"entries[{i}]"
        if not isinstance(e, Entry):
            raise InvalidMessage(where, f"must be an Entry, got {type(e).__name__}")
        if e.index != m.prev_index + 1 + i:
            raise InvalidMessage(
                f"{where}.index", f"expected {m.prev_index + 1 + i} (contiguous after prev_index)"
            )
        if not isinstance(e.term, int) or e.term < prev_term or e.term > m.term:
            raise InvalidMessage(
                f"{where}.term",
                f"{e.term} must lie between the previous entry's term {prev_term} and {m.term}",
            )
        if not isinstance(e.data, bytes):
            raise InvalidMessage(f"{where}.data", "must be bytes")
        if not isinstance(e.kind, EntryKind):
            raise InvalidMessage(f"{where}.kind", f"unknown entry kind {e.kind!r}")
        if e.kind == EntryKind.CONFIG:
            try:
                Membership.decode(e.data)
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidMessage(f"{where}.data", f"not a valid membership: {exc}") from exc
        prev_term = e.term
        size += e.size
    return size
