"""The built-in state machine: a keyed table (latest value per key, tombstones delete).

A snapshot of a partition is this table at an applied index; the log itself stays readable down
to the compaction floor.
"""

from __future__ import annotations

import msgspec

from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import decode_record


class _TableImage(msgspec.Struct, array_like=True):
    applied_index: int
    rows: list[tuple[bytes, bytes]]


_image_encoder = msgspec.msgpack.Encoder()
_image_decoder = msgspec.msgpack.Decoder(_TableImage)


class KeyedTable:
    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}
        self.applied_index = 0
        self.undecodable = 0  # entries kept in the log but not indexed (not a Record)

    def apply(self, entry: Entry) -> None:
        if entry.index <= self.applied_index:
            return  # already covered (e.g. by the snapshot this table was restored from)
        self.applied_index = entry.index
        if entry.kind != EntryKind.NORMAL:
            return
        try:
            record = decode_record(entry.data)
        except msgspec.DecodeError:
            self.undecodable += 1
            return
        if record.key is None:
            return
        if record.value is None:
            self.rows.pop(record.key, None)
        else:
            self.rows[record.key] = record.value

    def get(self, key: bytes) -> bytes | None:
        return self.rows.get(key)

    def snapshot(self) -> bytes:
        return _image_encoder.encode(_TableImage(self.applied_index, sorted(self.rows.items())))

    @classmethod
    def restore(cls, data: bytes) -> KeyedTable:
        table = cls()
        if data:
            image = _image_decoder.decode(data)
            table.applied_index = image.applied_index
            table.rows = dict(image.rows)
        return table
