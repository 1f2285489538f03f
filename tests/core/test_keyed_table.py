"""The keyed table every replica applies committed records to: a key's latest value, deleted
by a tombstone; and where a producer's recent sequences landed."""

from __future__ import annotations

from raftlog.node.core.types import Entry
from raftlog.node.record import Record, encode_record
from raftlog.node.statemachine import MAX_PRODUCERS, PRODUCER_MEMORY, KeyedTable


def record(index: int, key: bytes | None, value: bytes | None, term: int = 1) -> Entry:
    return Entry(index, term, data=encode_record(Record(key, value)))


def produced(index: int, producer: str, sequence: int, term: int = 1) -> Entry:
    data = encode_record(Record(b"k", b"v", producer_id=producer, sequence=sequence))
    return Entry(index, term, data=data)


def test_a_tombstone_deletes_its_key_and_a_later_value_puts_it_back():
    table = KeyedTable()
    table.apply(record(1, b"colour", b"blue"))
    table.apply(record(2, b"size", b"9"))
    table.apply(record(3, b"colour", None))  # a tombstone
    assert table.get(b"colour") is None and table.get(b"size") == b"9"
    assert table.rows == {b"size": b"9"}
    table.apply(record(4, None, b"no key"))  # in the log, not in the table
    table.apply(record(5, b"colour", b"red"))
    assert table.rows == {b"size": b"9", b"colour": b"red"}
    # The same after a snapshot.
    assert KeyedTable.restore(table.snapshot()).rows == table.rows


def test_only_the_sequences_remembered_are_placed_each_at_its_own_entry():
    table = KeyedTable()
    last = PRODUCER_MEMORY + 5
    for seq in range(last + 1):
        table.apply(produced(seq + 1, "p", seq, term=1 + seq % 3))
    assert table.last_sequence("p") == last
    for seq in range(last - PRODUCER_MEMORY + 1, last + 1):
        assert table.placed("p", seq) == (seq + 1, 1 + seq % 3)
    # Older than the memory: not placed (a retry of it is answered `already_appended`).
    assert table.placed("p", last - PRODUCER_MEMORY) is None
    assert table.placed("p", 0) is None


def test_a_forgotten_producer_keeps_its_last_sequence_not_its_first():
    table = KeyedTable()
    for seq in range(4):
        table.apply(produced(seq + 1, "old", seq))
    index = 4
    for p in range(MAX_PRODUCERS):  # the table fills up; "old" is the least recent
        index += 1
        table.apply(produced(index, f"p{p}", 0))
    assert "old" not in table.producers
    assert table.last_sequence("old") == 3
    # A retry of its second batch is a duplicate, kept out of the table and the log's answers.
    before = table.duplicates
    index += 1
    table.apply(produced(index, "old", 1))
    assert table.duplicates == before + 1 and table.placed("old", 1) is None
