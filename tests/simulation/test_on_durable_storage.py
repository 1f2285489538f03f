"""The simulator, unchanged, on the durable WAL storage (a subset of seeds; SIM_WAL_SEEDS).

Every node keeps each partition in a real directory with small segments, so roll-over, suffix
truncation, whole-segment compaction and snapshot installs all hit the files; a simulated crash
closes every file and the restart recovers the partition from disk.
"""

from __future__ import annotations

import logging
import os

import pytest

from raftlog.node.sim.invariants import InvariantViolation
from raftlog.node.sim.scenarios import SCENARIOS, run_scenario

pytestmark = [pytest.mark.simulation, pytest.mark.slow]

SEEDS = int(os.environ.get("SIM_WAL_SEEDS", "30"))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_on_wal_storage(scenario, tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="raftlog.storage")
    totals = {"crashes": 0, "snapshots": 0, "acked": 0, "steps": 0}
    for seed in range(SEEDS):
        data_dir = tmp_path / f"seed{seed}"
        try:
            result = run_scenario(scenario, seed, data_dir=str(data_dir))
        except InvariantViolation as exc:
            pytest.fail(
                f"{exc.render(tail=80)}\nreproduce: raftlog-sim --scenario {scenario} "
                f"--seed {seed} --storage wal --trace"
            )
        totals["crashes"] += result.stats.crashes
        totals["snapshots"] += result.stats.snapshot_transfers
        totals["acked"] += result.acked
        totals["steps"] += result.steps
        assert any(data_dir.rglob("*.wal")), "the nodes really ran on WAL files"
    assert totals["acked"] > 0 and totals["steps"] >= SEEDS * 300
    if scenario in ("crash", "chaos"):
        assert totals["crashes"] > 0, "the crash paths ran"
    if scenario == "lagging":
        assert totals["snapshots"] > 0, "snapshot installs went through the files"
