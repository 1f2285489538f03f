"""Binary framing of core messages between peers (msgspec MessagePack).

msgspec is fast, maintained and typed; MessagePack keeps entry payloads as raw bytes (no base64).
A frame is a list of `[partition, type code, field values...]`; entries travel as
`[index, term, kind, data]` and snapshot metadata as `[index, term, voters, learners]`. A node's
liveness ping is `[-1, 255, src]` (`Ping`: of the node, not of a partition). Decoding
never trusts the peer: any shape error becomes `InvalidMessage`, and the core validates the rest.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import msgspec

from raftlog.node.core.errors import InvalidMessage
from raftlog.node.core.messages import MESSAGE_TYPES, AppendRequest, InstallSnapshot, Message
from raftlog.node.core.types import Entry, Membership, SnapshotMeta

PING_CODE = 255


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    """A node's ping to a peer while it has quiesced partitions (`core/liveness.py`)."""

    src: str


Item = tuple[int, Message | Ping]  # (partition, message); a ping's partition is -1

_CODES = {cls: i for i, cls in enumerate(MESSAGE_TYPES)}
_FIELDS = {cls: [f.name for f in dataclasses.fields(cls)] for cls in MESSAGE_TYPES}
# Every field of a message at once, in C (a message has three fields at least, so the getter
# gives a tuple) rather than field by field in Python: fewer calls per message; the effect on
# appends/s is within the bench's noise (bench/RESULTS.md, "Fewer calls per message").
_VALUES = {cls: operator.attrgetter(*_FIELDS[cls]) for cls in MESSAGE_TYPES}
_AT_ENTRIES = _FIELDS[AppendRequest].index("entries")
_AT_META = _FIELDS[InstallSnapshot].index("meta")
_ENTRIES = tuple[Entry, ...]
_BYTES = (bytes,)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def _meta_out(meta: SnapshotMeta) -> list[Any]:
    m = meta.membership
    return [meta.index, meta.term, sorted(m.voters), sorted(m.learners)]


def encode_frame(items: Sequence[Item]) -> bytes:
    out: list[list[Any]] = []
    for partition, m in items:
        if isinstance(m, Ping):
            out.append([-1, PING_CODE, m.src])
            continue
        cls = type(m)
        if isinstance(m, InstallSnapshot):  # its metadata is a list of its own
            out.append([partition, _CODES[cls], m.src, m.dst, m.term, _meta_out(m.meta)])
        else:  # every field a scalar or the entries (each [index, term, kind, data])
            out.append([partition, _CODES[cls], *_VALUES[cls](m)])
    return _encoder.encode(out)


def size_hint(m: Message | Ping) -> int:
    """About how many bytes `m` takes in a frame (its entries, and a message's own fields)."""
    return 64 + sum(e.size for e in m.entries) if isinstance(m, AppendRequest) else 64


def decode_frame(data: bytes) -> list[Item]:
    try:
        raw = _decoder.decode(data)
    except msgspec.DecodeError as e:
        raise InvalidMessage("frame", f"not MessagePack: {e}") from None
    except RecursionError:  # msgspec's own depth limit, reached by a hostile frame
        raise InvalidMessage("frame", "nested too deep") from None
    if not isinstance(raw, list):
        raise InvalidMessage("frame", "must be a list of messages")
    return [_decode_one(item) for item in raw]


def _decode_one(item: Any) -> Item:
    if not isinstance(item, list) or len(item) < 2:
        raise InvalidMessage("frame", "each message is [partition, type, fields...]")
    partition, code, *values = item
    if not isinstance(partition, int) or not isinstance(code, int):
        raise InvalidMessage("frame", "partition and type must be integers")
    if code == PING_CODE:
        if len(values) != 1 or not isinstance(values[0], str) or not values[0]:
            raise InvalidMessage("frame", "a ping is [-1, 255, node name]")
        return -1, Ping(values[0])
    if not 0 <= code < len(MESSAGE_TYPES):
        raise InvalidMessage("type", f"unknown message type {code}")
    cls = MESSAGE_TYPES[code]
    names = _FIELDS[cls]
    if len(values) != len(names):
        raise InvalidMessage("frame", f"{cls.__name__} has {len(names)} fields, got {len(values)}")
    if type(values[0]) is not str:
        # The receiver keys what it knows of its peers by the sender's name (`seen`, `heard`)
        # before the core validates the rest: a list there was a TypeError in the protocol.
        raise InvalidMessage("src", f"must be a node name, got {type(values[0]).__name__}")
    try:
        # The fields in their declared order, as the encoder wrote them: positional, with no
        # keyword dict built per message.
        if cls is AppendRequest:
            # [index, term, kind, data] lists to Entries, each field type-checked, in C. Entry's
            # defaults for kind and data would take a shorter list, so every entry must have all
            # four fields; bytes as a builtin type keeps a str from being read as base64.
            entries = values[_AT_ENTRIES]
            if entries and min(map(len, entries)) != 4:
                raise ValueError("each entry is [index, term, kind, data]")
            values[_AT_ENTRIES] = msgspec.convert(entries, _ENTRIES, builtin_types=_BYTES)
        elif cls is InstallSnapshot:
            i, t, voters, learners = values[_AT_META]
            values[_AT_META] = SnapshotMeta(
                int(i), int(t), Membership(frozenset(voters), frozenset(learners))
            )
        return partition, cls(*values)
    except (TypeError, ValueError, OverflowError, msgspec.ValidationError) as e:  # int(inf)
        raise InvalidMessage("frame", f"malformed {cls.__name__}: {e}") from None
