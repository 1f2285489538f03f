"""`register(spark)` on a session whose Python workers cannot import raftlog: refused at once,
naming PYSPARK_PYTHON, instead of failing in every task (a venv used without activating it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]

SCRIPT = """
from pyspark.sql import SparkSession
from raftlog.spark import register
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:
    register(spark)
    print("REGISTERED")
except RuntimeError as e:
    print("REFUSED", e)
finally:
    spark.stop()
"""


def clean_env() -> dict[str, str]:
    """The test's environment without PySpark's settings or a PYTHONPATH (either could hand
    the workers raftlog)."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith("PYSPARK") and k != "PYTHONPATH"
    }


def run_with_workers(python: str | None) -> str:
    env = clean_env()
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = ":".join(d for d in env["PATH"].split(":") if d != venv_bin)
    if python:
        env["PYSPARK_PYTHON"] = python
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def base_python() -> str:
    """The interpreter the venv was made from: it cannot import raftlog. (`python3` from PATH
    was used before; one CI run found a `python3` there that could.)"""
    for name in ("python3", "python"):
        path = Path(sys.base_prefix) / "bin" / name
        if path.is_file():
            return str(path)
    raise AssertionError(f"no interpreter in {sys.base_prefix}/bin")


def test_workers_without_raftlog_are_refused_naming_the_fix():
    python = base_python()
    probe = subprocess.run(
        [python, "-c", "import raftlog"], capture_output=True, check=False, env=clean_env()
    )
    assert probe.returncode != 0, f"{python} imports raftlog: not a worker without it"
    out = run_with_workers(python)
    assert "REFUSED" in out and f"PYSPARK_PYTHON={sys.executable}" in out, out


def test_workers_on_the_venv_are_registered():
    assert "REGISTERED" in run_with_workers(sys.executable)
