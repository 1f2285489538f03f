"""The reconciler's decisions, table-style, without I/O: observed state in, one step out."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from raftlog.operator.actions import (
    Action,
    ChangeMembership,
    CreateMembers,
    DeleteMember,
    InstallSnapshot,
    Outcome,
    RestartMember,
    StopMember,
    SyncPeers,
    TakeBackup,
    TransferLeader,
    Wait,
    describe,
)
from raftlog.operator.cluster_views import (
    FollowerView,
    MemberObserved,
    NodeView,
    Observed,
    PartitionView,
    PodState,
    parse_node_status,
)
from raftlog.operator.models import MemberStatus, RaftClusterSpec, RaftClusterStatus
from raftlog.operator.reconciler import (
    INSTALL_MAX_ATTEMPTS,
    Plan,
    config_hash,
    decide,
    record_outcome,
)

NAME = "c"
T0 = 1_000_000.0


def spec(**kw: Any) -> RaftClusterSpec:
    base: dict[str, Any] = {"replicas": 3, "partitions": 2}
    base.update(kw)
    return RaftClusterSpec.model_validate(base)


def url(n: str) -> str:
    return f"http://{n}:7001"


def fv(name: str, lag: int | None = 0, state: str = "replicate", **kw: Any) -> FollowerView:
    return FollowerView(
        name=name,
        learner=kw.get("learner", False),
        state=state,
        match=kw.get("match", 100 - (lag or 0)),
        lag=lag,
        snapshot_required=kw.get("snapshot_required", False),
        recent_active=kw.get("recent_active", True),
    )


class World:
    """A cluster as the runtime would observe it: pods, and each partition's leader view."""

    def __init__(self, members: list[str], partitions: int = 2) -> None:
        self.pods: dict[str, PodState] = dict.fromkeys(members, "running")
        self.volumes = {m: True for m in members}
        self.hashes: dict[str, str | None] = {m: None for m in members}
        self.voters = {p: set(members) for p in range(partitions)}
        self.learners: dict[int, set[str]] = {p: set() for p in range(partitions)}
        self.leader: dict[int, str | None] = {p: members[0] for p in range(partitions)}
        self.followers: dict[int, dict[str, FollowerView]] = {p: {} for p in range(partitions)}
        self.floor = 1
        self.peers_known = True
        self.silent: set[str] = set()  # running, but not answering
        self.leaderless: set[tuple[str, int]] = set()  # (member, partition): no leader known
        self.extra: dict[str, int] = {}  # member -> more partitions it holds (a raise)
        self.pending: set[int] = set()  # partitions whose leader's change is not committed
        self.stuck: dict[str, str] = {}  # member -> why its pod cannot start (kube.pod_stuck)

    def follower(self, p: int, f: FollowerView) -> None:
        self.followers[p][f.name] = f

    def observed(self) -> Observed:
        members = {}
        for name, pod in self.pods.items():
            node = None
            if pod == "running" and name not in self.silent:
                parts = {}
                for p in [*self.voters, *range(len(self.voters), self.extra.get(name, 0))]:
                    if p not in self.voters:  # a raised partition: not elected yet
                        parts[p] = PartitionView(
                            partition=p, role="pre_candidate", member="voter", term=0,
                            leader=None, high_water_mark=0, compaction_floor=1,
                            voters=frozenset(self.pods), learners=frozenset(),
                        )  # fmt: skip
                        continue
                    leading = self.leader[p] == name
                    fol = {}
                    if leading:
                        others = (self.voters[p] | self.learners[p]) - {name}
                        fol = {
                            n: self.followers[p].get(n) or fv(n, learner=n in self.learners[p])
                            for n in sorted(others)
                        }
                    parts[p] = PartitionView(
                        partition=p, role="leader" if leading else "follower", member="voter",
                        term=3, leader=None if (name, p) in self.leaderless else self.leader[p],
                        high_water_mark=100,
                        compaction_floor=self.floor, voters=frozenset(self.voters[p]),
                        learners=frozenset(self.learners[p]), followers=fol,
                        membership_pending=leading and p in self.pending,
                    )  # fmt: skip
                peers = {n: url(n) for n in self.pods} if self.peers_known else {}
                node = NodeView(name, parts, peers)
            members[name] = MemberObserved(
                name,
                pod,
                self.volumes.get(name, False),
                self.hashes.get(name),
                node,
                stuck=self.stuck.get(name),
            )
        return Observed(members, {n: url(n) for n in self.pods})


def running_status(members: list[str], s: RaftClusterSpec | None = None) -> RaftClusterStatus:
    st = RaftClusterStatus(
        bootstrapped=True,
        next_ordinal=len(members),
        members=[
            MemberStatus(name=m, ordinal=int(m.split("-")[1]), role="voter", bootstrap=True)
            for m in members
        ],
    )
    return st


def step(
    st: RaftClusterStatus, w: World, s: RaftClusterSpec | None = None, now: float = T0
) -> Plan:
    return decide(NAME, s or spec(), st, w.observed(), now)


MEMBERS = ["c-0", "c-1", "c-2"]


# ===================================================================== bootstrap
def test_an_empty_status_creates_every_initial_voter_at_once():
    plan = decide(NAME, spec(), RaftClusterStatus(), Observed({}), T0)
    assert plan.action == CreateMembers(("c-0", "c-1", "c-2"), join=False)
    assert [m.role for m in plan.status.members] == ["voter"] * 3
    assert all(m.bootstrap for m in plan.status.members)
    assert plan.status.next_ordinal == 3
    assert [e.reason for e in plan.events] == ["Bootstrapping"]


def test_before_the_first_elections_the_operator_waits_and_says_why():
    w = World(MEMBERS)
    w.leader = {0: "c-0", 1: None}
    st = running_status(MEMBERS)
    st.bootstrapped = False
    plan = step(st, w)
    assert isinstance(plan.action, Wait) and "partitions [1]" in plan.action.reason
    assert not plan.status.bootstrapped and plan.status.phase == "Bootstrapping"


def test_once_every_partition_elected_the_cluster_is_available_and_steady():
    st = running_status(MEMBERS)
    st.bootstrapped = False
    plan = step(st, World(MEMBERS))
    assert plan.action is None
    assert plan.status.bootstrapped and plan.status.phase == "Running"
    cond = {c.type: c for c in plan.status.conditions}
    assert cond["Available"].status == "True" and cond["Degraded"].status == "False"
    assert cond["Progressing"].status == "False"
    assert plan.status.leaders == {"0": "c-0", "1": "c-0"}
    assert plan.status.ready_replicas == 3 and plan.status.replicas == 3
    assert [e.reason for e in plan.events] == ["Bootstrapped"]


def test_a_pod_lost_before_bootstrap_is_recreated_able_to_bootstrap():
    w = World(MEMBERS)
    w.pods["c-1"] = "missing"
    w.leader = {0: None, 1: None}
    st = running_status(MEMBERS)
    st.bootstrapped = False
    assert step(st, w).action == CreateMembers(("c-1",), join=False)


def test_a_member_that_lost_its_volume_once_a_partition_elected_is_not_an_initial_voter_again():
    """Found by a review: before every partition elected, a member whose pod and volume were
    gone came back as an initial voter with an empty log, though partition 0 had elected
    (with its vote, perhaps) and committed entries on it."""
    w = World(MEMBERS)
    w.pods["c-1"], w.volumes["c-1"] = "missing", False
    w.leader = {0: "c-0", 1: None}
    st = running_status(MEMBERS)
    st.bootstrapped = False
    plan = step(st, w)
    assert not isinstance(plan.action, CreateMembers), plan.action
    assert plan.status.member("c-1").role == "removing"  # type: ignore[union-attr]
    w.volumes["c-1"] = True  # its volume there: it comes back on its data, joining
    plan = step(running_status(MEMBERS).model_copy(update={"bootstrapped": False}), w)
    assert plan.action == CreateMembers(("c-1",), join=True)


# ===================================================================== pods and peers
def test_a_crashed_member_with_its_volume_comes_back_joining():
    w = World(MEMBERS)
    w.pods["c-2"] = "failed"
    # Found on the cluster: a pod in phase Failed (evicted, its node shut down) keeps its name,
    # so creating the member's pod over it was a 409 that left the member down for good.
    plan = step(running_status(MEMBERS), w)
    assert plan.action == RestartMember("c-2")
    assert [e.reason for e in plan.events] == ["PodEnded"]
    w.pods["c-2"] = "missing"  # deleted
    plan = step(plan.status, w)
    # `--join`: were its volume empty, it could never bootstrap a second cluster.
    assert plan.action == CreateMembers(("c-2",), join=True)
    assert plan.status.phase == "Degraded" or plan.status.phase == "Reconciling"
    assert {c.type: c.status for c in plan.status.conditions}["Degraded"] == "True"


