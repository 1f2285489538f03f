"""Plain values shared by the core, its storage and its drivers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgspec


class EntryKind(IntEnum):
    NORMAL = 0  # an application record
    NOOP = 1  # appended by each new leader so that entries of older terms can commit
    CONFIG = 2  # a membership change; its data is an encoded `Membership`


class Entry(msgspec.Struct, frozen=True, array_like=True, gc=False, forbid_unknown_fields=True):
    """One log entry: immutable and hashable like a frozen dataclass, but built in C (a tenth
    of a frozen dataclass's cost; the append path builds one per record on every replica), and
    converted from a peer frame's `[index, term, kind, data]` lists with type checks in one
    `msgspec.convert` call. No I/O, no clock: the core stays sans-I/O and deterministic."""

    index: int
    term: int
    kind: EntryKind = EntryKind.NORMAL
    data: bytes = b""

    @property
    def size(self) -> int:
        return len(self.data) + 24


def within_bytes(entries: list[Entry], budget: int) -> tuple[Entry, ...]:
    """The longest prefix of `entries` whose sizes total at most `budget`; at least the first
    entry, which goes alone when it is larger."""
    total = 0
    for i, e in enumerate(entries):
        total += e.size
        if total > budget and i:
            return tuple(entries[:i])
    return tuple(entries)


@dataclass(frozen=True, slots=True)
class Membership:
    """Voters count for commit and elections; learners only receive the log."""

    voters: frozenset[str] = frozenset()
    learners: frozenset[str] = frozenset()

    @classmethod
    def of(cls, voters: list[str] | tuple[str, ...], learners: tuple[str, ...] = ()) -> Membership:
        return cls(frozenset(voters), frozenset(learners))

    @property
    def members(self) -> frozenset[str]:
        return self.voters | self.learners

    def encode(self) -> bytes:
        return json.dumps(
            {"voters": sorted(self.voters), "learners": sorted(self.learners)}
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Membership:
        raw = json.loads(data)
        return cls(frozenset(raw["voters"]), frozenset(raw["learners"]))

    def describe(self) -> str:
        learners = f" learners={sorted(self.learners)}" if self.learners else ""
        return f"voters={sorted(self.voters)}{learners}"


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Describes a snapshot: the last entry it covers and the membership at that point."""

    index: int = 0
    term: int = 0
    membership: Membership = field(default_factory=Membership)


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """The leader asks its driver to get a snapshot covering `required_index` to `target`.

    The core never streams snapshots itself; the driver picks a source (an eligible follower or
    the leader), transfers the data, and the target's driver steps an `InstallSnapshot` message.
    """

    target: str
    required_index: int
    term: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Event:
    """A notable transition, for timelines, logs and metrics (never needed for correctness)."""

    kind: str
    node: str
    term: int
    detail: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"{self.node} t{self.term} {self.kind} {extra}".rstrip()


@dataclass(frozen=True, slots=True)
class ReadState:
    """A ReadIndex request confirmed: once applied reaches `index`, a read is linearizable."""

    request_id: int
    index: int
