"""The image's build, run without Docker: the Dockerfile's own `RUN` commands, on the files its
`COPY` lines take, in a fresh virtual environment standing for the runtime stage. It shows that
the wheels the build stage makes are the whole dependency closure (the runtime stage installs with
`--no-index`) and that both console scripts start from them. What it cannot show is the base
image itself (no Docker engine and no container registry here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.chart.helm import ROOT
from tests.chart.test_image import DOCKERFILE, instructions

pytestmark = [pytest.mark.chart, pytest.mark.slow]


def stage_runs() -> tuple[str, str]:
    """The build stage's `RUN` and the runtime stage's install `RUN` (its bind mount dropped)."""
    build, runtime = DOCKERFILE.split("\nFROM ")[1:3]
    [wheel] = [r for r in instructions("RUN") if r in re.sub(r"\\\n\s*", "", build)]
    [install] = [
        r for r in instructions("RUN") if "--find-links /wheels" in r and r.startswith("--mount")
    ]
    assert install.split()[0] in re.sub(r"\\\n\s*", "", runtime)
    return wheel, install.split(None, 1)[1]


def test_the_build_and_runtime_stages_install_and_start_both_commands(tmp_path: Path):
    wheel_run, install_run = stage_runs()
    assert wheel_run == "python -m pip wheel --wheel-dir /wheels ."
    context, wheels, runtime = tmp_path / "src", tmp_path / "wheels", tmp_path / "runtime"
    context.mkdir()
    for copy in instructions("COPY"):  # the build context, as the COPY lines take it
        *sources, _dest = copy.split()
        for source in sources:
            src = ROOT / source.rstrip("/")
            if src.is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
                shutil.copytree(src, context / src.name, ignore=ignore)
            else:
                shutil.copy(src, context / src.name)
    subprocess.run([sys.executable, "-m", "venv", str(runtime)], check=True)
    env = {
        **os.environ,
        "PATH": f"{runtime / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "VIRTUAL_ENV": str(runtime),
    }
    env.pop("PYTHONPATH", None)

    def run(command: str, cwd: Path) -> str:
        done = subprocess.run(
            command.replace("/wheels", str(wheels)),
            shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    run(wheel_run, context)  # build stage (PyPI, or pip's cache)
    built = {p.name.split("-")[0].lower() for p in wheels.glob("*.whl")}
    assert {"raftlog", "aiohttp", "kopf", "kubernetes", "pydantic", "msgspec"} <= built, built
    assert "pyspark" not in built  # the spark extra stays out of the image
    run(install_run, tmp_path)  # runtime stage: offline, from those wheels only
    scripts = runtime / "bin"
    assert (scripts / "raftlog-node").exists() and (scripts / "raftlog-operator").exists()
    assert "--peer-port" in run("raftlog-node --help", tmp_path)
