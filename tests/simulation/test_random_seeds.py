"""Randomized simulation: at least 1,000 seeds across the scenarios (SIM_SEEDS raises it).

Every seed checks every invariant after every step, then heals the faults and requires a leader,
a newly committed proposal, and every member applying it within a bounded number of ticks.
"""

from __future__ import annotations

import os

import pytest

from raftlog.node.sim.invariants import InvariantViolation
from raftlog.node.sim.scenarios import SCENARIOS, run_scenario

pytestmark = [pytest.mark.simulation, pytest.mark.slow]

TOTAL_SEEDS = int(os.environ.get("SIM_SEEDS", "1000"))
if TOTAL_SEEDS < 1:
    raise ValueError(f"SIM_SEEDS must be at least 1, got {TOTAL_SEEDS}")
BATCH = 25
PER_SCENARIO = -(-TOTAL_SEEDS // len(SCENARIOS))  # ceil: the total is at least SIM_SEEDS

BATCHES = [
    (name, start, min(BATCH, PER_SCENARIO - start))
    for name in sorted(SCENARIOS)
    for start in range(0, PER_SCENARIO, BATCH)
]


def test_seed_budget_covers_the_requested_total() -> None:
    assert sum(n for _, _, n in BATCHES) >= TOTAL_SEEDS


@pytest.mark.parametrize(("scenario", "first", "count"), BATCHES)
def test_seeds(scenario: str, first: int, count: int) -> None:
    steps = 0
    for seed in range(first, first + count):
        try:
            result = run_scenario(scenario, seed)
        except InvariantViolation as exc:
            pytest.fail(
                f"{exc.render()}\nreproduce: .venv/bin/raftlog-sim --scenario {scenario} "
                f"--seed {seed} --trace",
                pytrace=False,
            )
        steps += result.steps
        assert result.acked > 0, f"seed {seed}: no proposal was acknowledged"
    assert steps >= count * SCENARIOS[scenario].ticks
