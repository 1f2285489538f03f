"""The built-in state machine: a keyed table (latest value per key, tombstones delete).

A snapshot of a partition is this table at an applied index; the log itself stays readable down
to the compaction floor.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import MutableSequence
from dataclasses import dataclass

import msgspec

from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import decode_record

# Runs per producer whose indexes a retry can still be told. A run is sequences appended at
# consecutive indexes in one term (a batch, or several in a row): a retry of a batch of any
# size within a producer's last 64 is answered with its indexes (it was 64 records, so the
# retry of a 65-record batch after a lost answer was told `already_appended`).
PRODUCER_MEMORY = 64
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


Run = list[int]  # [first sequence, last sequence, first index, term], extended in place


def _last_index(run: Run) -> int:
    return run[2] + run[1] - run[0]


class _TableImage(msgspec.Struct, array_like=True):
    applied_index: int
    rows: list[tuple[bytes, bytes]]
    # producer -> its last PRODUCER_MEMORY records' (sequence, index, term), oldest first: what
    # a node before runs kept, written still so that one can install this image (a rolling
    # upgrade's new leader sends it to members not restarted yet); read when `runs` is absent
    producers: dict[str, list[tuple[int, int, int]]] = {}
    # (producer_hash, last sequence) of producers forgotten since, the first forgotten first
    forgotten: list[tuple[int, int]] = []
    # producer -> its most recent runs (first sequence, last sequence, first index, term),
    # oldest first (a field older nodes' decoders skip, as trailing)
    runs: dict[str, list[tuple[int, int, int, int]]] = {}


_image_encoder = msgspec.msgpack.Encoder()
_image_decoder = msgspec.msgpack.Decoder(_TableImage)


def _encode_image(
    applied_index: int,
    rows: dict[bytes, bytes],
    producers: dict[str, list[Run]],
    forgotten: list[tuple[int, int]],
) -> bytes:
    names = sorted(producers)  # the same table, the same bytes
    runs = {p: [(r[0], r[1], r[2], r[3]) for r in producers[p]] for p in names}
    records = {p: _last_records(producers[p]) for p in names}
    return _image_encoder.encode(
        _TableImage(applied_index, sorted(rows.items()), records, forgotten, runs)
    )


def _last_records(runs: list[Run]) -> list[tuple[int, int, int]]:
    """The last PRODUCER_MEMORY records of `runs` as (sequence, index, term), oldest first."""
    out: list[tuple[int, int, int]] = []
    for first, last, index, term in reversed(runs):
        seq = last
        while seq >= first and len(out) < PRODUCER_MEMORY:
            out.append((seq, index + seq - first, term))
            seq -= 1
        if len(out) == PRODUCER_MEMORY:
            break
    out.reverse()
    return out


@dataclass(frozen=True, slots=True)
class TableCapture:
    """The table as applied at one index, copied so that it no longer changes: encoding it
    (sorting, msgpack) can then run in a worker thread while the table goes on applying."""

    applied_index: int
    rows: dict[bytes, bytes]
    producers: dict[str, list[Run]]
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
        self.producers: OrderedDict[str, deque[Run]] = OrderedDict()
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
            elif record.sequence <= seen[-1][1]:
                self.duplicates += 1  # never appended by a correct leader; kept out of the table
                return
            else:
                self.producers.move_to_end(record.producer_id)
            _add_record(seen, record.sequence, entry.index, entry.term)
        if record.key is None:
            return
        if record.value is None:
            self.rows.pop(record.key, None)
        else:
            self.rows[record.key] = record.value

    def _forget_oldest(self) -> None:
        producer, seen = self.producers.popitem(last=False)
        self.forgotten[producer_hash(producer)] = seen[-1][1]
        if len(self.forgotten) > MAX_FORGOTTEN:
            self.forgotten.popitem(last=False)

    def get(self, key: bytes) -> bytes | None:
        return self.rows.get(key)

    def last_sequence(self, producer: str) -> int:
        """The highest sequence of `producer` applied so far (-1: none known), remembered or
        forgotten lately."""
        seen = self.producers.get(producer)
        if seen:
            return seen[-1][1]
        return self.forgotten.get(producer_hash(producer), -1) if self.forgotten else -1

    def placed(self, producer: str, sequence: int) -> tuple[int, int] | None:
        """(index, term) of a recent record of `producer`, or None when not remembered."""
        for first, last, index, term in reversed(self.producers.get(producer, ())):
            if first <= sequence <= last:
                return index + sequence - first, term
            if last < sequence:
                break
        return None

    def spans(self, producer: str, first: int, last: int) -> list[tuple[int, int, int]]:
        """Where the remembered records of `producer` with sequences `first..last` are: runs
        of (first sequence, first index, count), in sequence order."""
        out = []
        for lo, hi, index, _ in self.producers.get(producer, ()):
            a, b = max(lo, first), min(hi, last)
            if a <= b:
                out.append((a, index + a - lo, b - a + 1))
        return out

    def snapshot(self) -> bytes:
        producers = {p: [list(r) for r in seen] for p, seen in self.producers.items()}
        return _encode_image(self.applied_index, self.rows, producers, list(self.forgotten.items()))

    def capture(self) -> TableCapture:
        """A consistent copy for a snapshot encoded elsewhere: a shallow copy of the rows
        (keys and values are immutable bytes), about 2 ms for 100,000 keys here."""
        producers = {p: [list(r) for r in seen] for p, seen in self.producers.items()}
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
            if image.runs or not image.producers:
                runs = {p: [list(r) for r in seen] for p, seen in image.runs.items()}
            else:  # an older node's image: its records, joined as `apply` joins them
                runs = {p: _joined(seen) for p, seen in image.producers.items()}
            recent = sorted(runs.items(), key=lambda kv: _last_index(kv[1][-1]) if kv[1] else 0)
            table.producers = OrderedDict(
                (p, deque(seen, maxlen=PRODUCER_MEMORY)) for p, seen in recent
            )
            table.forgotten = OrderedDict((h, last) for h, last in image.forgotten)
        return table


def _add_record(runs: MutableSequence[Run], seq: int, index: int, term: int) -> None:
    """A producer's record at `index` after `runs`: it extends the last run when it follows it
    (the next sequence, at the next index, in the same term), else starts one."""
    run = runs[-1] if runs else None
    if run is not None and seq == run[1] + 1 and index == _last_index(run) + 1 and term == run[3]:
        run[1] = seq
    else:
        runs.append([seq, seq, index, term])


def _joined(records: list[tuple[int, int, int]]) -> list[Run]:
    """Runs of an older image's (sequence, index, term) records, joined as `apply` joins them."""
    runs: list[Run] = []
    for seq, index, term in records:
        _add_record(runs, seq, index, term)
    return runs
