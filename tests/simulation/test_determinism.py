"""A seed is a complete description of a run: the same seed replays the same run, event for
event, and a failing seed fails again at the same tick with the same report."""

from __future__ import annotations

import pytest

from raftlog.node.sim.cli import main as sim_main
from raftlog.node.sim.invariants import InvariantViolation
from raftlog.node.sim.scenarios import run_scenario
from tests.simulation.broken_cores import VotesTwice

pytestmark = pytest.mark.simulation


def trace_of(scenario: str, seed: int) -> list[str]:
    lines: list[str] = []
    run_scenario(scenario, seed, on_trace=lines.append)
    return lines


@pytest.mark.parametrize("scenario", ["chaos", "membership", "multi"])
def test_same_seed_same_run(scenario: str) -> None:
    first = trace_of(scenario, 11)
    assert len(first) > 20
    assert trace_of(scenario, 11) == first
    assert trace_of(scenario, 12) != first


def test_a_failing_seed_reproduces_exactly() -> None:
    def failure() -> InvariantViolation:
        for seed in range(100):
            try:
                run_scenario("chaos", seed, raft_cls=VotesTwice)
            except InvariantViolation as exc:
                return exc
        raise AssertionError("VotesTwice was not caught")

    a, b = failure(), failure()
    assert (a.seed, a.tick, a.invariant, a.detail) == (b.seed, b.tick, b.invariant, b.detail)
    assert a.trace == b.trace
    text = a.render()
    assert f"seed={a.seed}" in text and "state at the violation:" in text


def test_cli_runs_a_seed_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--scenario", "crash", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "crash seed 3: ok" in out and "invariants checked after every step" in out
