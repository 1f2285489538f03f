"""Which member should stream a snapshot to a lagging follower (RATIS-2428).

A follower F is an eligible source for target T when F answered the leader recently and
F.match >= required_index (the leader's compaction floor - 1) and F's commit index reached it
too (F can only snapshot what it applied, and it applies only what it knows committed): a snapshot
from F then lets T resume ordinary appends from the leader. Eligible followers are ranked by: in
sync with the leader, then highest match index, then highest commit index, then freshest
response. With no eligible follower the leader serves the snapshot itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.node.core.raft import FollowerStatus


def rank_snapshot_sources(
    followers: Iterable[FollowerStatus],
    *,
    target: str,
    required_index: int,
    leader_last_index: int,
    now_tick: int,
    responsive_within: int,
) -> list[str]:
    """Eligible follower sources, best first; empty means: fall back to the leader."""
    eligible = [
        f
        for f in followers
        if f.node != target
        and f.last_response_tick >= 0
        and now_tick - f.last_response_tick <= responsive_within
        and f.match >= required_index
        and f.follower_commit >= required_index
        and not f.snapshot_required
    ]
    eligible.sort(
        key=lambda f: (
            f.match == leader_last_index,
            f.match,
            f.follower_commit,
            f.last_response_tick,
        ),
        reverse=True,
    )
    return [f.node for f in eligible]