def test_a_pod_deleted_from_outside_is_said_once_and_one_the_operator_deleted_is_not():
    """Found by a review: `kubectl delete pod` (or an eviction) left no trace on the cluster:
    the pod was made again without a word. A pod the operator deleted itself says nothing."""
    w = World(MEMBERS)
    st = step(running_status(MEMBERS), w).status
    assert all(m.ready for m in st.members)
    w.pods["c-2"] = "terminating"
    plan = step(st, w)
    gone = [e for e in plan.events if e.reason == "PodGone"]
    assert len(gone) == 1 and gone[0].type == "Warning" and "c-2's pod" in gone[0].message
    w.pods["c-2"] = "missing"
    plan = step(plan.status, w)
    assert plan.action == CreateMembers(("c-2",), join=True)
    assert "PodGone" not in [e.reason for e in plan.events], "said once"
    st, _ = record_outcome(plan.status, plan.action, Outcome(True), T0)
    w.pods["c-2"] = "running"
    st = step(st, w).status
    # Deleted by the operator (here hibernation, follower first; a restart, fencing and a
    # removal mark it the same way): marked in the plan, saved before the delete, so a pass
    # cut short after it (a kill, a status conflict) says nothing, nor does the next.
    plan = step(st, w, spec(hibernate=True))
    assert isinstance(plan.action, StopMember)
    stopped = plan.action.name
    assert plan.status.member(stopped).pod_deleted  # type: ignore[union-attr]
    w.pods[stopped] = "terminating"
    plan = step(plan.status, w, spec(hibernate=True))  # no outcome recorded: cut short
    assert "PodGone" not in [e.reason for e in plan.events]
    w.pods[stopped] = "missing"
    plan = step(plan.status, w)  # woken
    assert "PodGone" not in [e.reason for e in plan.events]
    assert plan.action == CreateMembers((stopped,), join=True)
    st, _ = record_outcome(plan.status, plan.action, Outcome(True), T0)
    assert not st.member(stopped).pod_deleted  # type: ignore[union-attr]
    w.pods[stopped] = "running"
    st = step(st, w).status
    w.pods[stopped] = "missing"  # then stopped from outside again: said again
    assert "PodGone" in [e.reason for e in step(st, w).events]


def test_a_member_that_lost_pod_and_volume_is_removed_then_replaced():
    w = World(MEMBERS)
    w.pods["c-2"] = "missing"
    w.volumes["c-2"] = False
    plan = step(running_status(MEMBERS), w)
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-2")
    assert plan.status.member("c-2").role == "removing"  # type: ignore[union-attr]
    assert "MemberLost" in [e.reason for e in plan.events]
    # Out of both partitions: its remains go; then a new member takes its place.
    for p in (0, 1):
        w.voters[p].discard("c-2")
    plan = step(plan.status, w)
    assert plan.action == DeleteMember("c-2", delete_volume=True)
    st, _ = record_outcome(plan.status, plan.action, Outcome(True), T0)
    assert [m.name for m in st.members] == ["c-0", "c-1"]
    del w.pods["c-2"]
    plan = step(st, w)
    assert plan.action == CreateMembers(("c-3",), join=True)


def test_a_node_missing_a_members_address_is_told_every_address():
    w = World(MEMBERS)
    w.peers_known = False
    plan = step(running_status(MEMBERS), w)
    assert plan.action == SyncPeers("c-0", tuple((n, url(n)) for n in MEMBERS))


# ===================================================================== scale up, learners
def scaled_up_world() -> tuple[World, RaftClusterStatus, RaftClusterSpec]:
    s = spec(replicas=4)
    plan = step(running_status(MEMBERS), World(MEMBERS), s)
    assert plan.action == CreateMembers(("c-3",), join=True)
    assert plan.status.member("c-3").role == "joining"  # type: ignore[union-attr]
    w = World(MEMBERS)
    w.pods["c-3"] = "running"
    return w, plan.status, s


def test_scale_up_adds_the_new_member_as_a_learner_of_each_partition_in_turn():
    w, st, s = scaled_up_world()
    plan = step(st, w, s)
    assert plan.action == ChangeMembership(0, "c-0", "add_learner", "c-3")
    w.learners[0].add("c-3")
    plan = step(plan.status, w, s)
    assert plan.action == ChangeMembership(1, "c-0", "add_learner", "c-3")
    w.learners[1].add("c-3")
    w.follower(0, fv("c-3", lag=500, learner=True))
    w.follower(1, fv("c-3", lag=500, learner=True))
    plan = step(plan.status, w, s)
    m = plan.status.member("c-3")
    assert m is not None and m.role == "learner" and m.promotion is not None
    assert isinstance(plan.action, Wait) and "lags by 500, more than" in plan.action.reason
    assert plan.status.phase == "Scaling"


def learner_world(lag: int) -> tuple[World, RaftClusterStatus, RaftClusterSpec]:
    w, st, s = scaled_up_world()
    for p in (0, 1):
        w.learners[p].add("c-3")
        w.follower(p, fv("c-3", lag=lag, learner=True))
    plan = step(st, w, s)  # adds nothing: already a learner everywhere
    return w, plan.status, s


def test_a_learner_is_promoted_only_after_a_whole_window_within_the_lag():
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    assert st.member("c-3").promotion.window_started_at == T0  # type: ignore[union-attr]
    plan = step(st, w, s, now=T0 + window - 0.5)
    assert isinstance(plan.action, Wait) and "within learnerPromotionLag" in plan.action.reason
    plan = step(plan.status, w, s, now=T0 + window)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-3")
    w.learners[0].discard("c-3")
    w.voters[0].add("c-3")
    plan = step(plan.status, w, s, now=T0 + window + 0.2)
    assert plan.action == ChangeMembership(1, "c-0", "promote", "c-3")
    w.learners[1].discard("c-3")
    w.voters[1].add("c-3")
    plan = step(plan.status, w, s, now=T0 + window + 0.4)
    assert plan.status.member("c-3").role == "voter"  # type: ignore[union-attr]
    assert "Promoted" in [e.reason for e in plan.events]
    assert plan.action is None and plan.status.phase == "Running"


def test_a_window_shorter_than_a_pass_still_runs_its_course():
    """Passes a second apart and a window of half a second: each pass watched the learner
    (the first version of the check below took the window for the longest gap allowed, and no
    learner with a short window was ever promoted: the RBAC test on the cluster found it)."""
    w, st, s = learner_world(lag=3)
    s = s.model_copy(
        update={"raft": s.raft.model_copy(update={"learner_promotion_stable_window": 0.5})}
    )
    plan = step(st, w, s, now=T0 + 1)
    plan = step(plan.status, w, s, now=T0 + 2)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-3")


def test_a_window_not_watched_for_a_while_starts_again():
    """Found by a review: the window's start was kept in status, so after an operator outage
    (or a pass held by a long step) one sample within the lag promoted the learner at once,
    though nobody had watched its lag for the window."""
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    later = T0 + 600  # the operator was down
    plan = step(st, w, s, now=later)
    assert isinstance(plan.action, Wait) and "within learnerPromotionLag" in plan.action.reason
    promotion = plan.status.member("c-3").promotion  # type: ignore[union-attr]
    assert promotion is not None and (promotion.window_started_at, promotion.restarts) == (
        later,
        1,
    )
    assert "not watched for 600 s" in " ".join(e.message for e in plan.events)
    for i in range(1, 4):  # watched every second now: the whole window, then promoted
        plan = step(plan.status, w, s, now=later + i * window / 3)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-3")


def test_a_window_not_watched_for_longer_than_itself_starts_again_though_briefly():
    """Found by a review: a gap below 30 s still counted, so a 3 s window that started was
    passed by one sample 25 s later (an operator restart, a pass held by a snapshot install).
    A gap longer than the window (or 5 s, for windows shorter than a pass) restarts it."""
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    assert window == 3.0
    plan = step(st, w, s, now=T0 + 4)  # 4 s unwatched: more than the 3 s window
    assert isinstance(plan.action, Wait), plan.action
    assert "PromotionWindowRestarted" in [e.reason for e in plan.events]
    # Passes 3 s apart (the floor) watch a 3 s window: the learner is promoted.
    w2, st2, s2 = learner_world(lag=3)
    plan = step(st2, w2, s2, now=T0 + 3)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-3")
    # A 60 s window is watched at most 5 s apart: a sample 59 s after its start restarts it.
    long = spec(replicas=4, raft={"learnerPromotionStableWindow": 60})
    w3, st3, _ = learner_world(lag=3)
    plan = step(st3, w3, long, now=T0 + 59)
    assert isinstance(plan.action, Wait) and "PromotionWindowRestarted" in [
        e.reason for e in plan.events
    ]


