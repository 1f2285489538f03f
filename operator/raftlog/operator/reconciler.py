"""The reconciler: from what is observed to the next safe step, one step per pass.

`decide` is a pure function of the spec, the previous status (the only memory the operator has),
what the runtime observed and the time; it returns the next status, one action and the events
to emit. The runtime carries the action out and `record_outcome` folds the result back into the
status. Nothing here does I/O, so every decision is unit-tested table-style.

The order of concerns in a pass, the first that asks for something wins:
a restore's plan; bootstrap; hibernation; pods to (re)create; leaders; peer addresses; backups;
removals cancelled by a raised `replicas`; members being removed; snapshot installs for members
in SnapshotRequired; fencing; a switchover; scale down; a joining member added as a learner; a
learner's promotion window; scale up; volume expansion; rolling restart of members on an old
configuration (or for a restart request). A paused cluster (`controls.PAUSE`) gets no step at
all.
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
    ExpandVolume,
    InstallSnapshot,
    Outcome,
    PlanRestore,
    RestartMember,
    StopMember,
    SyncPeers,
    TakeBackup,
    TransferLeader,
    Wait,
    describe,
)
from raftlog.operator.archive_steps import backups, record_backup, record_restore, restore_plan
from raftlog.operator.cluster_views import ArchiveView, Observed, PartitionView
from raftlog.operator.controls import NONE, Controls
from raftlog.operator.models import (
    ArchiveStatus,
    Condition,
    MemberPartition,
    MemberStatus,
    PartitionArchive,
    Promotion,
    RaftClusterSpec,
    RaftClusterStatus,
    RaftSettings,
    SnapshotInstall,
    Switchover,
    VolumeExpansion,
    quantity,
)
from raftlog.operator.safety import (
    can_serve_snapshot,
    caught_up,
    fit_to_lead,
    has_quorum,
    keeps_majority,
    lowering_refused,
    next_to_remove,
    next_to_restart,
    others_caught_up,
    stays_available,
    within_promotion_lag,
)

# A learner's lag not sampled for longer than its window (at most PROMOTION_UNWATCHED_S, at
# least PROMOTION_GAP_FLOOR_S: passes come every second or so) was not watched: its promotion
# window starts again.
PROMOTION_UNWATCHED_S = 5.0
PROMOTION_GAP_FLOOR_S = 3.0
INSTALL_MAX_ATTEMPTS = 5
INSTALL_BACKOFF_S = 2.0  # doubled per failed attempt
INSTALL_BACKOFF_MAX_S = 60.0
INSTALL_COOLDOWN_S = 300.0  # after a failed install, before another is scheduled
INSTALL_HISTORY = 10  # finished installs kept in status
SWITCHOVER_TIMEOUT_S = 120.0  # a switchover whose target never becomes fit to lead fails
EXPANSION_RETRY_S = 300.0  # after the API server refused a larger claim, before asking again
ARCHIVE_PROBLEMS_SHOWN = 5  # failing partitions named one by one in status.problems
ARCHIVE_ERROR_CHARS = 200  # of a node's archive error, in status.problems


def member_name(cluster: str, ordinal: int) -> str:
    return f"{cluster}-{ordinal}"


def config_hash(spec: RaftClusterSpec, restart: str | None = None) -> str:
    """What a member's pod is launched with; a change rolls the members one at a time.

    `replicas` is left out (scaling does not restart anybody), and so is the volume itself (it
    is not resized or moved by restarting its pod), and so are the Raft settings only the
    operator reads (they never reach a member), and the day-2 controls (fencing, hibernation,
    removals: they stop or remove members, never roll them), nor the restore (read once, at
    creation) and the backup schedule. `restart` (the restartedAt
    annotation) is in: a new value rolls every member once."""
    volume = {"size", "storage_class_name", "reclaim_policy"}
    operator_only = set(RaftSettings.OPERATOR_ONLY)
    launch: dict[str, object] = spec.model_dump(
        mode="json",
        exclude={
            "replicas": True,
            "storage": volume,
            "raft": operator_only,
            "fenced_members": True,
            "hibernate": True,
            "remove_members": True,
            "restore": True,  # read once, when the cluster is created
            "archive": {"backup_interval_minutes"},  # the operator's schedule alone
        },
    )
    if launch.get("archive") is None:
        del launch["archive"]  # a cluster without one keeps the hash it had before the field
    if restart is not None:
        launch["restartedAt"] = restart
    return hashlib.sha256(json.dumps(launch, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Plan:
    action: Action | None
    status: RaftClusterStatus
    events: list[Event] = field(default_factory=list)


@dataclass
class _ClusterPass:
    """One cluster as one pass sees it, and what the pass has found so far. The steps write
    the next status into `status`; the previous one is never changed."""

    name: str
    spec: RaftClusterSpec
    status: RaftClusterStatus
    observed: Observed
    now: float
    wanted_hash: str  # the launch configuration every member should run
    leader_views: dict[int, PartitionView | None]  # partition -> its leader's view, if any
    controls: Controls = NONE
    events: list[Event] = field(default_factory=list)
    lagging: dict[str, str] = field(default_factory=dict)  # learner -> why its window is shut
    windows_tracked: bool = False
    archive_failing: list[int] = field(default_factory=list)  # partitions whose archive fails

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def ready(self, name: str) -> bool:
        """Running, answering, and knowing a leader of every partition served: what the pod's
        readiness probe (`/readyz`) says, so status.readyReplicas and a member's `ready` agree
        with `kubectl get pods`. A member just restarted that has not heard from the leader of
        one partition is not ready yet; during a raise, the partitions not every member holds
        yet are left out (they elect once all do: `Observed.partitions_served`)."""
        seen = self.observed.members.get(name)
        if seen is None or seen.pod != "running" or seen.node is None:
            return False
        parts = seen.node.partitions
        return all(
            (view := parts.get(p)) is not None and view.leader is not None
            for p in range(self.observed.partitions_served(self.spec.partitions))
        )

    def answering(self, name: str) -> bool:
        seen = self.observed.members.get(name)
        return seen is not None and seen.pod == "running" and seen.node is not None

    def stuck(self, name: str) -> str | None:
        """Why the member's pod cannot start by itself (kube.pod_stuck), or None."""
        seen = self.observed.members.get(name)
        return seen.stuck if seen is not None else None

    def running(self, name: str) -> bool:
        seen = self.observed.members.get(name)
        return seen is not None and seen.pod == "running"

    def ready_names(self) -> set[str]:
        return {name for name in self.observed.members if self.ready(name)}

    def stopped_on_purpose(self, m: MemberStatus) -> bool:
        """Fenced, or the whole cluster hibernating: its pod is meant to be down."""
        return m.fenced or self.spec.hibernate

    def url(self, name: str) -> str | None:
        return self.observed.urls.get(name)

    def led_partitions(self) -> list[tuple[int, PartitionView]]:
        """Each partition with its leader's view, in order; only once `_leaders` found them all."""
        views = []
        for partition, leader_view in sorted(self.leader_views.items()):
            assert leader_view is not None  # `_leaders` waited otherwise
            views.append((partition, leader_view))
        return views


