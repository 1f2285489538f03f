"""The operator's safety rules, each a function named for the rule it states.

The reconciler asks these before it removes, restarts, promotes a member or picks one to take
over or to serve a snapshot, as Strimzi's KafkaRoller states its rules; each has a table test
(tests/operator/test_safety.py). They are pure: names and views in, an answer out.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from raftlog.operator.cluster_views import FollowerView, PartitionView
from raftlog.operator.models import MemberStatus


def majority(voters: int) -> int:
    """How many of `voters` must agree for a partition to commit or elect a leader."""
    return voters // 2 + 1


def has_quorum(voters: AbstractSet[str], ready: AbstractSet[str]) -> bool:
    """A majority of `voters` is ready. No voters at all is no quorum (a majority of 0 is 1)."""
    return len(voters & ready) >= majority(len(voters))


def keeps_majority(voters: AbstractSet[str], leaving: str, ready: AbstractSet[str]) -> bool:
    """Never below a majority: once `leaving` is out, a majority of the voters left is ready
    (the remaining voters must still commit and elect without it)."""
    return has_quorum(voters - {leaving}, ready)


def stays_available(voters: AbstractSet[str], stopping: str, ready: AbstractSet[str]) -> bool:
    """Stopping a voter that stays one (a restart, fencing): a majority of all the voters,
    `stopping` still counted among them, is ready without it."""
    return has_quorum(voters, ready - {stopping})


def caught_up(follower: FollowerView, threshold: int) -> bool:
    """Its lag is known and within `threshold` (backfillThreshold): it is in live replication,
    not being repaired. An unknown lag never counts as caught up."""
    return follower.lag is not None and follower.lag <= threshold


def others_caught_up(leader_view: PartitionView, threshold: int) -> bool:
    """Roll only while the others are caught up: every member of the partition other than its
    leader (learners too) is caught up. Restarting one while another is behind could leave the
    partition without a caught-up majority until the repair ends."""
    return all(caught_up(f, threshold) for f in leader_view.followers.values())


def next_to_restart(stale: Sequence[MemberStatus], leading: AbstractSet[str]) -> MemberStatus:
    """The leader goes last: followers first, by ordinal, then a member that leads a partition
    (its leadership moves once, when nobody else is left to restart)."""
    return min(stale, key=lambda m: (m.name in leading, m.ordinal))


def next_to_remove(active: Sequence[MemberStatus]) -> MemberStatus:
    """A member not yet a voter (joining, a learner) goes first on a scale-down, then the newest:
    a scale-up creates its members together, and a voter promoted beside one that never started
    is not the one to lose."""
    return max(active, key=lambda m: (m.role != "voter", m.ordinal))


def fit_to_lead(follower: FollowerView, leaving: str, ready: AbstractSet[str]) -> bool:
    """A member may take leadership over from `leaving` only as a voter that replicates live
    (not probing, not waiting for a snapshot), answers the leader and is ready."""
    return (
        follower.name != leaving
        and not follower.learner
        and follower.recent_active
        and follower.name in ready
        and follower.state == "replicate"
    )


def can_serve_snapshot(
    follower: FollowerView, target: str, needed_match: int, ready: AbstractSet[str]
) -> bool:
    """RATIS-2428: a follower may stream a snapshot to `target` when it answers the leader, needs
    no snapshot itself, holds every entry the target needs (`needed_match`) and is ready."""
    return (
        follower.name != target
        and follower.recent_active
        and not follower.snapshot_required
        and follower.match >= needed_match
        and follower.name in ready
    )


def within_promotion_lag(follower: FollowerView | None, limit: int) -> bool:
    """A learner's time in one partition counts toward its promotion window only with a known
    lag within `limit` (learnerPromotionLag), reported while it answers: a paused learner
    still shows the lag it had, and a voter that does not answer weakens the quorum."""
    return (
        follower is not None
        and follower.recent_active
        and follower.lag is not None
        and follower.lag <= limit
    )


def keeps_partitions(held: int, wanted: int) -> bool:
    """The partition count is never lowered: members restarted with fewer would drop the
    partitions above it with their records."""
    return held <= wanted


def lowering_refused(held: int, wanted: int) -> str | None:
    """Why `wanted` partitions are refused while the members hold `held`, or None."""
    if keeps_partitions(held, wanted):
        return None
    return (
        f"spec.partitions is {wanted} but the members hold {held} partitions: lowering is "
        f"refused (it would drop partitions with their records); set it back to {held} or more"
    )