def test_a_lag_excursion_restarts_the_window():
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s, now=T0 + window / 2)
    w.follower(1, fv("c-3", lag=11, learner=True))  # one partition falls behind
    plan = step(plan.status, w, s, now=T0 + window * 0.9)
    pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
    assert pr is not None and pr.window_started_at is None and pr.restarts == 1
    assert pr.max_lag == 11
    assert "PromotionWindowRestarted" in [e.reason for e in plan.events]
    w.follower(1, fv("c-3", lag=2, learner=True))
    restart = T0 + window
    plan = step(plan.status, w, s, now=restart)
    # The full window counts again from the end of the excursion, not from the first start.
    plan = step(plan.status, w, s, now=restart + window - 0.1)
    assert isinstance(plan.action, Wait)
    plan = step(plan.status, w, s, now=restart + window)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-3")


def test_a_learner_that_stops_answering_restarts_the_window_whatever_its_lag():
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s, now=T0 + window / 2)
    w.follower(0, fv("c-3", lag=0, learner=True, recent_active=False))  # paused: lag frozen
    plan = step(plan.status, w, s, now=T0 + window * 2)
    pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
    assert isinstance(plan.action, Wait) and "not answering" in plan.action.reason
    assert pr is not None and pr.window_started_at is None and pr.restarts == 1


def test_an_unknown_lag_never_counts_as_within():
    w, st, s = learner_world(lag=3)
    w.follower(0, fv("c-3", lag=None, learner=True))
    plan = step(st, w, s, now=T0 + 100)
    assert isinstance(plan.action, Wait) and "unknown" in plan.action.reason
    assert plan.status.member("c-3").promotion.window_started_at is None  # type: ignore[union-attr]


def test_a_promotion_the_leader_refuses_restarts_the_window():
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s, now=T0 + window)
    assert isinstance(plan.action, ChangeMembership) and plan.action.op == "promote"
    st2, events = record_outcome(plan.status, plan.action, Outcome(False, "HTTP 409: lags"), T0)
    pr = st2.member("c-3").promotion  # type: ignore[union-attr]
    assert pr is not None and pr.window_started_at is None and pr.restarts == 1
    assert [e.reason for e in events] == ["StepFailed", "PromotionWindowRestarted"]
    assert "the leader refused the promotion (HTTP 409: lags)" in events[1].message
    gone = Outcome(False, "HTTP 404: c-3 is not a member of partition 0")  # a 404 refuses too
    _, events = record_outcome(plan.status, plan.action, gone, T0)
    assert "the leader refused the promotion (HTTP 404" in events[1].message
    # Not answered in time: not a refusal (found by a review: it was reported as one).
    timeout = Outcome(False, "HTTP 503: the change at 9 is not committed yet")
    _, events = record_outcome(plan.status, plan.action, timeout, T0)
    assert "the promotion was not confirmed, it may still take effect" in events[1].message


def added_as_learner(
    st: RaftClusterStatus, w: World, s: RaftClusterSpec, name: str, lag: int = 0
) -> RaftClusterStatus:
    """Step `st` through `name`'s addition as a learner of both partitions, answering each."""
    for p in (0, 1):
        plan = step(st, w, s)
        assert plan.action == ChangeMembership(p, "c-0", "add_learner", name)
        w.learners[p].add(name)
        w.follower(p, fv(name, lag=lag, learner=True))
        st = plan.status
    return st


@pytest.mark.parametrize("c3", ["never starts", "lags"])
def test_a_member_that_never_starts_or_lags_holds_up_no_other_learners_promotion(c3: str):
    """3 -> 5 with c-3 stuck (its pod never runs, or it runs but lags): c-4's window runs and it
    is promoted; c-3's reason is the pass's wait before and after."""
    s = spec(replicas=5)
    st = step(running_status(MEMBERS), World(MEMBERS), s).status
    w = World(MEMBERS)
    w.pods.update({"c-3": "pending" if c3 == "never starts" else "running", "c-4": "running"})
    if c3 == "lags":
        st = added_as_learner(st, w, s, "c-3", lag=500)
    st = added_as_learner(st, w, s, "c-4")
    reason = "c-3 is starting" if c3 == "never starts" else "c-3: lags by 500"
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s)
    assert isinstance(plan.action, Wait) and plan.action.reason.startswith(reason)
    plan = step(plan.status, w, s, now=T0 + window)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-4")
    for p in (0, 1):
        w.learners[p].discard("c-4")
        w.voters[p].add("c-4")
    plan = step(plan.status, w, s, now=T0 + window + 1)
    assert isinstance(plan.action, Wait) and plan.action.reason.startswith(reason)
    c3_role = "joining" if c3 == "never starts" else "learner"
    assert [m.role for m in plan.status.members] == ["voter"] * 3 + [c3_role, "voter"]


def test_replicas_raised_again_while_a_learner_catches_up_wait_for_its_promotion():
    w, st, _ = learner_world(lag=500)
    s5 = spec(replicas=5)
    plan = step(st, w, s5)
    assert isinstance(plan.action, Wait)  # c-3 still catching up: no c-4 yet
    assert [m.name for m in plan.status.members] == ["c-0", "c-1", "c-2", "c-3"]


def test_a_scale_up_creates_its_members_together_and_promotes_them_one_at_a_time():
    """3 -> 5: both pods at once; the one running joins while the other still starts; their
    windows run side by side; each promotion is a change of its own, one after the other."""
    s = spec(replicas=5)
    plan = step(running_status(MEMBERS), World(MEMBERS), s)
    assert plan.action == CreateMembers(("c-3", "c-4"), join=True)
    assert [e.message for e in plan.events if e.reason == "ScalingUp"] == [
        "adding c-3, c-4 (5 of 5)"
    ]
    assert plan.status.next_ordinal == 5
    w = World(MEMBERS)
    w.pods.update({"c-3": "pending", "c-4": "running"})
    plan = step(plan.status, w, s)
    assert plan.action == ChangeMembership(0, "c-0", "add_learner", "c-4")  # c-3 holds up nothing
    for p in (0, 1):
        w.learners[p].add("c-4")
        w.follower(p, fv("c-4", lag=0, learner=True))
    plan = step(plan.status, w, s)
    assert isinstance(plan.action, Wait) and plan.action.reason == "c-3 is starting"
    assert plan.status.member("c-4").role == "learner"  # type: ignore[union-attr]
    w.pods["c-3"] = "running"
    st = added_as_learner(plan.status, w, s, "c-3")
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s, now=T0 + 0.1)  # both windows open
    assert all(plan.status.member(n).promotion.window_started_at for n in ("c-3", "c-4"))  # type: ignore[union-attr]
    promoted = []
    now = T0 + window + 0.1
    while (plan := step(plan.status, w, s, now=now)).action is not None:
        action = plan.action
        assert isinstance(action, ChangeMembership) and action.op == "promote", action
        promoted.append((action.partition, action.member))
        w.learners[action.partition].discard(action.member)
        w.voters[action.partition].add(action.member)
        now += 0.2
    assert promoted == [(0, "c-3"), (1, "c-3"), (0, "c-4"), (1, "c-4")]
    assert [m.role for m in plan.status.members] == ["voter"] * 5


def test_a_scale_down_during_a_scale_up_removes_the_learner_without_promoting_it():
    w, st, _ = learner_world(lag=3)
    plan = step(st, w, spec(replicas=3), now=T0 + 100)
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-3")
    assert plan.status.member("c-3").role == "removing"  # type: ignore[union-attr]


def test_scale_up_waits_for_unready_members():
    w = World(MEMBERS)
    w.silent.add("c-1")
    plan = step(running_status(MEMBERS), w, spec(replicas=4))
    assert isinstance(plan.action, Wait) and "c-1" in plan.action.reason


def test_a_joining_member_becomes_a_learner_only_once_its_pod_runs() -> None:
    w, st, s = scaled_up_world()
    w.pods["c-3"] = "pending"
    plan = step(st, w, s)
    assert plan.action == Wait("c-3 is starting")  # nothing asked of the leaders yet
    w.pods["c-3"] = "running"
    for p in (0, 1):
        plan = step(plan.status, w, s)
        assert plan.action == ChangeMembership(p, "c-0", "add_learner", "c-3")
        w.learners[p].add("c-3")
    plan = step(plan.status, w, s)
    assert plan.status.member("c-3").role == "learner"  # type: ignore[union-attr]
    assert [e.message for e in plan.events if e.reason == "LearnerAdded"] == [
        "c-3 is a learner of every partition; catching up"
    ]


