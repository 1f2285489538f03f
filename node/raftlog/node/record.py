"""The application record carried by NORMAL log entries, and its binary encoding.

msgspec's MessagePack codec: compact, typed decoding with clear errors, and fast enough to stay
off the profile of the append path.
"""

from __future__ import annotations

import datetime as dt

import msgspec

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)


def epoch_ms(t: dt.datetime) -> int:
    """`t` in milliseconds since the epoch, exactly (a naive `t` is local time, as Python's
    `timestamp()` takes it). `int(t.timestamp() * 1000)` is off by one about one time in 160:
    the float product of 547641621.915 and 1000 is 547641621914.99994."""
    aware = t if t.tzinfo is not None else t.astimezone()
    return (aware - _EPOCH) // _MS


# gc=False: a record holds bytes, strings and ints only (no reference cycles), so the garbage
# collector need not track it; bulk reads decode tens of thousands at once (`columnar`).
class Record(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    key: bytes | None = None
    value: bytes | None = None  # None on a keyed record is a tombstone: the key is deleted
    # Text headers as a map, or Kafka's headers: pairs in order, keys may repeat, values bytes.
    headers: dict[str, str] | list[tuple[str, bytes]] = {}
    timestamp_ms: int = 0
    # Idempotent producers (as Kafka's): each record of a producer has the next sequence number,
    # and a retried append of records already in the log is answered, not appended again.
    producer_id: str | None = None
    sequence: int = -1


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)


def encode_record(record: Record) -> bytes:
    return _encoder.encode(record)


def header_pairs(headers: dict[str, str] | list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """A record's headers as Kafka's pairs (a map's values as UTF-8)."""
    if isinstance(headers, dict):
        return [(k, v.encode()) for k, v in headers.items()]
    return headers


def decode_record(data: bytes) -> Record:
    """Raises msgspec.DecodeError (a ValueError) naming what is wrong."""
    try:
        return _decoder.decode(data)
    except UnicodeDecodeError as e:  # msgspec's answer to a str that is not UTF-8
        raise msgspec.DecodeError(f"a str that is not UTF-8: {e}") from None