def decide(
    name: str,
    spec: RaftClusterSpec,
    previous: RaftClusterStatus,
    observed: Observed,
    now: float,
    generation: int | None = None,
    controls: Controls = NONE,
) -> Plan:
    status = previous.model_copy(deep=True)
    status.observed_generation = generation
    leader_views = {
        p: observed.leader_view(p) for p in range(observed.partitions_served(spec.partitions))
    }
    wanted = config_hash(spec, controls.restart)
    cluster = _ClusterPass(name, spec, status, observed, now, wanted, leader_views, controls)
    _refresh_members(cluster)
    _problems(cluster, previous)
    _archive(cluster, previous)
    action: Action | None = None
    if controls.paused:
        action = None  # nothing is done to a paused cluster; its status still tells what is seen
    else:
        action = _next_action(cluster)
        _promotion_windows(cluster)  # when a step before the promotions acted (once a pass)
        if action is None:
            _restart_done(cluster)
    if isinstance(action, CreateMembers):
        action = CreateMembers(action.names, action.join, cluster.wanted_hash)
    deleting = action if isinstance(action, RestartMember | StopMember | DeleteMember) else None
    if deleting is not None and (m := status.member(deleting.name)) is not None:
        # Saved with the plan, before the pod is deleted: a pass cut short after the delete
        # (a kill, a status conflict) must not take the pod's absence for someone else's doing.
        m.pod_deleted = True
    _summarize(cluster, action, previous)
    return Plan(action, status, cluster.events)


def _next_action(cluster: _ClusterPass) -> Action | None:
    for step in (
        restore_plan,
        _bootstrap,
        _hibernation,
        _unfence,
        _recreate_pods,
        _leaders,
        _partitions_not_lowered,
        _peers,
        backups,
        _cancel_removals,
        _removals,
        _snapshot_installs,
        _fencing,
        _switchover,
        _scale_down,  # before the learners: a member no longer wanted is not promoted first
        _joining,
        _promotions,
        _scale_up,
        _expand_volumes,
        _rolling_restart,
    ):
        action = step(cluster)
        if action is not None:
            return action
    return None


# ===================================================================== the steps
def _bootstrap(cluster: _ClusterPass) -> Action | None:
    if cluster.status.members:
        return None
    replicas = cluster.spec.replicas
    cluster.status.members = [
        MemberStatus(name=member_name(cluster.name, i), ordinal=i, role="voter", bootstrap=True)
        for i in range(replicas)
    ]
    cluster.status.next_ordinal = replicas
    cluster.event(
        "Bootstrapping",
        f"creating {replicas} initial voters, {cluster.spec.partitions} partitions",
    )
    return CreateMembers(tuple(m.name for m in cluster.status.members), join=False)


def _needed_for_quorum(cluster: _ClusterPass, name: str) -> bool:
    """Whether a member being removed is still needed in a partition's quorum: a partition has
    no leader, or it is a voter whose removal would leave too few ready voters."""
    ready = cluster.ready_names()
    return any(
        view is None or (name in view.voters and not keeps_majority(view.voters, name, ready))
        for view in cluster.leader_views.values()
    )


def _recreate_pods(cluster: _ClusterPass) -> Action | None:
    gone = [
        m
        for m in cluster.status.members
        if (
            m.role != "removing"
            # One being removed is a voter until its removal commits, and its removal waits
            # while the others lack a ready majority: left down meanwhile, the quorum was lost
            # for good (a cancelled removal waits for it to be ready too).
            or (_needed_for_quorum(cluster, m.name) and _has_volume(cluster, m.name))
        )
        and not cluster.stopped_on_purpose(m)
        and _pod(cluster, m.name) in ("missing", "failed")
    ]
    if not gone:
        return None
    ended = next((m for m in gone if _pod(cluster, m.name) == "failed"), None)
    if ended is not None:
        # Its pod ran to its end and stays (phase Failed: evicted for node pressure, or its
        # node shut down): its name is taken until it is deleted, and the next pass makes it
        # again (creating it over the pod was a 409 that left the member down for good).
        cluster.event(
            "PodEnded",
            f"{ended.name}'s pod ended (evicted, or its node shut down); it is deleted to be "
            "made again",
            warning=True,
        )
        return RestartMember(ended.name)
    if not cluster.status.bootstrapped and not any(cluster.leader_views.values()):
        # Until an initial voter's partition has elected, a member without data may still
        # bootstrap. Once one has, a member whose volume is lost may have voted and taken
        # entries there: started empty as an initial voter, it could vote again in that term.
        return CreateMembers(tuple(m.name for m in gone), join=False)
    back = []
    for m in gone:
        if _has_volume(cluster, m.name) or m.role == "joining":
            # Its data is there (or it never had any): the same member comes back. It starts
            # with `--join` so that an empty volume can never bootstrap a second cluster.
            back.append(m.name)
            continue
        m.role = "removing"
        cluster.event(
            "MemberLost",
            f"{m.name} lost its pod and its volume; it is removed and a new member replaces it",
            warning=True,
        )
    # All at once: after a hibernation every member comes back, and a quorum needs several.
    return CreateMembers(tuple(back), join=True) if back else None


def _has_volume(cluster: _ClusterPass, name: str) -> bool:
    seen = cluster.observed.members.get(name)
    return seen is not None and bool(seen.volume)


def _leaders(cluster: _ClusterPass) -> Action | None:
    missing = [p for p, leader_view in cluster.leader_views.items() if leader_view is None]
    if not cluster.status.bootstrapped:
        if missing:
            # An initial voter whose pod cannot start as it is, made before the spec changed
            # (a fix after a bad first spec), is made again with the fix: it holds no quorum.
            stuck = next(
                (m for m in cluster.status.members if _stale(cluster, m) and cluster.stuck(m.name)),
                None,
            )
            if stuck is not None:
                why = cluster.stuck(stuck.name)
                cluster.event("RollingRestart", f"restarting {stuck.name} with the new "
                              f"configuration, its pod cannot start ({why})")  # fmt: skip
                return RestartMember(stuck.name)
            return Wait(f"the initial voters have not elected a leader of partitions {missing}")
        cluster.status.bootstrapped = True
        cluster.event("Bootstrapped", "every partition has elected a leader")
    if missing:
        return Wait(f"no leader for partitions {missing}")
    return None


def _stale(cluster: _ClusterPass, m: MemberStatus) -> bool:
    """The member's pod was made with an older configuration than the one wanted now."""
    seen = cluster.observed.members.get(m.name)
    return (
        seen is not None
        and seen.config_hash is not None
        and seen.config_hash != cluster.wanted_hash
    )


