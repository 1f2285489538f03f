"""The leader's view of each follower: where its log is and how to feed it.

States, as in etcd-io/raft: `probe` (one anchored append at a time until the match point is
found), `replicate` (live pipelining within an inflight window, or bounded backfill rounds when the
follower lags by more than `backfill_threshold`), and `snapshot` (the needed entries are below
the compaction floor: SnapshotRequired until an install completes).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class ProgressState(StrEnum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


@dataclass
class Progress:
    match: int = 0
    next: int = 1
    state: ProgressState = ProgressState.PROBE
    is_learner: bool = False
    known: bool = False  # heard from this term: until then its lag is unknown (None)
    probe_sent: bool = False  # probe: an append is out, wait for its answer or a heartbeat's
    inflight: deque[int] = field(default_factory=deque)  # last index of each in-flight append
    backfilling: bool = False
    recent_active: bool = False  # for check-quorum
    last_response_tick: int = -1
    last_progress_tick: int = 0  # last tick the match point moved (detects lost appends)
    commit_sent: int = 0  # the high-water mark last told to this follower
    appended: bool = False  # an append went to it since the leader's last heartbeat
    follower_commit: int = 0
    pending_snapshot: int = 0
    snapshot_attempt: int = 0
    snapshot_retry_at: int = 0
    backfill_rounds: int = 0
    backfill_entries: int = 0
    snapshots_installed: int = 0
    catching_up: bool = False  # installed a snapshot, not yet within backfill_threshold
    transferring: bool = False  # the driver is streaming it a snapshot (`snapshot_transfer`)

    def become_probe(self) -> None:
        if self.state == ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.backfilling = False
        self.pending_snapshot = 0

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()

    def become_snapshot(self, required_index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = required_index
        self.probe_sent = False
        self.inflight.clear()
        self.backfilling = False
        self.snapshot_attempt = 0

    def maybe_update(self, index: int) -> bool:
        """A success reply acknowledged `index`. Returns whether the match point moved."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        return updated

    def maybe_decrease_to(self, rejected: int, match_hint: int) -> bool:
        """A LogMismatch for an append anchored at `rejected`. False when the reply is stale."""
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True

    def lag(self, commit: int) -> int | None:
        return max(commit - self.match, 0) if self.known else None
