"""The node's clock: a tick each period, and after a stall no burst of the ticks missed."""

from __future__ import annotations

import pytest

from raftlog.node.server.node import next_tick


def ticks_between(start: float, stall_until: float, end: float, period: float) -> list[float]:
    """The times ticks are taken when the loop is held up from `start` to `stall_until`."""
    taken: list[float] = []
    due = now = start
    while True:
        due = next_tick(due, now, period)
        now = max(now, due)
        if start < now < stall_until:
            now = stall_until  # the tick waits for the loop
        if now > end:
            return taken
        taken.append(round(now, 3))


def test_ticks_keep_their_period():
    assert ticks_between(0.0, 0.0, 0.21, 0.05) == [0.05, 0.1, 0.15, 0.2]


def test_a_stall_drops_the_ticks_it_missed_instead_of_taking_them_at_once():
    # Held up from 0 to 1 s: 20 ticks missed. One is taken as the loop comes back, then the
    # period resumes from there; a burst of 20 would expire a 10-tick election timeout at once.
    taken = ticks_between(0.0, 1.0, 1.21, 0.05)
    assert taken == [1.0, 1.05, 1.1, 1.15, 1.2]


@pytest.mark.parametrize(("late", "expected"), [(0.01, 1.05), (0.049, 1.05), (0.2, 1.25)])
def test_a_late_tick_is_caught_up_only_within_one_period(late, expected):
    assert next_tick(1.0, 1.0 + late, 0.05) == pytest.approx(expected)