def test_a_starting_member_does_not_count_toward_the_voters_quorum() -> None:
    w, st, s = scaled_up_world()
    w.pods["c-3"] = "pending"
    w.silent.add("c-1")  # 2 of the 3 voters ready: a majority of the voters
    plan = step(st, w, s)
    available = {c.type: c for c in plan.status.conditions}["Available"]
    assert available.status == "True" and available.reason == "QuorumAvailable"


def test_each_new_member_takes_the_next_ordinal() -> None:
    w, st, _ = scaled_up_world()
    assert st.next_ordinal == 4
    st.member("c-3").role = "voter"  # type: ignore[union-attr]
    w.voters = {p: {*MEMBERS, "c-3"} for p in (0, 1)}
    plan = step(st, w, spec(replicas=5))
    assert plan.action == CreateMembers(("c-4",), join=True)
    assert [m.name for m in plan.status.members] == ["c-0", "c-1", "c-2", "c-3", "c-4"]
    assert plan.status.next_ordinal == 5


def test_scaling_events_count_the_members_there_will_be() -> None:
    plan = step(running_status(MEMBERS), World(MEMBERS), spec(replicas=4))
    assert [e.message for e in plan.events if e.reason == "ScalingUp"] == ["adding c-3 (4 of 4)"]
    plan = step(running_status(MEMBERS), World(MEMBERS), spec(replicas=2))
    assert [e.message for e in plan.events if e.reason == "ScalingDown"] == [
        "removing c-2 (2 of the members left)"
    ]


def test_a_changed_promotion_window_applies_to_the_learner_already_in_one() -> None:
    w, st, _ = learner_world(lag=3)
    longer = spec(replicas=4, raft={"learnerPromotionStableWindow": 30})
    plan = step(st, w, longer, now=T0 + 3)
    assert plan.action == Wait("c-3 within learnerPromotionLag for 3.0 of 30 s")
    assert plan.status.member("c-3").promotion.window_seconds == 30  # type: ignore[union-attr]
    for now in range(5, 30, 2):  # watched every 2 s
        plan = step(plan.status, w, longer, now=T0 + now)
        assert isinstance(plan.action, Wait), now
    plan = step(plan.status, w, longer, now=T0 + 30)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-3")


def test_every_excursion_restarts_the_window_from_zero_and_is_counted() -> None:
    w, st, s = learner_world(lag=3)
    plan = step(st, w, s, now=T0 + 2)
    assert plan.status.member("c-3").promotion.elapsed_seconds == 2.0  # type: ignore[union-attr]
    for n, start in ((1, T0 + 3), (2, T0 + 6)):
        w.follower(1, fv("c-3", lag=11, learner=True))
        plan = step(plan.status, w, s, now=start)
        pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
        assert pr is not None and pr.restarts == n
        assert pr.window_started_at is None and pr.elapsed_seconds == 0.0  # status says 0, not 2
        w.follower(1, fv("c-3", lag=2, learner=True))
        plan = step(plan.status, w, s, now=start + 2)
        pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
        assert pr is not None and pr.window_started_at == start + 2 and pr.restarts == n


def test_a_partition_losing_its_leader_restarts_the_learners_window() -> None:
    w, st, s = learner_world(lag=3)
    plan = step(st, w, s, now=T0 + 2)
    w.leader[1] = None  # an election in partition 1: nobody reports the learner's lag there
    plan = step(plan.status, w, s, now=T0 + 2.5)
    assert plan.action == Wait("no leader for partitions [1]")
    pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
    assert pr is not None and pr.window_started_at is None and pr.restarts == 1
    assert [e.message for e in plan.events if e.reason == "PromotionWindowRestarted"] == [
        "c-3: lag unknown in partitions [1]; its promotion window starts again"
    ]


def test_a_learner_whose_lag_no_leader_knows_shows_no_lag() -> None:
    w, st, s = learner_world(lag=3)
    for p in (0, 1):
        w.follower(p, fv("c-3", lag=None, learner=True))
    plan = step(st, w, s, now=T0 + 1)
    pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
    assert pr is not None and pr.max_lag is None  # shown as "lag ?", never as 0


def test_a_promotion_the_leader_accepts_goes_on_to_the_next_partition_at_once() -> None:
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s, now=T0 + window)
    assert plan.action == ChangeMembership(0, "c-0", "promote", "c-3")
    st2, events = record_outcome(plan.status, plan.action, Outcome(True), T0 + window)
    assert events == []
    pr = st2.member("c-3").promotion  # type: ignore[union-attr]
    assert pr is not None and pr.window_started_at == T0 and pr.restarts == 0
    w.learners[0].discard("c-3")
    w.voters[0].add("c-3")
    plan = step(st2, w, s, now=T0 + window + 0.2)
    assert plan.action == ChangeMembership(1, "c-0", "promote", "c-3")
    w.learners[1].discard("c-3")
    w.voters[1].add("c-3")
    plan = step(plan.status, w, s, now=T0 + window + 0.4)
    m = plan.status.member("c-3")
    assert m is not None and m.role == "voter" and m.promotion is None  # no window left shown


def test_a_learner_being_removed_gets_no_promotion_window_events() -> None:
    w, st, _ = learner_world(lag=3)
    s3 = spec(replicas=3)
    plan = step(st, w, s3, now=T0 + 1)
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-3")
    w.learners[0].discard("c-3")  # out of partition 0: no lag reported there any more
    plan = step(plan.status, w, s3, now=T0 + 2)
    assert plan.action == ChangeMembership(1, "c-0", "remove", "c-3")
    assert "PromotionWindowRestarted" not in [e.reason for e in plan.events]


def test_the_promotion_window_follows_learner_promotion_lag_not_the_backfill_threshold() -> None:
    w, st, _ = learner_world(lag=3)
    s = spec(replicas=4, raft={"learnerPromotionLag": 5, "backfillThreshold": 50})
    for p in (0, 1):
        w.follower(p, fv("c-3", lag=7, learner=True))
    plan = step(st, w, s, now=T0 + 1)
    assert plan.action == Wait("c-3: lags by 7, more than learnerPromotionLag=5")
    assert plan.status.member("c-3").promotion.restarts == 1  # type: ignore[union-attr]


def test_a_learner_is_not_promoted_even_a_moment_before_its_window_ends() -> None:
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s, now=T0 + window - 0.01)
    assert isinstance(plan.action, Wait) and "within learnerPromotionLag" in plan.action.reason
    pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
    assert pr is not None and pr.elapsed_seconds == pytest.approx(window - 0.01)


def test_a_joining_member_is_added_as_a_learner_before_it_knows_any_leader() -> None:
    """Not in any partition's configuration yet, it hears from no leader, so it is not ready;
    running is enough (waiting for ready would wait for good)."""
    w, st, s = scaled_up_world()
    w.leaderless |= {("c-3", 0), ("c-3", 1)}
    plan = step(st, w, s)
    assert plan.action == ChangeMembership(0, "c-0", "add_learner", "c-3")


def test_a_scale_up_waiting_for_an_unready_member_says_scaling() -> None:
    w = World(MEMBERS)
    w.silent.add("c-1")
    plan = step(running_status(MEMBERS), w, spec(replicas=4))
    assert isinstance(plan.action, Wait) and "scaling up waits for c-1" in plan.action.reason
    assert plan.status.phase == "Scaling"


# ===================================================================== scale down
def test_scale_down_transfers_leadership_away_then_removes_one_voter_then_deletes():
    w = World(MEMBERS)
    w.leader = {0: "c-2", 1: "c-0"}
    w.follower(0, fv("c-0", lag=0, match=100))
    w.follower(0, fv("c-1", lag=5, match=95))
    s = spec(replicas=2)
    plan = step(running_status(MEMBERS), w, s)
    assert plan.action == TransferLeader(0, "c-2", "c-0")  # the most caught-up voter
    assert plan.status.member("c-2").role == "removing"  # type: ignore[union-attr]
    w.leader[0] = "c-0"
    plan = step(plan.status, w, s)
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-2")
    w.voters[0].discard("c-2")
    plan = step(plan.status, w, s)
    assert plan.action == ChangeMembership(1, "c-0", "remove", "c-2")
    w.voters[1].discard("c-2")
    plan = step(plan.status, w, s)
    assert plan.action == DeleteMember("c-2", delete_volume=True)
    st, _ = record_outcome(plan.status, plan.action, Outcome(True), T0)
    assert [m.name for m in st.members] == ["c-0", "c-1"]


