"""The one parser of an append body (`append_parse.parse_append`): any body gives its records or
an error naming the field and the reason; each kind of mistake, and text without a UTF-8 form,
named as the API's other errors are."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.node.record import decode_record
from raftlog.node.server.api_common import ApiError
from raftlog.node.server.append_parse import parse_append

LIMIT = 64
MAX_RECORDS = 4

scalars = st.none() | st.booleans() | st.integers(-3, 2**63) | st.text(max_size=6)
texts = st.none() | st.text(max_size=LIMIT + 8) | st.integers(-1, 1)
record_fields = {
    "key": texts,
    "value": texts,
    "key_b64": st.sampled_from([None, "eA==", "***", "eA"]),
    "value_b64": st.sampled_from([None, "eQ==", "!"]),
    "headers": st.dictionaries(st.text(max_size=3), st.text(max_size=3) | scalars, max_size=2)
    | st.lists(  # Kafka's headers: pairs
        st.fixed_dictionaries(
            {},
            optional={
                "key": st.text(max_size=3) | scalars,
                "value": texts,
                "value_b64": st.sampled_from([None, "AP8=", "%"]),
                "colour": scalars,
            },
        ),
        max_size=3,
    )
    | scalars,
    "timestamp_ms": st.integers(-2, 2**40) | scalars,
    "colour": scalars,
}
records = st.fixed_dictionaries({}, optional=record_fields)
producer = st.fixed_dictionaries(
    {},
    optional={
        "producer_id": st.none() | st.text(max_size=3) | st.just("p" * 201) | st.integers(),
        "sequence": st.none() | st.integers(-1, 2**62) | st.booleans() | st.floats(0, 1),
    },
)
bodies = st.one_of(
    st.builds(lambda r, p: {**r, **p}, records, producer),
    st.builds(
        lambda rs, p, extra: {"records": rs, **p, **extra},
        st.lists(records, max_size=3) | scalars,
        producer,
        st.fixed_dictionaries({}, optional={"value": texts}),
    ),
    scalars,
    st.lists(scalars, max_size=2),
)


def parse(body: Any) -> tuple[list[bytes], str | None, int]:
    return parse_append(json.dumps(body).encode(), LIMIT, MAX_RECORDS)


@settings(max_examples=1500, deadline=None)
@given(bodies)
def test_any_body_is_records_or_an_error_naming_the_field(body: Any) -> None:
    try:
        encoded, producer, first = parse(body)
    except ApiError as e:
        assert e.status in (400, 413) and e.body["field"] and e.body["reason"], e.body
        return
    items = body.get("records", [body])
    assert len(encoded) == len(items) and producer == body.get("producer_id")
    for i, (data, item) in enumerate(zip(encoded, items, strict=True)):
        r = decode_record(data)
        assert r.sequence == (-1 if producer is None else first + i)
        if isinstance(item.get("value"), str):
            assert r.value == item["value"].encode()
        assert r.timestamp_ms == item.get("timestamp_ms", 0)


@pytest.mark.parametrize(
    "body",
    [
        {"value": "x" * 60},
        {"key": "k", "value": None},
        {"key": "k", "value": "v", "headers": {"h": "1"}, "timestamp_ms": 7},
        {"records": [{"value": "a"}, {"key": "b", "value": "c"}]},
        {"records": [{"value": "a"}, {"value": "b"}], "producer_id": "p", "sequence": 5},
        {"value": "é", "producer_id": "p", "sequence": 0},
        {"key_b64": "eA==", "value_b64": "AP8="},
    ],
)
def test_the_bodies_clients_send(body: dict[str, Any]) -> None:
    encoded, producer, first = parse(body)
    if producer is not None:  # each record carries its own sequence number, in order
        assert [decode_record(e).sequence for e in encoded] == list(
            range(first, first + len(encoded))
        )


def test_the_limits_are_inclusive() -> None:
    many = {"records": [{"value": "v"}] * MAX_RECORDS}
    assert len(parse(many)[0]) == MAX_RECORDS
    body = {"key": "k" * LIMIT, "value": "x" * LIMIT, "headers": {"h": "y" * (LIMIT - 1)}}
    assert len(parse(body)[0]) == 1


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        (b"{not json", 400, "body"),
        (b"[1, 2]", 400, "body"),
        # JSON is UTF-8: Python's json (the reread naming a mistake) also took UTF-16 and
        # UTF-32, and a byte order mark, which msgspec refuses, and appended them.
        ('{"value": "x"}'.encode("utf-16"), 400, "body"),
        ('{"value": "x"}'.encode("utf-16-le"), 400, "body"),
        ('{"value": "x"}'.encode("utf-32"), 400, "body"),
        ('{"value": "x"}'.encode("utf-8-sig"), 400, "body"),
        (b'{"value": "a\xff"}', 400, "body"),
        (b"[" * 5000 + b"]" * 5000, 400, "body"),
        (b'{"records": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "body"),
        (b'{"records": []}', 400, "records"),
        (b'{"records": [{}]}', 400, "records[0]"),
        (b'{"records": [{"value": "a"}, 7]}', 400, "records[1]"),
        (b'{"key": 5}', 400, "records[0].key"),
        (b'{"value_b64": "eQ"}', 400, "records[0].value_b64"),
        (b'{"value": "x", "value_b64": "eQ=="}', 400, "records[0].value"),
        (b'{"value": "x", "colour": "red"}', 400, "records[0].colour"),
        (b'{"records": [{"value": "a", "colour": 1}]}', 400, "records[0].colour"),
        (b'{"records": [{"value": "a"}], "colour": 1}', 400, "colour"),
        (b'{"records": [{"value": "a"}], "value": "b"}', 400, "value"),
        (b'{"value": "x", "producer_id": "p"}', 400, "sequence"),
        (b'{"value": "x", "sequence": 1}', 400, "producer_id"),
        (b'{"value": "x", "producer_id": "", "sequence": 1}', 400, "producer_id"),
        (b'{"value": "x", "producer_id": "p", "sequence": -1}', 400, "sequence"),
        (b'{"value": "x", "producer_id": "p", "sequence": true}', 400, "sequence"),
        (b'{"value": "x", "headers": {"h": 1}}', 400, "records[0].headers"),
        (b'{"value": "' + b"x" * (LIMIT + 1) + b'"}', 413, "records[0].value"),
        (b'{"key": "' + b"k" * (LIMIT + 1) + b'", "value": "v"}', 413, "records[0].key"),
        (b'{"key_b64": "' + b"AAAA" * (LIMIT // 3 + 1) + b'"}', 413, "records[0].key"),
        (
            b'{"value": "v", "headers": {"a": "'
            + b"h" * (LIMIT // 2)
            + b'", "b": "'
            + b"h" * (LIMIT // 2)
            + b'"}}',
            413,
            "records[0].headers",
        ),
        (
            b'{"records": [{"value": "v"}, {"value": "v", "headers": [{"key": "a", "value_b64": "'
            + b"AAAA" * (LIMIT // 3 + 1)
            + b'"}]}]}',
            413,
            "records[1].headers",
        ),
        (
            b'{"records": [' + b", ".join([b'{"value": "v"}'] * (MAX_RECORDS + 1)) + b"]}",
            413,
            "records",
        ),
        (b'{"value": "\\ud800"}', 400, "records[0].value"),
        (b'{"key": "\\ud800", "value": "v"}', 400, "records[0].key"),
        (b'{"value": "a", "headers": {"h": "\\ud800"}}', 400, "records[0].headers"),
        (b'{"value": "a", "headers": {"\\udfff": "v"}}', 400, "records[0].headers"),
        (b'{"value": "a", "producer_id": "\\ud800", "sequence": 0}', 400, "producer_id"),
        (b'{"\\ud800": 1}', 400, "body"),
        (b'{"value": "a", "timestamp_ms": 18446744073709551616}', 400, "records[0].timestamp_ms"),
        (b'{"value": "a", "timestamp_ms": 9223372036854775808}', 400, "records[0].timestamp_ms"),
        (b'{"value": "a", "timestamp_ms": NaN}', 400, "records[0].timestamp_ms"),
        # A record's field beside `records` would be dropped without a word: refused instead.
        (b'{"records": [{"value": "a"}], "timestamp_ms": 5}', 400, "timestamp_ms"),
        (b'{"records": [{"value": "a"}], "headers": {"h": "v"}}', 400, "headers"),
        (
            b'{"records": [{"value": "a"}, {"value": "b", "timestamp_ms": 2e400}]}',
            400,
            "records[1].timestamp_ms",
        ),
    ],
)
def test_bad_bodies_are_errors_naming_the_field(raw: bytes, status: int, field: str) -> None:
    with pytest.raises(ApiError) as e:
        parse_append(raw, LIMIT, MAX_RECORDS)
    assert (e.value.status, e.value.body["field"]) == (status, field), e.value.body
    assert e.value.body["reason"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"value": "a", "timestamp_ms": ' + b"9" * 5000 + b"}", "records[0].timestamp_ms"),
        (b'{"value": "a", "timestamp_ms": -' + b"9" * 5000 + b"}", "records[0].timestamp_ms"),
        (b'{"value": "a", "timestamp_ms": ' + b"1" + b"0" * 20 + b"}", "records[0].timestamp_ms"),
        (b'{"value": "a", "producer_id": "p", "sequence": ' + b"7" * 4400 + b"}", "sequence"),
        (
            b'{"records": [{"value": "a"}, {"value": "b", "timestamp_ms": ' + b"5" * 4301 + b"}]}",
            "records[1].timestamp_ms",
        ),
    ],
)
def test_an_integer_of_thousands_of_digits_is_out_of_range_not_invalid_json(
    raw: bytes, field: str
) -> None:
    """Valid JSON whose integer has more digits than Python converts (4,300): named with its
    field's bound, as a merely large one is, never "is not valid JSON"."""
    with pytest.raises(ApiError) as e:
        parse_append(raw, LIMIT, MAX_RECORDS)
    assert (e.value.status, e.value.body["field"]) == (400, field), e.value.body
    assert "must be an integer" in e.value.body["reason"], e.value.body


