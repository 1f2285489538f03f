"""The keyed table every replica applies committed records to: a key's latest value, deleted
by a tombstone; and where a producer's recent sequences landed."""

from __future__ import annotations

import msgspec

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


def test_a_batch_of_any_size_is_one_run_placed_whole_and_runs_are_the_memory():
    """Found by a hostile client: the memory was 64 records, so the retry of a 100-record batch
    after a lost answer was told `already_appended` (an error to the client, for records in the
    log once). A batch at consecutive indexes in one term is one run, and 64 runs are kept."""
    table = KeyedTable()
    for seq in range(200):  # one batch: indexes 11..210, term 2
        table.apply(produced(11 + seq, "p", seq, term=2))
    assert table.placed("p", 0) == (11, 2) and table.placed("p", 199) == (210, 2)
    assert table.spans("p", 50, 250) == [(50, 61, 150)]
    table.apply(record(211, b"other", b"x"))  # another writer's entry between two batches
    table.apply(produced(212, "p", 200, term=2))
    table.apply(produced(213, "p", 201, term=3))  # a new term: a run of its own
    assert table.spans("p", 199, 201) == [(199, 210, 1), (200, 212, 1), (201, 213, 1)]
    assert table.placed("p", 201) == (213, 3) and table.placed("p", 202) is None
    restored = KeyedTable.restore(table.snapshot())
    assert [restored.placed("p", s) for s in (0, 199, 200, 201)] == [
        (11, 2), (210, 2), (212, 2), (213, 3),
    ]  # fmt: skip
    index = 213
    for seq in range(202, 202 + PRODUCER_MEMORY - 2):  # 65 runs in all: the first forgotten
        index += 2
        table.apply(record(index - 1, b"other", b"x"))
        table.apply(produced(index, "p", seq, term=3))
    assert table.placed("p", 200) is not None and table.placed("p", 199) is None


def test_an_image_of_an_older_node_is_read_with_its_records_joined_into_runs():
    """Records of an older node's image (a (sequence, index, term) each) are joined as `apply`
    joins them: a replica restored from it holds the runs one that applied them holds."""
    records = {"p": [[0, 4, 1], [1, 5, 1], [2, 7, 1]]}
    old = msgspec.msgpack.encode([7, [[b"k", b"v"]], records, []])
    table = KeyedTable.restore(old)
    assert table.last_sequence("p") == 2
    assert table.spans("p", 0, 2) == [(0, 4, 2), (2, 7, 1)]
    applied = KeyedTable()
    for index, seq in ((4, 0), (5, 1), (7, 2)):
        applied.apply(produced(index, "p", seq))
    assert table.snapshot() == applied.snapshot()


class _OlderImage(msgspec.Struct, array_like=True):
    """The table image as a node before runs decodes it."""

    applied_index: int
    rows: list[tuple[bytes, bytes]]
    producers: dict[str, list[tuple[int, int, int]]] = {}
    forgotten: list[tuple[int, int]] = []


def test_an_older_node_reads_an_image_with_runs_as_its_last_records():
    """A rolling upgrade's new leader sends its image to members not restarted yet: an older
    node reads it (the runs are a trailing field it skips), with each producer's last 64
    records as it kept them."""
    table = KeyedTable()
    for seq in range(100):  # one run of 100 records at 11..110
        table.apply(produced(11 + seq, "p", seq, term=2))
    older = msgspec.msgpack.Decoder(_OlderImage).decode(table.snapshot())
    assert older.producers["p"] == [(s, 11 + s, 2) for s in range(36, 100)]
    assert KeyedTable.restore(table.snapshot()).spans("p", 0, 99) == [(0, 11, 100)]
