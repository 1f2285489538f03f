"""Retention holds (`storage/holds.py`) on their own: the floor is the lowest live hold, a hold
ends at its expiry, what a hold may name, and what `holds.json` keeps."""

from __future__ import annotations

import json

import pytest

from raftlog.node.storage.holds import MAX_HOLDER_CHARS, RetentionHolds, check_hold


def test_the_floor_is_the_lowest_live_hold_and_a_hold_ends_at_its_expiry(tmp_path):
    now = [0.0]
    holds = RetentionHolds(str(tmp_path / "holds.json"), clock=lambda: now[0])
    holds.set("slow", 10, 5)
    holds.set("fast", 50, 60)
    assert holds.floor() == 10  # the slower reader's needs are kept
    now[0] = 5.0  # "slow" expires now
    assert [h.holder for h in holds.live()] == ["fast"] and holds.floor() == 50
    now[0] = 60.0
    assert holds.live() == [] and holds.floor() is None


def test_expired_holds_leave_the_file_when_it_is_written_again(tmp_path):
    now = [0.0]
    path = tmp_path / "holds.json"
    holds = RetentionHolds(str(path), clock=lambda: now[0])
    holds.set("a", 1, 1)
    now[0] = 2.0
    holds.set("b", 1, 60)
    assert [h["holder"] for h in json.loads(path.read_bytes())] == ["b"]
    assert [h.holder for h in RetentionHolds(str(path), clock=lambda: now[0]).live()] == ["b"]


@pytest.mark.parametrize(
    ("holder", "min_index", "ttl", "field"),
    [
        ("", 1, 60, "holder"),
        ("h" * (MAX_HOLDER_CHARS + 1), 1, 60, "holder"),
        ("a\nb", 1, 60, "holder"),
        ("h", 0, 60, "min_index"),
        ("h", 2**62 + 1, 60, "min_index"),
        ("h", 1, 0, "ttl_seconds"),
        ("h", 1, float("nan"), "ttl_seconds"),
    ],
)
def test_a_hold_that_could_not_be_meant_is_refused_naming_its_field(holder, min_index, ttl, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        check_hold(holder, min_index, ttl)


def test_the_longest_holder_name_and_the_lowest_index_are_taken():
    check_hold("h" * MAX_HOLDER_CHARS, 1, 60)
