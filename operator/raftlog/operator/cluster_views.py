"""What the operator sees of a cluster in one pass: its members' pods and each node's status.

Runtimes build these (the Kubernetes runtime from pods and PVCs, the local runtime from processes
and directories); the reconciler reads nothing else, which is what makes it testable without I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

PodState = Literal["missing", "pending", "running", "failed", "terminating"]


@dataclass(frozen=True)
class FollowerView:
    """A leader's view of one follower of one partition."""

    name: str
    learner: bool
    state: str
    match: int
    lag: int | None
    snapshot_required: bool
    recent_active: bool


@dataclass(frozen=True)
class ArchiveView:
    """One node's continuous archive of one partition (`archive` in its `/v1/status`)."""

    archived_index: int
    lag_entries: int
    last_error: str | None
    last_upload_at: float | None


@dataclass(frozen=True)
class PartitionView:
    """One node's status of one partition (`/v1/status`)."""

    partition: int
    role: str
    member: str  # voter, learner or none
    term: int
    leader: str | None
    high_water_mark: int
    compaction_floor: int
    voters: frozenset[str]
    learners: frozenset[str]
    followers: dict[str, FollowerView] = field(default_factory=dict)
    archive: ArchiveView | None = None  # None: the node does not archive
    # A leader's last membership change is not committed yet: `voters` may still change back
    # (a new leader without the entry), and a member it removed may hold what others lack.
    membership_pending: bool = False

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"


@dataclass(frozen=True)
class NodeView:
    """A node's answer to `/v1/status` (and the peers it knows, from `/v1/admin/peers`)."""

    name: str
    partitions: dict[int, PartitionView]
    peers: dict[str, str] = field(default_factory=dict)
    started_at: float | None = None  # its process's start (None: a node that does not say)


@dataclass(frozen=True)
class MemberObserved:
    name: str
    pod: PodState
    volume: bool  # its data volume (PVC or directory) exists
    config_hash: str | None = None  # the launch configuration its pod was created with
    node: NodeView | None = None  # None: the node did not answer
    volume_size: str | None = None  # the size its claim asks for (None: not a sized volume)
    volume_capacity: str | None = None  # the size the volume has, as Kubernetes reports it
    stuck: str | None = None  # why its pod cannot start by itself (kube.pod_stuck), or None


@dataclass(frozen=True)
class Observed:
    members: dict[str, MemberObserved]
    urls: dict[str, str] = field(default_factory=dict)  # each member's node URL

    def node(self, name: str) -> NodeView | None:
        m = self.members.get(name)
        return m.node if m else None

    def partitions_served(self, wanted: int) -> int:
        """How many partitions every answering member serves: `wanted`, or fewer while the
        members restart one at a time with a raised count (the new ones elect once all do)."""
        return min([wanted, *(len(m.node.partitions) for m in self.members.values() if m.node)])

    def leader_view(self, partition: int) -> PartitionView | None:
        """The partition's leader as the leaders themselves say (the highest term wins)."""
        best: PartitionView | None = None
        for m in self.members.values():
            view = m.node.partitions.get(partition) if m.node else None
            if view is not None and view.is_leader and (best is None or view.term > best.term):
                best = view
        return best


def parse_node_status(body: dict[str, Any], peers: dict[str, str] | None = None) -> NodeView:
    """A `NodeView` from the node's `/v1/status` JSON."""
    parts = {}
    for p in body["partitions"]:
        leader_name = body["node"]
        followers = {
            name: FollowerView(
                name=name,
                learner=bool(f["learner"]),
                state=str(f["state"]),
                match=int(f["match"]),
                lag=None if f["lag"] is None else int(f["lag"]),
                snapshot_required=bool(f["snapshot_required"]),
                recent_active=bool(f["recent_active"]),
            )
            for name, f in p.get("followers", {}).items()
            if name != leader_name
        }
        parts[int(p["partition"])] = PartitionView(
            partition=int(p["partition"]),
            role=str(p["role"]),
            member=str(p["member"]),
            term=int(p["term"]),
            leader=p["leader"],
            high_water_mark=int(p["high_water_mark"]),
            compaction_floor=int(p["compaction_floor"]),
            voters=frozenset(p["voters"]),
            learners=frozenset(p["learners"]),
            followers=followers,
            archive=_archive(p.get("archive")),
            membership_pending=bool(p.get("membership_pending")),
        )
    started = body.get("started_at")
    return NodeView(
        name=str(body["node"]),
        partitions=parts,
        peers=dict(peers or {}),
        started_at=float(started) if isinstance(started, int | float) else None,
    )


def _archive(body: Any) -> ArchiveView | None:
    if not isinstance(body, dict):
        return None
    error = body.get("last_error")
    uploaded = body.get("last_upload_at")
    return ArchiveView(
        archived_index=int(body.get("archived_index") or 0),
        lag_entries=int(body.get("lag_entries") or 0),
        last_error=None if error is None else str(error),
        last_upload_at=None if uploaded is None else float(uploaded),
    )
