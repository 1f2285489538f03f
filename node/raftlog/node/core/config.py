"""One validated configuration for a partition's Raft core.

The names are the source documents' (Kommander's BackfillThreshold, MaxBackfillEntriesPerRound,
CompactEveryOperations, CompactNumberEntries, MaxEntriesPerCompaction, LearnerPromotionLag) in
snake case, so that the CRD, the node's flags and environment (`RAFTLOG_` prefix) and the docs all
say the same thing. Each setting is defined here once, with its bounds: the operator's spec takes
these fields as they are. LearnerPromotionStableWindow is not here: only the operator watches it
(`raftlog.operator.models.RaftSettings`). Time inside the core is logical ticks.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class RaftConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    election_ticks: int = Field(
        10,
        ge=3,
        le=10_000,
        description="Ticks without a leader before a follower campaigns; "
        "each node randomizes its timeout in [election_ticks, 2*election_ticks).",
    )
    heartbeat_ticks: int = Field(
        1, ge=1, le=1_000, description="Ticks between the leader's heartbeats."
    )
    pre_vote: bool = Field(
        True,
        description="Ask for a pre-vote before campaigning so a partitioned node cannot "
        "disturb a healthy leader by raising its term.",
    )
    check_quorum: bool = Field(
        True, description="A leader that has not heard from a quorum for election_ticks steps down."
    )
    quiesce: bool = Field(
        True,
        description="An idle partition whose followers hold and know every entry stops "
        "ticking: its leader sends no heartbeats and its followers run no election timer, "
        "until a proposal, a message, or the driver's word that a member went silent wakes it.",
    )
    backfill_threshold: int = Field(
        10,
        ge=0,
        le=1_000_000,
        description="Follower lag (leader commit minus follower match) above "
        "which the leader switches from live replication to bounded backfill rounds.",
    )
    max_backfill_entries_per_round: int = Field(
        128, ge=1, le=100_000, description="Most committed entries sent in one backfill round."
    )
    max_entries_per_append: int = Field(
        64, ge=1, le=100_000, description="Most entries in one live (pipelined) append."
    )
    max_append_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Most entry bytes in one append, live or backfill round (a single larger "
        "entry goes alone): large records must not make a message its receiver refuses. etcd "
        "bounds its messages at 1 MiB too (MaxSizePerMsg).",
    )
    max_inflight_appends: int = Field(
        32,
        ge=1,
        le=10_000,
        description="Live appends sent to a follower before an acknowledgement.",
    )
    max_message_entries: int = Field(
        100_000, ge=1, description="Peer appends with more entries are rejected as malformed."
    )
    max_message_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Peer appends larger than this are rejected."
    )
    compact_every_operations: int = Field(
        10_000,
        ge=1,
        description="Applied operations between two snapshot-and-compaction passes. Each pass "
        "writes and fsyncs the whole keyed table, so its cost grows with the table, not with "
        "the operations: 10,000 (hashicorp/raft snapshots every 8,192 entries, etcd before 3.2 "
        "every 10,000, etcd 3.4 and ZooKeeper every 100,000) keeps it to a few passes a second "
        "at 50,000 appends/s (1,000 would be about 35 a second).",
    )
    compact_every_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="Bytes of applied entries that also make a snapshot-and-compaction pass "
        "due, whichever of this and compact_every_operations comes first (0: operations only). "
        "10,000 records of 64 KiB are 640 MiB of log between two passes otherwise; at a WAL "
        "segment's size, the log holds a few segments whatever the record size.",
    )
    compact_number_entries: int = Field(
        1_000,
        ge=0,
        description="Most recent applied entries always kept in the log after a "
        "compaction, so that briefly lagging followers catch up by backfill, not by snapshot.",
    )
    max_entries_per_compaction: int = Field(
        100_000,
        ge=1,
        description="Most entries one compaction pass removes, and the most a follower that "
        "a snapshot is bringing back keeps in the leader's log.",
    )
    learner_promotion_lag: int = Field(
        10,
        ge=0,
        description="A learner is promoted only while its lag is at most this (the leader "
        "refuses a promotion beyond it; the operator waits for a whole window within it).",
    )
    snapshot_retry_ticks: int = Field(
        20,
        ge=1,
        description="Ticks before a snapshot install that has not completed is asked again; "
        "doubles after each attempt up to snapshot_retry_max_ticks.",
    )
    snapshot_retry_max_ticks: int = Field(
        400, ge=1, description="Cap of the snapshot install retry back-off, in ticks."
    )

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if problem := ticks_problem(self.heartbeat_ticks, self.election_ticks):
            raise ValueError(problem)
        if self.snapshot_retry_max_ticks < self.snapshot_retry_ticks:
            raise ValueError("snapshot_retry_max_ticks must be at least snapshot_retry_ticks")
        if self.max_append_bytes > self.max_message_bytes:
            raise ValueError(
                f"max_append_bytes ({self.max_append_bytes}) must be at most max_message_bytes "
                f"({self.max_message_bytes}), or followers refuse the appends"
            )
        return self


def ticks_problem(
    heartbeat_ticks: int,
    election_ticks: int,
    names: tuple[str, str] = ("heartbeat_ticks", "election_ticks"),
) -> str | None:
    """The heartbeat/election rule, stated once for the node and the operator's spec (which
    passes its camelCase `names`); None when the pair is coherent."""
    if heartbeat_ticks < election_ticks:
        return None
    heartbeat, election = names
    return (
        f"{heartbeat} ({heartbeat_ticks}) must be below {election} ({election_ticks}), "
        "or followers campaign between heartbeats"
    )


def describe_validation_error(err: ValidationError) -> str:
    """`field: reason` lines, the form every boundary of raftlog reports bad config in."""
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        lines.append(f"{where}: {e['msg']}")
    return "; ".join(lines)
