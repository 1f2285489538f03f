"""Sans-I/O Raft core: one deterministic state machine per partition.

Nothing in this package touches sockets, files, clocks or asyncio. Drivers feed it messages and
ticks, and carry out what its `Ready` asks for (persist, send, apply, snapshot) before `advance`.
"""

from raftlog.node.core.errors import (
    InvalidMessage,
    MembershipError,
    NotLeader,
    ProposalRefused,
    SafetyViolation,
)
from raftlog.node.core.messages import (
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    PreVoteRequest,
    PreVoteResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from raftlog.node.core.progress import ProgressState
from raftlog.node.core.raft import Raft, Ready, Role
from raftlog.node.core.types import (
    Entry,
    EntryKind,
    Event,
    HardState,
    Membership,
    SnapshotMeta,
    SnapshotRequest,
)

__all__ = [
    "AppendRequest",
    "AppendResponse",
    "Entry",
    "EntryKind",
    "Event",
    "HardState",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "InstallSnapshot",
    "InvalidMessage",
    "Membership",
    "MembershipError",
    "Message",
    "NotLeader",
    "PreVoteRequest",
    "PreVoteResponse",
    "ProgressState",
    "ProposalRefused",
    "Raft",
    "Ready",
    "Role",
    "SafetyViolation",
    "SnapshotMeta",
    "SnapshotRequest",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
]
