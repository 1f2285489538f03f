"""The reconciler: from what is observed to the next safe step, one step per pass.

`decide` is a pure function of the spec, the previous status (the only memory the operator has),
what the runtime observed and the time; it returns the next status, one action and the events
to emit. The runtime carries the action out and `record_outcome` folds the result back into the
status. Nothing here does I/O, so every decision is unit-tested table-style.

The order of concerns in a pass, the first that asks for something wins:
bootstrap; pods to (re)create; leaders; peer addresses; members being removed; snapshot installs
for members in SnapshotRequired; a joining member added as a learner; a learner's promotion
window; scale up; scale down; rolling restart of members on an old configuration.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from raftlog.operator.actions import (
    Action,
    ChangeMembership,
    CreateMembers,
    DeleteMember,
    Event,
    InstallSnapshot,
    Outcome,
    RestartMember,
    SyncPeers,
    TransferLeader,
    Wait,
    describe,
)
from raftlog.operator.models import (
    Condition,
    MemberPartition,
    MemberStatus,
    Promotion,
    RaftClusterSpec,
    RaftClusterStatus,
    SnapshotInstall,
)
from raftlog.operator.observed import Observed, PartitionView

INSTALL_MAX_ATTEMPTS = 5
INSTALL_BACKOFF_S = 2.0  # doubled per failed attempt
INSTALL_BACKOFF_MAX_S = 60.0
INSTALL_COOLDOWN_S = 300.0  # after a failed install, before another is scheduled
INSTALL_HISTORY = 10  # finished installs kept in status


def member_name(cluster: str, ordinal: int) -> str:
    return f"{cluster}-{ordinal}"


def config_hash(spec: RaftClusterSpec) -> str:
    """What a member's pod is launched with; a change rolls the members one at a time.

    `replicas` is left out (scaling does not restart anybody), and so is the volume itself (it
    is not resized or moved by restarting its pod)."""
    volume = {"size", "storage_class_name", "reclaim_policy"}
    launch = spec.model_dump(mode="json", exclude={"replicas": True, "storage": volume})
    return hashlib.sha256(json.dumps(launch, sort_keys=True).encode()).hexdigest()[:16]


def majority(n: int) -> int:
    return n // 2 + 1


@dataclass
class Plan:
    action: Action | None
    status: RaftClusterStatus
    events: list[Event] = field(default_factory=list)


@dataclass
class _Pass:
    name: str
    spec: RaftClusterSpec
    st: RaftClusterStatus
    obs: Observed
    now: float
    want_hash: str
    leaders: dict[int, PartitionView | None]
    events: list[Event] = field(default_factory=list)
    lagging: dict[str, str] = field(default_factory=dict)  # learner -> why its window is shut
    windows_tracked: bool = False

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def ready(self, name: str) -> bool:
        o = self.obs.members.get(name)
        return o is not None and o.pod == "running" and o.node is not None

    def running(self, name: str) -> bool:
        o = self.obs.members.get(name)
        return o is not None and o.pod == "running"

    def url(self, name: str) -> str | None:
        return self.obs.urls.get(name)


def decide(
    name: str,
    spec: RaftClusterSpec,
    previous: RaftClusterStatus,
    obs: Observed,
    now: float,
    generation: int | None = None,
) -> Plan:
    st = previous.model_copy(deep=True)
    st.observed_generation = generation
    leaders = {p: obs.leader_view(p) for p in range(obs.partitions_served(spec.partitions))}
    ps = _Pass(name, spec, st, obs, now, config_hash(spec), leaders)
    _refresh_members(ps)
    action = _next_action(ps)
    _promotion_windows(ps)  # when a step before the promotions acted (once a pass either way)
    _summarize(ps, action)
    return Plan(action, st, ps.events)


def _next_action(ps: _Pass) -> Action | None:
    for step in (
        _bootstrap,
        _recreate_pods,
        _leaders,
        _partitions_not_lowered,
        _peers,
        _removals,
        _snapshot_installs,
        _scale_down,  # before the learners: a member no longer wanted is not promoted first
        _joining,
        _promotions,
        _scale_up,
        _rolling_restart,
    ):
        action = step(ps)
        if action is not None:
            return action
    return None


# ===================================================================== the steps
def _bootstrap(ps: _Pass) -> Action | None:
    if ps.st.members:
        return None
    n = ps.spec.replicas
    ps.st.members = [
        MemberStatus(name=member_name(ps.name, i), ordinal=i, role="voter", bootstrap=True)
        for i in range(n)
    ]
    ps.st.next_ordinal = n
    ps.event("Bootstrapping", f"creating {n} initial voters, {ps.spec.partitions} partitions")
    return CreateMembers(tuple(m.name for m in ps.st.members), join=False)


def _recreate_pods(ps: _Pass) -> Action | None:
    gone = [
        m
        for m in ps.st.members
        if m.role != "removing" and _pod(ps, m.name) in ("missing", "failed")
    ]
    if not gone:
        return None
    if not ps.st.bootstrapped:
        # Until the initial voters have elected, a member without data may still bootstrap.
        return CreateMembers(tuple(m.name for m in gone), join=False)
    for m in gone:
        o = ps.obs.members.get(m.name)
        if (o is not None and o.volume) or m.role == "joining":
            # Its data is there (or it never had any): the same member comes back. It starts
            # with `--join` so that an empty volume can never bootstrap a second cluster.
            return CreateMembers((m.name,), join=True)
        m.role = "removing"
        ps.event(
            "MemberLost",
            f"{m.name} lost its pod and its volume; it is removed and a new member replaces it",
            warning=True,
        )
    return None


def _leaders(ps: _Pass) -> Action | None:
    missing = [p for p, lv in ps.leaders.items() if lv is None]
    if not ps.st.bootstrapped:
        if missing:
            return Wait(f"the initial voters have not elected a leader of partitions {missing}")
        ps.st.bootstrapped = True
        ps.event("Bootstrapped", "every partition has elected a leader")
    if missing:
        return Wait(f"no leader for partitions {missing}")
    return None


def _partitions_not_lowered(ps: _Pass) -> Action | None:
    """A lower spec.partitions is refused (the CRD refuses it too; a local manifest is not
    checked by an API server): members restarted with fewer would drop partitions with their
    records."""
    held = max((len(o.node.partitions) for o in ps.obs.members.values() if o.node), default=0)
    if held <= ps.spec.partitions:
        return None
    return Wait(
        f"spec.partitions is {ps.spec.partitions} but the members hold {held} partitions: "
        f"lowering is refused (it would drop partitions with their records); set it back to "
        f"{held} or more"
    )


def _peers(ps: _Pass) -> Action | None:
    want = {m.name: u for m in ps.st.members if (u := ps.url(m.name)) is not None}
    for m in ps.st.members:
        o = ps.obs.members.get(m.name)
        if o is None or o.node is None:
            continue
        if any(o.node.peers.get(n) != u for n, u in want.items()):
            return SyncPeers(m.name, tuple(sorted(want.items())))
    return None


def _removals(ps: _Pass) -> Action | None:
    for m in ps.st.members:
        if m.role == "removing":
            return _remove(ps, m)
    return None


def _remove(ps: _Pass, m: MemberStatus) -> Action:
    for p, lv in sorted(ps.leaders.items()):
        assert lv is not None  # _leaders waited otherwise
        if lv.leader == m.name:
            target = _successor(ps, lv, exclude=m.name)
            if target is None:
                return Wait(f"partition {p}: no caught-up voter to take over from {m.name}")
            return TransferLeader(p, m.name, target)
        if m.name in lv.voters:
            after = lv.voters - {m.name}
            live = [v for v in after if ps.ready(v)]
            if not after or len(live) < majority(len(after)):
                return Wait(
                    f"partition {p}: removing {m.name} would leave {len(live)} ready of "
                    f"{len(after)} voters, below a majority"
                )
            return ChangeMembership(p, lv.leader or "", "remove", m.name)
        if m.name in lv.learners:
            return ChangeMembership(p, lv.leader or "", "remove", m.name)
    return DeleteMember(m.name, delete_volume=ps.spec.storage.reclaim_policy == "Delete")


def _snapshot_installs(ps: _Pass) -> Action | None:
    names = {m.name for m in ps.st.members}
    pending = {(i.member, i.partition): i for i in ps.st.snapshot_installs if i.state == "pending"}
    due: list[tuple[SnapshotInstall, PartitionView]] = []
    for p, lv in sorted(ps.leaders.items()):
        assert lv is not None
        for f in lv.followers.values():
            if not f.snapshot_required or f.name not in names:
                continue
            inst = pending.pop((f.name, p), None)
            if inst is None:
                if _cooling_down(ps, f.name, p):
                    continue
                source = _snapshot_source(ps, lv, f.name)
                inst = SnapshotInstall(
                    member=f.name,
                    partition=p,
                    source=source,
                    started_at=ps.now,
                    next_attempt_at=ps.now,
                )
                ps.st.snapshot_installs.insert(0, inst)
                ps.event(
                    "SnapshotRequired",
                    f"{f.name} needs entries of partition {p} below the compaction floor "
                    f"{lv.compaction_floor}; a snapshot install from {source} is scheduled",
                )
            if inst.attempts >= INSTALL_MAX_ATTEMPTS:
                _finish(ps, inst, "failed")
                ps.event(
                    "SnapshotInstallFailed",
                    f"partition {p}: installing a snapshot on {f.name} failed "
                    f"{inst.attempts} times: {inst.last_error}",
                    warning=True,
                )
                continue
            due.append((inst, lv))
    # Pending installs whose target no longer needs one: done (by the install or otherwise).
    for inst in pending.values():
        _finish(ps, inst, "installed")
        inst.detail = inst.detail or "the member no longer needs a snapshot"
        ps.event("SnapshotInstalled", f"partition {inst.partition}: {inst.member} caught up")
    for inst, lv in due:
        if ps.now >= inst.next_attempt_at:
            return InstallSnapshot(inst.partition, lv.leader or "", inst.member, inst.source)
    if due:
        inst = due[0][0]
        return Wait(
            f"partition {inst.partition}: next snapshot install attempt on {inst.member} in "
            f"{inst.next_attempt_at - ps.now:.0f} s"
        )
    return None


def _joining(ps: _Pass) -> Action | None:
    for m in ps.st.members:
        if m.role != "joining":
            continue
        if not ps.running(m.name):
            return Wait(f"{m.name} is starting")
        for p, lv in sorted(ps.leaders.items()):
            assert lv is not None
            if m.name not in lv.voters | lv.learners:
                return ChangeMembership(p, lv.leader or "", "add_learner", m.name)
        m.role = "learner"
        m.promotion = Promotion(window_seconds=ps.spec.raft.learner_promotion_stable_window)
        ps.event("LearnerAdded", f"{m.name} is a learner of every partition; catching up")
    return None


def _promotion_windows(ps: _Pass) -> None:
    """Every pass, whichever step acts: a learner's window runs while its lag is within
    learnerPromotionLag in every partition, and starts again on an excursion (a lag above it,
    or unknown). Kept apart from `_promotions`, which an earlier step (a snapshot install, a
    removal) may pre-empt: an excursion meanwhile still restarts the window."""
    if ps.windows_tracked:
        return
    ps.windows_tracked = True
    limit = ps.spec.raft.learner_promotion_lag
    for m in ps.st.members:
        if m.role != "learner":
            continue
        pr = m.promotion or Promotion(window_seconds=ps.spec.raft.learner_promotion_stable_window)
        m.promotion = pr
        pr.window_seconds = ps.spec.raft.learner_promotion_stable_window
        lags = {p: _lag(lv, m.name) for p, lv in sorted(ps.leaders.items())}
        known = [lag for lag in lags.values() if lag is not None]
        unknown = [p for p, lag in lags.items() if lag is None]
        # A learner that stopped answering (a paused process) shows the lag it had: it must
        # not be promoted on that (a voter that does not answer weakens the quorum).
        silent = [
            p
            for p, lv in sorted(ps.leaders.items())
            if lv is not None
            and (f := lv.followers.get(m.name)) is not None
            and not f.recent_active
        ]
        pr.max_lag = max(known) if known else None
        if unknown or silent or any(lag > limit for lag in known):
            why = (
                f"lag unknown in partitions {unknown}"
                if unknown
                else f"not answering the leader of partitions {silent}"
                if silent
                else f"lags by {pr.max_lag}, more than learnerPromotionLag={limit}"
            )
            if pr.window_started_at is not None:
                pr.restarts += 1
                ps.event(
                    "PromotionWindowRestarted",
                    f"{m.name}: {why}; its promotion window starts again",
                )
            pr.window_started_at, pr.elapsed_seconds = None, 0.0
            ps.lagging[m.name] = why
            continue
        if pr.window_started_at is None:
            pr.window_started_at = ps.now
        pr.elapsed_seconds = round(ps.now - pr.window_started_at, 3)


def _promotions(ps: _Pass) -> Action | None:
    _promotion_windows(ps)
    for m in ps.st.members:
        if m.role != "learner":
            continue
        pr = m.promotion
        assert pr is not None  # `_promotion_windows` gave every learner one
        if m.name in ps.lagging:
            return Wait(f"{m.name}: {ps.lagging[m.name]}")
        if pr.elapsed_seconds < pr.window_seconds:
            return Wait(
                f"{m.name} within learnerPromotionLag for {pr.elapsed_seconds:.1f} of "
                f"{pr.window_seconds:g} s"
            )
        for p, lv in sorted(ps.leaders.items()):
            assert lv is not None
            if m.name in lv.learners:
                return ChangeMembership(p, lv.leader or "", "promote", m.name)
        m.role, m.promotion = "voter", None
        ps.event("Promoted", f"{m.name} is a voter of every partition")
    return None


def _scale_up(ps: _Pass) -> Action | None:
    active = [m for m in ps.st.members if m.role != "removing"]
    if len(active) >= ps.spec.replicas:
        return None
    unready = [m.name for m in active if not ps.ready(m.name)]
    if unready:
        return Wait(f"scaling up waits for {', '.join(unready)} to be ready")
    ordinal = ps.st.next_ordinal
    new = MemberStatus(name=member_name(ps.name, ordinal), ordinal=ordinal, role="joining")
    ps.st.next_ordinal = ordinal + 1
    ps.st.members.append(new)
    ps.event("ScalingUp", f"adding {new.name} ({len(active) + 1} of {ps.spec.replicas})")
    return CreateMembers((new.name,), join=True)


def _scale_down(ps: _Pass) -> Action | None:
    active = [m for m in ps.st.members if m.role != "removing"]
    if len(active) <= ps.spec.replicas:
        return None
    # The newest first: a learner still joining goes before any voter.
    victim = max(active, key=lambda m: m.ordinal)
    victim.role = "removing"
    ps.event("ScalingDown", f"removing {victim.name} ({len(active) - 1} of the members left)")
    return _remove(ps, victim)


def _rolling_restart(ps: _Pass) -> Action | None:
    stale = [
        m
        for m in ps.st.members
        if (o := ps.obs.members.get(m.name)) is not None
        and o.config_hash is not None
        and o.config_hash != ps.want_hash
    ]
    if not stale:
        return None
    unready = [m.name for m in ps.st.members if not ps.ready(m.name)]
    if unready:
        return Wait(f"restart of {stale[0].name} waits for {', '.join(unready)} to be ready")
    threshold = ps.spec.raft.backfill_threshold
    for p, lv in sorted(ps.leaders.items()):
        assert lv is not None
        behind = [f.name for f in lv.followers.values() if f.lag is None or f.lag > threshold]
        if behind:
            return Wait(f"restart waits: {', '.join(behind)} behind in partition {p}")
    leading = {lv.leader for lv in ps.leaders.values() if lv is not None}
    # Followers first; a leader last, and only after its leadership moved away.
    target = min(stale, key=lambda m: (m.name in leading, m.ordinal))
    for p, lv in sorted(ps.leaders.items()):
        assert lv is not None
        if lv.leader == target.name:
            successor = _successor(ps, lv, exclude=target.name)
            if successor is None:
                return Wait(f"partition {p}: no caught-up voter to take over from {target.name}")
            return TransferLeader(p, target.name, successor)
    ps.event("RollingRestart", f"restarting {target.name} with the new configuration")
    return RestartMember(target.name)


# ===================================================================== helpers
def _pod(ps: _Pass, name: str) -> str:
    o = ps.obs.members.get(name)
    return "missing" if o is None else o.pod


def _lag(lv: PartitionView | None, name: str) -> int | None:
    f = lv.followers.get(name) if lv is not None else None
    return f.lag if f is not None else None


def _successor(ps: _Pass, lv: PartitionView, exclude: str) -> str | None:
    """The voter most fit to lead: replicating, responsive, furthest along."""
    fit = [
        f
        for f in lv.followers.values()
        if f.name != exclude
        and not f.learner
        and f.recent_active
        and ps.ready(f.name)
        and f.state == "replicate"
    ]
    if not fit:
        return None
    return max(fit, key=lambda f: (f.match, f.name)).name


def _snapshot_source(ps: _Pass, lv: PartitionView, target: str) -> str:
    """RATIS-2428: an eligible follower (responsive, not itself in need, holding every entry
    the target needs), ranked by in-sync then match; else the leader. The leader re-checks."""
    if ps.spec.snapshot_source == "leader":
        return "leader"
    required = lv.compaction_floor - 1
    eligible = [
        f
        for f in lv.followers.values()
        if f.name != target
        and f.recent_active
        and not f.snapshot_required
        and f.match >= required
        and ps.ready(f.name)
    ]
    if not eligible:
        return "leader"
    best = max(eligible, key=lambda f: (f.state == "replicate", f.match, f.name))
    return best.name


def _cooling_down(ps: _Pass, member: str, partition: int) -> bool:
    for i in ps.st.snapshot_installs:
        if i.member == member and i.partition == partition and i.state == "failed":
            return i.finished_at is not None and ps.now - i.finished_at < INSTALL_COOLDOWN_S
    return False


def _finish(ps: _Pass, inst: SnapshotInstall, state: str) -> None:
    inst.state = "installed" if state == "installed" else "failed"
    inst.finished_at = ps.now
    pending = [i for i in ps.st.snapshot_installs if i.state == "pending"]
    done = [i for i in ps.st.snapshot_installs if i.state != "pending"]
    done.sort(key=lambda i: i.finished_at or 0.0, reverse=True)
    ps.st.snapshot_installs = pending + done[:INSTALL_HISTORY]


def _refresh_members(ps: _Pass) -> None:
    for m in ps.st.members:
        m.ready = ps.ready(m.name)
        m.partitions = [_member_partition(p, lv, m.name) for p, lv in sorted(ps.leaders.items())]
    ps.st.leaders = {str(p): lv.leader for p, lv in ps.leaders.items() if lv and lv.leader}
    names = sorted(set(ps.st.leaders.values()))
    ps.st.leader_summary = ",".join(names) if len(names) <= 3 else f"{len(names)} members"


def _member_partition(p: int, lv: PartitionView | None, name: str) -> MemberPartition:
    if lv is not None and lv.leader == name:
        return MemberPartition(partition=p, lag=0, state="leader")
    f = lv.followers.get(name) if lv is not None else None
    if f is None:
        return MemberPartition(partition=p)
    return MemberPartition(
        partition=p, lag=f.lag, state=f.state, snapshot_required=f.snapshot_required
    )


def _summarize(ps: _Pass, action: Action | None) -> None:
    st = ps.st
    active = [m for m in st.members if m.role != "removing"]
    st.replicas = len(active)
    st.ready_replicas = sum(1 for m in active if m.ready)
    st.selector = f"raftlog.dev/cluster={ps.name}"
    st.last_action = describe(action)
    led = [p for p, lv in ps.leaders.items() if lv is not None]
    voters = [m for m in active if m.role == "voter"]
    quorum = sum(1 for m in voters if m.ready) >= majority(max(len(voters), 1))
    available = st.bootstrapped and len(led) == len(ps.leaders) and quorum
    failed = [i for i in st.snapshot_installs if i.state == "failed" and _recent(ps, i)]
    unready = [m.name for m in active if not m.ready]
    _condition(
        ps,
        "Available",
        available,
        "QuorumAvailable" if available else "NoQuorum" if st.bootstrapped else "Bootstrapping",
        f"{len(led)} of {len(ps.leaders)} partitions have a leader; "
        f"{st.ready_replicas} of {len(active)} members ready"
        + (
            f"; partitions {len(ps.leaders)}..{ps.spec.partitions - 1} start once every "
            "member restarted with the new count"
            if len(ps.leaders) < ps.spec.partitions
            else ""
        ),
    )
    _condition(ps, "Progressing", action is not None, _reason(action), describe(action))
    degraded_msg = []
    if unready:
        degraded_msg.append(f"not ready: {', '.join(unready)}")
    if failed:
        degraded_msg.append(
            "snapshot install failed: " + ", ".join(f"{i.member}/p{i.partition}" for i in failed)
        )
    _condition(
        ps,
        "Degraded",
        bool(degraded_msg),
        ("SnapshotInstallFailed" if failed else "MembersNotReady")
        if degraded_msg
        else "AsExpected",
        "; ".join(degraded_msg),
    )
    if not st.bootstrapped:
        st.phase = "Bootstrapping"
    elif not available:
        st.phase = "Unavailable"
    elif any(m.role in ("joining", "learner", "removing") for m in st.members) or (
        len(active) != ps.spec.replicas
    ):
        st.phase = "Scaling"
    elif action is not None and not isinstance(action, Wait):
        st.phase = "Reconciling"
    elif degraded_msg:
        st.phase = "Degraded"
    else:
        st.phase = "Running"


def _recent(ps: _Pass, i: SnapshotInstall) -> bool:
    return i.finished_at is not None and ps.now - i.finished_at < INSTALL_COOLDOWN_S


def _reason(action: Action | None) -> str:
    return "Steady" if action is None else type(action).__name__


def _condition(ps: _Pass, kind: str, value: bool, reason: str, message: str) -> None:
    status: Literal["True", "False"] = "True" if value else "False"
    when = datetime.fromtimestamp(ps.now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for c in ps.st.conditions:
        if c.type == kind:
            if c.status != status:
                c.status, c.last_transition_time = status, when
            c.reason, c.message = reason, message
            return
    ps.st.conditions.append(
        Condition.model_validate(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": when,
            }
        )
    )


# ===================================================================== outcomes
def record_outcome(
    status: RaftClusterStatus, action: Action, outcome: Outcome, now: float
) -> tuple[RaftClusterStatus, list[Event]]:
    """Fold what came of `action` into the status (the next pass decides from it)."""
    st = status.model_copy(deep=True)
    events: list[Event] = []
    if not outcome.ok and not isinstance(action, Wait):
        events.append(Event("Warning", "StepFailed", f"{describe(action)}: {outcome.detail}"))
    match action:
        case InstallSnapshot(p, _, target, source):
            inst = next(
                (
                    i
                    for i in st.snapshot_installs
                    if i.state == "pending" and i.member == target and i.partition == p
                ),
                None,
            )
            if inst is not None:
                inst.attempts += 1
                if outcome.ok:
                    inst.state, inst.finished_at, inst.detail = "installed", now, outcome.detail
                    inst.last_error = None
                    events.append(
                        Event(
                            "Normal",
                            "SnapshotInstalled",
                            f"partition {p}: snapshot installed on {target} from {source} "
                            f"in {now - inst.started_at:.1f} s ({outcome.detail})",
                        )
                    )
                else:
                    inst.last_error = outcome.detail
                    backoff = min(
                        INSTALL_BACKOFF_S * 2 ** (inst.attempts - 1), INSTALL_BACKOFF_MAX_S
                    )
                    inst.next_attempt_at = now + backoff
        case ChangeMembership(_, _, "promote", member) if not outcome.ok:
            m = st.member(member)
            if m is not None and m.promotion is not None:
                # The leader's own check is the last word: the window starts again.
                m.promotion.window_started_at, m.promotion.elapsed_seconds = None, 0.0
                m.promotion.restarts += 1
                events.append(Event(
                    "Normal", "PromotionWindowRestarted",
                    f"{member}: the leader refused the promotion ({outcome.detail}); its "
                    "promotion window starts again",
                ))  # fmt: skip
        case DeleteMember(name, _) if outcome.ok:
            st.members = [m for m in st.members if m.name != name]
            events.append(Event("Normal", "MemberRemoved", f"{name} left the cluster"))
        case _:
            pass
    return st, events
