"""`make demo` runs its whole story against real processes, and checks what it claims."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tests.spark.helpers import JVM_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_demo_tells_the_whole_story():
    r = subprocess.run(
        [sys.executable, "-m", "raftlog.demo"], capture_output=True, text=True, timeout=420,
        env={**os.environ, **JVM_ENV},  # its Spark read: a short-lived JVM, as the tests' own
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for needle in (
        "200 records acknowledged",
        "backfill rounds",
        "largest round",
        "reported SnapshotRequired",
        "installed a snapshot",
        "promote while it lags: 409",
        "operator: Promoted",
        "for the whole 3 s window",
        "Available True",
        "97 of 97 keys hold the latest value",
        "mode=table (snapshot plus tail) of partition 0: 97 keys; 97 of 97 hold the latest",
    ):
        assert needle in out, f"missing {needle!r} in:\n{out}"
