"""The built-in state machine: a keyed table (latest value per key, tombstones delete).

A snapshot of a partition is this table at an applied index; the log itself stays readable down
to the compaction floor.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass

import msgspec

from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import decode_record

PRODUCER_MEMORY = 64  # records per producer whose index a retry can still be told
# Producers remembered per partition: past this, the one that appended least recently is
# forgotten (every client makes producer ids, so without a bound the table grows with every
# client ever connected). The same on every replica: it is part of the applied state.
MAX_PRODUCERS = 4096
# Producers forgotten since, by a 64-bit hash of their id, with their last sequence: a retry of
# theirs is still known for one (409 `already_appended`), where taken for a new producer's first
# batch it would land twice. 16 bytes each in a snapshot, about 100 in memory.
MAX_FORGOTTEN = 65536


def producer_hash(producer: str) -> int:
    """The same on every replica and across restarts (Python's `hash` of a str is neither)."""
    return int.from_bytes(hashlib.blake2b(producer.encode(), digest_size=8).digest(), "little")


class _TableImage(msgspec.Struct, array_like=True):
    applied_index: int
    rows: list[tuple[bytes, bytes]]
    # producer -> its most recent (sequence, index, term), oldest first
    producers: dict[str, list[tuple[int, int, int]]] = {}
    # (producer_hash, last sequence) of producers forgotten since, the first forgotten first
    forgotten: list[tuple[int, int]] = []


_image_encoder = msgspec.msgpack.Encoder()
_image_decoder = msgspec.msgpack.Decoder(_TableImage)


def _encode_image(
    applied_index: int,
    rows: dict[bytes, bytes],
    producers: dict[str, list[tuple[int, int, int]]],
    forgotten: list[tuple[int, int]],
) -> bytes:
    ordered = {p: producers[p] for p in sorted(producers)}  # the same table, the same bytes
    return _image_encoder.encode(
        _TableImage(applied_index, sorted(rows.items()), ordered, forgotten)
    )


@dataclass(frozen=True, slots=True)
class TableCapture:
    """The table as applied at one index, copied so that it no longer changes: encoding it
    (sorting, msgpack) can then run in a worker thread while the table goes on applying."""

    applied_index: int
    rows: dict[bytes, bytes]
    producers: dict[str, list[tuple[int, int, int]]]
    forgotten: list[tuple[int, int]]

    def encode(self) -> bytes:
        """The snapshot bytes: the same as `KeyedTable.snapshot()` at capture time."""
        return _encode_image(self.applied_index, self.rows, self.producers, self.forgotten)


class KeyedTable:
    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}
        self.applied_index = 0
        self.undecodable = 0  # entries kept in the log but not indexed (not a Record)
        # Least recently appended first, so the one to forget is at the front.
        self.producers: OrderedDict[str, deque[tuple[int, int, int]]] = OrderedDict()
        self.forgotten: OrderedDict[int, int] = OrderedDict()  # producer_hash -> last sequence
        self.duplicates = 0
        # Bytes of the entries applied since the last `capture` (snapshots are also due by bytes)
        self.bytes_since_capture = 0

    def apply(self, entry: Entry) -> None:
        if entry.index <= self.applied_index:
            return  # already covered (e.g. by the snapshot this table was restored from)
        self.applied_index = entry.index
        self.bytes_since_capture += len(entry.data)
        if entry.kind != EntryKind.NORMAL:
            return
        try:
            record = decode_record(entry.data)
        except msgspec.DecodeError:
            self.undecodable += 1
            return
        if record.producer_id is not None:
            seen = self.producers.get(record.producer_id)
            if seen is None:
                if self.forgotten:
                    h = producer_hash(record.producer_id)
                    if record.sequence <= self.forgotten.get(h, -1):
                        self.duplicates += 1  # as below
                        return
                    self.forgotten.pop(h, None)
                seen = self.producers[record.producer_id] = deque(maxlen=PRODUCER_MEMORY)
                if len(self.producers) > MAX_PRODUCERS:
                    self._forget_oldest()
            elif record.sequence <= seen[-1][0]:
                self.duplicates += 1  # never appended by a correct leader; kept out of the table
                return
            else:
                self.producers.move_to_end(record.producer_id)
            seen.append((record.sequence, entry.index, entry.term))
        if record.key is None:
            return
        if record.value is None:
            self.rows.pop(record.key, None)
        else:
            self.rows[record.key] = record.value

    def _forget_oldest(self) -> None:
        producer, seen = self.producers.popitem(last=False)
        self.forgotten[producer_hash(producer)] = seen[-1][0]
        if len(self.forgotten) > MAX_FORGOTTEN:
            self.forgotten.popitem(last=False)

    def get(self, key: bytes) -> bytes | None:
        return self.rows.get(key)

    def last_sequence(self, producer: str) -> int:
        """The highest sequence of `producer` applied so far (-1: none known), remembered or
        forgotten lately."""
        seen = self.producers.get(producer)
        if seen:
            return seen[-1][0]
        return self.forgotten.get(producer_hash(producer), -1) if self.forgotten else -1

    def placed(self, producer: str, sequence: int) -> tuple[int, int] | None:
        """(index, term) of a recent record of `producer`, or None when not remembered."""
        for seq, index, term in self.producers.get(producer, ()):
            if seq == sequence:
                return index, term
        return None

    def snapshot(self) -> bytes:
        producers = {p: list(seen) for p, seen in self.producers.items()}
        return _encode_image(self.applied_index, self.rows, producers, list(self.forgotten.items()))

    def capture(self) -> TableCapture:
        """A consistent copy for a snapshot encoded elsewhere: a shallow copy of the rows
        (keys and values are immutable bytes), about 2 ms for 100,000 keys here."""
        producers = {p: list(seen) for p, seen in self.producers.items()}
        self.bytes_since_capture = 0
        return TableCapture(
            self.applied_index, dict(self.rows), producers, list(self.forgotten.items())
        )

    @classmethod
    def restore(cls, data: bytes) -> KeyedTable:
        table = cls()
        if data:
            image = _image_decoder.decode(data)
            table.applied_index = image.applied_index
            table.rows = dict(image.rows)
            # Stored by name (the same bytes on every replica); the order of recency is that of
            # each producer's last index.
            recent = sorted(image.producers.items(), key=lambda kv: kv[1][-1][1] if kv[1] else 0)
            table.producers = OrderedDict(
                (p, deque((tuple(x) for x in seen), maxlen=PRODUCER_MEMORY))  # type: ignore[misc]
                for p, seen in recent
            )
            table.forgotten = OrderedDict((h, last) for h, last in image.forgotten)
        return table