def _partitions_not_lowered(cluster: _ClusterPass) -> Action | None:
    """A lower spec.partitions is refused (the CRD refuses it too; a local manifest is not
    checked by an API server)."""
    held = max(
        (len(seen.node.partitions) for seen in cluster.observed.members.values() if seen.node),
        default=0,
    )
    refused = lowering_refused(held, cluster.spec.partitions)
    return None if refused is None else Wait(refused)


def _peers(cluster: _ClusterPass) -> Action | None:
    want = {m.name: u for m in cluster.status.members if (u := cluster.url(m.name)) is not None}
    for m in cluster.status.members:
        seen = cluster.observed.members.get(m.name)
        if seen is None or seen.node is None:
            continue
        if any(seen.node.peers.get(n) != u for n, u in want.items()):
            return SyncPeers(m.name, tuple(sorted(want.items())))
    return None


def _removals(cluster: _ClusterPass) -> Action | None:
    for m in cluster.status.members:
        if m.role == "removing":
            return _remove(cluster, m)
    return None


def _remove(cluster: _ClusterPass, m: MemberStatus) -> Action:
    handing = _hand_over(cluster, m.name, f"removing {m.name}")
    if handing is not None:
        return handing
    for partition, leader_view in cluster.led_partitions():
        if m.name in leader_view.voters:
            ready = cluster.ready_names()
            if not keeps_majority(leader_view.voters, m.name, ready):
                after = leader_view.voters - {m.name}
                return Wait(
                    f"partition {partition}: removing {m.name} would leave {len(after & ready)} "
                    f"ready of {len(after)} voters, below a majority"
                )
            return ChangeMembership(partition, leader_view.leader or "", "remove", m.name)
        if m.name in leader_view.learners:
            return ChangeMembership(partition, leader_view.leader or "", "remove", m.name)
    # The leader takes a change on as soon as it is appended: its view lacks the member before
    # the change is committed. Until then the member may hold entries the remaining voters lack
    # (its acknowledgements counted for them), and a new leader may not have the change at all.
    pending = [p for p, view in cluster.led_partitions() if view.membership_pending]
    if pending:
        return Wait(f"removing {m.name}: the change is not committed yet in partitions {pending}")
    return DeleteMember(m.name, delete_volume=cluster.spec.storage.reclaim_policy == "Delete")


def _snapshot_installs(cluster: _ClusterPass) -> Action | None:
    names = {m.name for m in cluster.status.members}
    pending = {
        (i.member, i.partition): i for i in cluster.status.snapshot_installs if i.state == "pending"
    }
    due: list[tuple[SnapshotInstall, PartitionView]] = []
    for partition, leader_view in cluster.led_partitions():
        for f in leader_view.followers.values():
            if not f.snapshot_required or f.name not in names:
                continue
            install = pending.pop((f.name, partition), None)
            if install is None:
                if _cooling_down(cluster, f.name, partition):
                    continue
                source = _snapshot_source(cluster, leader_view, f.name)
                install = SnapshotInstall(
                    member=f.name,
                    partition=partition,
                    source=source,
                    started_at=cluster.now,
                    next_attempt_at=cluster.now,
                )
                cluster.status.snapshot_installs.insert(0, install)
                cluster.event(
                    "SnapshotRequired",
                    f"{f.name} needs entries of partition {partition} below the compaction "
                    f"floor {leader_view.compaction_floor}; a snapshot install from {source} "
                    "is scheduled",
                )
            if install.attempts >= INSTALL_MAX_ATTEMPTS:
                _finish(cluster, install, "failed")
                cluster.event(
                    "SnapshotInstallFailed",
                    f"partition {partition}: installing a snapshot on {f.name} failed "
                    f"{install.attempts} times: {install.last_error}",
                    warning=True,
                )
                continue
            due.append((install, leader_view))
    # Pending installs whose target no longer needs one: done (by the install or otherwise).
    for install in pending.values():
        _finish(cluster, install, "installed")
        install.detail = install.detail or "the member no longer needs a snapshot"
        cluster.event(
            "SnapshotInstalled", f"partition {install.partition}: {install.member} caught up"
        )
    for install, leader_view in due:
        if cluster.now < install.next_attempt_at:
            continue
        if not cluster.running(install.member):
            # An attempt now would only time out at its old address and use up one of the
            # INSTALL_MAX_ATTEMPTS (a member restarted by a rolling restart, its pod not back).
            # Nor is it waited for here: a pod that never runs (its node gone) would hold every
            # later step, the removal that would replace it included; those steps have their
            # own gates on members that are not ready.
            continue
        # The source is chosen again for every attempt: the one first chosen may have been
        # removed since (its volume lost) or stopped answering, and the leader refuses a
        # source that is not a member; five attempts from a removed member gave up the
        # install while the member needing it was the quorum's.
        source = _snapshot_source(cluster, leader_view, install.member)
        if source != install.source:
            cluster.event(
                "SnapshotSourceChanged",
                f"partition {install.partition}: {install.member}'s snapshot now comes from "
                f"{source}, not {install.source}",
            )
            install.source = source
        return InstallSnapshot(
            install.partition, leader_view.leader or "", install.member, install.source
        )
    due = [(i, v) for i, v in due if cluster.running(i.member)]
    if due:
        install = min((i for i, _ in due), key=lambda i: i.next_attempt_at)
        return Wait(
            f"partition {install.partition}: next snapshot install attempt on {install.member} "
            f"in {max(install.next_attempt_at - cluster.now, 0):.0f} s"
        )
    return None


def _joining(cluster: _ClusterPass) -> Action | None:
    """Each joining member that runs is added as a learner of every partition; one still
    starting holds up none of the others (a scale-up creates its members together)."""
    starting = []
    for m in cluster.status.members:
        if m.role != "joining":
            continue
        if not cluster.running(m.name):
            starting.append(m.name)
            continue
        for partition, leader_view in cluster.led_partitions():
            if m.name not in leader_view.voters | leader_view.learners:
                return ChangeMembership(partition, leader_view.leader or "", "add_learner", m.name)
        m.role = "learner"
        m.promotion = Promotion(window_seconds=cluster.spec.raft.learner_promotion_stable_window)
        cluster.event("LearnerAdded", f"{m.name} is a learner of every partition; catching up")
    if starting:
        # A pod that does not start (unschedulable, an image not pulled) keeps no learner
        # beside it from its promotion; every other step waits for it.
        promotion = _promotions(cluster)
        if isinstance(promotion, ChangeMembership):
            return promotion
        return Wait(f"{', '.join(starting)} {'is' if len(starting) == 1 else 'are'} starting")
    return None