def test_a_removed_voter_is_deleted_only_once_its_removal_is_committed():
    """Found by a review: the leader's view lacks the member once the change is appended, and
    the member's pod and volume went while the change waited for a lagging voter to commit it.
    Until then the member may hold acknowledged entries the others lack."""
    w = World(MEMBERS)
    s = spec(replicas=2)
    plan = step(running_status(MEMBERS), w, s)
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-2")
    w.voters[0].discard("c-2")
    w.pending.add(0)
    plan = step(plan.status, w, s)
    assert plan.action == ChangeMembership(1, "c-0", "remove", "c-2")
    w.voters[1].discard("c-2")
    w.pending.add(1)
    for _ in range(2):
        plan = step(plan.status, w, s)
        assert plan.action == Wait(
            "removing c-2: the change is not committed yet in partitions [0, 1]"
        )
    w.pending.discard(0)
    plan = step(plan.status, w, s)
    assert plan.action == Wait("removing c-2: the change is not committed yet in partitions [1]")
    w.pending.clear()
    assert step(plan.status, w, s).action == DeleteMember("c-2", delete_volume=True)


def test_the_leaders_pending_membership_is_read_from_its_status() -> None:
    def part(p: int, pending: bool | None) -> dict[str, Any]:
        return {
            "partition": p, "role": "leader", "member": "voter", "term": 2, "leader": "c-0",
            "high_water_mark": 9, "compaction_floor": 1, "voters": ["c-0", "c-1"],
            "learners": [], "membership_pending": pending,
        }  # fmt: skip

    body = {"node": "c-0", "partitions": [part(0, True), part(1, False), part(2, None)]}
    view = parse_node_status(body)
    assert [view.partitions[p].membership_pending for p in range(3)] == [True, False, False]


def test_retained_volumes_are_kept_on_scale_down():
    w = World(MEMBERS)
    for p in (0, 1):
        w.voters[p].discard("c-2")
    s = spec(replicas=2, storage={"reclaimPolicy": "Retain"})
    assert step(running_status(MEMBERS), w, s).action == DeleteMember("c-2", delete_volume=False)


def test_scale_down_never_removes_a_voter_when_the_rest_would_lose_their_majority():
    members = ["c-0", "c-1", "c-2", "c-3"]
    w = World(members)
    w.silent |= {"c-1", "c-2"}  # two of the three that would stay are down
    plan = step(running_status(members), w, spec(replicas=3))
    assert isinstance(plan.action, Wait) and "below a majority" in plan.action.reason


def test_no_transfer_without_a_caught_up_successor():
    w = World(MEMBERS)
    w.leader = {0: "c-2", 1: "c-0"}
    w.follower(0, fv("c-0", state="probe"))
    w.follower(0, fv("c-1", recent_active=False))
    plan = step(running_status(MEMBERS), w, spec(replicas=2))
    assert isinstance(plan.action, Wait) and "no caught-up voter" in plan.action.reason


def test_scale_down_of_three_waits_while_the_one_left_ready_is_no_majority() -> None:
    w = World(MEMBERS)
    w.silent.add("c-1")  # c-0 and c-1 would stay: only c-0 ready
    plan = step(running_status(MEMBERS), w, spec(replicas=2))
    assert plan.action == Wait(
        "partition 0: removing c-2 would leave 1 ready of 2 voters, below a majority"
    )


def test_scale_down_of_four_goes_ahead_while_the_three_left_keep_a_ready_majority() -> None:
    members = ["c-0", "c-1", "c-2", "c-3"]
    w = World(members)
    w.silent.add("c-1")  # c-0 and c-2 ready of the three that stay: a majority of them
    plan = step(running_status(members), w, spec(replicas=3))
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-3")


def test_scale_down_hands_over_every_partition_the_member_leads_not_only_the_first() -> None:
    w = World(MEMBERS)
    w.leader = {0: "c-0", 1: "c-2"}
    w.follower(1, fv("c-0", lag=3, match=97))
    plan = step(running_status(MEMBERS), w, spec(replicas=2))
    assert plan.action == TransferLeader(1, "c-2", "c-1")
    assert plan.status.member("c-2").role == "removing"  # type: ignore[union-attr]


def test_during_a_scale_down_the_status_counts_the_members_staying_and_says_scaling() -> None:
    plan = step(running_status(MEMBERS), World(MEMBERS), spec(replicas=2))
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-2")
    assert plan.status.replicas == 2 and plan.status.ready_replicas == 2
    assert plan.status.phase == "Scaling"


def test_a_member_whose_deletion_failed_stays_in_the_status() -> None:
    st = running_status(MEMBERS)
    st.members[2].role = "removing"
    action = DeleteMember("c-2", delete_volume=True)
    st2, events = record_outcome(st, action, Outcome(False, "HTTP 500: etcd timeout"), T0)
    assert [m.name for m in st2.members] == MEMBERS  # the next pass deletes it again
    assert [e.reason for e in events] == ["StepFailed"]


def test_scale_down_hands_the_leadership_to_a_ready_voter_only() -> None:
    w = World(MEMBERS)
    w.leader = {0: "c-2", 1: "c-0"}
    w.follower(0, fv("c-0", lag=5, match=95))
    w.follower(0, fv("c-1", lag=0, match=100))  # further along, but not ready:
    w.leaderless.add(("c-1", 1))  # it knows no leader of partition 1
    plan = step(running_status(MEMBERS), w, spec(replicas=2))
    assert plan.action == TransferLeader(0, "c-2", "c-0")


# ===================================================================== snapshot installs
def snapshot_world(**kw: Any) -> World:
    w = World(MEMBERS)
    w.floor = 500
    w.follower(1, fv("c-2", lag=None, state="snapshot", match=10, snapshot_required=True))
    w.follower(1, fv("c-1", **({"lag": 0, "match": 900} | kw)))
    return w


def test_snapshot_required_schedules_an_install_from_an_eligible_follower():
    plan = step(running_status(MEMBERS), snapshot_world())
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "c-1")
    inst = plan.status.snapshot_installs[0]
    assert (inst.member, inst.partition, inst.source, inst.state) == ("c-2", 1, "c-1", "pending")
    assert "SnapshotRequired" in [e.reason for e in plan.events]
    assert plan.status.member("c-2").partitions[1].snapshot_required  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "follower, why",
    [
        ({"recent_active": False}, "unresponsive"),
        ({"match": 400}, "its match is below what the target needs"),
        ({"match": 498}, "one short of the floor's entry before it (499)"),
        ({"snapshot_required": True, "state": "snapshot"}, "it needs a snapshot itself"),
    ],
)
def test_an_ineligible_follower_leaves_the_install_to_the_leader(follower, why):
    plan = step(running_status(MEMBERS), snapshot_world(**follower))
    assert isinstance(plan.action, InstallSnapshot) and plan.action.source == "leader", why


def test_a_follower_holding_exactly_the_entry_before_the_floor_may_stream():
    """The target needs the snapshot and then the entries from the floor on: a follower whose
    match is the floor's entry before (499) holds all it needs to be sent."""
    plan = step(running_status(MEMBERS), snapshot_world(match=499))
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "c-1")


def test_the_leader_policy_always_uses_the_leader():
    plan = step(running_status(MEMBERS), snapshot_world(), spec(snapshotSource="leader"))
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "leader")


def test_a_failed_install_is_retried_with_back_off_then_given_up_and_reported():
    w = snapshot_world()
    plan = step(running_status(MEMBERS), w)
    st = plan.status
    now = T0
    seen = []
    for attempt in range(1, INSTALL_MAX_ATTEMPTS + 1):
        assert isinstance(plan.action, InstallSnapshot)
        st, _ = record_outcome(plan.status, plan.action, Outcome(False, "HTTP 503: reset"), now)
        inst = st.snapshot_installs[0]
        assert inst.attempts == attempt and inst.last_error == "HTTP 503: reset"
        if attempt < INSTALL_MAX_ATTEMPTS:  # 2 s after the first failure, doubled after each
            wait = {1: 2.0, 2: 4.0, 3: 8.0, 4: 16.0}[attempt]
            assert inst.next_attempt_at == pytest.approx(now + wait), (attempt, inst)
        plan = step(st, w, now=now + 0.1)
        seen += [e.reason for e in plan.events]
        if attempt < INSTALL_MAX_ATTEMPTS:
            assert isinstance(plan.action, Wait) and "next snapshot install" in plan.action.reason
        now = inst.next_attempt_at
        plan = step(plan.status, w, now=now)
    assert not isinstance(plan.action, InstallSnapshot)
    assert plan.status.snapshot_installs[0].state == "failed"
    assert seen == ["SnapshotInstallFailed"]  # once, when given up
    degraded = {c.type: c for c in plan.status.conditions}["Degraded"]
    assert degraded.status == "True" and degraded.reason == "SnapshotInstallFailed"


