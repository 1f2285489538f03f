"""Errors raised by the core. Each names what failed and why."""

from __future__ import annotations


class RaftError(Exception):
    """Base of every error the core raises."""


class SafetyViolation(RaftError):
    """A Raft safety property was about to be broken (e.g. truncating a committed entry).

    Fatal by design: the partition must stop rather than silently repair its log.
    """


class NotLeader(RaftError):
    """A leader-only operation reached a node that is not the leader of the partition."""

    def __init__(self, leader_hint: str | None) -> None:
        self.leader_hint = leader_hint
        hint = f"; the leader is {leader_hint}" if leader_hint else "; no leader is known"
        super().__init__(f"this node is not the leader{hint}")


class ProposalRefused(RaftError):
    """The leader refuses a proposal for a stated reason (e.g. a leadership transfer)."""


class MembershipError(RaftError):
    """A membership change was refused; the message gives the member and the reason."""


class InvalidMessage(RaftError):
    """A peer message failed validation; `field` and `reason` say what and why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class Compacted(RaftError):
    """The requested log index lies below the compaction floor."""


class Unavailable(RaftError):
    """The requested log index lies beyond the last entry."""
