"""The steps the reconciler can ask for, one per pass, and what came of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class CreateMembers:
    """Create these members' pods (and volumes if missing); `join`: start empty as learners."""

    names: tuple[str, ...]
    join: bool
    # What the pods are launched with (`reconciler.config_hash`): derived from the spec and the
    # restart request, so it does not tell two creations apart.
    launch_hash: str = field(default="", compare=False)


@dataclass(frozen=True)
class DeleteMember:
    """Delete a member's pod (it is out of every partition already), its volume if asked."""

    name: str
    delete_volume: bool


@dataclass(frozen=True)
class RestartMember:
    """Delete a member's pod so that it comes back with the current configuration."""

    name: str


@dataclass(frozen=True)
class StopMember:
    """Delete a member's pod and leave it stopped (fenced, or the cluster hibernating); its
    volume and its place in every partition stay."""

    name: str


@dataclass(frozen=True)
class ExpandVolume:
    """Raise the size a member's volume claims (spec.storage.size); no restart."""

    name: str
    size: str


@dataclass(frozen=True)
class SyncPeers:
    """Tell node `name` every member's address (members added later are not in its flags)."""

    name: str
    peers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ChangeMembership:
    """A one-server membership change of one partition, asked of its leader."""

    partition: int
    leader: str
    op: Literal["add_learner", "promote", "remove"]
    member: str


@dataclass(frozen=True)
class TransferLeader:
    partition: int
    leader: str
    target: str


@dataclass(frozen=True)
class InstallSnapshot:
    """Install a snapshot on `target` from `source` (a member, or "leader"), asked of the leader."""

    partition: int
    leader: str
    target: str
    source: str


@dataclass(frozen=True)
class PlanRestore:
    """Resolve spec.restore's target to an index per partition, once, before any member."""


@dataclass(frozen=True)
class TakeBackup:
    """Have each partition's leader archive what it has committed, then record backup `name`."""

    name: str
    leaders: tuple[tuple[int, str], ...]  # partition -> its leader
    # Asked again after the operator stopped during it: a record already written is its.
    resume: bool = False


@dataclass(frozen=True)
class Wait:
    """Nothing safe to do now; `reason` says what the operator waits for."""

    reason: str


Action = (
    CreateMembers
    | DeleteMember
    | RestartMember
    | StopMember
    | ExpandVolume
    | SyncPeers
    | ChangeMembership
    | TransferLeader
    | InstallSnapshot
    | PlanRestore
    | TakeBackup
    | Wait
)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str = ""
    indexes: dict[int, int] | None = None  # a restore plan's or a backup's, per partition
    # An installed snapshot's streamer as the leader answered ("leader" when it fell back).
    source: str | None = None


@dataclass(frozen=True)
class Event:
    """A Kubernetes event on the RaftCluster (also printed by the local runtime)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def describe(action: Action | None) -> str:
    """One line for status and logs."""
    match action:
        case None:
            return "steady"
        case CreateMembers(names, join):
            return f"create {', '.join(names)}" + (" (joining the running cluster)" if join else "")
        case DeleteMember(name, delete_volume):
            return f"delete {name}" + (" and its volume" if delete_volume else "")
        case RestartMember(name):
            return f"restart {name}"
        case StopMember(name):
            return f"stop {name} (its volume stays)"
        case ExpandVolume(name, size):
            return f"expand {name}'s volume to {size}"
        case SyncPeers(name, peers):
            return f"tell {name} the addresses of {', '.join(n for n, _ in peers)}"
        case ChangeMembership(p, leader, op, member):
            return f"partition {p}: {op.replace('_', ' ')} {member} (asked of {leader})"
        case TransferLeader(p, leader, target):
            return f"partition {p}: transfer leadership from {leader} to {target}"
        case InstallSnapshot(p, leader, target, source):
            return f"partition {p}: install a snapshot on {target} from {source} (leader {leader})"
        case PlanRestore():
            return "resolve the restore target to an index per partition"
        case TakeBackup(name, leaders):
            return f"back up as {name} ({len(leaders)} partitions)"
        case Wait(reason):
            return f"wait: {reason}"
    raise AssertionError(action)