def test_each_attempt_chooses_its_source_again():
    """A source chosen when the install was scheduled may be gone by the next attempt (its
    volume lost and the member removed): the leader refuses a source that is not a member, so
    five attempts from it gave the install up while the member needing it held the quorum."""
    w = snapshot_world()
    plan = step(running_status(MEMBERS), w)
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "c-1")
    st, _ = record_outcome(plan.status, plan.action, Outcome(False, "HTTP 503: timeout"), T0)
    w.follower(1, fv("c-1", lag=0, match=900, recent_active=False))  # c-1 stopped answering
    plan = step(st, w, now=T0 + 5)
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "leader")
    assert plan.status.snapshot_installs[0].source == "leader"
    changed = [e for e in plan.events if e.reason == "SnapshotSourceChanged"]
    assert len(changed) == 1 and "from leader, not c-1" in changed[0].message, plan.events
    # Eligible again: the next attempt goes back to it, and says so.
    st, _ = record_outcome(plan.status, plan.action, Outcome(False, "HTTP 503: reset"), T0 + 5)
    w.follower(1, fv("c-1", lag=0, match=900))
    plan = step(st, w, now=T0 + 60)
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "c-1")
    assert [e.reason for e in plan.events].count("SnapshotSourceChanged") == 1


def test_no_attempt_is_spent_while_the_target_pod_is_not_running():
    w = snapshot_world()
    plan = step(running_status(MEMBERS), w)
    assert isinstance(plan.action, InstallSnapshot)
    st, _ = record_outcome(plan.status, plan.action, Outcome(False, "HTTP 503: timeout"), T0)
    w.pods["c-2"] = "pending"  # restarted: its new pod is not running yet
    for now in (T0 + 5, T0 + 50, T0 + 500):
        plan = step(st, w, now=now)
        assert not isinstance(plan.action, InstallSnapshot), plan.action
        st = plan.status
        assert st.snapshot_installs[0].attempts == 1 and st.snapshot_installs[0].state == "pending"
    w.pods["c-2"] = "running"
    plan = step(st, w, now=T0 + 501)
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "c-1")


def test_a_member_needing_a_snapshot_whose_pod_never_runs_can_still_be_removed():
    """Found by a review: its pending install answered every pass with a Wait, so nothing
    after it ran, the removal that would replace the member included (a pod left Pending
    by a node that is gone)."""
    w = snapshot_world()
    w.pods["c-2"] = "pending"
    s = spec(replicas=2, removeMembers=["c-2"])
    st = running_status(MEMBERS)
    for now in (T0, T0 + 1000):
        plan = step(st, w, s, now=now)
        st = plan.status
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-2")
    assert st.snapshot_installs[0].attempts == 0 and st.snapshot_installs[0].state == "pending"


def test_a_successful_install_is_recorded_and_the_member_leaves_the_list_of_pending():
    w = snapshot_world()
    plan = step(running_status(MEMBERS), w)
    assert isinstance(plan.action, InstallSnapshot)
    st, events = record_outcome(plan.status, plan.action, Outcome(True, "status=installed"), T0 + 2)
    inst = st.snapshot_installs[0]
    assert inst.state == "installed" and inst.attempts == 1 and inst.finished_at == T0 + 2
    assert [e.reason for e in events] == ["SnapshotInstalled"]
    w.follower(1, fv("c-2", lag=0))
    plan = step(st, w, now=T0 + 3)
    assert plan.action is None and plan.status.phase == "Running"


def test_an_install_the_leader_streamed_itself_names_the_leader_as_its_source():
    """Found by a review: when the named member could not stream it, the event and the status
    still named that member as the source, and the leader's own word was only in the detail."""
    plan = step(running_status(MEMBERS), snapshot_world())
    assert plan.action == InstallSnapshot(1, "c-0", "c-2", "c-1")
    said = "status=installed, source=leader, fell_back_to_leader=c-1 could not stream it"
    st, events = record_outcome(plan.status, plan.action, Outcome(True, said, source="leader"), T0)
    assert st.snapshot_installs[0].source == "leader"
    assert events[0].message.startswith("partition 1: snapshot installed on c-2 from leader in")
    plan = step(running_status(MEMBERS), snapshot_world())
    assert plan.action is not None
    st, events = record_outcome(plan.status, plan.action, Outcome(True, "", source="c-1"), T0)
    assert st.snapshot_installs[0].source == "c-1" and " from c-1 in " in events[0].message


# ===================================================================== rolling restart
def test_a_spec_change_restarts_followers_first_then_the_leader_after_a_transfer():
    s = spec(image="raftlog:new")
    old = config_hash(spec())
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, old)
    for p in (0, 1):
        w.follower(p, fv("c-1", lag=0, match=100))
        w.follower(p, fv("c-2", lag=1, match=99))
    plan = step(running_status(MEMBERS), w, s)
    assert plan.action == RestartMember("c-1")
    w.hashes["c-1"] = w.hashes["c-2"] = config_hash(s)
    plan = step(plan.status, w, s)
    assert plan.action == TransferLeader(0, "c-0", "c-1")
    w.leader = {0: "c-1", 1: "c-1"}
    plan = step(plan.status, w, s)
    assert plan.action == RestartMember("c-0")


def test_a_restart_waits_while_a_follower_is_behind_or_a_member_unready():
    s = spec(image="raftlog:new")
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    w.follower(0, fv("c-2", lag=50))
    plan = step(running_status(MEMBERS), w, s)
    assert isinstance(plan.action, Wait) and "c-2 behind" in plan.action.reason
    w.follower(0, fv("c-2", lag=0))
    w.silent.add("c-2")
    plan = step(running_status(MEMBERS), w, s)
    assert isinstance(plan.action, Wait) and "c-2 to be ready" in plan.action.reason


def test_a_member_that_knows_no_leader_of_a_partition_is_not_ready_and_the_roll_waits():
    """As its pod's /readyz says: answering is not enough (a restarted member that has not
    heard from one partition's leader yet); readyReplicas and the roll go by it."""
    s = spec(image="raftlog:new")
    w = World(MEMBERS)
    w.hashes = {"c-0": config_hash(spec()), "c-1": config_hash(spec()), "c-2": config_hash(s)}
    w.leaderless.add(("c-2", 1))
    plan = step(running_status(MEMBERS), w, s)
    assert isinstance(plan.action, Wait) and "c-2 to be ready" in plan.action.reason
    assert [m.ready for m in plan.status.members] == [True, True, False]
    assert plan.status.ready_replicas == 2
    w.leaderless.clear()
    plan = step(plan.status, w, s)
    assert plan.action == RestartMember("c-1")
    assert plan.status.ready_replicas == 3


def test_a_stale_member_that_answers_but_knows_no_leader_is_restarted_first():
    """Its restart may be what brings it back (a partition it could not start); waiting for it
    to be ready, as for the others, would hold the roll for good."""
    s = spec(image="raftlog:new")
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    w.leaderless.add(("c-2", 1))
    plan = step(running_status(MEMBERS), w, s)
    assert plan.action == RestartMember("c-2")
    assert [e.message for e in plan.events if e.reason == "RollingRestart"] == [
        "restarting c-2 with the new configuration, not ready"
    ]


def test_a_member_whose_pod_cannot_start_is_restarted_once_the_spec_is_fixed():
    """A bad image (or a node selector nothing matches) stops the roll at its first member,
    whose pod never answers. Fixed in the spec, that member must get the fixed pod: waiting
    for it to be ready, as for a pod that may be starting, held the roll for good (found on
    the real cluster: only `kubectl delete pod` moved it)."""
    bad, fixed = spec(image="raftlog:typo"), spec(image="raftlog:new")
    w = World(MEMBERS)
    w.hashes = {"c-0": config_hash(spec()), "c-1": config_hash(spec()), "c-2": config_hash(bad)}
    w.pods["c-2"] = "pending"
    plan = step(running_status(MEMBERS), w, bad)
    assert isinstance(plan.action, Wait) and "c-2 to be ready" in plan.action.reason
    w.stuck["c-2"] = "ImagePullBackOff"
    plan = step(plan.status, w, bad)  # the same spec: its pod would be the same again
    assert isinstance(plan.action, Wait) and "c-2 to be ready" in plan.action.reason
    degraded = next(c for c in plan.status.conditions if c.type == "Degraded")
    assert "not ready: c-2 (ImagePullBackOff)" in degraded.message
    plan = step(plan.status, w, fixed)
    assert plan.action == RestartMember("c-2")
    assert [e.message for e in plan.events if e.reason == "RollingRestart"] == [
        "restarting c-2 with the new configuration, not ready"
    ]
    # A pod on its way (pending, nothing stuck) is waited for, spec fixed or not.
    del w.stuck["c-2"]
    plan = step(running_status(MEMBERS), w, fixed)
    assert isinstance(plan.action, Wait) and "c-2 to be ready" in plan.action.reason


