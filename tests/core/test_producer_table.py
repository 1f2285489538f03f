"""The keyed table's memory of idempotent producers: bounded, and the same after a snapshot."""

from __future__ import annotations

from raftlog.node.core.types import Entry
from raftlog.node.record import Record, encode_record
from raftlog.node.statemachine import MAX_PRODUCERS, KeyedTable


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
    assert table.last_sequence("p1") == -1  # forgotten
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
    assert original.last_sequence(names[0]) == -1  # the first to append, the first forgotten


def test_a_sequence_already_applied_is_a_duplicate_and_changes_nothing():
    table = KeyedTable()
    table.apply(entry(1, "p", 0))
    table.apply(entry(2, "q", 0))
    table.apply(entry(3, "p", 0))  # a correct leader never proposes this
    assert table.duplicates == 1
    assert list(table.producers) == ["p", "q"]  # the duplicate did not make p recent