def _promotion_windows(cluster: _ClusterPass) -> None:
    """Every pass, whichever step acts: a learner's window runs while its lag is within
    learnerPromotionLag in every partition, and starts again on an excursion (a lag above it,
    or unknown). Kept apart from `_promotions`, which an earlier step (a snapshot install, a
    removal) may pre-empt: an excursion meanwhile still restarts the window."""
    if cluster.windows_tracked:
        return
    cluster.windows_tracked = True
    limit = cluster.spec.raft.learner_promotion_lag
    window = cluster.spec.raft.learner_promotion_stable_window
    for m in cluster.status.members:
        if m.role != "learner":
            continue
        promotion = m.promotion or Promotion(window_seconds=window)
        m.promotion = promotion
        promotion.window_seconds = window
        followers = {
            p: leader_view.followers.get(m.name) if leader_view is not None else None
            for p, leader_view in sorted(cluster.leader_views.items())
        }
        known = [f.lag for f in followers.values() if f is not None and f.lag is not None]
        promotion.max_lag = max(known) if known else None
        last_seen, promotion.sampled_at = promotion.sampled_at, cluster.now
        if (
            promotion.window_started_at is not None
            and last_seen is not None
            and cluster.now - last_seen
            > max(min(window, PROMOTION_UNWATCHED_S), PROMOTION_GAP_FLOOR_S)
        ):
            # Not watched for a while (the operator down, or a pass held by a long step): one
            # sample after it would have promoted the learner at once (it was 30 s: a 3 s
            # window was passed by one sample 25 s after it started; a 60 s one by samples 59
            # s apart). Not the window's length alone: a window shorter than a pass (0.5 s)
            # would never run.
            promotion.restarts += 1
            cluster.event(
                "PromotionWindowRestarted",
                f"{m.name}: its lag was not watched for {cluster.now - last_seen:.0f} s; its "
                "promotion window starts again",
            )
            promotion.window_started_at, promotion.elapsed_seconds = None, 0.0
        if not all(within_promotion_lag(f, limit) for f in followers.values()):
            unknown = [p for p, f in followers.items() if f is None or f.lag is None]
            silent = [p for p, f in followers.items() if f is not None and not f.recent_active]
            why = (
                f"lag unknown in partitions {unknown}"
                if unknown
                else f"not answering the leader of partitions {silent}"
                if silent
                else f"lags by {promotion.max_lag}, more than learnerPromotionLag={limit}"
            )
            if promotion.window_started_at is not None:
                promotion.restarts += 1
                cluster.event(
                    "PromotionWindowRestarted",
                    f"{m.name}: {why}; its promotion window starts again",
                )
            promotion.window_started_at, promotion.elapsed_seconds = None, 0.0
            cluster.lagging[m.name] = why
            continue
        if promotion.window_started_at is None:
            promotion.window_started_at = cluster.now
        promotion.elapsed_seconds = round(cluster.now - promotion.window_started_at, 3)


def _promotions(cluster: _ClusterPass) -> Action | None:
    """The first learner whose whole window has run is promoted, one partition a pass; one
    still lagging or within its window holds up no other (a scale-up's learners catch up side
    by side). With none ready, the first learner's wait is the pass's."""
    _promotion_windows(cluster)
    waiting: Wait | None = None
    for m in cluster.status.members:
        if m.role != "learner":
            continue
        promotion = m.promotion
        assert promotion is not None  # `_promotion_windows` gave every learner one
        if m.name in cluster.lagging:
            waiting = waiting or Wait(f"{m.name}: {cluster.lagging[m.name]}")
            continue
        if promotion.elapsed_seconds < promotion.window_seconds:
            waiting = waiting or Wait(
                f"{m.name} within learnerPromotionLag for {promotion.elapsed_seconds:.1f} of "
                f"{promotion.window_seconds:g} s"
            )
            continue
        for partition, leader_view in cluster.led_partitions():
            if m.name in leader_view.learners:
                return ChangeMembership(partition, leader_view.leader or "", "promote", m.name)
        m.role, m.promotion = "voter", None
        cluster.event("Promoted", f"{m.name} is a voter of every partition")
    return waiting


def _raising(cluster: _ClusterPass) -> bool:
    """A raise of spec.partitions not finished: some member still serves fewer.

    A new partition's first voters are the members a pod is given (`--peers`, every member
    in status) when it restarts with the raised count. A member added or removed between two
    of the raise's restarts would give members different first voters for one partition, whose
    majorities need not meet (two leaders of one term). So scaling waits for the raise; the
    rolling restart that carries it comes after the scaling steps, which step aside for it."""
    return cluster.observed.partitions_served(cluster.spec.partitions) < cluster.spec.partitions


def _scale_up(cluster: _ClusterPass) -> Action | None:
    """Every member missing is created at once, to join as learners side by side: learners
    count in no quorum, and their pods' starts, their catch-up and their promotion windows then
    overlap (3 -> 5 took 27 s one at a time on an idle test cluster). Each is still promoted
    alone, a single-server change each (`_promotions`)."""
    active = [m for m in cluster.status.members if m.role != "removing"]
    if len(active) >= cluster.spec.replicas or _raising(cluster):
        return None
    unready = [
        m.name for m in active if not cluster.ready(m.name) and not cluster.stopped_on_purpose(m)
    ]
    if unready:
        return Wait(f"scaling up waits for {', '.join(unready)} to be ready")
    new: list[MemberStatus] = []
    for _ in range(cluster.spec.replicas - len(active)):
        ordinal = cluster.status.next_ordinal
        new.append(
            MemberStatus(name=member_name(cluster.name, ordinal), ordinal=ordinal, role="joining")
        )
        cluster.status.next_ordinal = ordinal + 1
    cluster.status.members.extend(new)
    names = tuple(m.name for m in new)
    cluster.event(
        "ScalingUp",
        f"adding {', '.join(names)} ({cluster.spec.replicas} of {cluster.spec.replicas})",
    )
    return CreateMembers(names, join=True)


def _scale_down(cluster: _ClusterPass) -> Action | None:
    active = [m for m in cluster.status.members if m.role != "removing"]
    if len(active) <= cluster.spec.replicas or _raising(cluster):
        return None
    named = [m for name in cluster.spec.remove_members for m in active if m.name == name]
    victim = named[0] if named else next_to_remove(active)
    victim.role = "removing"
    cluster.event("ScalingDown", f"removing {victim.name} ({len(active) - 1} of the members left)")
    return _remove(cluster, victim)