def test_initial_voters_that_cannot_start_are_made_again_once_the_spec_is_fixed():
    """A new cluster over retained volumes with fewer partitions than they hold: every member
    crash-loops (its node refuses to lower the count), and raising the count again waited for
    an election that could not come (found on the real cluster)."""
    bad, fixed = spec(partitions=1), spec(partitions=2)
    w = World(MEMBERS)
    w.silent = set(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(bad))
    w.stuck = dict.fromkeys(MEMBERS, "CrashLoopBackOff")
    status = running_status(MEMBERS)
    status.bootstrapped = False
    plan = step(status, w, bad)
    assert isinstance(plan.action, Wait) and "initial voters" in plan.action.reason
    plan = step(status, w, fixed)
    assert plan.action == RestartMember("c-0")
    assert [e.message for e in plan.events if e.reason == "RollingRestart"] == [
        "restarting c-0 with the new configuration, its pod cannot start (CrashLoopBackOff)"
    ]
    w.stuck.clear()  # made again, starting: waited for
    plan = step(status, w, fixed)
    assert isinstance(plan.action, Wait) and "initial voters" in plan.action.reason


def test_during_a_raise_the_partitions_not_every_member_holds_leave_readiness_alone():
    s = spec(partitions=3)
    w = World(MEMBERS)
    w.hashes = {"c-0": config_hash(spec()), "c-1": config_hash(spec()), "c-2": config_hash(s)}
    w.extra["c-2"] = 3  # restarted with 3: its partition 2 waits for the others to elect
    plan = step(running_status(MEMBERS), w, s)
    assert plan.status.ready_replicas == 3
    assert plan.action == RestartMember("c-1")


def test_scaling_alone_restarts_nobody():
    assert config_hash(spec(replicas=3)) == config_hash(spec(replicas=5))
    assert config_hash(spec()) != config_hash(spec(raft={"backfillThreshold": 20}))


def test_a_change_of_the_promotion_window_restarts_nobody():
    # Only the operator reads the window: the members run what they ran, and a pass over a
    # steady cluster with the new window takes no step at all.
    s = spec(raft={"learnerPromotionStableWindow": 30})
    assert config_hash(s) == config_hash(spec())
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    plan = step(running_status(MEMBERS), w, s)
    assert plan.action is None
    assert "RollingRestart" not in [e.reason for e in plan.events]
    # A setting the members do read, changed the same way, rolls them.
    assert step(running_status(MEMBERS), w, spec(raft={"learnerPromotionLag": 5})).action == (
        RestartMember("c-1")
    )


def test_a_condition_keeps_its_transition_time_until_it_changes():
    st = running_status(MEMBERS)
    w = World(MEMBERS)
    plan = step(st, w, now=T0)
    first = {c.type: c.last_transition_time for c in plan.status.conditions}
    plan = step(plan.status, w, now=T0 + 3600)
    assert {c.type: c.last_transition_time for c in plan.status.conditions} == first
    w.silent.add("c-1")
    plan = step(plan.status, w, now=T0 + 7200)
    changed = {c.type: c.last_transition_time for c in plan.status.conditions}
    assert changed["Degraded"] != first["Degraded"] and changed["Available"] == first["Available"]


def test_an_excursion_restarts_the_window_while_a_snapshot_install_takes_the_pass():
    """The learner falls so far behind that it needs a snapshot: the passes go to the install,
    and its promotion window must still start again (before, only the promotion step did it)."""
    w, st, s = learner_world(lag=3)
    window = s.raft.learner_promotion_stable_window
    plan = step(st, w, s, now=T0 + window / 2)
    assert plan.status.member("c-3").promotion.window_started_at == T0  # type: ignore[union-attr]
    w.follower(
        0, fv("c-3", lag=None, state="snapshot", match=10, learner=True, snapshot_required=True)
    )
    plan = step(plan.status, w, s, now=T0 + window * 0.9)
    assert isinstance(plan.action, InstallSnapshot) and plan.action.target == "c-3"
    pr = plan.status.member("c-3").promotion  # type: ignore[union-attr]
    assert pr is not None and pr.window_started_at is None and pr.restarts == 1
    assert "PromotionWindowRestarted" in [e.reason for e in plan.events]


# ===================================================================== partition count
def test_raised_partitions_roll_the_members_before_the_new_partitions_have_leaders():
    s = spec(partitions=4)
    w = World(MEMBERS)  # the members serve 2 partitions until they restart with 4
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    for p in (0, 1):
        w.follower(p, fv("c-1", lag=0, match=100))
        w.follower(p, fv("c-2", lag=0, match=100))
    plan = step(running_status(MEMBERS), w, s)
    assert plan.action == RestartMember("c-1")
    available = {c.type: c for c in plan.status.conditions}["Available"]
    assert available.status == "True"
    assert "partitions 2..3 start once every member restarted" in available.message


@pytest.mark.parametrize("replicas", [2, 4])
def test_scaling_waits_for_a_raise_of_partitions_to_finish(replicas):
    """Found by a review: a member removed (or added) between two of the raise's restarts
    left members with other first voters for the new partitions, whose majorities need not
    meet. The raise goes first, then the scaling."""
    s = spec(partitions=4, replicas=replicas)
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    w.hashes["c-1"] = config_hash(s)
    w.extra["c-1"] = 4  # c-1 restarted with 4 partitions; c-0 and c-2 serve 2
    for p in (0, 1):
        w.follower(p, fv("c-1", lag=0, match=100))
        w.follower(p, fv("c-2", lag=0, match=100))
    plan = step(running_status(MEMBERS), w, s)
    assert plan.action == RestartMember("c-2"), plan.action
    assert [m.role for m in plan.status.members] == ["voter"] * 3
    w.extra = {}  # every member serves 4: the raise is done
    w.hashes = dict.fromkeys(MEMBERS, config_hash(s))
    for p in (2, 3):
        w.voters[p], w.learners[p], w.leader[p], w.followers[p] = set(MEMBERS), set(), "c-0", {}
    plan = step(plan.status, w, s)
    if replicas == 2:
        assert isinstance(plan.action, ChangeMembership) and plan.action.op == "remove"
    else:
        assert isinstance(plan.action, CreateMembers) and plan.action.names == ("c-3",)


def test_lowered_partitions_are_refused_and_nobody_restarts():
    s = spec(partitions=1)
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    plan = step(running_status(MEMBERS), w, s)
    assert isinstance(plan.action, Wait)
    assert "spec.partitions is 1 but the members hold 2 partitions" in plan.action.reason
    assert "lowering is refused" in plan.action.reason


# ===================================================================== readiness, peers, status
def test_a_member_whose_pod_is_terminating_is_not_ready_while_its_node_still_answers() -> None:
    # Readiness follows the pod, as `kubectl get pods` does: a pod being deleted (a restart, a
    # fencing) whose node still answers counts as not ready in readyReplicas and the roll.
    observed = World(MEMBERS).observed()
    going = dataclasses.replace(observed.members["c-2"], pod="terminating")
    observed = Observed({**observed.members, "c-2": going}, observed.urls)
    plan = decide(NAME, spec(), running_status(MEMBERS), observed, T0)
    assert [m.ready for m in plan.status.members] == [True, True, False]
    assert plan.status.ready_replicas == 2


def test_a_member_being_removed_whose_pod_is_gone_is_not_made_again() -> None:
    # Its removal goes on from where it was: a new pod would only bring back what is leaving.
    w = World(MEMBERS)
    w.pods["c-2"] = "missing"  # its volume stays
    st = running_status(MEMBERS)
    st.members[2].role = "removing"
    plan = step(st, w, spec(replicas=2))
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-2")


def test_a_member_being_removed_whose_pod_died_is_made_again_while_the_quorum_needs_it() -> None:
    """Found by a review: 3 voters, c-1 down, scaled to 2; c-2's removal waits for a ready
    majority. c-2's pod then died (its volume kept): it was never made again, c-0 alone had no
    quorum, and replicas raised back to 3 did not help (a removal is cancelled once ready)."""
    w = World(MEMBERS)
    w.silent.add("c-1")
    plan = step(running_status(MEMBERS), w, spec(replicas=2))
    assert plan.status.member("c-2").role == "removing"  # type: ignore[union-attr]
    assert isinstance(plan.action, Wait) and "below a majority" in plan.action.reason
    w.pods["c-2"] = "missing"  # its volume stays
    again = step(plan.status, w, spec(replicas=2))  # the leaders' views still name it
    assert again.action == CreateMembers(("c-2",), join=True)
    w.leader = {0: None, 1: None}  # c-0 alone: no leader anywhere
    again = step(plan.status, w, spec(replicas=3))
    assert again.action == CreateMembers(("c-2",), join=True)
    w.volumes["c-2"] = False  # nothing of it to bring back
    assert not isinstance(step(plan.status, w, spec(replicas=2)).action, CreateMembers)


