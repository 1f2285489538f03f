"""The keyed table's memory of idempotent producers: bounded, and the same after a snapshot."""

from __future__ import annotations

import msgspec

from raftlog.node.core.types import Entry
from raftlog.node.record import Record, encode_record
from raftlog.node.statemachine import MAX_FORGOTTEN, MAX_PRODUCERS, KeyedTable


def entry(index: int, producer: str, sequence: int) -> Entry:
    data = encode_record(Record(b"k", b"v", producer_id=producer, sequence=sequence))
    return Entry(index, 1, data=data)


def test_the_table_forgets_the_producer_that_appended_least_recently():
    table = KeyedTable()
    index = 0
    for p in range(MAX_PRODUCERS):
        index += 1
        table.apply(entry(index, f"p{p}", 0))
    index += 1
    table.apply(entry(index, "p0", 1))  # p0 appends again: p1 is now the least recent
    index += 1
    table.apply(entry(index, "newcomer", 0))
    assert len(table.producers) == MAX_PRODUCERS
    assert "p1" not in table.producers and table.placed("p1", 0) is None  # forgotten
    assert table.last_sequence("p1") == 0  # but not its last sequence
    assert table.last_sequence("p0") == 1 and table.last_sequence("newcomer") == 0
    assert table.placed("p0", 1) == (index - 1, 1)


def test_a_restored_table_forgets_in_the_same_order_as_the_original():
    """Replicas must agree on which producer is forgotten, also after one of them restored a
    snapshot (stored sorted by name): recency is rebuilt from each producer's last index."""
    original = KeyedTable()
    names = [f"z{i}" for i in range(MAX_PRODUCERS)]  # names sort opposite to their recency
    names.reverse()
    index = 0
    for name in names:
        index += 1
        original.apply(entry(index, name, 0))
    restored = KeyedTable.restore(original.snapshot())
    for i in range(10):
        index += 1
        for table in (original, restored):
            table.apply(entry(index, f"late{i}", 0))
    assert list(restored.producers) == list(original.producers)
    assert restored.snapshot() == original.snapshot()
    assert names[0] not in original.producers  # the first to append, the first forgotten


def test_a_sequence_already_applied_is_a_duplicate_and_changes_nothing():
    table = KeyedTable()
    table.apply(entry(1, "p", 0))
    table.apply(entry(2, "q", 0))
    table.apply(entry(3, "p", 0))  # a correct leader never proposes this
    assert table.duplicates == 1
    assert list(table.producers) == ["p", "q"]  # the duplicate did not make p recent


def fill(table: KeyedTable, n: int, index: int = 0, prefix: str = "other") -> int:
    for i in range(n):
        index += 1
        table.apply(entry(index, f"{prefix}{i}", 0))
    return index


def test_a_forgotten_producers_retry_is_still_a_duplicate_and_it_may_go_on():
    """Taken for a new producer, a forgotten one's retried first batch would land twice."""
    table = KeyedTable()
    table.apply(entry(1, "victim", 0))
    index = fill(table, MAX_PRODUCERS, 1)
    assert "victim" not in table.producers and table.last_sequence("victim") == 0
    table.apply(entry(index + 1, "victim", 0))  # a correct leader never proposes it now
    assert table.duplicates == 1 and "victim" not in table.producers
    table.apply(entry(index + 2, "victim", 1))  # going on from where it was
    assert table.duplicates == 1 and table.placed("victim", 1) == (index + 2, 1)
    assert table.last_sequence("victim") == 1 and len(table.forgotten) == 1  # not "victim"


def test_the_forgotten_are_bounded_and_survive_a_snapshot():
    table = KeyedTable()
    table.apply(entry(1, "first", 4))
    index = fill(table, MAX_PRODUCERS + 10, 1)
    assert table.last_sequence("first") == 4
    restored = KeyedTable.restore(table.snapshot())
    assert restored.last_sequence("first") == 4 and restored.snapshot() == table.snapshot()
    assert KeyedTable.restore(table.capture().encode()).snapshot() == table.snapshot()
    fill(table, MAX_FORGOTTEN, index, prefix="later")
    assert len(table.forgotten) == MAX_FORGOTTEN
    assert table.last_sequence("first") == -1  # forgotten altogether: taken for a new one
    assert table.last_sequence("other9") == -1 and table.last_sequence("other10") == 0


def test_a_snapshot_written_before_the_forgotten_were_kept_still_restores():
    class OldImage(msgspec.Struct, array_like=True):
        applied_index: int
        rows: list[tuple[bytes, bytes]]
        producers: dict[str, list[tuple[int, int, int]]] = {}

    old = msgspec.msgpack.encode(OldImage(7, [(b"k", b"v")], {"p": [(3, 7, 1)]}))
    table = KeyedTable.restore(old)
    assert table.applied_index == 7 and table.get(b"k") == b"v"
    assert table.last_sequence("p") == 3 and not table.forgotten
