"""The CPU shares the `k8s` files run under (`shares.share`), between real processes as pytest's
workers are: two files whose requests do not fit together never run at once, one that fits runs
beside, the first to ask goes first, and a share left by a dead process is not counted."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

from tests.k8s import shares

# Its pods' CPU requests at most (tests/k8s/shares.py): no pod.
CPU_MILLIS = 0


def _hold(name: str, millis: int, state: Path, log: Path) -> None:
    with shares.share(name, millis, 1000, state):
        started = time.time()
        time.sleep(3)
        with log.open("a") as f:
            f.write(json.dumps([name, started, time.time()]) + "\n")


def test_files_run_side_by_side_only_when_their_cpu_fits(tmp_path):
    state, log = tmp_path / "shares.json", tmp_path / "log"
    # A share of a process that is gone (a crashed worker) holds nothing.
    state.write_text(json.dumps({"held": {"dead": [1000, 2**22 + 12345]}, "waiting": {}}))
    procs = []
    for name, millis in (("a", 600), ("b", 600), ("c", 300)):
        p = multiprocessing.get_context("spawn").Process(
            target=_hold, args=(name, millis, state, log)
        )
        p.start()
        procs.append(p)
        time.sleep(0.5)  # a asks first, then b, then c
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    spans = {
        name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())
    }
    a1, (b0, b1), c0 = spans["a"][1], spans["b"], spans["c"][0]
    assert b0 >= a1, "a and b (600m each of 1000m) ran at once"
    assert c0 >= a1, "c asked after b, so it waited behind b though it fitted beside a"
    assert c0 < b1, "c (300m) fitted beside b and ran with it"
    assert json.loads(state.read_text())["held"] == {}