def test_a_producers_records_take_the_sequences_from_the_first_on() -> None:
    body = {"records": [{"value": "a"}, {"value": "b"}, {"value": "c"}]}
    for first in (0, 7):
        data, producer, sequence = parse({**body, "producer_id": "p", "sequence": first})
        assert (producer, sequence) == ("p", first)
        assert [decode_record(d).sequence for d in data] == [first, first + 1, first + 2]


def test_the_largest_timestamp_is_taken() -> None:
    (data,), _, _ = parse({"value": "a", "timestamp_ms": 2**63 - 1})
    assert decode_record(data).timestamp_ms == 2**63 - 1


def test_kafka_headers_keep_their_order_repeated_keys_and_bytes() -> None:
    body = {
        "value": "v",
        "headers": [
            {"key": "trace", "value": "a"},
            {"key": "bin", "value_b64": "AP/+"},
            {"key": "trace", "value": "b"},
            {"key": "empty", "value": ""},
        ],
    }
    (data,), _, _ = parse(body)
    assert decode_record(data).headers == [
        ("trace", b"a"),
        ("bin", b"\x00\xff\xfe"),
        ("trace", b"b"),
        ("empty", b""),
    ]


@pytest.mark.parametrize(
    ("headers", "field", "reason"),
    [
        ([{"key": "k"}], "records[0].headers[0].value", "is required"),
        ([{"key": 5, "value": "v"}], "records[0].headers[0].key", "a string"),
        ([{"value": "v"}], "records[0].headers[0].key", "a string"),
        ([{"key": "k", "value": "v", "value_b64": "dg=="}], "records[0].headers[0].value",
         "not both"),
        ([{"key": "k", "value_b64": "%"}], "records[0].headers[0].value_b64", "base64"),
        ([{"key": "k", "value": "v", "colour": 1}], "records[0].headers[0]", "must be"),
        (["k"], "records[0].headers[0]", "must be"),
        ("k=v", "records[0].headers", "must map strings to strings, or be a list"),
    ],
)  # fmt: skip
def test_bad_kafka_headers_are_named_400s(headers: Any, field: str, reason: str) -> None:
    with pytest.raises(ApiError) as e:
        parse({"records": [{"value": "v", "headers": headers}]})
    assert (e.value.status, e.value.body["field"]) == (400, field)
    assert reason in e.value.body["reason"]
