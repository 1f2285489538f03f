"""The append body's fast path (`fast_records`, one typed decode) against the full parser
(`parse_records`): whatever the fast path accepts, it turns into exactly the same records, and
anything else falls through to the full parser (which names the field of the mistake)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.node.record import decode_record
from raftlog.node.server.api_common import ApiError
from raftlog.node.server.app import fast_records, parse_records

LIMIT = 64

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


def full(body: Any) -> tuple[list[bytes], str | None, int] | ApiError:
    try:
        return parse_records(body, LIMIT)
    except ApiError as e:
        return e


@settings(max_examples=1500, deadline=None)
@given(bodies)
def test_the_fast_path_gives_what_the_full_parser_gives_or_steps_aside(body: Any) -> None:
    raw = json.dumps(body).encode()
    fast = fast_records(raw, LIMIT)
    if fast is not None:
        assert fast == full(body)


@pytest.mark.parametrize(
    "body",
    [
        {"value": "x" * 60},
        {"key": "k", "value": None},
        {"key": "k", "value": "v", "headers": {"h": "1"}, "timestamp_ms": 7},
        {"records": [{"value": "a"}, {"key": "b", "value": "c"}]},
        {"records": [{"value": "a"}, {"value": "b"}], "producer_id": "p", "sequence": 5},
        {"value": "é", "producer_id": "p", "sequence": 0},
    ],
)
def test_the_bodies_clients_send_take_the_fast_path(body: dict[str, Any]) -> None:
    fast = fast_records(json.dumps(body).encode(), LIMIT)
    assert fast is not None and fast == parse_records(body, LIMIT)
    encoded, producer, first = fast
    if producer is not None:  # each record carries its own sequence number, in order
        assert [decode_record(e).sequence for e in encoded] == list(
            range(first, first + len(encoded))
        )


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b'{"records": []}',
        b'{"records": [{}]}',
        b'{"key": 5}',
        b'{"value_b64": "eQ=="}',
        b'{"value": "x", "colour": "red"}',
        b'{"records": [{"value": "a"}], "value": "b"}',
        b'{"value": "x", "producer_id": "p"}',
        b'{"value": "' + b"x" * (LIMIT + 1) + b'"}',
        b'{"value": "\\ud800"}',
    ],
)
def test_anything_else_is_left_to_the_full_parser(raw: bytes) -> None:
    assert fast_records(raw, LIMIT) is None


def test_a_lone_surrogate_is_a_named_400_not_a_500() -> None:
    with pytest.raises(ApiError) as e:
        parse_records(json.loads(b'{"value": "\\ud800"}'), LIMIT)
    assert e.value.status == 400 and e.value.body["field"] == "records[0].value"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"value": "a", "headers": {"h": "\\ud800"}}', "records[0].headers"),
        (b'{"value": "a", "headers": {"\\udfff": "v"}}', "records[0].headers"),
        (b'{"value": "a", "producer_id": "\\ud800", "sequence": 0}', "producer_id"),
        (b'{"value": "a", "timestamp_ms": 18446744073709551616}', "records[0].timestamp_ms"),
        (b'{"value": "a", "timestamp_ms": 9223372036854775808}', "records[0].timestamp_ms"),
        (
            b'{"records": [{"value": "a"}, {"value": "b", "timestamp_ms": 2e400}]}',
            "records[1].timestamp_ms",
        ),
    ],
)
def test_text_without_utf8_and_out_of_range_times_are_named_400s(raw: bytes, field: str) -> None:
    assert fast_records(raw, LIMIT) is None
    try:
        body = json.loads(raw)
    except ValueError:
        assert field == "body"
        return
    with pytest.raises(ApiError) as e:
        parse_records(body, LIMIT)
    assert e.value.status == 400 and e.value.body["field"] == field


def test_the_largest_timestamp_is_taken_by_both_parsers() -> None:
    body = {"value": "a", "timestamp_ms": 2**63 - 1}
    fast = fast_records(json.dumps(body).encode(), LIMIT)
    assert fast is not None and fast == parse_records(body, LIMIT)
    assert decode_record(fast[0][0]).timestamp_ms == 2**63 - 1


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
    (data,), _, _ = parse_records(body, LIMIT)
    assert decode_record(data).headers == [
        ("trace", b"a"),
        ("bin", b"\x00\xff\xfe"),
        ("trace", b"b"),
        ("empty", b""),
    ]
    assert fast_records(json.dumps(body).encode(), LIMIT) is None  # the full parser's


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
        parse_records({"records": [{"value": "v", "headers": headers}]}, LIMIT)
    assert (e.value.status, e.value.body["field"]) == (400, field)
    assert reason in e.value.body["reason"]
