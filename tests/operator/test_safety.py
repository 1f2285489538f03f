"""The operator's safety rules, one table each: the cases that a rule admits and refuses."""

from __future__ import annotations

from typing import Any

import pytest

from raftlog.operator.cluster_views import FollowerView, PartitionView
from raftlog.operator.models import MemberStatus
from raftlog.operator.safety import (
    can_serve_snapshot,
    caught_up,
    fit_to_lead,
    has_quorum,
    keeps_majority,
    keeps_partitions,
    majority,
    next_to_remove,
    next_to_restart,
    others_caught_up,
    stays_available,
    within_promotion_lag,
)


def follower(name: str = "c-1", **kw: Any) -> FollowerView:
    """A live, caught-up voter unless told otherwise."""
    fields: dict[str, Any] = {
        "name": name,
        "learner": False,
        "state": "replicate",
        "match": 100,
        "lag": 0,
        "snapshot_required": False,
        "recent_active": True,
    }
    return FollowerView(**(fields | kw))


def leader_view(*followers: FollowerView) -> PartitionView:
    return PartitionView(
        partition=0, role="leader", member="voter", term=3, leader="c-0", high_water_mark=100,
        compaction_floor=1, voters=frozenset({"c-0"} | {f.name for f in followers}),
        learners=frozenset(), followers={f.name: f for f in followers},
    )  # fmt: skip


def members(*names_and_roles: str) -> list[MemberStatus]:
    """`"c-3:joining"` is c-3 (ordinal 3) as a joining member; a bare name is a voter."""
    out = []
    for item in names_and_roles:
        name, _, role = item.partition(":")
        ordinal = int(name.split("-")[1])
        out.append(MemberStatus.model_validate(
            {"name": name, "ordinal": ordinal, "role": role or "voter"}
        ))  # fmt: skip
    return out


@pytest.mark.parametrize(
    "voters, expected",
    [(0, 1), (1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)],
)
def test_majority(voters: int, expected: int) -> None:
    assert majority(voters) == expected


@pytest.mark.parametrize(
    "voters, ready, expected",
    [
        ({"a", "b", "c"}, {"a", "b", "c"}, True),
        ({"a", "b", "c"}, {"a", "b"}, True),
        ({"a", "b", "c"}, {"a"}, False),
        ({"a", "b", "c", "d"}, {"a", "b"}, False),  # half is not a majority
        ({"a", "b", "c", "d"}, {"a", "b", "c"}, True),
        ({"a"}, {"a"}, True),
        ({"a"}, set(), False),
        (set(), set(), False),  # no voters: no quorum
        ({"a", "b", "c"}, {"x", "y", "a"}, False),  # ready non-voters do not count
    ],
)
def test_has_quorum(voters: set[str], ready: set[str], expected: bool) -> None:
    assert has_quorum(voters, ready) is expected


@pytest.mark.parametrize(
    "voters, leaving, ready, expected",
    [
        ({"a", "b", "c"}, "c", {"a", "b", "c"}, True),
        ({"a", "b", "c"}, "c", {"a", "b"}, True),  # the leaving one need not be up
        ({"a", "b", "c"}, "c", {"a", "c"}, False),  # 1 ready of 2 left
        ({"a", "b", "c", "d"}, "d", {"a", "b", "d"}, True),  # 2 of 3 left
        ({"a", "b", "c", "d"}, "d", {"a", "d"}, False),  # 1 of 3 left
        ({"a", "b", "c", "d"}, "x", {"a", "b"}, False),  # not a voter: 2 of 4 stay
        ({"a", "b", "c", "d", "e"}, "e", {"a", "b", "c"}, True),  # 3 of 4 left
        ({"a", "b", "c", "d", "e"}, "e", {"a", "b", "e"}, False),  # 2 of 4 left
        ({"a"}, "a", {"a"}, False),  # the last voter never goes
        ({"a", "b"}, "b", {"a"}, True),
    ],
)
def test_keeps_majority(voters: set[str], leaving: str, ready: set[str], expected: bool) -> None:
    assert keeps_majority(frozenset(voters), leaving, ready) is expected


@pytest.mark.parametrize(
    "voters, stopping, ready, expected",
    [
        ({"a", "b", "c"}, "a", {"a", "b", "c"}, True),  # 2 of 3 left ready
        ({"a", "b", "c"}, "a", {"a", "b"}, False),  # 1 of 3: it still counts as a voter
        ({"a", "b", "c"}, "c", {"a", "b"}, True),  # stopping one already down
        ({"a"}, "a", {"a"}, False),  # a single voter never stops while it serves
        ({"a", "b", "c", "d", "e"}, "a", {"a", "b", "c", "d"}, True),
        ({"a", "b", "c", "d", "e"}, "a", {"a", "b", "c"}, False),
    ],
)
def test_stays_available(voters: set[str], stopping: str, ready: set[str], expected: bool) -> None:
    assert stays_available(frozenset(voters), stopping, ready) is expected


@pytest.mark.parametrize(
    "lag, threshold, expected",
    [
        (0, 10, True),
        (10, 10, True),  # at the threshold is still live replication
        (11, 10, False),
        (None, 10, False),  # unknown never counts as caught up
        (None, 1_000_000, False),
        (5, 0, False),
        (0, 0, True),
    ],
)
def test_caught_up(lag: int | None, threshold: int, expected: bool) -> None:
    assert caught_up(follower(lag=lag), threshold) is expected