def _rolling_restart(cluster: _ClusterPass) -> Action | None:
    stale = [m for m in cluster.status.members if _stale(cluster, m)]
    if not stale:
        return None
    asked = cluster.controls.restart
    why = (
        "with the new configuration"
        if asked == cluster.status.restarted_at
        else f"(raftlog.dev/restartedAt {asked})"
        if asked is not None
        else "(raftlog.dev/restartedAt removed)"
    )
    unready = [
        m.name
        for m in cluster.status.members
        if not cluster.ready(m.name) and not cluster.stopped_on_purpose(m)
    ]
    if unready:
        # A stale member that answers but is not ready goes first: it holds up no ready
        # majority, and its restart may be what brings it back (a partition it could not
        # start, say); so does one whose pod cannot start as it is (an image that cannot be
        # pulled, a node selector nothing matches: a spec fixed after a bad one). Any other
        # that does not answer yet may be starting: it is waited for.
        broken = next(
            (
                m
                for m in stale
                if m.name in unready and (cluster.answering(m.name) or cluster.stuck(m.name))
            ),
            None,
        )
        if broken is None:
            return Wait(f"restart of {stale[0].name} waits for {', '.join(unready)} to be ready")
        cluster.event("RollingRestart", f"restarting {broken.name} {why}, not ready")
        return RestartMember(broken.name)
    # The leader's own line between live replication and backfill, not a second setting: a
    # member within it is not being repaired, which is what rolling needs; any other number
    # would either roll while the leader still repairs someone or wait on live followers.
    threshold = cluster.spec.raft.backfill_threshold
    for partition, leader_view in cluster.led_partitions():
        if not others_caught_up(leader_view, threshold):
            behind = [f.name for f in leader_view.followers.values() if not caught_up(f, threshold)]
            return Wait(f"restart waits: {', '.join(behind)} behind in partition {partition}")
    leading = {
        leader_view.leader for _, leader_view in cluster.led_partitions() if leader_view.leader
    }
    target = next_to_restart(stale, leading)
    short = _short_without(cluster, target.name, f"the restart of {target.name} waits")
    if short is not None:
        return short
    # A leader restarts only once its leaderships moved to a caught-up voter.
    handing = _hand_over(cluster, target.name, f"restarting {target.name}")
    if handing is not None:
        return handing
    cluster.event("RollingRestart", f"restarting {target.name} {why}")
    return RestartMember(target.name)


def _hibernation(cluster: _ClusterPass) -> Action | None:
    """spec.hibernate: every member's pod stops, followers first (a leader stops last, so
    leadership moves as little as possible); volumes and memberships stay."""
    if not cluster.spec.hibernate:
        return None
    up = [m for m in cluster.status.members if _pod(cluster, m.name) != "missing"]
    if not up:
        return Wait("hibernating: every member is stopped; spec.hibernate false brings it back")
    leading = {v.leader for v in cluster.leader_views.values() if v is not None and v.leader}
    if all(_pod(cluster, m.name) == "terminating" for m in up):
        return Wait(f"hibernating: waiting for {', '.join(m.name for m in up)} to stop")
    target = min(
        (m for m in up if _pod(cluster, m.name) != "terminating"),
        key=lambda m: (m.name in leading, m.ordinal),
    )
    cluster.event("Hibernating", f"stopping {target.name} (its volume stays)")
    return StopMember(target.name)


def _unfence(cluster: _ClusterPass) -> Action | None:
    """A member taken out of spec.fencedMembers comes back on its data (`_recreate_pods`);
    before the leaders are checked, since it may be what a partition's quorum lacks."""
    wanted = set(cluster.spec.fenced_members)
    for m in cluster.status.members:
        if m.fenced and m.name not in wanted:
            m.fenced = False
            cluster.event("Unfenced", f"{m.name} is no longer fenced; it starts on its data")
    return None


def _fencing(cluster: _ClusterPass) -> Action | None:
    """spec.fencedMembers: each gives its leaderships away, then stops while the others keep
    a ready majority of every partition it votes in."""
    for name in cluster.spec.fenced_members:
        m = cluster.status.member(name)
        if m is None or m.role == "removing":
            continue  # named in status.problems
        if m.fenced:
            pod = _pod(cluster, name)
            if pod in ("missing", "terminating"):
                continue
            return StopMember(name)  # it came back (a stop that failed, or someone made it)
        handing = _hand_over(cluster, name, f"fencing {name}")
        if handing is not None:
            return handing
        short = _short_without(cluster, name, f"fencing {name} is refused for now")
        if short is not None:
            return short
        m.fenced = True
        cluster.event("Fenced", f"{name} stops serving; its volume and memberships stay")
        return StopMember(name)
    return None


def _cancel_removals(cluster: _ClusterPass) -> Action | None:
    """`replicas` raised back while a member is being removed: the removal is cancelled while
    it is still a ready voter of every partition (no partition has taken it out yet)."""
    active = [m for m in cluster.status.members if m.role != "removing"]
    for m in cluster.status.members:
        if len(active) >= cluster.spec.replicas:
            break
        if m.role != "removing" or not cluster.ready(m.name):
            continue
        views = [v for _, v in cluster.led_partitions()]
        if views and all(m.name in v.voters for v in views):
            m.role = "voter"
            active.append(m)
            cluster.event(
                "RemovalCancelled", f"{m.name} stays: replicas was raised before its removal"
            )
    return None


def _switchover(cluster: _ClusterPass) -> Action | None:
    """raftlog.dev/switchover: the leadership of the partitions asked moves to the member
    named, each request carried out once and its outcome kept in status.switchover."""
    request = cluster.controls.switchover
    status = cluster.status
    if request is None:
        return None
    current = status.switchover
    if current is None or current.request != request.request:
        current = Switchover(
            request=request.request,
            target=request.target,
            partitions=list(request.partitions) if request.partitions is not None else None,
            started_at=cluster.now,
        )
        status.switchover = current
        cluster.event("SwitchoverRequested", f"{request.request}: leadership to {request.target}")
    if current.state != "pending":
        return None

    def fail(message: str) -> None:
        current.state, current.message, current.finished_at = "failed", message, cluster.now
        cluster.event("SwitchoverFailed", f"{request.request}: {message}", warning=True)

    m = status.member(request.target)
    served = len(cluster.leader_views)
    wanted = request.partitions if request.partitions is not None else tuple(range(served))
    if m is None or m.role != "voter" or m.fenced:
        fail(f"{request.target} is not a voting member that serves (fenced or not a voter)")
        return None
    if unknown := [p for p in wanted if p >= served]:
        fail(f"no partitions {unknown}: the cluster has {served}")
        return None
    ready = cluster.ready_names()
    for partition, leader_view in cluster.led_partitions():
        if partition not in wanted or leader_view.leader == request.target:
            continue
        follower = leader_view.followers.get(request.target)
        leaving = leader_view.leader or ""
        if follower is None or not fit_to_lead(follower, leaving, ready):
            if cluster.now - current.started_at > SWITCHOVER_TIMEOUT_S:
                fail(
                    f"partition {partition}: {request.target} was not fit to lead (a ready, "
                    f"live-replicating voter) within {SWITCHOVER_TIMEOUT_S:.0f} s"
                )
                return None
            current.message = f"partition {partition}: waiting for {request.target} to catch up"
            return Wait(current.message)
        current.message = f"partition {partition}: moving the leadership from {leaving}"
        return TransferLeader(partition, leaving, request.target)
    current.state, current.finished_at = "done", cluster.now
    current.message = f"{request.target} leads partitions {list(wanted)}"
    cluster.event(
        "SwitchoverDone",
        f"{request.request}: {current.message} after {cluster.now - current.started_at:.1f} s",
    )
    return None


