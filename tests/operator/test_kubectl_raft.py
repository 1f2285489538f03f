"""`kubectl raft` without an API server: the status view and its text, the requests it builds
(annotation values, patch bodies, refusals), its command line, and its calls through a small
in-memory stand-in of the four `CustomObjectsApi` methods it uses (merge patches, resourceVersion
conflicts, 404s as the API server answers them). On the real API server:
tests/k8s/test_kubectl_raft.py.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from raftlog.operator import controls, raftview
from raftlog.operator.kubectl_raft import (
    Clusters,
    Failure,
    annotation_patch,
    backup_patch,
    build_parser,
    check_switchover,
    connect,
    fence_patch,
    main,
    remove_patch,
    restore_manifest,
    restored_archive_url,
    switchover_value,
    utc_stamp,
)
from raftlog.operator.models import (
    BackupStatus,
    Condition,
    MemberPartition,
    MemberStatus,
    PartitionIndex,
    Promotion,
    RaftClusterSpec,
    RaftClusterStatus,
    RestoreStatus,
    SnapshotInstall,
    Switchover,
)

NS = "raftlog-system"
WHEN = "2025-01-01T00:00:00Z"
REQUEST = "orders-2:0@20250101T000000.000000Z"


def _condition(kind: str, status: str, reason: str, message: str = "") -> Condition:
    return Condition.model_validate(
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": WHEN,
        }
    )


def status_model() -> RaftClusterStatus:
    """orders: 3 voters, 2 partitions, orders-1 not ready and in SnapshotRequired on
    partition 1 with an install pending, a switchover of partition 0 under way."""
    return RaftClusterStatus(
        observed_generation=3,
        phase="Degraded",
        replicas=3,
        ready_replicas=2,
        leaders={"0": "orders-0", "1": "orders-2"},
        leader_summary="orders-0,orders-2",
        bootstrapped=True,
        next_ordinal=3,
        members=[
            MemberStatus(
                name="orders-0",
                ordinal=0,
                role="voter",
                bootstrap=True,
                ready=True,
                partitions=[
                    MemberPartition(partition=0, lag=0, state="leader"),
                    MemberPartition(partition=1, lag=0, state="replicate"),
                ],
            ),
            MemberStatus(
                name="orders-1",
                ordinal=1,
                role="voter",
                bootstrap=True,
                ready=False,
                partitions=[
                    MemberPartition(partition=0, lag=3, state="replicate"),
                    MemberPartition(partition=1, lag=412, state="snapshot", snapshot_required=True),
                ],
            ),
            MemberStatus(
                name="orders-2",
                ordinal=2,
                role="voter",
                bootstrap=True,
                ready=True,
                partitions=[
                    MemberPartition(partition=0, lag=None, state=None),
                    MemberPartition(partition=1, lag=0, state="leader"),
                ],
            ),
        ],
        snapshot_installs=[
            SnapshotInstall(
                member="orders-1",
                partition=1,
                source="orders-0",
                state="pending",
                attempts=2,
                started_at=1.0,
                last_error="connection refused",
                bytes_done=12_900_000,  # 12.3 MiB
                bytes_total=40 * 1024 * 1024,
            )
        ],
        conditions=[
            _condition("Available", "True", "QuorumAvailable", "2 of 2 partitions have a leader"),
            _condition("Progressing", "True", "InstallSnapshot", "install p1 on orders-1"),
            _condition("Degraded", "True", "MembersNotReady", "not ready: orders-1"),
            _condition("Paused", "False", "NotPaused"),
        ],
        last_action="install p1 on orders-1",
        switchover=Switchover(
            request=REQUEST,
            target="orders-2",
            partitions=[0],
            state="pending",
            message="transferring partition 0",
            started_at=1.0,
        ),
    )


def resource(
    status: RaftClusterStatus | None = None, name: str = "orders", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "raftlog.dev/v1alpha1",
        "kind": "RaftCluster",
        "metadata": {
            "name": name,
            "namespace": NS,
            "generation": 3,
            "resourceVersion": "100",
            "annotations": {controls.SWITCHOVER: REQUEST},
        },
        "spec": {"replicas": 3, "partitions": 2, **spec},
        "status": (status or status_model()).model_dump(by_alias=True, mode="json"),
    }


# ----------------------------------------------------------------------------- the view

EXPECTED = """\
RaftCluster raftlog-system/orders: Degraded, 2/3 members ready, 2 partitions
  Progressing=True InstallSnapshot: install p1 on orders-1
  Degraded=True MembersNotReady: not ready: orders-1

MEMBER     ROLE    READY   FENCED      LEADERSHIPS
orders-0   voter   yes     no          1
orders-1   voter   no      requested   0
orders-2   voter   yes     no          1

PARTITION   LEADER     orders-0      orders-1        orders-2
0           orders-0   leader        3/replicate     ?/?
1           orders-2   0/replicate   412/snapshot*   leader
(each member: lag/progress state; * SnapshotRequired)

Snapshot installs (pending, then the most recent):
MEMBER     PARTITION   SOURCE     STATE     PROGRESS              ATTEMPTS   LAST ERROR
orders-1   1           orders-0   pending   12.3/40.0 MiB (30%)   2          connection refused

