from __future__ import annotations

from raftlog.node.core.compaction import compaction_floor, should_snapshot
from raftlog.node.core.config import RaftConfig
from raftlog.node.core.progress import ProgressState
from raftlog.node.core.raft import FollowerStatus
from raftlog.node.core.snapshot_source import rank_snapshot_sources

CFG = RaftConfig(
    compact_every_operations=100, compact_number_entries=20, max_entries_per_compaction=500
)


def test_snapshot_every_n_operations() -> None:
    assert not should_snapshot(applied=99, last_snapshot_index=0, config=CFG)
    assert should_snapshot(applied=100, last_snapshot_index=0, config=CFG)


def test_snapshot_also_after_so_many_bytes() -> None:
    cfg = CFG.model_copy(update={"compact_every_bytes": 1000})
    assert not should_snapshot(applied=10, last_snapshot_index=0, config=cfg, bytes_since=999)
    assert should_snapshot(applied=10, last_snapshot_index=0, config=cfg, bytes_since=1000)
    assert not should_snapshot(applied=10, last_snapshot_index=10, config=cfg, bytes_since=5000)
    off = CFG.model_copy(update={"compact_every_bytes": 0})
    assert not should_snapshot(applied=10, last_snapshot_index=0, config=off, bytes_since=10**9)


def test_the_table_counts_the_bytes_applied_since_its_last_capture() -> None:
    from raftlog.node.core.types import Entry, EntryKind
    from raftlog.node.statemachine import KeyedTable

    t = KeyedTable()
    t.apply(Entry(1, 1, EntryKind.NORMAL, b"x" * 300))
    t.apply(Entry(2, 1, EntryKind.NOOP))
    t.apply(Entry(1, 1, EntryKind.NORMAL, b"y" * 999))  # already applied: not counted again
    assert t.bytes_since_capture == 300
    t.capture()
    assert t.bytes_since_capture == 0


def test_compaction_keeps_recent_entries_and_never_passes_the_snapshot() -> None:
    # Snapshot at 100, applied 150: keep the last 20 applied entries -> remove up to 100.
    assert compaction_floor(first_index=1, snapshot_index=100, applied=150, config=CFG) == 101
    # Applied 110: the 20 most recent (91..110) stay.
    assert compaction_floor(first_index=1, snapshot_index=100, applied=110, config=CFG) == 91


def test_compaction_is_bounded_per_pass_and_respects_a_retention_hold() -> None:
    assert compaction_floor(first_index=1, snapshot_index=5000, applied=5000, config=CFG) == 501
    hold = compaction_floor(
        first_index=1, snapshot_index=100, applied=150, config=CFG, retention_hold=40
    )
    assert hold == 40  # index 40 is still needed by a reader: it stays
    assert (
        compaction_floor(
            first_index=50, snapshot_index=100, applied=150, config=CFG, retention_hold=40
        )
        is None
    )


def follower(
    node: str, match: int, commit: int, last_response: int, **kw: object
) -> FollowerStatus:
    base: dict[str, object] = dict(
        node=node,
        learner=False,
        state=ProgressState.REPLICATE,
        match=match,
        next=match + 1,
        lag=0,
        snapshot_required=False,
        recent_active=True,
        last_response_tick=last_response,
        follower_commit=commit,
        inflight=0,
        backfilling=False,
        backfill_rounds=0,
        backfill_entries=0,
        snapshots_installed=0,
    )
    base.update(kw)
    return FollowerStatus(**base)  # type: ignore[arg-type]


def rank(*followers: FollowerStatus, required: int = 50, now: int = 100) -> list[str]:
    return rank_snapshot_sources(
        followers,
        target="t",
        required_index=required,
        leader_last_index=120,
        now_tick=now,
        responsive_within=10,
    )


def test_ratis_2428_eligibility() -> None:
    assert rank(
        follower("stale", 49, 49, 100),  # match below what the target needs
        follower("silent", 120, 120, 80),  # not responsive lately
        follower("t", 120, 120, 100),  # the target itself
        follower("needy", 120, 120, 100, snapshot_required=True),
        follower("uncommitted", 120, 49, 100),  # matched, but cannot have applied it yet
        follower("ok", 50, 50, 95),
    ) == ["ok"]
    assert rank(follower("stale", 10, 10, 100)) == []  # nobody: the leader serves it


def test_ratis_2428_ranking() -> None:
    assert rank(
        follower("behind", 100, 100, 100),
        follower("in-sync", 120, 110, 90),
        follower("same-match-lower-commit", 110, 100, 100),
        follower("same-match-higher-commit", 110, 105, 95),
        follower("same-all-fresher", 110, 105, 99),
    ) == [
        "in-sync",
        "same-all-fresher",
        "same-match-higher-commit",
        "same-match-lower-commit",
        "behind",
    ]


def test_a_pass_that_may_remove_exactly_one_entry_removes_it() -> None:
    cfg = RaftConfig(compact_number_entries=0)
    assert compaction_floor(first_index=1, snapshot_index=1, applied=1, config=cfg) == 2
    one = RaftConfig(compact_number_entries=0, max_entries_per_compaction=1)
    assert compaction_floor(first_index=5, snapshot_index=100, applied=100, config=one) == 6


def test_a_follower_that_answered_at_tick_zero_may_serve() -> None:
    """Tick 0 is a tick (a cluster's first); -1 says it never answered."""
    assert rank(follower("early", 60, 60, 0), now=5) == ["early"]
    assert rank(follower("never", 60, 60, -1), now=5) == []
