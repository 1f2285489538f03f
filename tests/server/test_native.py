"""The node's hot modules compiled with mypyc (`raftlog/node/native.py`): a build is used only by
the very sources it was made from, and runs the Raft core exactly as the interpreter does.

Each test works on a copy of the node's package built into a directory of its own, so what it
checks does not depend on the build `make install` left in the user's cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from raftlog.client import Client
from raftlog.harness.local import LocalCluster
from raftlog.node.native import MANIFEST, MODULES, cache_dir, key

# One mypyc build (about 20 s) and three-node clusters.
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

NODE = Path(__file__).resolve().parents[2] / "node"
SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX"))
# What a process that installs the loader first (as raftlog-node and raftlog-sim do) imports.
WHERE = (
    "import importlib, json, sys; from raftlog.node import native; native.install(); "
    "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))"
)


def run(src: Path, cache: Path, *args: str, native: str = "1") -> str:
    env = {**os.environ, "PYTHONPATH": str(src), "RAFTLOG_NATIVE_DIR": str(cache),
           "RAFTLOG_NATIVE": native}  # fmt: skip
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def where(src: Path, cache: Path, native: str = "1") -> dict[str, str]:
    import json

    files: dict[str, str] = json.loads(run(src, cache, "-c", WHERE, *MODULES, native=native))
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A copy of the node's package, compiled into a cache of its own: (copy, cache, output).

    `make install` has built these very sources into the user's cache (`make native`), and a
    build is named by the key of its sources: that one is copied in when it is whole, which
    spares a second mypyc run (20 to 60 s of CPU, on the 2 cores the `k8s` suite shares). The
    key covers the build's recipe too, so `make install` has run any build change itself."""
    base = tmp_path_factory.mktemp("native")
    src, cache = base / "src", base / "cache"
    shutil.copytree(NODE / "raftlog", src / "raftlog",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    made = cache_dir() / key(src)
    if (made / MANIFEST).exists() and all((made / f).exists() for f in _listed(made)):
        shutil.copytree(made, cache / made.name)
        return src, cache, f"copied: {made}"
    out = run(src, cache, "-m", "raftlog.node.native_build")
    return src, cache, out


def _listed(build: Path) -> list[str]:
    listed: dict[str, str] = json.loads((build / MANIFEST).read_text())
    return list(listed.values())


def copy_of(src: Path, dest: Path) -> Path:
    shutil.copytree(src / "raftlog", dest / "raftlog", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_a_build_is_used_by_the_sources_it_was_made_from(built: tuple[Path, Path, str]) -> None:
    src, cache, out = built
    assert "native modules built" in out or out.startswith("copied: ")
    (build,) = [d for d in cache.iterdir() if d.is_dir() and not d.name.startswith(".")]
    files = where(src, cache)
    for module in MODULES:
        assert files[module].startswith(str(build)) and files[module].endswith(SUFFIX), module
    # A copy elsewhere with the same bytes is the same sources: it uses the same build.
    assert where(copy_of(src, src.parent / "elsewhere"), cache) == files


def test_a_second_build_of_the_same_sources_compiles_nothing(
    built: tuple[Path, Path, str],
) -> None:
    src, cache, _ = built
    before = sorted(p.name for p in cache.iterdir())
    assert "up to date" in run(src, cache, "-m", "raftlog.node.native_build")
    assert sorted(p.name for p in cache.iterdir()) == before


@pytest.mark.parametrize(
    "edited", ["core/raft.py", "core/validate.py", "transport/codec.py", "native_build.py"]
)
def test_any_edit_of_their_packages_runs_every_module_interpreted(
    built: tuple[Path, Path, str], tmp_path: Path, edited: str
) -> None:
    """A stale build is never run, whether the edit is to a compiled module or to one of their
    packages' others (validate.py is not compiled, but they are compiled against it); and
    none is run at all, since compiled modules reach into each other's compiled classes."""
    src, cache, _ = built
    copy = copy_of(src, tmp_path)
    with open(copy / "raftlog" / "node" / edited, "a") as f:
        f.write("# edited\n")
    files = where(copy, cache)
    assert all(files[m].startswith(str(copy)) and files[m].endswith(".py") for m in MODULES)


def test_a_build_missing_a_file_runs_every_module_interpreted(
    built: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """A build cut short (or pruned while a node starts) must not fail the import of the core:
    the node runs interpreted instead."""
    src, cache, _ = built
    partial = tmp_path / "cache"
    shutil.copytree(cache, partial)
    (build,) = [d for d in partial.iterdir() if d.is_dir() and not d.name.startswith(".")]
    next(build.rglob(f"log{SUFFIX}")).unlink()
    files = where(src, partial)
    assert all(files[m].startswith(str(src)) and files[m].endswith(".py") for m in MODULES)


def test_raftlog_native_0_runs_them_interpreted(built: tuple[Path, Path, str]) -> None:
    src, cache, _ = built
    files = where(src, cache, native="0")
    assert all(files[m].startswith(str(src)) and files[m].endswith(".py") for m in MODULES)


@pytest.mark.parametrize(
    "scenario", [["chaos", "7"], ["membership", "3"], ["crash", "11", "--storage", "wal"]]
)
def test_the_simulation_runs_step_for_step_the_same_compiled_and_interpreted(
    built: tuple[Path, Path, str], scenario: list[str]
) -> None:
    """The simulator is deterministic by seed: the compiled core must take every step the
    interpreted one takes (the last line is the run's time)."""
    src, cache, _ = built
    name, seed, *more = scenario
    args = ["-m", "raftlog.node.sim.cli", "--scenario", name, "--seed", seed, "--trace", *more]
    compiled = run(src, cache, *args).splitlines()
    interpreted = run(src, cache, *args, native="0").splitlines()
    assert len(compiled) > 100  # a whole timeline, not a refusal
    assert compiled[:-1] == interpreted[:-1]
    assert " ok, " in compiled[-1]


def test_a_cluster_runs_compiled_says_so_and_replicates(
    built: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """Three real nodes on the build (and, for the contrast, on `RAFTLOG_NATIVE=0`): each says
    in `/v1/status` whether its core runs compiled, and appends commit on every member."""
    src, cache, _ = built
    for native, compiled in (("1", True), ("0", False)):
        env = {"PYTHONPATH": str(src), "RAFTLOG_NATIVE_DIR": str(cache), "RAFTLOG_NATIVE": native}
        with LocalCluster(tmp_path / native, replicas=3, partitions=2, env=env) as c:
            c.wait_ready()
            with Client(c.endpoints) as client:
                for i in range(10):
                    for p in (0, 1):
                        last = client.append(p, [{"value": f"{p}/{i}"}]).last_index
                for url in c.endpoints:
                    page = client.read(1, 1, 100, endpoint=url, min_index=last, wait_ms=5000)
                    values = [r["value"] for r in page["records"] if r["index"] <= last]
                    assert values == [f"1/{i}" for i in range(10)], url
            assert [c.status(n)["compiled"] for n in c.nodes] == [compiled] * 3
