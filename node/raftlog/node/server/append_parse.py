"""The one parser of an append body, for both paths that take appends (the aiohttp routes and
the client listener's fast path, `listener.py`).

A typed msgspec decode checks the body's shape and every bound (stated once, below, as the
types' constraints) in C: the parse stays a few microseconds per append on the hot path. The
rules no type states (text or base64, a key or a value, `max_record_bytes`, text without a UTF-8
form) are checked in the one pass that encodes the records. A body the typed decode refuses is
read again with Python's json, which also takes what msgspec calls malformed (lone surrogate
escapes, NaN), and converted to the same types, only to name the mistake: the field's path and
the reason, as every error of the API does.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from raftlog.node.record import Record, encode_record
from raftlog.node.routing import FieldError, field_bytes
from raftlog.node.server.api_common import ApiError, bad

MAX_PRODUCER_ID_CHARS = 200
MAX_SEQUENCE = 2**62 - 1
MAX_TIMESTAMP_MS = 2**63 - 1

ProducerId = Annotated[str, Meta(min_length=1, max_length=MAX_PRODUCER_ID_CHARS)]
Sequence = Annotated[int, Meta(ge=0, le=MAX_SEQUENCE)]
Timestamp = Annotated[int, Meta(ge=0, le=MAX_TIMESTAMP_MS)]


class HeaderIn(msgspec.Struct, forbid_unknown_fields=True):
    """One of Kafka's headers: keys may repeat, values may be any bytes (`value_b64`)."""

    key: str
    value: str | None = None
    value_b64: str | None = None


class RecordIn(msgspec.Struct, forbid_unknown_fields=True):
    key: str | None = None
    key_b64: str | None = None
    value: str | None = None
    value_b64: str | None = None
    headers: dict[str, str] | list[HeaderIn] = {}
    timestamp_ms: Timestamp = 0


class AppendIn(msgspec.Struct, forbid_unknown_fields=True):
    """`{"records": [...]}`, or one record's fields at the top level; UNSET tells the two apart
    (a top-level record field beside `records` is refused)."""

    records: Annotated[list[RecordIn], Meta(min_length=1)] | UnsetType = UNSET
    key: str | UnsetType | None = UNSET
    key_b64: str | UnsetType | None = UNSET
    value: str | UnsetType | None = UNSET
    value_b64: str | UnsetType | None = UNSET
    headers: dict[str, str] | list[HeaderIn] | UnsetType = UNSET
    timestamp_ms: Timestamp | UnsetType = UNSET
    producer_id: ProducerId | None = None
    sequence: Sequence | None = None


# The encoded records, the producer id, and its first sequence (-1 without one). A plain tuple:
# a NamedTuple cost the hot path 0.28 us per append, more than the rest of the change.
Append = tuple[list[bytes], str | None, int]


_RECORD_FIELDS = RecordIn.__struct_fields__
_HEADERS = "must map strings to strings, or be a list of {key, value} pairs"
_PAIR = 'must be {"key": ..., "value": ...} or {"key": ..., "value_b64": ...}'
# The reason of each field's type or bound, by its path with indexes left out.
_REASONS = {
    "": "must be a JSON object",
    "records": "must be a non-empty list",
    "records[]": "must be an object",
    "key": "must be a string or null",
    "value": "must be a string or null",
    "key_b64": "must be a base64 string",
    "value_b64": "must be a base64 string",
    "headers": _HEADERS,
    "headers[]": _PAIR,
    "headers[].key": "must be a string of Unicode text",
    "headers[].value": "must be a string or null",
    "headers[].value_b64": "must be a base64 string",
    "timestamp_ms": f"must be an integer from 0 to {MAX_TIMESTAMP_MS}",
    "producer_id": f"must be a string of 1 to {MAX_PRODUCER_ID_CHARS} characters",
    "sequence": f"must be an integer from 0 to {MAX_SEQUENCE}",
}
_decoder = msgspec.json.Decoder(AppendIn)