def _expand_volumes(cluster: _ClusterPass) -> Action | None:
    """spec.storage.size raised: each member's claim asks for the new size (never a restart; a
    size is not in the launch configuration). Lowering is never asked: a volume cannot shrink."""
    wanted = cluster.spec.storage.size
    failed = cluster.status.volume_expansion
    for m in cluster.status.members:
        seen = cluster.observed.members.get(m.name)
        if seen is None or seen.volume_size is None:
            continue
        if quantity(seen.volume_size) >= quantity(wanted):
            continue
        if (
            failed is not None
            and failed.size == wanted
            and failed.state == "failed"
            and cluster.now - failed.at < EXPANSION_RETRY_S
        ):
            return None  # the refusal is in status and in the Degraded condition
        cluster.status.volume_expansion = VolumeExpansion(
            size=wanted, state="requested", at=cluster.now
        )
        return ExpandVolume(m.name, wanted)
    expansion = cluster.status.volume_expansion
    if expansion is not None and expansion.state == "requested" and expansion.size == wanted:
        sizes = [
            seen.volume_capacity
            for seen in cluster.observed.members.values()
            if seen.volume_size is not None
        ]
        if all(c is not None and quantity(c) >= quantity(wanted) for c in sizes):
            expansion.state, expansion.message = "done", f"every volume has {wanted}"
            cluster.event("VolumesExpanded", f"every member's volume has {wanted}")
    return None


def _restart_done(cluster: _ClusterPass) -> None:
    """A restart request is done once nothing is left to roll: every member runs a pod launched
    with it, and is ready again (the roll itself is `_rolling_restart`). Without the second,
    `kubectl raft restart --wait` returned while the last member restarted was still starting."""
    asked = cluster.controls.restart
    if asked is None or asked == cluster.status.restarted_at:
        return
    up = [seen for seen in cluster.observed.members.values() if seen.config_hash is not None]
    if up and all(
        seen.config_hash == cluster.wanted_hash and cluster.ready(seen.name) for seen in up
    ):
        cluster.status.restarted_at = asked
        cluster.event("Restarted", f"every member restarted for raftlog.dev/restartedAt {asked}")


def _problems(cluster: _ClusterPass, previous: RaftClusterStatus) -> None:
    """What the operator was asked and cannot act on, each with the reason: in status.problems
    (and the Degraded condition), and an event when it first appears."""
    names = {m.name for m in cluster.status.members}
    found = list(cluster.controls.problems)
    for name in cluster.spec.fenced_members:
        if name not in names:
            found.append(f"spec.fencedMembers: {name} is not a member of this cluster")
    for name in cluster.spec.remove_members:
        if name not in names and cluster.spec.replicas < len(names):
            found.append(f"spec.removeMembers: {name} is not a member of this cluster")
    for problem in found:
        if problem not in previous.problems:
            cluster.event("InvalidControl", problem, warning=True)
    expansion = cluster.status.volume_expansion
    if (
        expansion is not None
        and expansion.state == "failed"
        and expansion.size == cluster.spec.storage.size
    ):
        found.append(f"spec.storage.size {expansion.size}: {expansion.message}")
    wanted = cluster.spec.storage.size
    larger = sorted(
        f"{name}'s {seen.volume_size}"
        for name, seen in cluster.observed.members.items()
        if seen.volume_size is not None and quantity(seen.volume_size) > quantity(wanted)
    )
    if larger:
        # Taken without a word, it gave a member made later a volume smaller than its peers'.
        found.append(
            f"spec.storage.size {wanted}: below {', '.join(larger)}; volumes never shrink, and "
            f"a member made now would get {wanted}: set it back"
        )
    cluster.status.problems = found


def _archive(cluster: _ClusterPass, previous: RaftClusterStatus) -> None:
    """status.archive from what each partition's leader reports of its archive (the members
    with archiving on say `archive` in their status), and, for each partition whose archive
    fails on any member, an entry in status.problems (so in the Degraded condition too), with
    an event when it starts failing and when it recovers. A partition with no leader seen
    keeps its last entry (or, having none, takes any member's report)."""
    spec = cluster.spec.archive
    if spec is None:
        cluster.status.archive = None
        return
    old = previous.archive if previous.archive and previous.archive.url == spec.url else None
    before = {a.partition: a for a in old.partitions} if old else {}
    entries: list[PartitionArchive] = []
    problems: list[str] = []
    for partition, leader_view in sorted(cluster.leader_views.items()):
        errors: dict[str, str] = {}
        reports: dict[str, ArchiveView] = {}
        for name, seen in sorted(cluster.observed.members.items()):
            view = seen.node.partitions.get(partition) if seen.node else None
            if view is not None and view.archive is not None:
                reports[name] = view.archive
                if view.archive.last_error:
                    errors[name] = view.archive.last_error
        leader = leader_view.leader if leader_view is not None else None
        # The leader's report; with no leader seen, the last entry, else any member's.
        reporter = leader if leader in reports else None
        if reporter is None and partition in before:
            entries.append(before[partition].model_copy(update={"failing_on": sorted(errors)}))
        elif reporter is not None or reports:
            reporter = reporter or next(iter(reports))
            mine = reports[reporter]
            entries.append(
                PartitionArchive(
                    partition=partition,
                    archived_index=mine.archived_index,
                    lag_entries=mine.lag_entries,
                    last_error=mine.last_error,
                    failing_on=sorted(errors),
                    last_upload_at=mine.last_upload_at,
                    reported_by=reporter,
                )
            )
        was = before.get(partition)
        if errors:
            cluster.archive_failing.append(partition)
            error = errors.get(leader or "") or next(iter(errors.values()))
            text = (
                f"spec.archive: partition {partition}: archiving fails on "
                f"{', '.join(errors)}: {error[:ARCHIVE_ERROR_CHARS]}"
            )
            problems.append(text)
            if was is None or not was.failing_on:
                cluster.event("ArchiveFailing", text, warning=True)
        elif was is not None and was.failing_on:
            cluster.event(
                "ArchiveRecovered", f"partition {partition}: archiving works again on every member"
            )
    if len(problems) > ARCHIVE_PROBLEMS_SHOWN:
        more = cluster.archive_failing[ARCHIVE_PROBLEMS_SHOWN:]
        listed = ", ".join(map(str, more[:20])) + (", ..." if len(more) > 20 else "")
        problems = [
            *problems[:ARCHIVE_PROBLEMS_SHOWN],
            f"spec.archive: {len(more)} more partitions fail to archive ({listed})",
        ]
    cluster.status.archive = ArchiveStatus(url=spec.url, partitions=entries)
    cluster.status.problems = [*cluster.status.problems, *problems]