def test_a_joining_member_that_lost_its_pod_is_made_again_having_no_data_to_lose() -> None:
    # A member still joining never held data: no volume is nothing lost, so it is made again
    # as it was, not replaced by a new member.
    w = World([*MEMBERS, "c-3"])
    w.voters = {p: set(MEMBERS) for p in range(2)}
    w.pods["c-3"] = "missing"
    w.volumes["c-3"] = False
    st = running_status(MEMBERS)
    st.members.append(MemberStatus(name="c-3", ordinal=3, role="joining"))
    st.next_ordinal = 4
    plan = step(st, w, spec(replicas=4))
    assert plan.action == CreateMembers(("c-3",), join=True)
    assert plan.status.member("c-3").role == "joining"  # type: ignore[union-attr]
    assert "MemberLost" not in [e.reason for e in plan.events]


def test_a_node_knowing_a_member_at_an_old_address_is_told_the_new_one() -> None:
    # A member's address can change (TLS turned on: http becomes https); a node that knows
    # every name but one at its old address must still be told.
    observed = World(MEMBERS).observed()
    moved = {**observed.urls, "c-2": "https://c-2:7001"}
    plan = decide(NAME, spec(), running_status(MEMBERS), Observed(observed.members, moved), T0)
    assert plan.action == SyncPeers("c-0", tuple(sorted(moved.items())))


def test_a_partition_whose_leader_went_silent_makes_the_cluster_unavailable() -> None:
    # Partition 1's leader stopped answering; the others still name it (no election yet), so
    # they are ready and hold a quorum: only the partition without a leader seen tells.
    w = World(MEMBERS)
    w.leader = {0: "c-1", 1: "c-0"}
    w.silent.add("c-0")
    plan = step(running_status(MEMBERS), w)
    assert plan.status.ready_replicas == 2
    available = {c.type: c for c in plan.status.conditions}["Available"]
    assert (available.status, available.reason) == ("False", "NoQuorum")
    assert available.message.startswith("1 of 2 partitions have a leader")
    assert plan.status.phase == "Unavailable"


def test_a_steady_clusters_availability_says_only_its_leaders_and_readiness() -> None:
    # The note about raised partitions belongs to a raise alone.
    plan = step(running_status(MEMBERS), World(MEMBERS))
    available = {c.type: c for c in plan.status.conditions}["Available"]
    assert available.message == "2 of 2 partitions have a leader; 3 of 3 members ready"


@pytest.mark.parametrize(("leaders", "summary"), [(3, "c-0,c-1,c-2"), (4, "4 members")])
def test_the_leaders_column_names_up_to_three_leaders(leaders: int, summary: str) -> None:
    members = [f"c-{i}" for i in range(4)]
    w = World(members, partitions=4)
    w.leader = {p: members[p % leaders] for p in range(4)}
    plan = step(running_status(members), w, spec(replicas=4, partitions=4))
    assert plan.status.leader_summary == summary


def test_each_member_shows_the_partitions_it_leads_as_leader_with_no_lag() -> None:
    # `kubectl raft status` prints "leader" in these cells.
    w = World(MEMBERS)
    w.follower(0, fv("c-1", lag=4))
    plan = step(running_status(MEMBERS), w)
    leader, follower = plan.status.member("c-0"), plan.status.member("c-1")
    assert leader is not None and follower is not None
    assert [(p.lag, p.state) for p in leader.partitions] == [(0, "leader"), (0, "leader")]
    assert [(p.lag, p.state) for p in follower.partitions] == [(4, "replicate"), (0, "replicate")]


def test_a_pass_that_only_waits_is_not_reconciling() -> None:
    # Phase Reconciling is for a step taken; a wait shows in the Progressing condition.
    s = spec(image="raftlog:new")
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    w.follower(0, fv("c-2", lag=50))
    plan = step(running_status(MEMBERS), w, s)
    assert isinstance(plan.action, Wait) and plan.status.phase == "Running"
    progressing = {c.type: c for c in plan.status.conditions}["Progressing"]
    assert (progressing.status, progressing.reason) == ("True", "Wait")


def test_the_roll_waits_on_the_backfill_threshold_not_the_promotion_lag() -> None:
    # A follower within backfillThreshold is not being repaired: the roll goes on, whatever
    # learnerPromotionLag says (the mirror of the promotion window's test above).
    s = spec(image="raftlog:new", raft={"backfillThreshold": 50, "learnerPromotionLag": 5})
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    w.follower(0, fv("c-2", lag=20))
    assert step(running_status(MEMBERS), w, s).action == RestartMember("c-1")


def test_partitions_lowered_back_during_a_raise_are_refused_while_one_member_holds_more() -> None:
    # c-2 restarted with 4 already: lowering to 2 again would drop its partitions 2 and 3, so
    # the most any member holds counts, not the fewest.
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(spec()))
    w.extra["c-2"] = 4
    plan = step(running_status(MEMBERS), w, spec(partitions=2))
    assert isinstance(plan.action, Wait)
    assert "spec.partitions is 2 but the members hold 4 partitions" in plan.action.reason


# ===================================================================== what the nodes say
def test_a_nodes_status_is_read_with_the_leader_left_out_of_its_followers() -> None:
    def follower(state: str, match: int, lag: int | None, required: bool, active: bool) -> Any:
        return {"state": state, "learner": False, "match": match, "next": match + 1, "lag": lag,
                "snapshot_required": required, "recent_active": active}  # fmt: skip

    body = {
        "node": "c-0",
        "partitions": [
            {
                "partition": 0, "role": "leader", "member": "voter", "term": 4, "leader": "c-0",
                "high_water_mark": 100, "compaction_floor": 50, "voters": MEMBERS, "learners": [],
                "followers": {
                    "c-0": follower("replicate", 100, 0, False, True),  # its own progress
                    "c-1": follower("replicate", 100, 0, False, True),
                    # Lag unknown is not "no lag": it keeps a promotion window shut.
                    "c-2": follower("snapshot", 10, None, True, False),
                },
            }
        ],
    }  # fmt: skip
    view = parse_node_status(body).partitions[0]
    assert view.followers == {
        "c-1": FollowerView("c-1", False, "replicate", 100, 0, False, True),
        "c-2": FollowerView("c-2", False, "snapshot", 10, None, True, False),
    }


@pytest.mark.parametrize("order", [("c-0", "c-1"), ("c-1", "c-0")])
def test_of_two_members_that_say_they_lead_the_higher_term_is_the_leader(
    order: tuple[str, str],
) -> None:
    # A deposed leader cut off from the others still says it leads, in its older term.
    old = PartitionView(
        partition=0, role="leader", member="voter", term=3, leader="c-0", high_water_mark=90,
        compaction_floor=1, voters=frozenset(MEMBERS), learners=frozenset(),
    )  # fmt: skip
    new = dataclasses.replace(old, term=4, leader="c-1", high_water_mark=100)
    views = {"c-0": old, "c-1": new}
    observed = Observed(
        {n: MemberObserved(n, "running", True, None, NodeView(n, {0: views[n]})) for n in order}
    )
    assert observed.leader_view(0) == new


# ===================================================================== status.lastAction
@pytest.mark.parametrize(
    ("action", "line"),
    [
        (CreateMembers(("c-3",), join=True), "create c-3 (joining the running cluster)"),
        (CreateMembers(("c-0", "c-1"), join=False), "create c-0, c-1"),
        (DeleteMember("c-3", delete_volume=True), "delete c-3 and its volume"),
        (DeleteMember("c-3", delete_volume=False), "delete c-3"),
        (
            ChangeMembership(1, "c-0", "add_learner", "c-3"),
            "partition 1: add learner c-3 (asked of c-0)",
        ),
        (
            InstallSnapshot(0, "c-0", "c-2", "c-1"),
            "partition 0: install a snapshot on c-2 from c-1 (leader c-0)",
        ),
        (TakeBackup("nightly", ((0, "c-0"), (1, "c-1"))), "back up as nightly (2 partitions)"),
    ],
)
def test_the_last_action_says_what_was_asked(action: Action, line: str) -> None:
    # status.lastAction and the Progressing condition's message: what a person reads.
    assert describe(action) == line


def test_replicas_lowered_while_another_step_takes_the_pass_says_scaling() -> None:
    # The snapshot install comes before the scale down; the phase already tells of the scale.
    w = World(MEMBERS)
    w.follower(0, fv("c-2", lag=None, state="snapshot", match=10, snapshot_required=True))
    plan = step(running_status(MEMBERS), w, spec(replicas=2))
    assert isinstance(plan.action, InstallSnapshot) and plan.status.phase == "Scaling"