Switchover orders-2:0@20250101T000000.000000Z: to orders-2, partition 0: pending \
(transferring partition 0)
"""


def test_status_text_of_a_realistic_cluster() -> None:
    text = raftview.render(raftview.view(resource(fencedMembers=["orders-1"])))
    assert text == EXPECTED


def test_status_text_says_what_is_asked_and_not_yet_done() -> None:
    obj = resource()
    obj["metadata"]["annotations"] = {
        controls.PAUSE: "true",
        controls.RESTART: "2025-02-02T00:00:00Z",
        controls.SWITCHOVER: "orders-0@x",
    }
    obj["status"]["conditions"] = []
    obj["status"]["lastAction"] = "restart orders-1"
    obj["status"]["volumeExpansion"] = {"size": "2Gi", "state": "requested", "at": 5.0}
    obj["status"]["problems"] = ["spec.fencedMembers: x is not a member of this cluster"]
    v = raftview.view(obj)
    assert v["volumeExpansion"] == {"size": "2Gi", "state": "requested", "message": ""}
    assert v["problems"] == ["spec.fencedMembers: x is not a member of this cluster"]
    text = raftview.render(v)
    assert "  volumes expanding to 2Gi" in text
    assert "pause requested (raftlog.dev/pause-reconciliation), not in effect yet" in text
    assert "restart 2025-02-02T00:00:00Z requested, under way" in text
    assert "last action: restart orders-1" in text
    assert "Switchover orders-0@x: requested, not picked up by the operator yet" in text


def test_status_text_says_nothing_of_a_restart_already_done() -> None:
    obj = resource()
    obj["metadata"]["annotations"] = {controls.RESTART: "2025-02-02T00:00:00Z"}
    obj["status"]["restartedAt"] = "2025-02-02T00:00:00Z"
    assert "under way" not in raftview.render(raftview.view(obj))


def test_status_text_of_a_steady_cluster_is_quiet() -> None:
    st = status_model()
    st.conditions = [_condition("Available", "True", "QuorumAvailable")]
    st.last_action = "steady"
    st.phase = "Running"
    lines = raftview.render(raftview.view(resource(st))).splitlines()
    assert lines[0] == "RaftCluster raftlog-system/orders: Running, 2/3 members ready, 2 partitions"
    assert lines[1] == ""  # no condition, no "last action: steady"


def test_status_text_of_a_new_cluster_without_status() -> None:
    obj = resource()
    del obj["status"]
    obj["metadata"]["annotations"] = {}
    text = raftview.render(raftview.view(obj))
    assert text.splitlines()[0] == (
        "RaftCluster raftlog-system/orders: Pending, 0/0 members ready (spec: 3), 2 partitions"
    )
    # Found by a review: a cluster in a namespace no operator watches looked merely Pending.
    assert text.splitlines()[1] == (
        "  no operator has reconciled it yet: is one running, and watching namespace "
        "raftlog-system? (the chart's watch.namespaces, or raftlog-operator -n/-A)"
    )
    assert "No members yet." in text
    # The partitions the spec asks for, with no leader yet.
    assert "0           none" in text and "1           none" in text


def test_json_view_is_the_documented_object() -> None:
    v = raftview.view(resource(fencedMembers=["orders-1"], removeMembers=["orders-0"]))
    assert json.loads(json.dumps(v)) == v
    assert set(v) == {
        "name", "namespace", "phase", "generation", "observedGeneration", "lastAction",
        "desiredReplicas", "replicas", "readyReplicas", "desiredPartitions", "paused",
        "hibernate", "restartRequested", "restartedAt", "conditions", "notable", "members",
        "partitions", "snapshotInstalls", "switchover", "switchoverRequested",
        "volumeExpansion", "problems", "restore", "backups", "backupRequested",
    }  # fmt: skip
    assert (v["name"], v["namespace"], v["phase"]) == ("orders", NS, "Degraded")
    assert v["notable"] == ["Progressing", "Degraded"]
    assert [c["type"] for c in v["conditions"]] == [
        "Available", "Progressing", "Degraded", "Paused"
    ]  # fmt: skip
    assert v["members"] == [
        {"name": "orders-0", "role": "voter", "ready": True, "fenced": False,
         "fenceRequested": False, "removeRequested": True, "leaderships": 1, "promotion": None},
        {"name": "orders-1", "role": "voter", "ready": False, "fenced": False,
         "fenceRequested": True, "removeRequested": False, "leaderships": 0, "promotion": None},
        {"name": "orders-2", "role": "voter", "ready": True, "fenced": False,
         "fenceRequested": False, "removeRequested": False, "leaderships": 1, "promotion": None},
    ]  # fmt: skip
    assert v["partitions"][1] == {
        "partition": 1,
        "leader": "orders-2",
        "members": {
            "orders-0": {"lag": 0, "state": "replicate", "snapshotRequired": False},
            "orders-1": {"lag": 412, "state": "snapshot", "snapshotRequired": True},
            "orders-2": {"lag": 0, "state": "leader", "snapshotRequired": False},
        },
    }
    assert v["snapshotInstalls"] == [
        {"member": "orders-1", "partition": 1, "source": "orders-0", "state": "pending",
         "attempts": 2, "lastError": "connection refused", "bytesDone": 12_900_000,
         "bytesTotal": 41_943_040}
    ]  # fmt: skip
    assert v["switchover"] == {
        "request": REQUEST, "target": "orders-2", "partitions": [0], "state": "pending",
        "message": "transferring partition 0",
    }  # fmt: skip
    assert v["switchoverRequested"] == REQUEST and v["paused"] is False
    assert v["volumeExpansion"] is None and v["problems"] == []
    assert v["restore"] is None and v["backups"] == [] and v["backupRequested"] is None


@pytest.mark.parametrize(
    ("done", "total", "shown"),
    [
        (None, None, "-"),
        (None, 1000, "-"),
        (0, 41_943_040, "0.0/40.0 MiB (0%)"),
        (12_900_000, 41_943_040, "12.3/40.0 MiB (30%)"),
        (41_943_039, 41_943_040, "40.0/40.0 MiB (99%)"),  # 100% only once it is all there
        (41_943_040, 41_943_040, "40.0/40.0 MiB (100%)"),
        (512, 2048, "0.5/2.0 KiB (25%)"),
        (300, 700, "300/700 B (42%)"),
        (3 * 1024**3, 6 * 1024**3, "3.0/6.0 GiB (50%)"),
        (0, 0, "0/0 B (100%)"),
        (512, 1024 * 1024, "0.0/1.0 MiB (0%)"),  # exactly a MiB is counted in MiB
    ],
)
def test_install_progress_text(done: int | None, total: int | None, shown: str) -> None:
    assert raftview.progress(done, total) == shown


def test_installs_table_shows_progress_while_pending_and_after() -> None:
    st = status_model()
    pending = st.snapshot_installs[0]
    pending.bytes_done, pending.bytes_total = None, None  # not reported yet
    done = pending.model_copy(
        update={"member": "orders-2", "state": "installed", "finished_at": 9.0, "last_error": None}
    )
    done.bytes_done = done.bytes_total = 3 * 1024 * 1024
    st.snapshot_installs.append(done)
    v = raftview.view(resource(st))
    assert [(i["bytesDone"], i["bytesTotal"]) for i in v["snapshotInstalls"]] == [
        (None, None),
        (3 * 1024 * 1024, 3 * 1024 * 1024),
    ]
    lines = raftview.render(v).splitlines()
    start = lines.index("Snapshot installs (pending, then the most recent):") + 1
    assert [re.split(r"\s{3,}", row) for row in lines[start : start + 3]] == [
        ["MEMBER", "PARTITION", "SOURCE", "STATE", "PROGRESS", "ATTEMPTS", "LAST ERROR"],
        ["orders-1", "1", "orders-0", "pending", "-", "2", "connection refused"],
        ["orders-2", "1", "orders-0", "installed", "3.0/3.0 MiB (100%)", "2", "-"],
    ]


def with_learner(promotion: Promotion) -> tuple[RaftClusterStatus, MemberStatus]:
    """The status of `status_model` with orders-1 a learner in its promotion window."""
    st = status_model()
    learner = st.member("orders-1")
    assert learner is not None
    learner.role = "learner"
    learner.promotion = promotion
    return st, learner


def test_a_learner_catching_up_shows_its_lag_and_window() -> None:
    st, learner = with_learner(Promotion(window_seconds=3.0, elapsed_seconds=1.5, max_lag=412))
    v = raftview.view(resource(st))
    assert v["members"][1]["promotion"] == {
        "maxLag": 412,
        "windowSeconds": 3.0,
        "elapsedSeconds": 1.5,
    }
    text = raftview.render(v)
    assert "orders-1   learner (lag 412, window 1.5/3 s)   no" in text, text
    assert "412/snapshot*" in text  # and per partition, as for every member
    learner.promotion = Promotion(window_seconds=3.0)
    assert "learner (lag ?, window 0.0/3 s)" in raftview.render(raftview.view(resource(st)))


def test_a_learner_being_removed_shows_no_promotion_window() -> None:
    # A scale down took it out while it caught up: its window is over, whatever the status
    # kept of it.
    st, learner = with_learner(Promotion(window_seconds=3.0, elapsed_seconds=1.5, max_lag=412))
    learner.role = "removing"
    v = raftview.view(resource(st))
    assert v["members"][1]["promotion"] is None
    assert "window" not in raftview.render(v)


def test_a_learner_at_lag_0_and_a_member_asked_to_leave_say_so() -> None:
    st, _ = with_learner(Promotion(window_seconds=3.0, elapsed_seconds=2.0, max_lag=0))
    text = raftview.render(raftview.view(resource(st, removeMembers=["orders-2"])))
    assert "learner (lag 0, window 2.0/3 s)" in text, text
    assert "orders-2   voter (remove requested)" in text, text


def test_the_list_names_a_partition_without_a_leader_and_counts_those_past_three() -> None:
    st = status_model()
    st.leaders = {"0": "orders-0", "1": "orders-1", "2": "orders-2"}
    line = raftview.render_list([raftview.view(resource(st, partitions=3))], False).splitlines()[1]
    assert "orders-0,orders-1,orders-2 " in line and "+" not in line
    st.leaders = {"0": "orders-0", "1": "orders-1", "3": "orders-2"}  # 2 has none
    line = raftview.render_list([raftview.view(resource(st, partitions=4))], False).splitlines()[1]
    assert "orders-0,orders-1,none,+1" in line, line


def test_a_backup_asked_while_others_are_listed_is_shown_as_not_picked_up() -> None:
    obj = resource(restored_status(), archive=ARCHIVE)
    obj["metadata"]["annotations"][controls.BACKUP] = "brand-new"
    text = raftview.render(raftview.view(obj))
    assert "\nBackup brand-new: requested, not picked up by the operator yet\n" in text


def test_the_archive_table_names_the_other_members_failing_and_cuts_long_errors() -> None:
    v = raftview.view(resource())
    entry = {"partition": 0, "archivedIndex": 7, "lagEntries": 3, "lastUploadAt": None}
    v["archive"] = {
        "url": "s3://b/c",
        "partitions": [
            {**entry, "lastError": "e" * 80, "failingOn": ["orders-0", "orders-1"],
             "reportedBy": "orders-0"},
            {**entry, "partition": 1, "lastError": "x" * 81, "failingOn": [],
             "reportedBy": "orders-2"},
        ],
    }  # fmt: skip
    rows = raftview.render(v).split("Archive to s3://b/c:\n", 1)[1].splitlines()
    assert rows[1].endswith("e" * 80 + "; failing on orders-1"), rows[1]  # not its reporter
    assert rows[2].endswith("x" * 77 + "..."), rows[2]  # 80 characters at most


@pytest.mark.parametrize(
    ("kind", "status", "shown"),
    [
        ("Available", "True", False),
        ("Available", "False", True),
        ("Available", "Unknown", True),
        ("Progressing", "True", True),
        ("Progressing", "False", False),
        ("Degraded", "True", True),
        ("Degraded", "False", False),
        ("Paused", "True", True),
        ("Paused", "False", False),
        ("Hibernated", "True", True),
        ("Hibernated", "False", False),
    ],
)
def test_notable_conditions(kind: str, status: str, shown: bool) -> None:
    c = _condition(kind, status, "Why")
    assert raftview.notable_conditions([c]) == ([c] if shown else [])


def test_fenced_column() -> None:
    st = status_model()
    st.members[0].fenced = True  # fenced and still listed
    st.members[2].fenced = True  # fenced, taken out of the list: coming back
    text = raftview.render(raftview.view(resource(st, fencedMembers=["orders-0", "orders-1"])))
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("MEMBER     ROLE"))
    rows = {line.split()[0]: line for line in lines[start + 1 : start + 4]}
    assert rows["orders-0"].split()[3] == "yes"
    assert "requested" in rows["orders-1"]
    assert "yes, lifting" in rows["orders-2"]


def test_list_text_one_line_per_cluster() -> None:
    calm = status_model()
    calm.conditions = [_condition("Available", "True", "QuorumAvailable")]
    calm.phase = "Running"
    views = [raftview.view(resource(calm, name="a")), raftview.view(resource(name="b"))]
    lines = raftview.render_list(views, all_namespaces=True).splitlines()
    assert lines[0].split() == [
        "NAMESPACE", "NAME", "PHASE", "READY", "PARTITIONS", "LEADERS", "NOTES"
    ]  # fmt: skip
    assert lines[1].split() == [NS, "a", "Running", "2/3", "2", "orders-0,orders-2", "-"]
    assert lines[2].endswith("Progressing, Degraded (MembersNotReady)")
    assert raftview.render_list([], all_namespaces=False) == "No RaftClusters found.\n"


# ----------------------------------------------------------------------------- requests


def test_switchover_value_reads_back_as_the_request() -> None:
    now = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
    value = switchover_value("orders-2", [1, 0, 1], now)
    assert value == "orders-2:0,1@20250304T050607.890123Z"
    asked = controls.parse({controls.SWITCHOVER: value}).switchover
    assert asked is not None
    assert (asked.target, asked.partitions, asked.request) == ("orders-2", (0, 1), value)
    every = switchover_value("orders-2", [], now)
    assert every == "orders-2@20250304T050607.890123Z"
    asked = controls.parse({controls.SWITCHOVER: every}).switchover
    assert asked is not None and asked.partitions is None
    # Another moment, another request.
    assert switchover_value("orders-2", [], now.replace(microsecond=1)) != every


def test_restart_value_is_rfc3339_utc() -> None:
    assert utc_stamp(datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)) == "2025-03-04T05:06:07Z"
    assert annotation_patch(controls.RESTART, "x") == {
        "metadata": {"annotations": {"raftlog.dev/restartedAt": "x"}}
    }
    assert annotation_patch(controls.PAUSE, None) == {
        "metadata": {"annotations": {"raftlog.dev/pause-reconciliation": None}}
    }


def test_switchover_refusals() -> None:
    obj = resource(fencedMembers=["orders-1"])
    check_switchover(obj, "orders-2", [0, 1])  # fine
    with pytest.raises(Failure, match="raftcluster raftlog-system/orders has no member orders-9"):
        check_switchover(obj, "orders-9", [])
    with pytest.raises(Failure, match="orders-1 is fenced"):
        check_switchover(obj, "orders-1", [])
    with pytest.raises(Failure, match=r"has partitions 0\.\.1: no partition 2, 5"):
        check_switchover(obj, "orders-0", [0, 5, 2])
    obj["status"]["members"][0]["role"] = "learner"
    with pytest.raises(Failure, match="orders-0 is a learner, and only a voter can lead"):
        check_switchover(obj, "orders-0", [])


def test_fence_and_unfence_patches() -> None:
    obj = resource(fencedMembers=["orders-0"])
    assert fence_patch(obj, "orders-1", True) == {
        "metadata": {"resourceVersion": "100"},
        "spec": {"fencedMembers": ["orders-0", "orders-1"]},
    }
    assert fence_patch(obj, "orders-0", True) is None  # already fenced
    with pytest.raises(
        Failure, match=r"has no member orders-7 \(its members: orders-0, orders-1, "
    ):
        fence_patch(obj, "orders-7", True)
    assert fence_patch(obj, "orders-0", False) == {
        "metadata": {"resourceVersion": "100"},
        "spec": {"fencedMembers": []},
    }
    assert fence_patch(obj, "orders-1", False) is None  # not fenced


def test_remove_patch_and_its_refusals() -> None:
    obj = resource(replicas=3, removeMembers=["gone-5"])  # removed earlier: leaves the list
    assert remove_patch(obj, ["orders-0", "orders-0"]) == {
        "metadata": {"resourceVersion": "100"},
        "spec": {"removeMembers": ["orders-0"], "replicas": 2},
    }
    obj["status"]["members"].append({"name": "orders-3", "ordinal": 3, "role": "voter"})
    obj["spec"].update(replicas=3, removeMembers=["orders-3"])  # under way: stays listed
    assert remove_patch(obj, ["orders-1"])["spec"] == {
        "removeMembers": ["orders-3", "orders-1"],
        "replicas": 2,
    }
    # Raised back to 3 before it started: orders-3's removal was cancelled, and it leaves the
    # list (listed first, it would be the next one removed).
    obj["spec"].update(replicas=4, removeMembers=["orders-3"])
    assert remove_patch(obj, ["orders-0"])["spec"] == {
        "removeMembers": ["orders-0"],
        "replicas": 3,
    }
    obj = resource(replicas=3)
    assert remove_patch(obj, ["orders-0", "orders-2"])["spec"]["replicas"] == 1
    with pytest.raises(Failure, match=r"spec\.replicas 3: removing 3 would leave 0"):
        remove_patch(obj, ["orders-0", "orders-1", "orders-2"])
    with pytest.raises(Failure, match="has no member orders-4"):
        remove_patch(obj, ["orders-0", "orders-4"])
    obj["status"]["members"][1]["role"] = "removing"
    with pytest.raises(Failure, match="orders-1 is already being removed"):
        remove_patch(obj, ["orders-1"])
    obj = resource(replicas=2, removeMembers=["orders-2"])  # asked, not started yet
    with pytest.raises(Failure, match="orders-2 is already being removed"):
        remove_patch(obj, ["orders-2"])
    obj = resource(replicas=3, removeMembers=["orders-2"])  # cancelled: may be asked again
    assert remove_patch(obj, ["orders-2"])["spec"]["removeMembers"] == ["orders-2"]


def test_remove_patch_keeps_removals_under_way_and_drops_those_cancelled() -> None:
    obj = resource(replicas=2, removeMembers=["orders-2"])
    obj["status"]["members"][2]["role"] = "removing"  # under way: stays listed
    assert remove_patch(obj, ["orders-1"])["spec"] == {
        "removeMembers": ["orders-2", "orders-1"],
        "replicas": 1,
    }
    # replicas raised past the members (a scale up to come): every name asked before was
    # cancelled, however many there are.
    obj = resource(replicas=4, removeMembers=["orders-2", "orders-1"])
    assert remove_patch(obj, ["orders-0"])["spec"] == {"removeMembers": ["orders-0"], "replicas": 3}
    # One under way beside one cancelled: the member leaving is not counted among those that
    # stay (found by a planted bug, which kept the cancelled orders-2 listed, next to go).
    obj = resource(replicas=3, removeMembers=["orders-3", "orders-2"])
    obj["status"]["members"].append({"name": "orders-3", "ordinal": 3, "role": "removing"})
    assert remove_patch(obj, ["orders-1"])["spec"] == {
        "removeMembers": ["orders-3", "orders-1"],
        "replicas": 2,
    }


# ----------------------------------------------------------------------------- command line


def test_argument_parsing() -> None:
    ap = build_parser()
    a = ap.parse_args(["switchover", "orders", "--to", "orders-2", "-p", "1", "--partition", "0"])
    assert (a.command, a.name, a.to, a.partition, a.wait) == (
        "switchover", "orders", "orders-2", [1, 0], False
    )  # fmt: skip
    a = ap.parse_args(["status", "-A", "-o", "json"])
    assert (a.name, a.all_namespaces, a.output) == (None, True, "json")
    a = ap.parse_args(["remove", "orders", "orders-1", "orders-2", "-n", "ns"])
    assert (a.members, a.namespace) == (["orders-1", "orders-2"], "ns")
    a = ap.parse_args(["restart", "orders", "--wait", "--timeout", "60"])
    assert (a.wait, a.timeout) == (True, 60.0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["switchover", "orders"], "the following arguments are required: --to"),
        (["switchover", "orders", "--to", "m", "-p", "x"], "'x' is not a partition number"),
        (["switchover", "orders", "--to", "m", "-p", "-1"], "partitions are numbered from 0"),
        (["restart", "orders", "--timeout", "0"], "the timeout must be positive"),
        (["restart", "orders", "--timeout", "inf"], "the timeout must be positive"),
        (["restart", "orders", "--timeout", "soon"], "'soon' is not a number of seconds"),
        (["status", "-o", "wide"], "invalid choice: 'wide'"),
        (["fence", "orders"], "the following arguments are required: MEMBER"),
        (["remove", "orders"], "the following arguments are required: MEMBER"),
        (["explode"], "invalid choice: 'explode'"),
        ([], "the following arguments are required: COMMAND"),
        (["backup", "orders"], "the following arguments are required: NAME"),
        (["backup", "orders", "b", "--timeout", "-1"], "the timeout must be positive"),
        (["restore", "new"], "the following arguments are required: --from"),
        (["restore", "new", "--from", "orders", "-o", "table"], "invalid choice: 'table'"),
        (
            ["restore", "new", "--from", "orders", "--apply", "-o", "json"],
            "-o prints the manifest, --apply creates it: give one of them",
        ),
        (["status", "orders", "-A"], "a NAME and --all-namespaces do not go together"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv, clusters=Clusters(FakeCustomObjects()))
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    ["status", "switchover", "restart", "pause", "resume", "fence", "unfence", "hibernate",
     "wake", "remove", "backup", "restore"],
)  # fmt: skip
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: kubectl raft {command}") and "--namespace" in text


def test_no_kubeconfig_is_named(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nothing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(Failure, match=r"no kubeconfig: .*nothing does not exist"):
        connect(None, None)
    assert main(["status", "orders"]) == 1
    assert "error: no kubeconfig" in capsys.readouterr().err


def test_kubeconfig_namespace_is_the_default(tmp_path: Any) -> None:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "one", "context": {"cluster": "c", "user": "u", "namespace": "ns1"}},
                    {"name": "two", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "one",
            }
        )
    )
    assert connect(str(path), None)[1] == "ns1"
    assert connect(str(path), "two")[1] == "default"


# ----------------------------------------------------------------------------- through the API


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def _error(status: int, reason: str, message: str) -> ApiException:
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return ApiException(status=status, reason=reason, body=body)


class FakeCustomObjects:
    """The four CustomObjectsApi methods of `Clusters`, on a dict: merge patches, a
    resourceVersion bumped by each write, 409 for a patch carrying a stale one, 404s."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.store = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}
        self.patches: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.before_patch: Callable[[dict[str, Any]], None] | None = None  # a concurrent writer
        self.on_get: Callable[[dict[str, Any]], None] | None = None  # the operator's progress

    def _check(self, group: str, version: str, plural: str) -> None:
        assert (group, version, plural) == ("raftlog.dev", "v1alpha1", "raftclusters")

    def _obj(self, namespace: str, name: str) -> dict[str, Any]:
        if (namespace, name) not in self.store:
            raise _error(404, "Not Found", f'raftclusters.raftlog.dev "{name}" not found')
        return self.store[(namespace, name)]

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any:
        self._check(group, version, plural)
        obj = self._obj(namespace, name)
        if self.on_get:
            self.on_get(obj)
        return copy.deepcopy(obj)

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str
    ) -> Any:
        self._check(group, version, plural)
        return {"items": [copy.deepcopy(o) for (ns, _), o in self.store.items() if ns == namespace]}

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> Any:
        self._check(group, version, plural)
        return {"items": [copy.deepcopy(o) for o in self.store.values()]}

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any
    ) -> Any:
        self._check(group, version, plural)
        assert isinstance(body, dict), "merge patches only"
        obj = self._obj(namespace, name)
        if self.before_patch:
            self.before_patch(obj)
        self.patches.append(copy.deepcopy(body))
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != obj["metadata"]["resourceVersion"]:
            raise _error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on raftclusters.raftlog.dev "{name}": the '
                "object has been modified; please apply your changes to the latest version",
            )
        new = merge(obj, body)
        new["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.store[(namespace, name)] = new
        return copy.deepcopy(new)

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Any
    ) -> Any:
        self._check(group, version, plural)
        name = body["metadata"]["name"]
        assert body["metadata"].get("namespace") in (None, namespace)
        if (namespace, name) in self.store:
            raise _error(409, "AlreadyExists", f'raftclusters.raftlog.dev "{name}" already exists')
        self.created.append(copy.deepcopy(body))
        new = copy.deepcopy(body)
        new["metadata"] = {**new["metadata"], "namespace": namespace, "resourceVersion": "1"}
        self.store[(namespace, name)] = new
        return copy.deepcopy(new)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept = 0

    def now(self) -> datetime:
        return datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.slept += 1