# ===================================================================== helpers
def _pod(cluster: _ClusterPass, name: str) -> str:
    seen = cluster.observed.members.get(name)
    return "missing" if seen is None else seen.pod


def _hand_over(cluster: _ClusterPass, name: str, doing: str) -> Action | None:
    """The next of `name`'s leaderships moved to a caught-up voter (one partition a pass), a
    Wait saying which partition has none, or None once it leads no partition."""
    for partition, leader_view in cluster.led_partitions():
        if leader_view.leader == name:
            target = _successor(cluster, leader_view, leaving=name)
            if target is None:
                return Wait(
                    f"{doing}: partition {partition} has no caught-up voter to take over from "
                    f"{name}"
                )
            return TransferLeader(partition, name, target)
    return None


def _short_without(cluster: _ClusterPass, name: str, doing: str) -> Wait | None:
    """A Wait naming the first partition whose other voters would not hold a ready majority
    with `name` stopped (`safety.stays_available`); None when every partition would."""
    ready = cluster.ready_names()
    for partition, leader_view in cluster.led_partitions():
        voters = leader_view.voters
        if name in voters and not stays_available(voters, name, ready):
            left = len(voters & (ready - {name}))
            return Wait(
                f"{doing}: partition {partition} would have {left} of {len(voters)} voters "
                "ready without it, below a majority"
            )
    return None


def _successor(cluster: _ClusterPass, leader_view: PartitionView, leaving: str) -> str | None:
    """The voter most fit to lead, the furthest along."""
    ready = cluster.ready_names()
    fit = [f for f in leader_view.followers.values() if fit_to_lead(f, leaving, ready)]
    if not fit:
        return None
    return max(fit, key=lambda f: (f.match, f.name)).name


def _snapshot_source(cluster: _ClusterPass, leader_view: PartitionView, target: str) -> str:
    """An eligible follower ranked by in-sync then match (RATIS-2428); else the leader. The
    leader re-checks."""
    if cluster.spec.snapshot_source == "leader":
        return "leader"
    needed = leader_view.compaction_floor - 1
    ready = cluster.ready_names()
    eligible = [
        f for f in leader_view.followers.values() if can_serve_snapshot(f, target, needed, ready)
    ]
    if not eligible:
        return "leader"
    best = max(eligible, key=lambda f: (f.state == "replicate", f.match, f.name))
    return best.name


def _cooling_down(cluster: _ClusterPass, member: str, partition: int) -> bool:
    for i in cluster.status.snapshot_installs:
        if i.member == member and i.partition == partition and i.state == "failed":
            return i.finished_at is not None and cluster.now - i.finished_at < INSTALL_COOLDOWN_S
    return False


def _finish(cluster: _ClusterPass, install: SnapshotInstall, state: str) -> None:
    install.state = "installed" if state == "installed" else "failed"
    install.finished_at = cluster.now
    installs = cluster.status.snapshot_installs
    pending = [i for i in installs if i.state == "pending"]
    done = [i for i in installs if i.state != "pending"]
    done.sort(key=lambda i: i.finished_at or 0.0, reverse=True)
    cluster.status.snapshot_installs = pending + done[:INSTALL_HISTORY]


def _refresh_members(cluster: _ClusterPass) -> None:
    status = cluster.status
    for m in status.members:
        gone = _pod(cluster, m.name) in ("missing", "terminating")
        if gone and m.ready and not m.pod_deleted and not cluster.stopped_on_purpose(m):
            # Said once, as it goes: the pod the member ran in is made again without a word.
            cluster.event(
                "PodGone",
                f"{m.name}'s pod is gone and the operator did not delete it (kubectl delete "
                "pod, an eviction, or its node lost); it comes back on its volume",
                warning=True,
            )
        m.ready = cluster.ready(m.name)
        m.partitions = [
            _member_partition(p, leader_view, m.name)
            for p, leader_view in sorted(cluster.leader_views.items())
        ]
    status.leaders = {
        str(p): leader_view.leader
        for p, leader_view in cluster.leader_views.items()
        if leader_view and leader_view.leader
    }
    names = sorted(set(status.leaders.values()))
    status.leader_summary = ",".join(names) if len(names) <= 3 else f"{len(names)} members"


def _member_partition(
    partition: int, leader_view: PartitionView | None, name: str
) -> MemberPartition:
    if leader_view is not None and leader_view.leader == name:
        return MemberPartition(partition=partition, lag=0, state="leader")
    f = leader_view.followers.get(name) if leader_view is not None else None
    if f is None:
        return MemberPartition(partition=partition)
    return MemberPartition(
        partition=partition, lag=f.lag, state=f.state, snapshot_required=f.snapshot_required
    )


