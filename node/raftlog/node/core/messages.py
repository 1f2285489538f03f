"""Messages exchanged between the Raft cores of one partition.

Every message carries the sender's term. Appends are always anchored with (prev_index, prev_term),
live ones included: the log-matching property is never traded for speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.node.core.types import Entry, SnapshotMeta


@dataclass(frozen=True, slots=True)
class PreVoteRequest:
    src: str
    dst: str
    term: int  # the term the sender would campaign in (its term + 1); nobody's term changes
    last_index: int
    last_term: int


@dataclass(frozen=True, slots=True)
class PreVoteResponse:
    src: str
    dst: str
    term: int
    granted: bool


@dataclass(frozen=True, slots=True)
class VoteRequest:
    src: str
    dst: str
    term: int
    last_index: int
    last_term: int
    transfer: bool = False  # a leadership transfer: voters skip the leader-lease check


@dataclass(frozen=True, slots=True)
class VoteResponse:
    src: str
    dst: str
    term: int
    granted: bool


@dataclass(frozen=True, slots=True)
class AppendRequest:
    src: str
    dst: str
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int
    backfill: bool = False  # a bounded catch-up round for a follower beyond backfill_threshold


@dataclass(frozen=True, slots=True)
class AppendResponse:
    """Success: `index` is the follower's last entry known to match the leader.

    LogMismatch (success False): `index` is the rejected prev_index, and (hint_index, hint_term)
    point at the follower's last entry that could still match, so the leader backs up in a few
    round trips rather than one entry at a time.
    """

    src: str
    dst: str
    term: int
    success: bool
    index: int
    hint_index: int = 0
    hint_term: int = 0
    commit: int = 0  # the follower's high-water mark, used to rank snapshot sources


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    src: str
    dst: str
    term: int
    commit: int  # never above what the follower is known to hold
    ctx: int = 0  # the newest ReadIndex request this heartbeat confirms leadership for
    quiesce: bool = False  # the partition is idle: stop the election timer (see `Raft.quiesced`)


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    src: str
    dst: str
    term: int
    ctx: int = 0  # echoed from the request


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the caught-up target campaigns at once."""

    src: str
    dst: str
    term: int


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """Stepped by the target's driver once a snapshot's data is received and verified.

    `src` and `term` are the leader's, whichever member streamed the bytes.
    """

    src: str
    dst: str
    term: int
    meta: SnapshotMeta


Message = (
    PreVoteRequest
    | PreVoteResponse
    | VoteRequest
    | VoteResponse
    | AppendRequest
    | AppendResponse
    | HeartbeatRequest
    | HeartbeatResponse
    | TimeoutNow
    | InstallSnapshot
)

MESSAGE_TYPES: tuple[type, ...] = (
    PreVoteRequest,
    PreVoteResponse,
    VoteRequest,
    VoteResponse,
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    TimeoutNow,
    InstallSnapshot,
)
