"""Restores and backups in the reconciler (issue 21), table-style through `decide` and
`record_outcome`: a restored cluster's plan comes first and once, every member that starts it is
given that plan, and backups are taken by name or by schedule, each recorded once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.operator.test_reconciler import MEMBERS, NAME, T0, World, running_status, spec

from raftlog.operator import manifests
from raftlog.operator.actions import CreateMembers, Outcome, PlanRestore, TakeBackup, Wait
from raftlog.operator.archive_steps import BACKUP_STALLED_S, BACKUPS_KEPT, RESTORE_RETRY_S
from raftlog.operator.cluster_views import Observed
from raftlog.operator.controls import BACKUP, NONE, Controls, parse
from raftlog.operator.models import RaftClusterSpec, RaftClusterStatus
from raftlog.operator.node_launch import restore_env
from raftlog.operator.reconciler import Plan, config_hash, decide, record_outcome

ARCHIVE = {"url": "s3://bkt/new"}
RESTORE = {"url": "s3://bkt/old", "target": "backup:nightly"}


def restored_spec(**kw: Any) -> RaftClusterSpec:
    return spec(archive=ARCHIVE, restore=RESTORE, **kw)


def run(
    st: RaftClusterStatus,
    observed: Observed,
    s: RaftClusterSpec,
    now: float = T0,
    controls: Controls = NONE,
) -> Plan:
    return decide(NAME, s, st, observed, now, None, controls)


# ===================================================================== restore
def test_a_restored_cluster_plans_first_then_creates_its_members_with_the_plan() -> None:
    s = restored_spec()
    plan = run(RaftClusterStatus(), Observed({}), s)
    assert plan.action == PlanRestore()
    assert plan.status.members == []  # nobody before the plan
    assert plan.status.restore is not None and plan.status.restore.state == "planning"
    st, events = record_outcome(
        plan.status, PlanRestore(), Outcome(True, "backup nightly", indexes={0: 41, 1: 7}), T0
    )
    assert st.restore is not None and st.restore.state == "planned"
    assert [(p.partition, p.index) for p in st.restore.partitions] == [(0, 41), (1, 7)]
    assert [e.reason for e in events] == ["RestorePlanned"]
    assert "0@41, 1@7" in events[0].message
    # Then the initial voters, started with the plan.
    plan = run(st, Observed({}), s, T0 + 1)
    assert plan.action == CreateMembers(("c-0", "c-1", "c-2"), join=False)
    env = restore_env(plan.status)
    assert env == {
        "RAFTLOG_RESTORE_URL": "s3://bkt/old",
        "RAFTLOG_RESTORE_INDEXES": json.dumps({"0": 41, "1": 7}),
    }
    pod = manifests.pod(s, NAME, "ns", "c-0", {}, join=False, config_hash="h", restore=env)
    got = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert got["RAFTLOG_RESTORE_INDEXES"] == json.dumps({"0": 41, "1": 7})
    # A member that joins later is sent the log: no plan for it.
    joining = manifests.pod(s, NAME, "ns", "c-3", {}, join=True, config_hash="h")
    assert "RAFTLOG_RESTORE_URL" not in {e["name"] for e in joining["spec"]["containers"][0]["env"]}


def test_a_plan_still_being_made_is_never_given_to_a_member() -> None:
    # No indexes yet: a member started with it would restore nothing and start empty.
    plan = run(RaftClusterStatus(), Observed({}), restored_spec())
    assert plan.status.restore is not None and plan.status.restore.state == "planning"
    assert restore_env(plan.status) == {}


def test_a_plan_that_fails_is_shown_and_tried_again_after_a_pause() -> None:
    s = restored_spec()
    plan = run(RaftClusterStatus(), Observed({}), s)
    st, _ = record_outcome(
        plan.status, PlanRestore(), Outcome(False, "partition 0: index 9 is not archived"), T0
    )
    assert st.restore is not None and st.restore.state == "failed"
    later = run(st, Observed({}), s, T0 + RESTORE_RETRY_S / 2)
    assert isinstance(later.action, Wait)
    assert "index 9 is not archived" in later.action.reason
    assert later.status.members == []
    again = run(st, Observed({}), s, T0 + RESTORE_RETRY_S + 1)
    assert again.action == PlanRestore()
    assert restore_env(st) == {}  # a failed plan is never given to a member


def test_a_planned_restore_is_not_planned_again_and_not_part_of_the_launch_hash() -> None:
    s = restored_spec()
    st = running_status(MEMBERS, s)
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(s))
    plan = run(st, w.observed(), s)
    assert not isinstance(plan.action, PlanRestore)  # members exist: it was restored already
    assert config_hash(s) == config_hash(spec(archive=ARCHIVE))
    scheduled = spec(archive={**ARCHIVE, "backupIntervalMinutes": 60})
    assert config_hash(scheduled) == config_hash(spec(archive=ARCHIVE))


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"restore": RESTORE}, "restore: needs archive"),
        ({"archive": {"url": "s3://bkt/old"}, "restore": RESTORE}, "restore.url: the same"),
        # The same place up to a trailing slash is the same place.
        ({"archive": {"url": "s3://bkt/old/"}, "restore": RESTORE}, "restore.url: the same"),
        ({"archive": ARCHIVE, "restore": {"url": "s3://bkt/old", "target": "soon"}}, "target"),
        ({"archive": ARCHIVE, "restore": {"url": "http://bkt/old"}}, "s3://bucket/prefix"),
        ({"archive": {**ARCHIVE, "backupIntervalMinutes": 1}}, "backupIntervalMinutes"),
    ],
)
def test_restore_and_schedule_fields_are_checked_naming_the_field(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        spec(**extra)


# ===================================================================== backups
def settled(s: RaftClusterSpec) -> tuple[RaftClusterStatus, World]:
    w = World(MEMBERS)
    w.hashes = dict.fromkeys(MEMBERS, config_hash(s))
    w.leader = {0: "c-1", 1: "c-2"}
    return running_status(MEMBERS, s), w


def test_a_backup_asked_by_name_is_taken_once_at_each_leader() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    asked = parse({BACKUP: "before-upgrade"})
    plan = run(st, w.observed(), s, controls=asked)
    assert plan.action == TakeBackup("before-upgrade", ((0, "c-1"), (1, "c-2")))
    assert [b.state for b in plan.status.backups] == ["pending"]
    assert "BackupStarted" in [e.reason for e in plan.events]
    assert isinstance(plan.action, TakeBackup)
    st2, events = record_outcome(
        plan.status, plan.action, Outcome(True, "t", indexes={0: 120, 1: 80}), T0 + 2
    )
    b = st2.backups[0]
    assert (b.state, [(p.partition, p.index) for p in b.partitions]) == (
        "done",
        [(0, 120), (1, 80)],
    )
    assert [e.reason for e in events] == ["BackupDone"]
    # The same name is not taken again, whatever passes follow.
    again = run(st2, w.observed(), s, T0 + 10, controls=asked)
    assert not isinstance(again.action, TakeBackup)


def test_a_failed_backup_is_recorded_with_the_reason_and_not_retried_under_its_name() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    asked = parse({BACKUP: "b1"})
    plan = run(st, w.observed(), s, controls=asked)
    assert isinstance(plan.action, TakeBackup)
    st2, events = record_outcome(
        plan.status, plan.action, Outcome(False, "HTTP 503: the store is down"), T0 + 1
    )
    assert (st2.backups[0].state, st2.backups[0].message) == (
        "failed",
        "HTTP 503: the store is down",
    )
    assert "BackupFailed" in [e.reason for e in events]
    assert not isinstance(run(st2, w.observed(), s, T0 + 5, controls=asked).action, TakeBackup)


def test_a_backup_asked_of_a_cluster_without_an_archive_fails_with_the_reason() -> None:
    s = spec()
    st, w = settled(s)
    plan = run(st, w.observed(), s, controls=parse({BACKUP: "b1"}))
    assert not isinstance(plan.action, TakeBackup)
    assert plan.status.backups[0].state == "failed"
    assert "spec.archive is not set" in (plan.status.backups[0].message or "")


def test_scheduled_backups_come_every_interval() -> None:
    s = spec(archive={**ARCHIVE, "backupIntervalMinutes": 60})
    st, w = settled(s)
    plan = run(st, w.observed(), s)
    assert isinstance(plan.action, TakeBackup)
    assert plan.action.name == "scheduled-19700112t134640z"  # T0 in UTC
    st2, _ = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={0: 1}), T0)
    assert not isinstance(run(st2, w.observed(), s, T0 + 59 * 60).action, TakeBackup)
    due = run(st2, w.observed(), s, T0 + 60 * 60)
    assert isinstance(due.action, TakeBackup) and due.action.name != plan.action.name
    assert all(b.scheduled for b in due.status.backups)


def test_no_backup_while_a_partition_has_no_leader() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    w.leader[1] = None
    plan = run(st, w.observed(), s, controls=parse({BACKUP: "b1"}))
    assert isinstance(plan.action, Wait)
    assert plan.status.backups == []


def test_the_status_keeps_the_most_recent_backups() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    for i in range(BACKUPS_KEPT + 3):
        plan = run(st, w.observed(), s, T0 + i, controls=parse({BACKUP: f"b{i}"}))
        assert isinstance(plan.action, TakeBackup)
        st, _ = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={}), T0 + i)
    assert len(st.backups) == BACKUPS_KEPT
    assert st.backups[-1].name == f"b{BACKUPS_KEPT + 2}"


@pytest.mark.parametrize("value", ["Bad Name", "../x", "-x", "x" * 129])
def test_a_backup_name_that_cannot_be_one_is_a_problem_not_a_backup(value: str) -> None:
    c = parse({BACKUP: value})
    assert c.backup is None
    assert c.problems and c.problems[0].startswith(BACKUP)


def test_a_requested_backup_is_not_taken_again_once_it_left_the_status() -> None:
    """The annotation stays on the resource; scheduled backups push its entry out of the last
    BACKUPS_KEPT: the same name is still never taken twice (the archive would refuse it)."""
    s = spec(archive={**ARCHIVE, "backupIntervalMinutes": 5})
    st, w = settled(s)
    asked = parse({BACKUP: "keep"})
    now = T0
    plan = run(st, w.observed(), s, now, controls=asked)
    assert isinstance(plan.action, TakeBackup) and plan.action.name == "keep"
    st, _ = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={}), now)
    for _ in range(BACKUPS_KEPT + 2):
        now += 5 * 60
        plan = run(st, w.observed(), s, now, controls=asked)
        assert isinstance(plan.action, TakeBackup) and plan.action.name != "keep"
        st, _ = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={}), now)
    assert "keep" not in {b.name for b in st.backups}
    assert st.backup_request == "keep"


def test_a_backup_left_pending_by_an_operator_that_stopped_is_asked_again() -> None:
    """The status says pending (saved before the flush) but no outcome came: the operator
    stopped during it. Once BACKUP_STALLED_S passed, it is asked again, taking a record the
    first try wrote as its own (`resume`)."""
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    asked = parse({BACKUP: "b1"})
    plan = run(st, w.observed(), s, controls=asked)
    assert isinstance(plan.action, TakeBackup) and not plan.action.resume
    pending = plan.status  # saved before acting; the outcome never recorded
    soon = run(pending, w.observed(), s, T0 + BACKUP_STALLED_S / 2, controls=asked)
    assert not isinstance(soon.action, TakeBackup)
    later = run(pending, w.observed(), s, T0 + BACKUP_STALLED_S, controls=asked)
    assert later.action == TakeBackup("b1", ((0, "c-1"), (1, "c-2")), resume=True)
    assert "BackupResumed" in [e.reason for e in later.events]
    st2, _ = record_outcome(
        later.status, later.action, Outcome(True, "t", indexes={0: 5, 1: 6}), T0 + 601
    )
    assert [(b.name, b.state) for b in st2.backups] == [("b1", "done")]


def test_a_plan_that_succeeds_after_failing_shows_no_failure() -> None:
    s = restored_spec()
    plan = run(RaftClusterStatus(), Observed({}), s)
    st, _ = record_outcome(plan.status, PlanRestore(), Outcome(False, "the store is down"), T0)
    again = run(st, Observed({}), s, T0 + RESTORE_RETRY_S + 1)
    assert again.action == PlanRestore()
    st, events = record_outcome(
        again.status, PlanRestore(), Outcome(True, "latest", indexes={1: 7, 0: 41}), T0 + 32
    )
    assert st.restore is not None
    assert (st.restore.state, st.restore.message, st.restore.at) == ("planned", None, T0 + 32)
    assert [(p.partition, p.index) for p in st.restore.partitions] == [(0, 41), (1, 7)]
    assert "partition@index 0@41, 1@7" in events[0].message


def test_a_backup_records_when_it_finished_and_its_partitions_in_order() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    plan = run(st, w.observed(), s, controls=parse({BACKUP: "b1"}))
    assert isinstance(plan.action, TakeBackup)
    st2, events = record_outcome(
        plan.status, plan.action, Outcome(True, "t", indexes={1: 80, 0: 120}), T0 + 2
    )
    b = st2.backups[0]
    assert (b.finished_at, [(p.partition, p.index) for p in b.partitions]) == (
        T0 + 2,
        [(0, 120), (1, 80)],
    )
    plan = run(st2, w.observed(), s, T0 + 3, controls=parse({BACKUP: "b2"}))
    assert isinstance(plan.action, TakeBackup)
    _, events = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={}), T0 + 4)
    assert events[0].message.endswith("partition@index none")


def test_a_name_asked_again_after_another_one_is_not_taken_twice() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    for name in ("a", "b"):
        plan = run(st, w.observed(), s, controls=parse({BACKUP: name}))
        assert isinstance(plan.action, TakeBackup)
        st, _ = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={}), T0)
    again = run(st, w.observed(), s, T0 + 5, controls=parse({BACKUP: "a"}))
    assert not isinstance(again.action, TakeBackup)
    assert [b.name for b in again.status.backups] == ["a", "b"]


def test_a_backup_asked_by_name_does_not_move_the_schedule() -> None:
    s = spec(archive={**ARCHIVE, "backupIntervalMinutes": 60})
    st, w = settled(s)
    plan = run(st, w.observed(), s)
    assert isinstance(plan.action, TakeBackup)
    st, _ = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={}), T0)
    asked = parse({BACKUP: "manual"})
    plan = run(st, w.observed(), s, T0 + 30 * 60, controls=asked)
    assert isinstance(plan.action, TakeBackup) and plan.action.name == "manual"
    st, _ = record_outcome(plan.status, plan.action, Outcome(True, "t", indexes={}), T0 + 1800)
    due = run(st, w.observed(), s, T0 + 60 * 60, controls=asked)
    assert isinstance(due.action, TakeBackup) and due.action.name.startswith("scheduled-")


def test_a_resumed_backup_is_asked_again_once_not_at_every_pass() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    asked = parse({BACKUP: "b1"})
    plan = run(st, w.observed(), s, controls=asked)
    later = run(plan.status, w.observed(), s, T0 + BACKUP_STALLED_S, controls=asked)
    assert isinstance(later.action, TakeBackup) and later.action.resume
    after = run(later.status, w.observed(), s, T0 + BACKUP_STALLED_S + 1, controls=asked)
    assert not isinstance(after.action, TakeBackup)


def test_a_backup_left_pending_is_not_asked_again_once_the_archive_is_gone() -> None:
    s = spec(archive=ARCHIVE)
    st, w = settled(s)
    plan = run(st, w.observed(), s, controls=parse({BACKUP: "b1"}))
    assert isinstance(plan.action, TakeBackup)
    bare = spec()
    w.hashes = dict.fromkeys(MEMBERS, config_hash(bare))
    later = run(plan.status, w.observed(), bare, T0 + BACKUP_STALLED_S)
    assert not isinstance(later.action, TakeBackup)