def parse_append(raw: bytes, max_record_bytes: int, max_records: int) -> Append:
    """The encoded records of a raw append body, or `ApiError` naming the field and the reason
    (400; 413 for more than `max_records` records, or a key, a value or a record's headers
    over `max_record_bytes`)."""
    try:
        body = _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        # ValidationError is a DecodeError; invalid UTF-8 inside a string is the second one
        body = _reread(raw)
    return _encode(body, max_record_bytes, max_records)


def _too_large(field: str, size: int, limit: int) -> ApiError:
    return ApiError(413, "too_large", f"is {size} bytes, limit {limit}", field)


def _encode(body: AppendIn, max_record_bytes: int, max_records: int) -> Append:
    producer, sequence = body.producer_id, body.sequence
    if (producer is None) != (sequence is None):
        raise bad("producer_id" if producer is None else "sequence", "give both or neither")
    if isinstance(body.records, list):
        if (
            body.key is not UNSET
            or body.key_b64 is not UNSET
            or body.value is not UNSET
            or body.value_b64 is not UNSET
            or body.headers is not UNSET
            or body.timestamp_ms is not UNSET
        ):  # (a loop over the names costs the hot path more)
            name = next(n for n in _RECORD_FIELDS if getattr(body, n) is not UNSET)
            raise bad(name, "unknown field")
        items = body.records
        if len(items) > max_records:
            # Each record is an entry the leader's loop handles in one go: 200,000 empty ones
            # (3 MB) held it 0.6 s, past its followers' election timeout.
            raise ApiError(
                413,
                "too_large",
                f"{len(items)} records in one append, limit {max_records} (send several)",
                "records",
            )
    else:
        items = [
            RecordIn(
                None if body.key is UNSET else body.key,
                None if body.key_b64 is UNSET else body.key_b64,
                None if body.value is UNSET else body.value,
                None if body.value_b64 is UNSET else body.value_b64,
                {} if body.headers is UNSET else body.headers,
                0 if body.timestamp_ms is UNSET else body.timestamp_ms,
            )
        ]
    out = []
    seq = -1 if sequence is None else sequence
    for i, r in enumerate(items):
        headers: dict[str, str] | list[tuple[str, bytes]]
        if r.key_b64 is None and r.value_b64 is None and type(r.headers) is dict:
            headers = r.headers
            try:  # the bodies clients send: text keys and values, text headers
                key = None if r.key is None else r.key.encode()
                value = None if r.value is None else r.value.encode()
            except UnicodeEncodeError:  # a lone surrogate: name the field
                key = _bytes(r.key, None, f"records[{i}].key")
                value = _bytes(r.value, None, f"records[{i}].value")
        else:
            key = _bytes(r.key, r.key_b64, f"records[{i}].key")
            value = _bytes(r.value, r.value_b64, f"records[{i}].value")
            headers = _pairs(r.headers, i)
        if value is None:
            if key is None:
                raise bad(f"records[{i}]", "needs a key or a value")
        elif len(value) > max_record_bytes:
            raise _too_large(f"records[{i}].value", len(value), max_record_bytes)
        if key is not None and len(key) > max_record_bytes:
            raise _too_large(f"records[{i}].key", len(key), max_record_bytes)
        if headers and (size := _headers_size(headers)) > max_record_bytes:
            raise _too_large(f"records[{i}].headers", size, max_record_bytes)
        try:
            out.append(encode_record(Record(key, value, headers, r.timestamp_ms, producer, seq)))
        except UnicodeEncodeError:  # a lone surrogate in a header or the producer id
            raise _not_text(headers, i, producer) from None
        if seq >= 0:
            seq += 1
    return out, producer, -1 if sequence is None else sequence


def _headers_size(headers: dict[str, str] | list[tuple[str, bytes]]) -> int:
    """About the bytes a record's headers take (characters for text: a bound, not a size)."""
    pairs = headers.items() if isinstance(headers, dict) else headers
    return sum(len(k) + len(v) for k, v in pairs)


def _bytes(text: str | None, b64: str | None, field: str) -> bytes | None:
    """`text` as UTF-8, or `b64` decoded; None when both are absent."""
    try:
        return field_bytes(text, b64, field)
    except FieldError as e:
        raise bad(e.field, e.reason) from None