def _summarize(cluster: _ClusterPass, action: Action | None, previous: RaftClusterStatus) -> None:
    status = cluster.status
    active = [m for m in status.members if m.role != "removing"]
    status.replicas = len(active)
    status.ready_replicas = sum(1 for m in active if m.ready)
    status.selector = f"raftlog.dev/cluster={cluster.name}"
    status.last_action = describe(action)
    partitions = len(cluster.leader_views)
    led = [p for p, leader_view in cluster.leader_views.items() if leader_view is not None]
    voters = [m for m in active if m.role == "voter"]
    quorum = has_quorum({m.name for m in voters}, {m.name for m in voters if m.ready})
    available = status.bootstrapped and len(led) == partitions and quorum
    failed = [i for i in status.snapshot_installs if i.state == "failed" and _recent(cluster, i)]
    unready = [m.name for m in active if not m.ready]
    _condition(
        cluster,
        "Available",
        available,
        "QuorumAvailable" if available else "NoQuorum" if status.bootstrapped else "Bootstrapping",
        f"{len(led)} of {partitions} partitions have a leader; "
        f"{status.ready_replicas} of {len(active)} members ready"
        + (
            f"; partitions {partitions}..{cluster.spec.partitions - 1} start once every "
            "member restarted with the new count"
            if partitions < cluster.spec.partitions
            else ""
        ),
    )
    _condition(cluster, "Progressing", action is not None, _reason(action), describe(action))
    paused = cluster.controls.paused
    if _condition(
        cluster,
        "Paused",
        paused,
        "ReconciliationPaused" if paused else "Reconciling",
        "raftlog.dev/pause-reconciliation is set: the operator changes nothing in this cluster"
        if paused
        else "the operator reconciles this cluster",
    ):
        cluster.event(
            "ReconciliationPaused" if paused else "ReconciliationResumed",
            "the operator changes nothing until raftlog.dev/pause-reconciliation is removed"
            if paused
            else "reconciliation resumed",
        )
    stopped = [m.name for m in status.members if _pod(cluster, m.name) == "missing"]
    hibernated = cluster.spec.hibernate and len(stopped) == len(status.members)
    if _condition(
        cluster,
        "Hibernated",
        hibernated,
        "Hibernated" if hibernated else "Hibernating" if cluster.spec.hibernate else "Awake",
        f"every member stopped, volumes kept: {', '.join(stopped)}" if hibernated else "",
    ):
        cluster.event(
            "Hibernated" if hibernated else "Resumed",
            "every member is stopped; their volumes stay"
            if hibernated
            else "the members start again on their data",
        )
    degraded_msg = []
    unready = [n for n in unready if not cluster.stopped_on_purpose(_member(status, n))]
    fenced = [m.name for m in status.members if m.fenced]
    if unready:
        said = [f"{n} ({why})" if (why := cluster.stuck(n)) else n for n in unready]
        degraded_msg.append(f"not ready: {', '.join(said)}")
    if fenced:
        degraded_msg.append(f"fenced: {', '.join(fenced)}")
    degraded_msg.extend(status.problems)
    if failed:
        degraded_msg.append(
            "snapshot install failed: " + ", ".join(f"{i.member}/p{i.partition}" for i in failed)
        )
    _condition(
        cluster,
        "Degraded",
        bool(degraded_msg),
        (
            "SnapshotInstallFailed"
            if failed
            else "MembersNotReady"
            if unready
            else "Fenced"
            if fenced
            else "ArchiveFailing"
            if cluster.archive_failing
            and all(p.startswith("spec.archive:") for p in status.problems)
            else "CannotAct"
        )
        if degraded_msg
        else "AsExpected",
        "; ".join(degraded_msg),
    )
    if paused:
        status.phase = "Paused"
    elif hibernated:
        status.phase = "Hibernated"
    elif cluster.spec.hibernate:
        status.phase = "Hibernating"
    elif not status.bootstrapped:
        status.phase = "Bootstrapping"
    elif not available:
        status.phase = "Unavailable"
    elif any(m.role in ("joining", "learner", "removing") for m in status.members) or (
        len(active) != cluster.spec.replicas
    ):
        status.phase = "Scaling"
    elif action is not None and not isinstance(action, Wait):
        status.phase = "Reconciling"
    elif degraded_msg:
        status.phase = "Degraded"
    else:
        status.phase = "Running"


def _recent(cluster: _ClusterPass, install: SnapshotInstall) -> bool:
    return (
        install.finished_at is not None and cluster.now - install.finished_at < INSTALL_COOLDOWN_S
    )


def _reason(action: Action | None) -> str:
    return "Steady" if action is None else type(action).__name__


def _member(status: RaftClusterStatus, name: str) -> MemberStatus:
    m = status.member(name)
    assert m is not None
    return m


def _condition(cluster: _ClusterPass, kind: str, value: bool, reason: str, message: str) -> bool:
    """Sets the condition; True when its status changed (a new condition that is False is not
    a change)."""
    status: Literal["True", "False"] = "True" if value else "False"
    when = datetime.fromtimestamp(cluster.now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for c in cluster.status.conditions:
        if c.type == kind:
            changed = c.status != status
            if changed:
                c.status, c.last_transition_time = status, when
            c.reason, c.message = reason, message
            return changed
    cluster.status.conditions.append(
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
    return value


# ===================================================================== outcomes
def record_outcome(
    status: RaftClusterStatus, action: Action, outcome: Outcome, now: float
) -> tuple[RaftClusterStatus, list[Event]]:
    """Fold what came of `action` into the status (the next pass decides from it)."""
    new_status = status.model_copy(deep=True)
    events: list[Event] = []
    if not outcome.ok and not isinstance(action, Wait):
        events.append(Event("Warning", "StepFailed", f"{describe(action)}: {outcome.detail}"))
    match action:
        case PlanRestore():
            events += record_restore(new_status, outcome, now)
        case TakeBackup():
            events += record_backup(new_status, action, outcome, now)
        case InstallSnapshot(p, _, target, source):
            install = next(
                (
                    i
                    for i in new_status.snapshot_installs
                    if i.state == "pending" and i.member == target and i.partition == p
                ),
                None,
            )
            if install is not None:
                install.attempts += 1
                if outcome.ok:
                    install.state, install.finished_at, install.detail = (
                        "installed",
                        now,
                        outcome.detail,
                    )
                    install.last_error = None
                    # Where it came from: the leader streams it itself when `source` could not.
                    install.source = source = outcome.source or source
                    if install.bytes_total is not None:  # its stream's last report was earlier
                        install.bytes_done = install.bytes_total
                    events.append(
                        Event(
                            "Normal",
                            "SnapshotInstalled",
                            f"partition {p}: snapshot installed on {target} from {source} "
                            f"in {now - install.started_at:.1f} s ({outcome.detail})",
                        )
                    )
                else:
                    install.last_error = outcome.detail
                    backoff = min(
                        INSTALL_BACKOFF_S * 2 ** (install.attempts - 1), INSTALL_BACKOFF_MAX_S
                    )
                    install.next_attempt_at = now + backoff
        case ChangeMembership(_, _, "promote", member) if not outcome.ok:
            m = new_status.member(member)
            if m is not None and m.promotion is not None:
                # The leader's own check is the last word: the window starts again.
                m.promotion.window_started_at, m.promotion.elapsed_seconds = None, 0.0
                m.promotion.restarts += 1
                # A 409 (or 404: no such member there) is the leader's refusal; anything else
                # (no answer, a 503 timeout) left the outcome unknown: the change may still
                # commit, as the next pass will see.
                what = (
                    "the leader refused the promotion"
                    if outcome.detail.startswith(("HTTP 409", "HTTP 404"))
                    else "the promotion was not confirmed, it may still take effect"
                )
                events.append(Event(
                    "Normal", "PromotionWindowRestarted",
                    f"{member}: {what} ({outcome.detail}); its promotion window starts again",
                ))  # fmt: skip
        case ExpandVolume(name, size) if not outcome.ok:
            new_status.volume_expansion = VolumeExpansion(
                size=size, state="failed", at=now, message=f"{name}: {outcome.detail}"
            )
        case DeleteMember(name, _) if outcome.ok:
            new_status.members = [m for m in new_status.members if m.name != name]
            events.append(Event("Normal", "MemberRemoved", f"{name} left the cluster"))
        case CreateMembers(names) if outcome.ok:
            for m in new_status.members:
                m.pod_deleted = m.pod_deleted and m.name not in names
        case _:
            pass
    return new_status, events
