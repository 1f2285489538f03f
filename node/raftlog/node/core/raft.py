"""The Raft state machine of one partition: sans-I/O and deterministic.

Drivers call `tick()`, `step(message)`, `propose(...)`, then loop on `ready()` / `advance()`:

    rd = raft.ready()
    install rd.snapshot if any                  # first: it resets the log behind it
    storage.save(rd.hard_state, rd.entries)     # durable (fsync); entries follow the snapshot
    send rd.messages                            # only now: they depend on what was persisted
    apply rd.committed                          # never above the durable high-water mark
    serve rd.snapshot_requests                  # stream a snapshot to a lagging follower
    raft.advance(rd)

Randomness (election timeouts) comes from a seeded RNG, time from ticks: the same inputs give the
same outputs, which is what lets the simulator replay a failing seed exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from mypy_extensions import mypyc_attr

from raftlog.node.core.config import RaftConfig
from raftlog.node.core.errors import (
    InvalidMessage,
    MembershipError,
    NotLeader,
    ProposalRefused,
)
from raftlog.node.core.log import RaftLog
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
from raftlog.node.core.progress import Progress, ProgressState
from raftlog.node.core.storage import LogStorage
from raftlog.node.core.types import (
    Entry,
    EntryKind,
    Event,
    HardState,
    Membership,
    ReadState,
    SnapshotMeta,
    SnapshotRequest,
    within_bytes,
)
from raftlog.node.core.validate import validate_message

MembershipOp = Literal["add_learner", "promote", "remove"]

# Most committed entries handed out for apply in one Ready, so one Ready stays bounded.
MAX_APPLY_PER_READY = 4096


class Role(StrEnum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass
class Ready:
    """What the driver must do, in this order: install, persist, send, apply, serve.

    A snapshot comes first because installing it resets the log: entries in the same Ready
    (appended after the snapshot was accepted) follow it and must not be wiped by it.
    """

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: SnapshotMeta | None = None
    messages: list[Message] = field(default_factory=list)
    committed: list[Entry] = field(default_factory=list)
    snapshot_requests: list[SnapshotRequest] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)


@dataclass(frozen=True)
class FollowerStatus:
    node: str
    learner: bool
    state: ProgressState
    match: int
    next: int
    lag: int | None
    snapshot_required: bool
    recent_active: bool
    last_response_tick: int
    follower_commit: int
    inflight: int
    backfilling: bool
    backfill_rounds: int
    backfill_entries: int
    snapshots_installed: int


@dataclass(frozen=True)
class PartitionStatus:
    node: str
    role: Role
    member: Literal["voter", "learner", "none"]
    term: int
    leader: str | None
    high_water_mark: int
    applied: int
    compaction_floor: int
    last_index: int
    membership: Membership
    transferee: str | None
    followers: dict[str, FollowerStatus]


# Compiled by mypyc (raftlog/node/native.py); the simulation's broken cores subclass it.
@mypyc_attr(allow_interpreted_subclasses=True)
class Raft:
    def __init__(
        self, node_id: str, config: RaftConfig, storage: LogStorage, seed: int = 0
    ) -> None:
        self.id = node_id
        self.cfg = config
        hs, snap = storage.initial_state()
        self.log = RaftLog(storage, hs.commit, snap.index)
        self.term = hs.term
        self.vote = hs.vote
        self._prev_hs = HardState(hs.term, hs.vote, self.log.committed)
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        self._rng = random.Random(f"{seed}/{node_id}")
        # Membership takes effect when its entry is appended (Raft dissertation, 4.1), so every
        # config entry in the log is remembered and a truncation can fall back to the previous.
        self._config_history: list[tuple[int, Membership]] = [(snap.index, snap.membership)]
        for e in storage.config_entries(snap.index + 1):
            self._config_history.append((e.index, Membership.decode(e.data)))
        self.membership = self._config_history[-1][1]
        self.progress: dict[str, Progress] = {}
        self._votes: dict[str, bool] = {}
        self.ticks = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._last_heartbeat = 0  # the tick of the leader's last heartbeat round
        self._randomized_timeout = self._random_timeout()
        self.pending_conf_index = 0
        self.transferee: str | None = None
        self._transfer_elapsed = 0
        # Follower: the highest index known to match the current leader's log. The high-water
        # mark a follower accepts is never above it.
        self._leader_match = 0
        self._needs_broadcast = False
        self._msgs: list[Message] = []
        self._events: list[Event] = []
        self._snapshot_requests: list[SnapshotRequest] = []
        self._ready_out = False
        self.rejected: dict[str, int] = {}
        # ReadIndex (Raft dissertation 6.4): request id -> (read index, voters that confirmed).
        self._reads: dict[int, tuple[int, set[str]]] = {}
        self._reads_waiting_commit: list[int] = []  # until this term's first entry commits
        self._read_states: list[ReadState] = []
        # Quiescence (as CockroachDB quiesces idle ranges): an idle, fully replicated partition
        # stops ticking, so a node with a thousand idle partitions does no work for them. A
        # quiesced follower runs no election timer, so its leader's failure must come from
        # outside: the driver calls `wake(silent=True)` when the leader's node goes silent.
        self.quiesced = False

    # ===================================================================== public interface
    @property
    def commit(self) -> int:
        return self.log.committed

    def tick(self) -> None:
        self.ticks += 1
        if self.quiesced:
            return
        if self.role == Role.LEADER:
            self._tick_leader()
        else:
            self.election_elapsed += 1
            if self._promotable() and self.election_elapsed >= self._randomized_timeout:
                self.election_elapsed = 0
                self.hup()

    def step(self, m: object) -> None:
        """Feed one peer message. Malformed or stale ones are counted and ignored."""
        try:
            msg = validate_message(m, self.id, self.cfg)
        except InvalidMessage as exc:
            self._count_rejected(f"invalid {exc.field}")
            self._event("message_rejected", src=getattr(m, "src", "?"), reason=str(exc))
            return
        quiet = isinstance(msg, HeartbeatResponse) or (
            isinstance(msg, HeartbeatRequest) and msg.quiesce
        )
        if self.quiesced and not quiet:
            self.wake()
        if not self._check_term(msg):
            return
        match msg:
            case PreVoteRequest():
                self._on_pre_vote_request(msg)
            case VoteRequest():
                self._on_vote_request(msg)
            case PreVoteResponse():
                self._on_pre_vote_response(msg)
            case VoteResponse():
                self._on_vote_response(msg)
            case AppendRequest():
                self._on_append(msg)
            case HeartbeatRequest():
                self._on_heartbeat(msg)
            case InstallSnapshot():
                self._on_install_snapshot(msg)
            case AppendResponse():
                self._on_append_response(msg)
            case HeartbeatResponse():
                self._on_heartbeat_response(msg)
            case TimeoutNow():
                self._on_timeout_now(msg)

    def propose(self, data: bytes) -> tuple[int, int]:
        """Append a record on the leader. Returns (index, term); it is acknowledged once an
        entry with that index and term is in `Ready.committed`."""
        return self.propose_batch([data])[0]

    def wake(self, silent: bool = False) -> None:
        """Leave quiescence (no-op otherwise). `silent`: a member this partition relies on (a
        follower's leader, or a leader's voter) went silent, so a follower's leader lease is
        over and it may campaign after its randomized timeout, as if the heartbeats stopped."""
        if not self.quiesced:
            return
        self.quiesced = False
        self.heartbeat_elapsed = 0
        if self.role == Role.LEADER:
            self.election_elapsed = 0
            self._needs_broadcast = True  # heartbeat at the next tick confirms the followers
            if silent:
                # What they answered before it slept says nothing of its quorum now: it may
                # quiesce again only once they answer, and check-quorum deposes it if they
                # do not (it re-quiesced at once and led on, unable to commit, for good).
                for pr in self.progress.values():
                    pr.recent_active = False
        else:
            self.election_elapsed = self.cfg.election_ticks if silent else 0
        self._event("woken", silent=silent)

    def wake_if_silent(self, silent: set[str]) -> None:
        """Wake a quiesced partition that relies on a silent peer (see `liveness.py`): a
        follower's leader, or one of a leader's voters (its quorum may be gone: check it)."""
        if not self.quiesced:
            return
        if self.role == Role.LEADER:
            relies = bool(silent & self.membership.voters)
        else:
            relies = self.leader is None or self.leader in silent
        if relies:
            self.wake(silent=True)

    def _maybe_quiesce(self) -> bool:
        """A leader at its heartbeat: quiesce when nothing is pending and every member holds
        and was told every entry (the heartbeat sent carries the commit index and the flag)."""
        if not self.cfg.quiesce or self.transferee is not None or self._reads:
            return False
        last = self.log.last_index()
        if self._reads_waiting_commit or self.log.committed != last or self.log.unstable:
            return False
        if self.pending_conf_index > self.log.committed:
            return False
        if self.commit_untold():
            return False  # told first (`tell_commit`), so a follower's commit is never behind
        for pr in self.progress.values():
            if pr.match != last or pr.state != ProgressState.REPLICATE or not pr.recent_active:
                return False
        self.quiesced = True
        for node in self.progress:
            self._send(HeartbeatRequest(self.id, node, self.term, last, quiesce=True))
        self._event("quiesced", index=last)
        return True

    def propose_batch(self, records: list[bytes]) -> list[tuple[int, int]]:
        self.wake()
        self._check_can_propose()
        start = self.log.last_index() + 1
        entries = [Entry(start + i, self.term, EntryKind.NORMAL, d) for i, d in enumerate(records)]
        self._append_as_leader(entries)
        return [(e.index, e.term) for e in entries]

    def propose_membership(self, op: MembershipOp, node: str) -> tuple[int, int]:
        """One membership change at a time, through the log. Raises MembershipError with the
        reason when the change is not allowed now (e.g. a learner that still lags)."""
        self.wake()
        self._check_can_propose()
        if self.pending_conf_index > self.log.applied:
            raise MembershipError(
                f"membership change at index {self.pending_conf_index} is not applied yet; "
                "changes are made one at a time"
            )
        m = self.membership
        if op == "add_learner":
            if node in m.members:
                kind = "voter" if node in m.voters else "learner"
                raise MembershipError(f"{node} is already a {kind}")
            new = Membership(m.voters, m.learners | {node})
        elif op == "promote":
            if node in m.voters:
                raise MembershipError(f"{node} is already a voter")
            if node not in m.learners:
                raise MembershipError(f"{node} is not a learner; add it as a learner first")
            lag = self.progress[node].lag(self.log.committed)
            if lag is None:
                raise MembershipError(f"learner {node} has not answered this leader; lag unknown")
            if lag > self.cfg.learner_promotion_lag:
                raise MembershipError(
                    f"learner {node} lags by {lag} entries, more than "
                    f"learner_promotion_lag={self.cfg.learner_promotion_lag}"
                )
            new = Membership(m.voters | {node}, m.learners - {node})
        elif op == "remove":
            if node not in m.members:
                raise MembershipError(f"{node} is not a member")
            if m.voters == {node}:
                raise MembershipError(f"{node} is the last voter and cannot be removed")
            new = Membership(m.voters - {node}, m.learners - {node})
        else:
            raise MembershipError(f"unknown membership operation {op!r}")
        entry = Entry(self.log.last_index() + 1, self.term, EntryKind.CONFIG, new.encode())
        self._append_as_leader([entry])
        self.pending_conf_index = entry.index
        self._event("membership_proposed", op=op, member=node, index=entry.index)
        return entry.index, entry.term

    def transfer_leadership(self, target: str) -> None:
        self.wake()
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        if target == self.id:
            raise ProposalRefused(f"{target} is already the leader")
        if target not in self.membership.voters:
            raise ProposalRefused(f"{target} is not a voter of this partition")
        self.transferee = target
        self._transfer_elapsed = 0
        self._event("transfer_started", target=target)
        if self.progress[target].match == self.log.last_index():
            self._send(TimeoutNow(self.id, target, self.term))
        else:
            self._send_append(target)

    def catch_up_floor(self) -> int | None:
        """The lowest index compaction keeps for followers a snapshot is bringing back, or None.

        A follower that needs a snapshot, then the entries after it, would need another one if
        compaction passed those entries meanwhile: under a steady load the floor moves past a
        snapshot's index within one install (at the defaults, 1,000 entries are kept and a
        pass runs every 10,000 operations; on the real cluster, every install ended in a new
        SnapshotRequired until the load paused). So a leader keeps, for each answering
        follower, the entries after the index it needs a snapshot of (while it does) and after
        its match point (once installed, until it is within `backfill_threshold`). A follower
        that stops answering for an election timeout (`recent_active`) holds nothing, unless
        the driver is streaming it a snapshot: a follower back from a long stop is sent one
        before it has answered again. Nor does one that would keep more than
        `max_entries_per_compaction` entries: a follower that answers but never installs (its
        disk full) must not fill the leader's disk too."""
        if self.role != Role.LEADER:
            return None
        lowest = self.log.last_index() - self.cfg.max_entries_per_compaction
        floors = []
        for pr in self.progress.values():
            if pr.state == ProgressState.SNAPSHOT and (pr.recent_active or pr.transferring):
                floor = pr.pending_snapshot + 1
            elif pr.catching_up and pr.recent_active:
                floor = pr.match + 1
            else:
                continue
            if floor > lowest:
                floors.append(floor)
        return min(floors) if floors else None

    def snapshot_transfer(self, target: str) -> None:
        """The driver starts streaming `target` a snapshot (its end is `report_snapshot`)."""
        pr = self.progress.get(target)
        if self.role == Role.LEADER and pr is not None and pr.state == ProgressState.SNAPSHOT:
            pr.transferring = True

    def report_snapshot(self, target: str, success: bool) -> None:
        """The driver's verdict on a snapshot transfer it ran for `target`."""
        pr = self.progress.get(target)
        if pr is not None:
            pr.transferring = False
        if self.role != Role.LEADER or pr is None or pr.state != ProgressState.SNAPSHOT:
            return
        if not success:
            self._event("snapshot_failed", target=target, attempt=pr.snapshot_attempt)
            pr.snapshot_retry_at = self.ticks + self._snapshot_backoff(pr.snapshot_attempt)

    def step_down(self, reason: str) -> list[Message]:
        """Stop leading, or following a known leader: this node can take no further part (its
        storage failed) and is stepped no more, so it must not go on claiming a role its peers
        replaced. Term and vote are kept. A leader returns a TimeoutNow for its most caught-up
        voter, to send at once: the followers of a quiesced partition run no election timer,
        and this node's other partitions keep it from looking silent."""
        handoff: list[Message] = []
        if self.role == Role.LEADER:
            voters = [n for n in self.progress if n in self.membership.voters and n != self.id]
            if voters:
                target = max(voters, key=lambda n: self.progress[n].match)
                handoff.append(TimeoutNow(self.id, target, self.term))
        self._become_follower(self.term, None, reason=reason)
        return handoff

    def hup(self) -> None:
        """Start an election now (the timeout fired, or a test or operator asks)."""
        if self.role == Role.LEADER or not self._promotable():
            return
        if self.cfg.pre_vote:
            self._become_pre_candidate()
        else:
            self._campaign(transfer=False)

    def has_ready(self) -> bool:
        return bool(
            self._msgs
            or self._events
            or self._snapshot_requests
            or self._read_states
            or self.log.unstable
            or self.log.pending_snapshot is not None
            or self.log.committed > self.log.applied
            or self._needs_broadcast
            or self._hard_state_changed()
        )

    def _hard_state_changed(self) -> bool:
        # Field by field: a HardState built on every call was a tenth of a partition round's
        # core time at 16 partitions (bench/partitions.py, bench/RESULTS.md).
        prev = self._prev_hs
        return self.log.committed != prev.commit or self.term != prev.term or self.vote != prev.vote

    def ready(self) -> Ready:
        if self._ready_out:
            raise RuntimeError("ready() called twice without advance()")
        if self._needs_broadcast:
            self._needs_broadcast = False
            if self.role == Role.LEADER:
                self._broadcast_append()
        rd = Ready(
            hard_state=self._hard_state() if self._hard_state_changed() else None,
            entries=list(self.log.unstable),
            snapshot=self.log.pending_snapshot,
            messages=self._msgs,
            committed=self.log.committed_entries_to_apply(MAX_APPLY_PER_READY),
            snapshot_requests=self._snapshot_requests,
            events=self._events,
            read_states=self._read_states,
        )
        self._msgs, self._events, self._snapshot_requests = [], [], []
        self._read_states = []
        self._ready_out = True
        return rd

    def advance(self, rd: Ready) -> None:
        self._ready_out = False
        if rd.hard_state is not None:
            self._prev_hs = rd.hard_state
        if rd.snapshot is not None:
            self.log.snapshot_persisted(rd.snapshot.index)
        if rd.entries:
            last = rd.entries[-1]
            self.log.stable_to(last.index, last.term)
            if self.role == Role.LEADER:
                self._maybe_commit()  # followers hear of it with the next append (`tell_commit`)
        if rd.committed:
            self.log.applied_to(rd.committed[-1].index)
            if (
                self.role == Role.LEADER
                and self.id not in self.membership.voters
                and self._config_history[-1][0] <= self.log.applied
            ):
                # Followers have not heard that the removal committed (no append will carry it
                # from here): tell them now, or they learn it only from the next leader.
                self.tell_commit()
                self._become_follower(self.term, None, reason="removed from the voters")

    def read_committed(self, lo: int, hi: int) -> list[Entry]:
        """Entries in [lo, hi) that are at or below this node's high-water mark, never above."""
        return self.log.entries(lo, min(hi, self.log.committed + 1))

    def follower_lag(self, node: str) -> int | None:
        """Leader's commit minus the follower's match; None when unknown here."""
        pr = self.progress.get(node) if self.role == Role.LEADER else None
        return pr.lag(self.log.committed) if pr else None

    def read_index(self, request_id: int) -> None:
        """Ask for a linearizable read point; a `ReadState` in a later Ready answers it.

        The leader takes its commit index, then confirms it is still the leader with a heartbeat
        round acknowledged by a quorum of voters; a read served once `applied` reaches that index
        sees every write acknowledged before the request. A leader that has not yet committed an
        entry of its own term does not know the commit index for sure, so it waits for that first.
        `request_id` must grow from one request to the next. Raises NotLeader elsewhere; pending
        requests are dropped when the leader steps down (the driver fails them).
        """
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        self.wake()
        if self.log.term(self.log.committed) != self.term:
            self._reads_waiting_commit.append(request_id)
            return
        self._start_read(request_id)

    def _start_read(self, request_id: int) -> None:
        voters = self.membership.voters
        if voters == {self.id}:
            self._read_states.append(ReadState(request_id, self.log.committed))
            return
        # A leader that removed itself (the change appended, not yet committed) is no voter:
        # its own ack would let one voter of the new set confirm a read the others have passed.
        self._reads[request_id] = (self.log.committed, {self.id} if self.id in voters else set())
        for node in self.progress:
            commit = min(self.progress[node].match, self.log.committed)
            self._send(HeartbeatRequest(self.id, node, self.term, commit, ctx=request_id))

    def _confirm_reads(self, voter: str, ctx: int) -> None:
        if voter not in self.membership.voters:
            return
        quorum = len(self.membership.voters) // 2 + 1
        done = []
        for rid, (_, acks) in self._reads.items():
            if rid <= ctx:
                acks.add(voter)
            if len(acks) >= quorum:
                done.append(rid)
        if done:
            # A confirmed request confirms every earlier one too (same leadership, later check).
            top = max(done)
            for rid in sorted(self._reads):
                if rid <= top:
                    index, _ = self._reads.pop(rid)
                    self._read_states.append(ReadState(rid, index))

    def pending_reads(self) -> int:
        return len(self._reads) + len(self._reads_waiting_commit)

    def membership_at(self, index: int) -> Membership:
        current = self._config_history[0][1]
        for i, m in self._config_history:
            if i > index:
                break
            current = m
        return current

    def status(self) -> PartitionStatus:
        m = self.membership
        member: Literal["voter", "learner", "none"] = (
            "voter" if self.id in m.voters else "learner" if self.id in m.learners else "none"
        )
        followers = {}
        if self.role == Role.LEADER:
            for node, pr in sorted(self.progress.items()):
                followers[node] = FollowerStatus(
                    node=node,
                    learner=pr.is_learner,
                    state=pr.state,
                    match=pr.match,
                    next=pr.next,
                    lag=pr.lag(self.log.committed),
                    snapshot_required=pr.state == ProgressState.SNAPSHOT,
                    recent_active=pr.recent_active,
                    last_response_tick=pr.last_response_tick,
                    follower_commit=pr.follower_commit,
                    inflight=len(pr.inflight),
                    # Still behind by more than the threshold: the last round's flag alone
                    # would stay set once caught up until the next append is sent.
                    backfilling=pr.backfilling
                    and (pr.lag(self.log.committed) or 0) > self.cfg.backfill_threshold,
                    backfill_rounds=pr.backfill_rounds,
                    backfill_entries=pr.backfill_entries,
                    snapshots_installed=pr.snapshots_installed,
                )
        return PartitionStatus(
            node=self.id,
            role=self.role,
            member=member,
            term=self.term,
            leader=self.leader,
            high_water_mark=self.log.committed,
            applied=self.log.applied,
            compaction_floor=self.log.first_index(),
            last_index=self.log.last_index(),
            membership=m,
            transferee=self.transferee,
            followers=followers,
        )

    # ===================================================================== term and roles
    def _check_term(self, m: Message) -> bool:
        if m.term > self.term:
            if isinstance(m, PreVoteRequest) or (isinstance(m, PreVoteResponse) and m.granted):
                return True  # pre-votes never change anybody's term
            if isinstance(m, VoteRequest) and not m.transfer and self._in_lease():
                self._count_rejected("vote during leader lease")
                return False
            leader = (
                m.src if isinstance(m, AppendRequest | HeartbeatRequest | InstallSnapshot) else None
            )
            self._become_follower(m.term, leader)
            return True
        if m.term < self.term:
            # Answer with our term so that a stale leader or candidate steps down.
            if isinstance(m, AppendRequest | InstallSnapshot):
                self._send(AppendResponse(self.id, m.src, self.term, False, 0))
            elif isinstance(m, HeartbeatRequest):
                self._send(HeartbeatResponse(self.id, m.src, self.term))
            elif isinstance(m, PreVoteRequest):
                self._send(PreVoteResponse(self.id, m.src, self.term, False))
            elif isinstance(m, VoteRequest):
                self._send(VoteResponse(self.id, m.src, self.term, False))
            self._count_rejected("stale term")
            return False
        return True

    def _in_lease(self) -> bool:
        return (
            self.cfg.check_quorum
            and self.leader is not None
            and self.election_elapsed < self.cfg.election_ticks
        )

    def _promotable(self) -> bool:
        return self.id in self.membership.voters

    def _random_timeout(self) -> int:
        return self.cfg.election_ticks + self._rng.randrange(self.cfg.election_ticks)

    def _become_follower(self, term: int, leader: str | None, reason: str = "higher term") -> None:
        was = self.role
        if term != self.term:
            self.term = term
            self.vote = None
            self._leader_match = 0
        self.role = Role.FOLLOWER
        self.leader = leader
        self.quiesced = False
        self.election_elapsed = 0
        self._randomized_timeout = self._random_timeout()
        self.transferee = None
        self.progress = {}
        self._reads.clear()
        self._reads_waiting_commit.clear()
        if was == Role.LEADER:
            self._event("stepped_down", reason=reason)

    def _become_pre_candidate(self) -> None:
        self.quiesced = False
        self.role = Role.PRE_CANDIDATE
        self.leader = None
        self._votes = {self.id: True}
        self._event("pre_vote_started")
        if self._tally() == "won":
            self._campaign(transfer=False)
            return
        for v in sorted(self.membership.voters - {self.id}):
            self._send(
                PreVoteRequest(
                    self.id, v, self.term + 1, self.log.last_index(), self.log.last_term()
                )
            )

    def _campaign(self, transfer: bool) -> None:
        self.term += 1
        self.vote = self.id
        self.quiesced = False
        self.role = Role.CANDIDATE
        self.leader = None
        self._leader_match = 0
        self._votes = {self.id: True}
        self.election_elapsed = 0
        self._randomized_timeout = self._random_timeout()
        self._event("campaign", transfer=transfer)
        if self._tally() == "won":
            self._become_leader()
            return
        for v in sorted(self.membership.voters - {self.id}):
            self._send(
                VoteRequest(
                    self.id, v, self.term, self.log.last_index(), self.log.last_term(), transfer
                )
            )

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.id
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._last_heartbeat = self.ticks
        self.transferee = None
        self.progress = {}
        self._sync_progress()
        # A no-op of the new term: entries of earlier terms commit only under it, and no
        # membership change is accepted before it commits (the single-server change fix).
        noop = Entry(self.log.last_index() + 1, self.term, EntryKind.NOOP)
        self.pending_conf_index = noop.index
        self._event("elected", last_index=self.log.last_index())
        self._append_as_leader([noop])

    def _tally(self) -> Literal["won", "lost", "pending"]:
        voters = self.membership.voters
        need = len(voters) // 2 + 1
        granted = sum(1 for v in voters if self._votes.get(v) is True)
        rejected = sum(1 for v in voters if self._votes.get(v) is False)
        if granted >= need:
            return "won"
        if rejected >= need:
            return "lost"
        return "pending"

    # ===================================================================== elections
    def _on_pre_vote_request(self, m: PreVoteRequest) -> None:
        grant = (
            m.term > self.term
            and not self._in_lease()
            and self.log.is_up_to_date(m.last_index, m.last_term)
        )
        self._send(PreVoteResponse(self.id, m.src, m.term if grant else self.term, grant))

    def _on_vote_request(self, m: VoteRequest) -> None:
        can_vote = self.vote == m.src or (self.vote is None and self.leader is None)
        grant = can_vote and self.log.is_up_to_date(m.last_index, m.last_term)
        if grant:
            self.vote = m.src
            self.election_elapsed = 0
        self._send(VoteResponse(self.id, m.src, self.term, grant))

    def _on_pre_vote_response(self, m: PreVoteResponse) -> None:
        if self.role != Role.PRE_CANDIDATE:
            return
        if m.granted and m.term != self.term + 1:
            return
        if m.src not in self.membership.voters:
            return  # counts for nothing, and any name could be sent: none is kept
        self._votes[m.src] = m.granted
        result = self._tally()
        if result == "won":
            self._campaign(transfer=False)
        elif result == "lost":
            self._become_follower(self.term, None)

    def _on_vote_response(self, m: VoteResponse) -> None:
        if self.role != Role.CANDIDATE or m.src not in self.membership.voters:
            return
        self._votes[m.src] = m.granted
        result = self._tally()
        if result == "won":
            self._become_leader()
        elif result == "lost":
            self._become_follower(self.term, None)

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        if self.role != Role.LEADER and self._promotable():
            self._event("transfer_received", src=m.src)
            self._campaign(transfer=True)

    # ===================================================================== follower side
    def _accept_leader(self, m: AppendRequest | HeartbeatRequest | InstallSnapshot) -> bool:
        if self.role == Role.LEADER:
            # Impossible between correct peers (one leader per term); a confused or forged
            # peer must not take this partition down, so the message is refused and reported.
            self._count_rejected("leader message from another node in this leader's term")
            self._event("conflicting_leader", src=m.src, reason=f"{m.src} claims term {m.term}")
            return False
        if self.role != Role.FOLLOWER:
            self._become_follower(m.term, m.src)
        self.leader = m.src
        self.election_elapsed = 0
        return True

    def _on_append(self, m: AppendRequest) -> None:
        if not self._accept_leader(m):
            return
        result = self.log.maybe_append(m.prev_index, m.prev_term, m.entries)
        if result is None:
            hint_index, hint_term = self.log.find_conflict_by_term(
                min(m.prev_index, self.log.last_index()), m.prev_term
            )
            self._event(
                "log_mismatch", leader=m.src, prev_index=m.prev_index, hint_index=hint_index
            )
            self._send(
                AppendResponse(
                    self.id,
                    m.src,
                    self.term,
                    False,
                    m.prev_index,
                    hint_index,
                    hint_term,
                    self.log.committed,
                )
            )
            return
        last_new, written = result
        if written:
            self._config_truncated_from(written)
            for e in m.entries[written - m.entries[0].index :]:
                if e.kind == EntryKind.CONFIG:
                    self._config_appended(e)
            if written <= self.log.storage.last_index():
                self._event("truncated", from_index=written)
        self._leader_match = max(self._leader_match, last_new)
        self.log.commit_to(min(m.commit, last_new))
        self._send(
            AppendResponse(self.id, m.src, self.term, True, last_new, commit=self.log.committed)
        )

    def _on_heartbeat(self, m: HeartbeatRequest) -> None:
        if not self._accept_leader(m):
            return
        if self.log.last_term() == m.term:
            # Only this term's leader makes entries of its term, so by Log Matching this log is
            # the leader's up to its last entry. A follower restarted since it matched (which it
            # forgot) then learns the commit here: an idle leader sends it no append to match.
            self._leader_match = max(self._leader_match, self.log.last_index())
        self.log.commit_to(min(m.commit, self._leader_match))
        if m.quiesce:
            # Only with every entry the leader has (its commit is its last index): a follower
            # behind keeps its timer and is woken by the next append.
            self.quiesced = self._leader_match >= m.commit and self.log.committed >= m.commit
            return
        self._send(HeartbeatResponse(self.id, m.src, self.term, m.ctx))

    def _on_install_snapshot(self, m: InstallSnapshot) -> None:
        if not self._accept_leader(m):
            return
        meta = m.meta
        if meta.index <= self.log.committed:
            self._event("snapshot_not_needed", index=meta.index, commit=self.log.committed)
            index = self.log.committed
        elif self.log.term_or_none(meta.index) == meta.term:
            # The log already holds the snapshot's last entry: keep it, just commit up to it.
            self._leader_match = max(self._leader_match, meta.index)
            self.log.commit_to(meta.index)
            index = meta.index
        else:
            self.log.restore(meta)
            self._config_history = [(meta.index, meta.membership)]
            self.membership = meta.membership
            self._leader_match = meta.index
            self._event("snapshot_installed", index=meta.index, term=meta.term)
            index = meta.index
        self._send(
            AppendResponse(self.id, m.src, self.term, True, index, commit=self.log.committed)
        )

    # ===================================================================== leader side
    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.transferee is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= self.cfg.election_ticks:
                self._event("transfer_aborted", target=self.transferee)
                self.transferee = None
        if self.election_elapsed >= self.cfg.election_ticks:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None, reason="check_quorum: no quorum heard from")
                return
            for pr in self.progress.values():
                pr.recent_active = False
        if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            if self._maybe_quiesce():
                return
            since, self._last_heartbeat = self._last_heartbeat, self.ticks
            for node, pr in self.progress.items():
                busy, pr.appended = pr.appended, False
                if busy and self._answering_appends(pr, since):
                    continue
                commit = min(pr.match, self.log.committed)
                self._send(HeartbeatRequest(self.id, node, self.term, commit))
                # The heartbeat tells the mark as an append would: `tell_commit` below need
                # not send a commit-only append for it in the same tick.
                pr.commit_sent = max(pr.commit_sent, commit)
        for node, pr in self.progress.items():
            if pr.state == ProgressState.SNAPSHOT and self.ticks >= pr.snapshot_retry_at:
                self._request_snapshot(node, pr)
        self.tell_commit()  # at the latest one tick after a commit, when no append carried it

    def _answering_appends(self, pr: Progress, since: int) -> bool:
        """Whether a follower needs no heartbeat: live appends went to it since the last one
        and it answered in that time. The appends did what a heartbeat does (its election timer
        reset, the mark told, check-quorum fed by the answers); a follower that stops answering
        gets heartbeats again at once, and one being repaired (backfill) keeps them throughout.
        Under load over many partitions these heartbeats and their answers were about one
        message in five (bench/partitions.py)."""
        return (
            pr.state == ProgressState.REPLICATE
            and not pr.backfilling
            and pr.last_response_tick >= since
            and not self._reads
        )

    def _quorum_active(self) -> bool:
        voters = self.membership.voters
        active = sum(
            1
            for v in voters
            if v == self.id or (v in self.progress and self.progress[v].recent_active)
        )
        return active >= len(voters) // 2 + 1

    def _check_can_propose(self) -> None:
        if self.role != Role.LEADER:
            raise NotLeader(self.leader)
        if self.transferee is not None:
            raise ProposalRefused(f"leadership transfer to {self.transferee} is in progress")

    def _append_as_leader(self, entries: list[Entry]) -> None:
        self.log.append(entries)
        for e in entries:
            if e.kind == EntryKind.CONFIG:
                self._config_appended(e)
        self._needs_broadcast = True

    def _self_match(self) -> int:
        return self.log.stable_index()

    def _maybe_commit(self) -> bool:
        voters = self.membership.voters
        matches = sorted(
            (self._self_match() if v == self.id else self.progress[v].match for v in voters),
            reverse=True,
        )
        index = matches[len(matches) // 2]
        if index > self.log.committed and self._may_commit_at(index):
            self.log.commit_to(index)
            if self._reads_waiting_commit and self.log.term(index) == self.term:
                waiting, self._reads_waiting_commit = self._reads_waiting_commit, []
                for rid in waiting:
                    self._start_read(rid)
            return True
        return False

    def _may_commit_at(self, index: int) -> bool:
        """Raft's rule (paper, 5.4.2): only an entry of the leader's own term is committed by
        counting replicas; earlier ones commit with it."""
        return self.log.term(index) == self.term

    def commit_untold(self) -> bool:
        """Whether `tell_commit` would send something now: a live follower (replicating, with
        room in its window) has not been told the current high-water mark."""
        return self.role == Role.LEADER and any(
            pr.commit_sent < self.log.committed
            and pr.state == ProgressState.REPLICATE
            and len(pr.inflight) < self.cfg.max_inflight_appends
            for pr in self.progress.values()
        )

    def tell_commit(self) -> None:
        """Tell live followers the high-water mark they have not heard yet (a commit-only
        append, or the next entries when there are some).

        A commit does not send anything by itself: the next append to a follower carries the new
        mark, so under load no message is spent on it. The driver calls this once it has been
        idle for a moment after a commit, and every leader tick calls it, so a follower's mark
        trails the leader's by at most that moment (one tick when the driver never calls it).
        """
        if self.role != Role.LEADER:
            return
        for node, pr in self.progress.items():
            if pr.state == ProgressState.REPLICATE and pr.commit_sent < self.log.committed:
                self._send_append(node, send_empty=True)

    def _broadcast_append(self) -> None:
        last = self.log.last_index()
        for node, pr in self.progress.items():
            self._send_append(node, send_empty=True)
            # More only while entries are left to send: past `last` the next call would find
            # nothing (it was half of a 16-partition leader's `_send_append` calls).
            while pr.next <= last and self._send_append(node):
                pass

    def _send_append(self, node: str, send_empty: bool = False) -> bool:
        """Send the next anchored append to `node` if its progress allows. Returns whether an
        append carrying entries went out in the live pipeline (so the caller may send more)."""
        pr = self.progress[node]
        state = pr.state
        if state == ProgressState.REPLICATE:
            if len(pr.inflight) >= self.cfg.max_inflight_appends:
                return False
            if pr.next > self.log.last_index() and (
                not send_empty or pr.commit_sent >= self.log.committed
            ):
                # Sent up to the last entry, and no commit-only append asked for: what the
                # path below would conclude after reading terms and lags. Most calls end here
                # (one per answer received), a tenth of a 16-partition round in the core.
                return False
        elif state == ProgressState.SNAPSHOT or pr.probe_sent:
            return False
        if pr.next < self.log.first_index():
            self._enter_snapshot(node, pr)
            return False
        prev = pr.next - 1
        prev_term = self.log.term(prev)
        last = self.log.last_index()
        commit = self.log.committed
        lag = pr.lag(commit)
        backfill = lag is not None and lag > self.cfg.backfill_threshold
        if backfill:
            if pr.state == ProgressState.REPLICATE and pr.inflight:
                return False  # one bounded round at a time; heartbeats continue meanwhile
            upto = commit if commit > prev else last  # rounds carry committed entries
            hi = min(upto, prev + self.cfg.max_backfill_entries_per_round)
        else:
            hi = min(last, prev + self.cfg.max_entries_per_append)
        if hi <= prev and pr.state == ProgressState.REPLICATE:
            if send_empty and pr.commit_sent < commit:
                pr.commit_sent = commit
                pr.appended = True
                self._send(AppendRequest(self.id, node, self.term, prev, prev_term, (), commit))
            return False
        entries = within_bytes(self.log.entries(prev + 1, hi + 1), self.cfg.max_append_bytes)
        if entries:
            hi = entries[-1].index
        self._send(
            AppendRequest(self.id, node, self.term, prev, prev_term, entries, commit, backfill)
        )
        pr.appended = True
        pr.commit_sent = commit
        pr.backfilling = backfill
        if backfill and entries:
            pr.backfill_rounds += 1
            pr.backfill_entries += len(entries)
            self._event("backfill_round", follower=node, first=entries[0].index, last=hi, lag=lag)
        if pr.state == ProgressState.PROBE:
            pr.probe_sent = True
            return False
        pr.next = hi + 1
        pr.inflight.append(hi)
        return bool(entries) and not backfill

    def _responding(self, m: AppendResponse | HeartbeatResponse) -> Progress | None:
        """The progress of a follower that answered this leader; marks it responsive."""
        pr = self.progress.get(m.src) if self.role == Role.LEADER else None
        if pr is not None:
            pr.recent_active = True
            pr.last_response_tick = self.ticks
        return pr

    def _on_append_response(self, m: AppendResponse) -> None:
        if m.success and m.index > self.log.last_index() and self.role == Role.LEADER:
            # A follower of this term cannot hold more than its leader sent: a confused or
            # forged answer. Counting it as a match would offer the quorum an entry that
            # does not exist; it is refused and reported, as a malformed message is.
            self._count_rejected("answer beyond the leader's log")
            self._event(
                "message_rejected",
                src=m.src,
                reason=f"index: {m.index} is beyond this leader's last index "
                f"{self.log.last_index()}",
            )
            return
        pr = self._responding(m)
        if pr is None:
            return
        pr.known = True
        pr.follower_commit = m.commit
        if not m.success:
            next_probe = m.hint_index
            if m.hint_term > 0:
                next_probe, _ = self.log.find_conflict_by_term(m.hint_index, m.hint_term)
            if pr.maybe_decrease_to(m.index, next_probe):
                self._event("log_mismatch_backoff", follower=m.src, next=pr.next)
                if pr.state == ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.src)
            return
        updated = pr.maybe_update(m.index)
        if updated:
            pr.last_progress_tick = self.ticks
        if pr.state == ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state == ProgressState.SNAPSHOT and (
            pr.match >= pr.pending_snapshot or pr.match + 1 >= self.log.first_index()
        ):
            pr.snapshots_installed += 1
            pr.catching_up = True
            self._event("snapshot_caught_up", follower=m.src, match=pr.match)
            pr.become_probe()
            pr.become_replicate()
        if pr.catching_up and self.log.committed - pr.match <= self.cfg.backfill_threshold:
            pr.catching_up = False
        if updated:
            self._maybe_commit()  # followers hear of it with the next append (`tell_commit`)
        while self._send_append(m.src):
            pass
        if m.src == self.transferee and pr.match == self.log.last_index():
            self._send(TimeoutNow(self.id, m.src, self.term))

    def _on_heartbeat_response(self, m: HeartbeatResponse) -> None:
        pr = self._responding(m)
        if pr is None:
            return
        if m.ctx and self._reads:
            self._confirm_reads(m.src, m.ctx)
        if pr.state == ProgressState.PROBE:
            pr.probe_sent = False
        elif (
            pr.state == ProgressState.REPLICATE
            and pr.inflight
            and self.ticks - pr.last_progress_tick > max(2, self.cfg.election_ticks // 2)
        ):
            # Appends in flight but no progress for a while: assume they were lost, probe again.
            pr.become_probe()
        if pr.match < self.log.last_index() or pr.state == ProgressState.PROBE:
            self._send_append(m.src)

    def _enter_snapshot(self, node: str, pr: Progress) -> None:
        required = self.log.first_index() - 1
        pr.become_snapshot(required)
        self._event("snapshot_required", follower=node, next=pr.next, floor=required + 1)
        self._request_snapshot(node, pr)

    def _request_snapshot(self, node: str, pr: Progress) -> None:
        pr.snapshot_attempt += 1
        pr.snapshot_retry_at = self.ticks + self._snapshot_backoff(pr.snapshot_attempt)
        self._snapshot_requests.append(
            SnapshotRequest(node, pr.pending_snapshot, self.term, pr.snapshot_attempt)
        )

    def _snapshot_backoff(self, attempt: int) -> int:
        backoff = self.cfg.snapshot_retry_ticks * (2 ** max(attempt - 1, 0))
        return int(min(backoff, self.cfg.snapshot_retry_max_ticks))

    # ===================================================================== membership
    def _config_appended(self, e: Entry) -> None:
        self._config_history.append((e.index, Membership.decode(e.data)))
        self._set_membership(self._config_history[-1][1])

    def _config_truncated_from(self, index: int) -> None:
        if self._config_history[-1][0] < index:
            return
        while len(self._config_history) > 1 and self._config_history[-1][0] >= index:
            self._config_history.pop()
        self._set_membership(self._config_history[-1][1])

    def _set_membership(self, m: Membership) -> None:
        if m == self.membership:
            return
        self._event("membership_changed", membership=m.describe())
        self.membership = m
        if self.role == Role.LEADER:
            self._sync_progress()

    def _sync_progress(self) -> None:
        m = self.membership
        for node in sorted(m.members - {self.id}):
            pr = self.progress.get(node)
            if pr is None:
                pr = Progress(next=self.log.last_index() + 1)
                pr.last_progress_tick = self.ticks
                self.progress[node] = pr
            pr.is_learner = node in m.learners
        for node in list(self.progress):
            if node not in m.members:
                del self.progress[node]

    # ===================================================================== plumbing
    def _hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    def _event(self, kind: str, **detail: Any) -> None:
        self._events.append(Event(kind, self.id, self.term, detail))

    def _count_rejected(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