def _pairs(
    headers: dict[str, str] | list[HeaderIn], i: int
) -> dict[str, str] | list[tuple[str, bytes]]:
    if isinstance(headers, dict):
        return headers
    pairs = []
    for j, h in enumerate(headers):
        at = f"records[{i}].headers[{j}]"
        value = _bytes(h.value, h.value_b64, f"{at}.value")
        if value is None:
            raise bad(f"{at}.value", "is required (a string, or value_b64 for bytes)")
        pairs.append((h.key, value))
    return pairs


def _is_text(s: str) -> bool:
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _not_text(
    headers: dict[str, str] | list[tuple[str, bytes]], i: int, producer: str | None
) -> ApiError:
    """The field whose text has no UTF-8 form, once encoding a record found one."""
    if producer is not None and not _is_text(producer):
        return bad("producer_id", "is not valid Unicode text")
    if isinstance(headers, list):
        for j, (key, _) in enumerate(headers):
            if not _is_text(key):
                return bad(f"records[{i}].headers[{j}].key", _REASONS["headers[].key"])
    return bad(f"records[{i}].headers", "is not valid Unicode text")


_ERROR = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<path>.*)`)?", re.DOTALL)
_FIELD = re.compile(r"Object (?:contains unknown|missing required) field `(?P<name>.*)`")
_INDEX = re.compile(r"\[[0-9]+\]")


def _bounded_int(text: str) -> int:
    """A JSON integer for `_reread`: one of more than 20 digits is past every bound of the API
    (int64), and past the 4,300 digits Python converts at all; kept out of range, so the field
    is named with its bound rather than the body called "not valid JSON"."""
    if len(text) > 20:
        return -(1 << 64) if text.startswith("-") else 1 << 64
    return int(text)


def _reread(raw: bytes) -> AppendIn:
    """A body the typed decode refused, read by Python's json: the same body typed, when only
    msgspec's stricter JSON refused it; else `ApiError` naming the mistake."""
    try:
        # Decoded first: given bytes, json also reads UTF-16 and UTF-32 (and skips a byte
        # order mark), which msgspec refuses; a body is taken only as its JSON in UTF-8.
        obj = json.loads(raw.decode(), parse_int=_bounded_int)
    except (ValueError, RecursionError):  # also UnicodeDecodeError; nested too deep
        raise bad("body", "is not valid JSON (in UTF-8)") from None
    try:
        return msgspec.convert(obj, AppendIn)
    except msgspec.ValidationError as e:
        raise _named(str(e), obj) from None
    except UnicodeEncodeError:  # msgspec's answer to a field name without a UTF-8 form
        raise bad("body", "has a field name that is not valid Unicode text") from None


def _named(error: str, obj: Any) -> ApiError:
    """A msgspec validation error as the API's: the field in the body's terms, with the reason
    of that field's type or bound."""
    m = _ERROR.fullmatch(error)
    what, path = (m["what"], (m["path"] or "").lstrip(".")) if m else (error, "")
    unknown = "unknown field" in what
    at_root = not path
    f = _FIELD.fullmatch(what)
    if f is not None:
        path = f"{path}.{f['name']}" if path else f["name"]
    top = re.split(r"[.\[]", path, maxsplit=1)[0]
    if (
        isinstance(obj, dict)
        and "records" not in obj
        and (top in _RECORD_FIELDS or (unknown and at_root))
    ):
        path = f"records[0].{path}"  # one record given at the top level
    if "headers[...]" in path:  # a map's key or value
        path = path.partition("[...]")[0]
    shape = _INDEX.sub("[]", path)
    if shape.startswith("records[]."):
        shape = shape[len("records[].") :]
    if unknown and shape.startswith("headers[]."):  # a pair with a field of its own
        return bad(path.rpartition(".")[0], _PAIR)
    if unknown:
        return bad(path, "unknown field")
    return bad(path or "body", _REASONS.get(shape, what))