@pytest.mark.parametrize(
    "lags, threshold, expected",
    [
        ([], 10, True),  # a single-member partition has nobody to wait for
        ([0, 0], 10, True),
        ([0, 10], 10, True),
        ([0, 11], 10, False),
        ([11, 0], 10, False),
        ([0, None], 10, False),
        ([None], 10, False),
        ([3, 4, 5], 4, False),
        ([3, 4, 4], 4, True),
    ],
)
def test_others_caught_up(lags: list[int | None], threshold: int, expected: bool) -> None:
    view = leader_view(*(follower(f"c-{i + 1}", lag=lag) for i, lag in enumerate(lags)))
    assert others_caught_up(view, threshold) is expected


@pytest.mark.parametrize(
    "stale, leading, expected",
    [
        (["c-0", "c-1", "c-2"], set(), "c-0"),  # no leader among them: by ordinal
        (["c-0", "c-1", "c-2"], {"c-0"}, "c-1"),  # the leader last
        (["c-0", "c-1", "c-2"], {"c-1"}, "c-0"),
        (["c-0", "c-2"], {"c-0"}, "c-2"),
        (["c-0", "c-1"], {"c-0", "c-1"}, "c-0"),  # only leaders left: by ordinal
        (["c-0"], {"c-0"}, "c-0"),  # the leader when nobody else is stale
        (["c-2", "c-1"], {"c-9"}, "c-1"),
    ],
)
def test_next_to_restart(stale: list[str], leading: set[str], expected: str) -> None:
    assert next_to_restart(members(*stale), leading).name == expected


@pytest.mark.parametrize(
    "active, expected",
    [
        (["c-0", "c-1", "c-2", "c-3"], "c-3"),
        (["c-0", "c-1", "c-2", "c-3:joining"], "c-3"),  # the joining one before any voter
        (["c-0", "c-4:learner", "c-2"], "c-4"),
        (["c-5", "c-1", "c-3"], "c-5"),  # by ordinal, not by position
        (["c-0", "c-1", "c-2", "c-3:joining", "c-4"], "c-3"),  # not yet a voter, whatever ordinal
        (["c-0", "c-1", "c-2", "c-3:learner", "c-4:joining"], "c-4"),
    ],
)
def test_next_to_remove(active: list[str], expected: str) -> None:
    assert next_to_remove(members(*active)).name == expected


READY = {"c-0", "c-1", "c-2"}


@pytest.mark.parametrize(
    "candidate, leaving, ready, expected",
    [
        (follower("c-1"), "c-0", READY, True),
        (follower("c-1"), "c-1", READY, False),  # not the one leaving
        (follower("c-1", learner=True), "c-0", READY, False),  # a learner cannot lead
        (follower("c-1", recent_active=False), "c-0", READY, False),  # not answering
        (follower("c-1"), "c-0", {"c-0", "c-2"}, False),  # not ready
        (follower("c-1", state="probe"), "c-0", READY, False),
        (follower("c-1", state="snapshot"), "c-0", READY, False),
        (follower("c-1", lag=50), "c-0", READY, True),  # behind but replicating: still fit
    ],
)
def test_fit_to_lead(
    candidate: FollowerView, leaving: str, ready: set[str], expected: bool
) -> None:
    assert fit_to_lead(candidate, leaving, ready) is expected


@pytest.mark.parametrize(
    "source, target, needed_match, ready, expected",
    [
        (follower("c-1", match=900), "c-2", 499, READY, True),
        (follower("c-1", match=499), "c-2", 499, READY, True),  # exactly what is needed
        (follower("c-1", match=498), "c-2", 499, READY, False),
        (follower("c-2", match=900), "c-2", 499, READY, False),  # not the target itself
        (follower("c-1", match=900, recent_active=False), "c-2", 499, READY, False),
        (follower("c-1", match=900, snapshot_required=True), "c-2", 499, READY, False),
        (follower("c-1", match=900), "c-2", 499, {"c-0", "c-2"}, False),  # not ready
        (follower("c-1", match=900, state="probe"), "c-2", 499, READY, True),  # ranked lower
        (follower("c-1", match=900, learner=True), "c-2", 499, READY, True),
    ],
)
def test_can_serve_snapshot(
    source: FollowerView, target: str, needed_match: int, ready: set[str], expected: bool
) -> None:
    assert can_serve_snapshot(source, target, needed_match, ready) is expected


@pytest.mark.parametrize(
    "learner, limit, expected",
    [
        (follower("c-3", learner=True, lag=0), 10, True),
        (follower("c-3", learner=True, lag=10), 10, True),
        (follower("c-3", learner=True, lag=11), 10, False),
        (follower("c-3", learner=True, lag=None), 10, False),  # unknown is never within
        (follower("c-3", learner=True, lag=0, recent_active=False), 10, False),  # paused
        (None, 10, False),  # the leader does not know it
        (follower("c-3", learner=True, lag=0), 0, True),
        (follower("c-3", learner=True, lag=1), 0, False),
    ],
)
def test_within_promotion_lag(learner: FollowerView | None, limit: int, expected: bool) -> None:
    assert within_promotion_lag(learner, limit) is expected


@pytest.mark.parametrize(
    "held, wanted, expected",
    [
        (0, 2, True),  # nobody answered yet
        (2, 2, True),
        (2, 4, True),  # raising is allowed
        (4, 2, False),
        (3, 2, False),
    ],
)
def test_keeps_partitions(held: int, wanted: int, expected: bool) -> None:
    assert keeps_partitions(held, wanted) is expected