def run(api: FakeCustomObjects, *argv: str) -> tuple[int, str, str]:
    """The command in NS (unless it names a namespace or -A): exit code, stdout, stderr."""
    args = list(argv) if {"-n", "-A"} & set(argv) else [*argv, "-n", NS]
    out, err = io.StringIO(), io.StringIO()
    code = main(args, clusters=Clusters(api), clock=FakeClock(), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_status_through_the_api() -> None:
    api = FakeCustomObjects(resource())
    code, out, _ = run(api, "status", "orders", "-n", NS)
    assert code == 0 and out.startswith("RaftCluster raftlog-system/orders: Degraded")
    code, out, _ = run(api, "status", "orders", "-n", NS, "-o", "json")
    assert code == 0 and json.loads(out) == raftview.view(resource())
    code, out, _ = run(api, "status", "orders", "-n", NS, "-o", "yaml")
    assert code == 0 and yaml.safe_load(out) == raftview.view(resource())
    code, out, _ = run(api, "status", "-n", NS, "-o", "json")
    assert code == 0 and [v["name"] for v in json.loads(out)["items"]] == ["orders"]
    code, out, _ = run(api, "status", "-n", "elsewhere")
    assert (code, out) == (0, "No RaftClusters found in namespace elsewhere.\n")
    code, out, _ = run(api, "status", "-A")
    assert code == 0 and out.splitlines()[1].startswith(f"{NS}   orders   Degraded")
    assert api.patches == []
    code, out, _ = run(FakeCustomObjects(), "status", "-A")  # not "in namespace default"
    assert (code, out) == (0, "No RaftClusters found.\n")


def test_every_default_a_flags_help_gives_is_its_default() -> None:
    """Found by a planted bug: switchover's --timeout default at 30 s, its help saying 300."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    said = 0
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if m := re.search(r"\((\d+)\)$", action.help or ""):
                assert action.default == float(m.group(1)), (name, action.dest)
                said += 1
    assert said == 3


@pytest.mark.parametrize(
    "status, reason, said",
    [
        (403, "Forbidden", "error: forbidden: raftclusters.raftlog.dev is forbidden: User "
                           '"dev" cannot get resource "raftclusters"\n'),
        (401, "Unauthorized", "error: unauthorized: the kubeconfig's credentials were refused "
                              f"(raftcluster {NS}/orders)\n"),
    ],
)  # fmt: skip
def test_a_refusal_by_the_api_server_is_said_in_words(status: int, reason: str, said: str) -> None:
    """Found by planted bugs: no test reached a 401 or a 403."""
    api = FakeCustomObjects(resource())

    def refuse(obj: dict[str, Any]) -> None:
        raise _error(status, reason, "raftclusters.raftlog.dev is forbidden: User \"dev\" "
                                     'cannot get resource "raftclusters"')  # fmt: skip

    api.on_get = refuse
    assert run(api, "status", "orders") == (1, "", said)


def test_unknown_cluster_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeCustomObjects(resource())
    for argv in (
        ["status", "nope"],
        ["pause", "nope"],
        ["fence", "nope", "orders-0"],
        ["switchover", "nope", "--to", "orders-0"],
        ["remove", "nope", "orders-0"],
    ):
        code, out, err = run(api, *argv)
        assert (code, out, err) == (1, "", "error: raftcluster raftlog-system/nope not found\n")


def test_pause_and_resume_set_and_remove_the_annotation() -> None:
    api = FakeCustomObjects(resource())
    code, out, _ = run(api, "pause", "orders", "-n", NS)
    assert code == 0 and "paused" in out
    assert api.store[(NS, "orders")]["metadata"]["annotations"][controls.PAUSE] == "true"
    code, out, _ = run(api, "resume", "orders", "-n", NS)
    assert code == 0 and "resumed" in out
    assert controls.PAUSE not in api.store[(NS, "orders")]["metadata"]["annotations"]
    # The other annotations stay.
    assert api.store[(NS, "orders")]["metadata"]["annotations"][controls.SWITCHOVER] == REQUEST


def test_hibernate_and_wake() -> None:
    api = FakeCustomObjects(resource())
    assert run(api, "hibernate", "orders", "-n", NS)[0] == 0
    assert api.store[(NS, "orders")]["spec"]["hibernate"] is True
    assert run(api, "wake", "orders", "-n", NS)[0] == 0
    assert api.store[(NS, "orders")]["spec"]["hibernate"] is False
    assert api.patches == [{"spec": {"hibernate": True}}, {"spec": {"hibernate": False}}]


def test_fence_keeps_a_concurrent_edit() -> None:
    api = FakeCustomObjects(resource(fencedMembers=[]))

    def someone_else(obj: dict[str, Any]) -> None:  # fences orders-0 between our read and write
        api.before_patch = None
        obj["spec"]["fencedMembers"] = ["orders-0"]
        obj["metadata"]["resourceVersion"] = "150"

    api.before_patch = someone_else
    code, out, _ = run(api, "fence", "orders", "orders-1", "-n", NS)
    assert (code, out) == (0, "raftcluster raftlog-system/orders: orders-1 fenced "
                              "(spec.fencedMembers)\n")  # fmt: skip
    assert api.store[(NS, "orders")]["spec"]["fencedMembers"] == ["orders-0", "orders-1"]
    assert [p["metadata"]["resourceVersion"] for p in api.patches] == ["100", "150"]
    code, out, _ = run(api, "unfence", "orders", "orders-0", "-n", NS)
    assert code == 0 and api.store[(NS, "orders")]["spec"]["fencedMembers"] == ["orders-1"]
    code, out, _ = run(api, "unfence", "orders", "orders-0", "-n", NS)
    assert code == 0 and "orders-0 was not fenced" in out and len(api.patches) == 3


def test_conflicts_without_end_give_up() -> None:
    api = FakeCustomObjects(resource())

    def always(obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)

    api.before_patch = always
    code, _, err = run(api, "fence", "orders", "orders-1", "-n", NS)
    assert code == 1 and "the object has been modified" in err and len(api.patches) == 5


def test_fence_refuses_an_unknown_member() -> None:
    api = FakeCustomObjects(resource())
    code, out, err = run(api, "fence", "orders", "orders-9", "-n", NS)
    assert (code, out) == (1, "")
    assert err == (
        "error: raftcluster raftlog-system/orders has no member orders-9 "
        "(its members: orders-0, orders-1, orders-2)\n"
    )
    assert api.patches == []


def test_remove_in_one_patch() -> None:
    api = FakeCustomObjects(resource())
    code, out, _ = run(api, "remove", "orders", "orders-0", "-n", NS)
    assert code == 0 and "spec.replicas now 2" in out
    assert api.patches == [
        {"metadata": {"resourceVersion": "100"},
         "spec": {"removeMembers": ["orders-0"], "replicas": 2}}
    ]  # fmt: skip
    code, _, err = run(api, "remove", "orders", "orders-1", "orders-2", "-n", NS)
    assert code == 1 and "spec.replicas 2: removing 2 would leave 0" in err
    assert len(api.patches) == 1


def test_restart_sets_the_time_and_waits_for_the_status() -> None:
    api = FakeCustomObjects(resource())
    gets = 0

    def operator(obj: dict[str, Any]) -> None:
        nonlocal gets
        gets += 1
        if gets == 2:
            obj["status"]["lastAction"] = "restart orders-1"
        if gets == 3:
            obj["status"]["restartedAt"] = obj["metadata"]["annotations"][controls.RESTART]

    api.on_get = operator
    code, out, _ = run(api, "restart", "orders", "-n", NS, "--wait")
    assert code == 0
    assert api.patches == [
        {"metadata": {"annotations": {controls.RESTART: "2025-03-04T05:06:07Z"}}}
    ]
    assert out.splitlines() == [
        "raftcluster raftlog-system/orders: restart requested "
        "(raftlog.dev/restartedAt=2025-03-04T05:06:07Z)",
        "restarting: install p1 on orders-1",
        "restarting: restart orders-1",
        "every member restarted for 2025-03-04T05:06:07Z",
    ]


@pytest.mark.parametrize(("outcome", "code"), [("done", 0), ("failed", 1)])
def test_switchover_waits_for_its_outcome(outcome: str, code: int) -> None:
    api = FakeCustomObjects(resource())
    value = "orders-1:1@20250304T050607.890123Z"
    gets = 0

    def operator(obj: dict[str, Any]) -> None:
        nonlocal gets
        gets += 1
        if gets == 3:
            obj["status"]["switchover"] = {"request": value, "target": "orders-1",
                                           "partitions": [1], "state": "pending",
                                           "message": "", "startedAt": 2.0}  # fmt: skip
        if gets == 4:
            obj["status"]["switchover"]["state"] = outcome
            obj["status"]["switchover"]["message"] = "leader of 1: orders-1"

    api.on_get = operator
    got, out, _ = run(api, "switchover", "orders", "--to", "orders-1", "-p", "1", "--wait")
    assert got == code
    assert api.patches == [{"metadata": {"annotations": {controls.SWITCHOVER: value}}}]
    lines = out.splitlines()
    assert lines[0] == (
        f"raftcluster {NS}/orders: switchover requested (raftlog.dev/switchover={value})"
    )
    assert lines[1:] == [
        "waiting for the operator to take the request",
        "switchover to orders-1: pending",
        f"switchover to orders-1: {outcome}: leader of 1: orders-1",
    ]
    # It ends at the outcome (found by a planted bug: a failed one polled on to --timeout).
    assert gets == 4


def test_switchover_wait_times_out() -> None:
    api = FakeCustomObjects(resource())
    code, _, err = run(api, "switchover", "orders", "--to", "orders-2", "--wait",
                       "--timeout", "5")  # fmt: skip
    assert code == 1
    assert err == (
        "error: raftcluster raftlog-system/orders: not done within 5 s "
        "(last: waiting for the operator to take the request)\n"
    )


def test_switchover_refused_writes_nothing() -> None:
    api = FakeCustomObjects(resource())
    code, _, err = run(api, "switchover", "orders", "--to", "orders-2", "-p", "7")
    assert code == 1 and "no partition 7" in err and api.patches == []


def test_paused_cluster_is_mentioned_on_a_request() -> None:
    obj = resource()
    obj["metadata"]["annotations"][controls.PAUSE] = "true"
    api = FakeCustomObjects(obj)
    code, out, _ = run(api, "switchover", "orders", "--to", "orders-0")
    assert code == 0 and "is paused: the operator acts once `kubectl raft resume` is run" in out


# ----------------------------------------------------------------------------- backups, restore

ARCHIVE = {"url": "s3://bucket/orders", "endpoint": "http://s3.example:8333",
           "credentialsSecret": "s3", "intervalSeconds": 1.0}  # fmt: skip
T0 = 1_740_000_000.0  # 2025-02-19T21:20:00Z


def _backup(name: str, state: str, at: float, message: str | None = None) -> BackupStatus:
    parts = [PartitionIndex(partition=0, index=120), PartitionIndex(partition=1, index=98)]
    return BackupStatus(
        name=name,
        state=state,
        requested_at=at,
        finished_at=None if state == "pending" else at + 2,
        partitions=parts if state == "done" else [],
        message=message,
    )


def restored_status() -> RaftClusterStatus:
    st = status_model()
    st.restore = RestoreStatus(
        url="s3://bucket/src",
        target="backup:b1",
        state="planned",
        partitions=[PartitionIndex(partition=0, index=120), PartitionIndex(partition=1, index=0)],
        at=T0,
    )
    st.backups = [_backup(f"old{i}", "done", T0 + i) for i in range(4)] + [
        _backup("nightly", "failed", T0 + 60, "partition 1: no leader"),
        _backup("now", "done", T0 + 120),
        _backup("last", "pending", T0 + 180),
    ]
    return st


def test_status_shows_the_restore_and_the_last_backups() -> None:
    obj = resource(restored_status(), archive=ARCHIVE)
    obj["metadata"]["annotations"][controls.BACKUP] = "last"
    v = raftview.view(obj)
    assert v["restore"] == {
        "url": "s3://bucket/src", "target": "backup:b1", "state": "planned",
        "partitions": [{"partition": 0, "index": 120}, {"partition": 1, "index": 0}],
        "message": None, "at": T0,
    }  # fmt: skip
    assert [b["name"] for b in v["backups"]] == [
        "old0",
        "old1",
        "old2",
        "old3",
        "nightly",
        "now",
        "last",
    ]  # every one the status keeps
    assert v["backups"][5] == {
        "name": "now", "scheduled": False, "state": "done", "requestedAt": T0 + 120,
        "finishedAt": T0 + 122,
        "partitions": [{"partition": 0, "index": 120}, {"partition": 1, "index": 98}],
        "message": None,
    }  # fmt: skip
    assert v["backupRequested"] == "last"
    assert json.loads(json.dumps(v)) == v
    text = raftview.render(v)
    assert "\nRestored from s3://bucket/src (backup:b1): planned, partition@index 0@120,1@0\n" in (
        text
    )
    tail = text.split("Backups", 1)[1].splitlines()
    assert tail[:7] == [
        " (oldest first, the last 5 of 7):",
        "NAME      STATE     REQUESTED              PARTITION@INDEX",
        "old2      done      2025-02-19T21:20:02Z   0@120,1@98",
        "old3      done      2025-02-19T21:20:03Z   0@120,1@98",
        "nightly   failed    2025-02-19T21:21:00Z   partition 1: no leader",
        "now       done      2025-02-19T21:22:00Z   0@120,1@98",
        "last      pending   2025-02-19T21:23:00Z   -",
    ]
    assert "not picked up" not in text  # "last" is in the status


def test_status_shows_a_failed_restore_plan_and_a_backup_not_picked_up() -> None:
    st = status_model()
    st.restore = RestoreStatus(
        url="s3://bucket/src", target="backup:nope", state="failed",
        message="backup nope: not in the archive", at=T0,
    )  # fmt: skip
    obj = resource(st)
    obj["metadata"]["annotations"][controls.BACKUP] = "b2"
    text = raftview.render(raftview.view(obj))
    assert (
        "Restored from s3://bucket/src (backup:nope): failed (backup nope: not in the archive)"
        in text
    )
    assert "\nBackup b2: requested, not picked up by the operator yet\n" in text
    assert "Backups (" not in text
    obj["status"]["restore"] = {"url": "s3://b/src", "target": "latest", "state": "planning"}
    assert "\nRestored from s3://b/src (latest): planning\n" in raftview.render(raftview.view(obj))
    # Neither: no line about them.
    quiet = raftview.render(raftview.view(resource()))
    assert "Restored" not in quiet and "Backup" not in quiet


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("Nightly", "backup name 'Nightly': 1 to 128 of a-z, 0-9"),
        (".b", "not starting with . or -"),
        ("a/b", "backup name 'a/b'"),
        ("x" * 129, "1 to 128"),
    ],
)
def test_backup_refuses_a_bad_name_naming_why(name: str, says: str) -> None:
    api = FakeCustomObjects(resource(archive=ARCHIVE))
    code, out, err = run(api, "backup", "orders", name)
    assert (code, out) == (1, "") and says in err
    assert api.patches == []


def test_backup_refuses_a_cluster_without_archive_and_a_name_taken() -> None:
    with pytest.raises(Failure, match=r"raftcluster raftlog-system/orders has no spec.archive"):
        backup_patch(resource(), "b1")
    st = status_model()
    st.backups = [_backup("b1", "done", T0)]
    with pytest.raises(Failure, match=r"backup b1 was already asked for \(done\)"):
        backup_patch(resource(st, archive=ARCHIVE), "b1")
    assert backup_patch(resource(st, archive=ARCHIVE), "b2") == {
        "metadata": {"resourceVersion": "100", "annotations": {controls.BACKUP: "b2"}}
    }


def test_backup_sets_the_annotation_on_the_version_read_and_again_on_a_conflict() -> None:
    api = FakeCustomObjects(resource(archive=ARCHIVE))

    def someone_else(obj: dict[str, Any]) -> None:
        api.before_patch = None
        obj["metadata"]["resourceVersion"] = "150"

    api.before_patch = someone_else
    code, out, _ = run(api, "backup", "orders", "b1")
    assert (code, out) == (
        0,
        f"raftcluster {NS}/orders: backup requested (raftlog.dev/backup=b1)\n",
    )
    assert [p["metadata"]["resourceVersion"] for p in api.patches] == ["100", "150"]
    annotations = api.store[(NS, "orders")]["metadata"]["annotations"]
    assert annotations[controls.BACKUP] == "b1" and annotations[controls.SWITCHOVER] == REQUEST


@pytest.mark.parametrize(
    ("outcome", "code", "last"),
    [
        ("done", 0, "backup b1: done: partition@index 0@120, 1@98"),
        ("failed", 1, "backup b1: failed: partition 1: no leader"),
    ],
)
def test_backup_waits_for_its_outcome(outcome: str, code: int, last: str) -> None:
    api = FakeCustomObjects(resource(archive=ARCHIVE))
    gets = 0

    def operator(obj: dict[str, Any]) -> None:
        nonlocal gets
        gets += 1
        st = obj["status"]
        if gets == 3:  # an older backup of the same name is not this one's outcome
            st["backups"] = [_backup("b0", "done", T0).model_dump(by_alias=True, mode="json")]
        if gets == 4:
            st["backups"].append(_backup("b1", "pending", T0).model_dump(by_alias=True))
        if gets == 5:
            message = "partition 1: no leader" if outcome == "failed" else None
            b = _backup("b1", outcome, T0, message)
            st["backups"][-1] = b.model_dump(by_alias=True, mode="json")

    api.on_get = operator
    got, out, err = run(api, "backup", "orders", "b1", "--wait")
    assert (got, err) == (code, "")
    assert out.splitlines() == [
        f"raftcluster {NS}/orders: backup requested (raftlog.dev/backup=b1)",
        "waiting for the operator to take the request",
        "backup b1: pending",
        last,
    ]


def test_backup_wait_times_out() -> None:
    api = FakeCustomObjects(resource(archive=ARCHIVE))
    code, _, err = run(api, "backup", "orders", "b1", "--wait", "--timeout", "3")
    assert code == 1
    assert err == (
        f"error: raftcluster {NS}/orders: not done within 3 s "
        "(last: waiting for the operator to take the request)\n"
    )


@pytest.mark.parametrize(
    ("url", "new", "default"),
    [
        ("s3://bucket/orders", "r", "s3://bucket/orders-restored-r"),
        ("s3://bucket/a/orders/", "r2", "s3://bucket/a/orders-restored-r2"),
        ("s3://bucket", "r", "s3://bucket/restored-r"),
    ],
)
def test_restored_archive_url_is_beside_the_source(url: str, new: str, default: str) -> None:
    assert restored_archive_url(url, new) == default
    assert default.rstrip("/") != url.rstrip("/")


def source(**spec: Any) -> dict[str, Any]:
    obj = resource(
        archive=ARCHIVE,
        fencedMembers=["orders-1"],
        removeMembers=["orders-0"],
        hibernate=True,
        storage={"size": "2Gi"},
        **spec,
    )
    return obj


def test_restore_manifest_is_the_source_spec_restored_from_its_archive() -> None:
    m = restore_manifest(source(), "again", "backup:b1", None)
    assert m == {
        "apiVersion": "raftlog.dev/v1alpha1",
        "kind": "RaftCluster",
        "metadata": {"name": "again", "namespace": NS},
        "spec": {
            "replicas": 3,
            "partitions": 2,
            "storage": {"size": "2Gi"},
            "archive": {**ARCHIVE, "url": "s3://bucket/orders-restored-again"},
            "restore": {"url": "s3://bucket/orders", "target": "backup:b1"},
        },
    }
    RaftClusterSpec.model_validate(m["spec"])
    # A source restored itself: its own restore is not copied but replaced.
    again = source(restore={"url": "s3://bucket/first", "target": "latest"})
    m = restore_manifest(again, "r", "index:0=5,1=7", "s3://other/place")
    assert m["spec"]["restore"] == {"url": "s3://bucket/orders", "target": "index:0=5,1=7"}
    assert m["spec"]["archive"]["url"] == "s3://other/place"


@pytest.mark.parametrize(
    ("obj", "target", "url", "says"),
    [
        (resource(), "latest", None,
         f"raftcluster {NS}/orders has no spec.archive: there is no archive to restore from"),
        (source(), "yesterday", None, "--to: target 'yesterday': give latest, index:N"),
        (source(), "time:2025-01-01T00:00:00", None, "give a zone"),
        (source(), "backup:Bad", None, "backup name 'Bad'"),
        (source(), "latest", "s3://bucket/orders/",
         f"--archive-url s3://bucket/orders/ is raftcluster {NS}/orders's own archive"),
        (source(), "latest", "http://bucket/x", "the new spec is not valid: spec.archive.url"),
    ],
)  # fmt: skip
def test_restore_refusals_name_why(
    obj: dict[str, Any], target: str, url: str | None, says: str
) -> None:
    with pytest.raises(Failure) as refused:
        restore_manifest(obj, "r", target, url)
    assert says in str(refused.value)


def test_restore_prints_the_manifest_or_creates_it() -> None:
    api = FakeCustomObjects(source())
    code, out, _ = run(api, "restore", "r", "--from", "orders", "--to", "time:1700000000000")
    assert code == 0
    printed = yaml.safe_load(out)
    assert printed == restore_manifest(source(), "r", "time:1700000000000", None)
    assert "status" not in printed
    code, out, _ = run(api, "restore", "r", "--from", "orders", "-o", "json")
    assert code == 0 and json.loads(out)["spec"]["restore"]["target"] == "latest"
    assert api.created == [] and api.patches == []

    code, out, _ = run(api, "restore", "r", "--from", "orders", "--to", "backup:b1", "--apply")
    assert (code, out) == (
        0,
        f"raftcluster {NS}/r created: restoring s3://bucket/orders (backup:b1), archiving to "
        "s3://bucket/orders-restored-r; `kubectl raft status r` shows where each partition "
        "comes back\n",
    )
    assert api.created == [restore_manifest(source(), "r", "backup:b1", None)]
    code, out, err = run(api, "restore", "r", "--from", "orders", "--apply")
    assert (code, out, err) == (1, "", f"error: raftcluster {NS}/r already exists\n")
    code, _, err = run(api, "restore", "r2", "--from", "nope", "--apply")
    assert (code, err) == (1, f"error: raftcluster {NS}/nope not found\n")
    assert len(api.created) == 1 and api.patches == []
