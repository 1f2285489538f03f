from __future__ import annotations

from raftlog.node.core.compaction import compaction_floor, should_snapshot
from raftlog.node.core.config import RaftConfig
from raftlog.node.core.progress import ProgressState
from raftlog.node.core.raft import FollowerStatus, Raft
from raftlog.node.core.snapshot_source import rank_snapshot_sources
from raftlog.node.core.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from raftlog.node.record import Record, encode_record
from raftlog.node.server.compaction_pass import compact_behind, snapshot_covering
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.memory import MemoryStorage
from tests.core.helpers import snapshot_and_compact

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


# ---- a partition's snapshot-and-compaction pass (server.compaction_pass) ----------------------
ABC = Membership.of(["a", "b", "c"])
ABCD = Membership.of(["a", "b", "c", "d"])
ABCDE = Membership.of(["a", "b", "c", "d", "e"])


def record(i: int, term: int) -> Entry:
    return Entry(i, term, EntryKind.NORMAL, encode_record(Record(b"k%d" % (i % 3), b"v%d" % i)))


def partition(
    entries: list[Entry], applied: int, term: int = 5
) -> tuple[MemoryStorage, Raft, KeyedTable]:
    """A member's log (all committed, current term `term`) and a table applied to `applied`."""
    s = MemoryStorage(ABC)
    s.save(HardState(term, None, len(entries)), entries)
    table = KeyedTable()
    for e in entries[:applied]:
        table.apply(e)
    return s, Raft("a", RaftConfig(), s), table


def changing_log() -> list[Entry]:
    """Terms 1, 2 and 3, and two membership changes: to ABCD at 11, to ABCDE at 18."""
    return [
        *(record(i, 1) for i in range(1, 11)),
        Entry(11, 2, EntryKind.CONFIG, ABCD.encode()),
        *(record(i, 3) for i in range(12, 18)),
        Entry(18, 3, EntryKind.CONFIG, ABCDE.encode()),
        *(record(i, 3) for i in range(19, 21)),
    ]


def test_a_pass_snapshots_the_term_and_membership_of_the_applied_index() -> None:
    """Not the current term (5) nor the latest membership (ABCDE, at 18, not applied yet)."""
    s, raft, table = partition(changing_log(), applied=15)
    cfg = RaftConfig(compact_every_operations=10, compact_number_entries=0)
    done = snapshot_and_compact(s, raft, table, cfg)
    assert done is not None and done.snapshot_index == 15
    assert s.snapshot_meta() == SnapshotMeta(15, 3, ABCD)
    assert KeyedTable.restore(s.snapshot_data()).rows == table.rows
    assert (done.floor, done.dropped, s.first_index()) == (16, 15, 16)


def test_a_snapshot_to_stream_covers_what_the_target_needs() -> None:
    """The stored snapshot when it covers the target's need, else a fresh one of the table."""
    log = changing_log()
    s, raft, table = partition(log, applied=15)
    s.create_snapshot(SnapshotMeta(15, 3, ABCD), table.snapshot())
    for e in log[15:19]:
        table.apply(e)
    assert snapshot_covering(s, raft, table, required=15) == (s.snapshot_meta(), s.snapshot_data())
    meta, data = snapshot_covering(s, raft, table, required=16)
    assert meta == SnapshotMeta(19, 3, ABCDE)
    assert KeyedTable.restore(data).rows == table.rows


def test_an_operator_pass_right_after_one_more_entry_takes_a_snapshot() -> None:
    s, raft, table = partition([record(i, 1) for i in range(1, 21)], applied=10)
    cfg = RaftConfig(compact_every_operations=1000, compact_number_entries=0)
    assert snapshot_and_compact(s, raft, table, cfg) is None, "not due"
    first = snapshot_and_compact(s, raft, table, cfg, force=True)
    assert first is not None and (first.snapshot_index, s.first_index()) == (10, 11)
    assert snapshot_and_compact(s, raft, table, cfg, force=True) is None, "nothing new"
    table.apply(record(11, 1))  # the table now stands at the first index the log holds
    again = snapshot_and_compact(s, raft, table, cfg, force=True)
    assert again is not None and s.snapshot_meta().index == 11


def test_a_pass_is_due_after_so_many_bytes_applied() -> None:
    log = [record(i, 1) for i in range(1, 21)]
    s, raft, table = partition(log, applied=0)
    cfg = RaftConfig(compact_every_operations=1000, compact_every_bytes=100)
    applied = 0
    while table.bytes_since_capture < 100:
        assert snapshot_and_compact(s, raft, table, cfg) is None
        table.apply(log[applied])
        applied += 1
    done = snapshot_and_compact(s, raft, table, cfg)
    assert done is not None and s.snapshot_meta().index == applied


def test_an_operator_pass_with_nothing_applied_since_the_snapshot_does_nothing() -> None:
    """Here compaction keeps the 5 most recent entries, so the log still holds the snapshot's."""
    s, raft, table = partition([record(i, 1) for i in range(1, 21)], applied=10)
    cfg = RaftConfig(compact_every_operations=1000, compact_number_entries=5)
    first = snapshot_and_compact(s, raft, table, cfg, force=True)
    assert first is not None and (first.snapshot_index, first.floor) == (10, 6)
    assert snapshot_and_compact(s, raft, table, cfg, force=True) is None


def test_compaction_behind_a_snapshot_keeps_the_most_recent_applied_entries_and_the_hold() -> None:
    """The snapshot at 10 was written while the table applied on to 20: the 5 entries kept are
    the 5 before 20, and a hold (a reader's, the archive's) keeps its index whatever it says."""
    s, _, table = partition([record(i, 1) for i in range(1, 21)], applied=10)
    s.create_snapshot(SnapshotMeta(10, 1, ABC), table.snapshot())
    cfg = RaftConfig(compact_number_entries=5)
    held = compact_behind(s, 10, applied=20, config=cfg, retention_hold=4)
    assert (held.dropped, held.floor, s.first_index()) == (3, 4, 4)
    done = compact_behind(s, 10, applied=20, config=cfg)
    assert (done.snapshot_index, done.dropped, done.floor, s.first_index()) == (10, 7, 11, 11)


def test_a_pass_removes_at_most_max_entries_per_compaction_and_a_single_one_too() -> None:
    s, _, _ = partition([record(i, 1) for i in range(1, 21)], applied=20)
    s.create_snapshot(SnapshotMeta(7, 1, ABC), b"")
    cfg = RaftConfig(compact_number_entries=0, max_entries_per_compaction=3)
    assert [compact_behind(s, 7, 20, cfg).dropped for _ in range(4)] == [3, 3, 1, 0]
    assert s.first_index() == 8


def test_a_whole_pass_never_passes_a_retention_hold() -> None:
    s, raft, table = partition([record(i, 1) for i in range(1, 21)], applied=20)
    cfg = RaftConfig(compact_every_operations=10, compact_number_entries=0)
    done = snapshot_and_compact(s, raft, table, cfg, retention_hold=6)
    assert done is not None and (done.snapshot_index, done.floor, s.first_index()) == (20, 6, 6)
