"""`register(spark)` on a session whose Python workers cannot import raftlog: refused at once,
naming PYSPARK_PYTHON, instead of failing in every task (a venv used without activating it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.helpers import JVM_ENV

pytestmark = [pytest.mark.spark]

# One JVM for both cases: each session is made with the workers' Python of its case (Spark
# fixes `pythonExec` when a context starts), then stopped.
SCRIPT = """
import os, sys
from pyspark.sql import SparkSession
from raftlog.spark import register
for case, python in zip(("WITHOUT", "VENV"), sys.argv[1:]):
    os.environ["PYSPARK_PYTHON"] = python
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    try:
        register(spark)
        print(case, "REGISTERED", flush=True)
    except RuntimeError as e:
        print(case, "REFUSED", e, flush=True)
    finally:
        spark.stop()
"""


def clean_env() -> dict[str, str]:
    """The test's environment without PySpark's settings or a PYTHONPATH (either could hand
    the workers raftlog)."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith("PYSPARK") and k != "PYTHONPATH"
    }


def base_python() -> str:
    """The interpreter the venv was made from: it cannot import raftlog. (`python3` from PATH
    was used before; one CI run found a `python3` there that could.)"""
    for name in ("python3", "python"):
        path = Path(sys.base_prefix) / "bin" / name
        if path.is_file():
            return str(path)
    raise AssertionError(f"no interpreter in {sys.base_prefix}/bin")


@pytest.fixture(scope="module")
def outcomes() -> dict[str, str]:
    """Each case's line: `register` on a session whose workers run the base interpreter, then
    on one whose workers run the venv's."""
    env = {**clean_env(), **JVM_ENV}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = ":".join(d for d in env["PATH"].split(":") if d != venv_bin)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, base_python(), sys.executable],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.partition(" ") for line in done.stdout.splitlines()]
    got = {case: rest for case, _, rest in lines if case in ("WITHOUT", "VENV")}
    assert set(got) == {"WITHOUT", "VENV"}, done.stdout
    return got


def test_workers_without_raftlog_are_refused_naming_the_fix(outcomes):
    python = base_python()
    probe = subprocess.run(
        [python, "-c", "import raftlog"], capture_output=True, check=False, env=clean_env()
    )
    assert probe.returncode != 0, f"{python} imports raftlog: not a worker without it"
    out = outcomes["WITHOUT"]
    assert out.startswith("REFUSED") and f"PYSPARK_PYTHON={sys.executable}" in out, out


def test_workers_on_the_venv_are_registered(outcomes):
    assert outcomes["VENV"] == "REGISTERED"
