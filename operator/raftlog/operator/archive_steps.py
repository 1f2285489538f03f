"""The reconciler's steps for restores and backups, and how their outcomes fold into the status
(pure, as the rest of the reconciler: the runtime resolves plans and takes backups).

A restore is planned once, before the first member: the target (`spec.restore.target`) is
resolved to an index per partition and kept in `status.restore`, and every member that starts
the cluster is given that plan (`node_launch.restore_env`). Members resolving it themselves
could restore different logs from an archive the source still writes to.

A backup is taken when the `raftlog.dev/backup` annotation names one not taken yet, or when
`spec.archive.backupIntervalMinutes` have passed since the last scheduled one; each is
recorded in `status.backups` (the most recent `BACKUPS_KEPT`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from raftlog.operator.actions import Action, Event, Outcome, PlanRestore, TakeBackup, Wait
from raftlog.operator.models import (
    BackupStatus,
    PartitionIndex,
    RaftClusterStatus,
    RestoreStatus,
)

if TYPE_CHECKING:
    from raftlog.operator.reconciler import _ClusterPass

RESTORE_RETRY_S = 30.0  # after a failed plan (the store down, a target not archived yet)
BACKUPS_KEPT = 20
# A backup still pending this long was being taken when the operator stopped (a flush of every
# partition answers within 120 s each).
BACKUP_STALLED_S = 600.0


def restore_plan(cluster: _ClusterPass) -> Action | None:
    """Before the first member of a restored cluster: its plan, once."""
    r = cluster.spec.restore
    if r is None or cluster.status.members:
        return None
    st = cluster.status.restore
    if st is not None and st.state == "planned":
        return None
    if st is not None and st.state == "failed" and cluster.now < (st.at or 0) + RESTORE_RETRY_S:
        return Wait(
            f"the restore from {r.url} ({r.target}) cannot be planned: {st.message}; trying "
            f"again in {st.at + RESTORE_RETRY_S - cluster.now if st.at else 0:.0f} s"
        )
    cluster.status.restore = RestoreStatus(url=r.url, target=r.target, state="planning")
    return PlanRestore()


def backups(cluster: _ClusterPass) -> Action | None:
    """A backup asked for by name, or one the schedule is due for (every partition led)."""
    archive = cluster.spec.archive
    stalled = next(
        (
            b
            for b in cluster.status.backups
            if b.state == "pending" and cluster.now - b.requested_at >= BACKUP_STALLED_S
        ),
        None,
    )
    if stalled is not None and archive is not None:
        # The operator stopped while taking it (its outcome was never recorded): again, and a
        # record it wrote before stopping is taken as the backup.
        stalled.requested_at = cluster.now
        cluster.event("BackupResumed", f"backup {stalled.name}: asked again")
        return TakeBackup(stalled.name, _leaders(cluster), resume=True)
    taken = {b.name for b in cluster.status.backups}
    name, scheduled = cluster.controls.backup, False
    if name is not None and (name in taken or name == cluster.status.backup_request):
        name = None
    if name is not None:
        cluster.status.backup_request = name
    if name is None and archive is not None and archive.backup_interval_minutes:
        last = max((b.requested_at for b in cluster.status.backups if b.scheduled), default=None)
        if last is None or cluster.now - last >= archive.backup_interval_minutes * 60:
            stamp = datetime.fromtimestamp(cluster.now, UTC).strftime("%Y%m%dt%H%M%Sz")
            name, scheduled = f"scheduled-{stamp}", True
    if name is None:
        return None
    backup = BackupStatus(name=name, scheduled=scheduled, state="pending", requested_at=cluster.now)
    cluster.status.backups = [*cluster.status.backups, backup][-BACKUPS_KEPT:]
    if archive is None:
        backup.state, backup.finished_at = "failed", cluster.now
        backup.message = "spec.archive is not set: there is no archive to back up to"
        cluster.event("BackupFailed", f"backup {name}: {backup.message}", warning=True)
        return None
    cluster.event("BackupStarted", f"backup {name}: archiving every partition's commits")
    return TakeBackup(name, _leaders(cluster))


def _leaders(cluster: _ClusterPass) -> tuple[tuple[int, str], ...]:
    return tuple(
        (p, view.leader) for p, view in cluster.led_partitions() if view.leader is not None
    )


def _indexes(indexes: dict[int, int] | None) -> list[PartitionIndex]:
    return [PartitionIndex(partition=p, index=i) for p, i in sorted((indexes or {}).items())]


def _listed(parts: list[PartitionIndex]) -> str:
    return ", ".join(f"{p.partition}@{p.index}" for p in parts) or "none"


def record_restore(status: RaftClusterStatus, outcome: Outcome, now: float) -> list[Event]:
    r = status.restore
    if r is None:
        return []
    r.at = now
    if not outcome.ok:
        r.state, r.message = "failed", outcome.detail
        return []
    r.state, r.message, r.partitions = "planned", None, _indexes(outcome.indexes)
    return [
        Event(
            "Normal",
            "RestorePlanned",
            f"restoring {r.url} to {outcome.detail}: partition@index {_listed(r.partitions)}",
        )
    ]


def record_backup(
    status: RaftClusterStatus, action: TakeBackup, outcome: Outcome, now: float
) -> list[Event]:
    b = next((b for b in status.backups if b.name == action.name and b.state == "pending"), None)
    if b is None:
        return []
    b.finished_at = now
    if not outcome.ok:
        b.state, b.message = "failed", outcome.detail
        return [Event("Warning", "BackupFailed", f"backup {b.name}: {outcome.detail}")]
    b.state, b.partitions = "done", _indexes(outcome.indexes)
    return [
        Event(
            "Normal",
            "BackupDone",
            f"backup {b.name} in {now - b.requested_at:.1f} s: partition@index "
            f"{_listed(b.partitions)}",
        )
    ]
