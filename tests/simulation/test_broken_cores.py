"""A checker that cannot fail is worthless: each deliberately broken core must be caught."""

from __future__ import annotations

import pytest

from raftlog.node.core.raft import Raft
from raftlog.node.sim.invariants import InvariantViolation
from raftlog.node.sim.scenarios import run_scenario
from tests.simulation.broken_cores import BROKEN_CORES

pytestmark = pytest.mark.simulation

# (scenario, invariants that may catch it). The search stops at the first caught seed; the runs
# are deterministic, so the seed found is the same on every machine.
EXPECTED: dict[str, tuple[str, set[str]]] = {
    "commits_previous_term_by_counting": (
        "figure8",
        {"leader completeness", "state machine safety", "durability"},
    ),
    "skips_anchor_check": ("figure8", {"log matching", "state machine safety", "durability"}),
    "votes_twice": ("chaos", {"election safety"}),
    "ignores_log_in_votes": ("chaos", {"leader completeness", "state machine safety"}),
}
MAX_SEEDS = 800


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_broken_core_is_caught(name: str) -> None:
    scenario, invariants = EXPECTED[name]
    cls = BROKEN_CORES[name]
    for seed in range(MAX_SEEDS):
        try:
            run_scenario(scenario, seed, raft_cls=cls)
        except InvariantViolation as exc:
            assert exc.invariant in invariants, exc.render()
            assert exc.seed == seed
            # The report names the seed and shows the timeline that led there.
            assert f"seed={seed}" in str(exc) and exc.trace
            return
    pytest.fail(f"{name} survived {MAX_SEEDS} seeds of {scenario}: the checks are too weak")


def test_every_broken_core_is_covered() -> None:
    assert set(EXPECTED) == set(BROKEN_CORES)


def test_the_correct_core_passes_the_seeds_that_catch_the_broken_ones() -> None:
    for scenario in {s for s, _ in EXPECTED.values()}:
        for seed in range(40):
            run_scenario(scenario, seed, raft_cls=Raft)
