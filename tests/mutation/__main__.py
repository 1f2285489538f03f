"""`make mutate`: run the core's unit tests and the simulation on each single-line mutant.

    python -m tests.mutation [--seeds N] [--only SUBSTRING] [--workers N] [--suite PATH ...]

Each mutant is applied to a copy of `node/` in a temporary directory, which is put first on
PYTHONPATH, so the checkout itself is never modified. The tests run with `-x`: a mutant is
killed by the first test that fails, and only a survivor pays for the whole run. A baseline run
on the unmutated copy comes first (a failing baseline would make every mutant look killed).
Prints a table and exits 1 when a mutant not marked equivalent survives.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.mutation.mutants import MUTANTS, Mutant, apply

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["tests/core", "tests/simulation"]


def run_tests(copy: Path, seeds: int, workers: int, suites: list[str]) -> tuple[bool, str, float]:
    """(passed, the first failing test or '', seconds)."""
    env = {**os.environ, "PYTHONPATH": str(copy / "node"), "SIM_SEEDS": str(seeds)}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", str(workers)]
    started = time.monotonic()
    out = subprocess.run(
        [*cmd, *suites], cwd=copy, env=env, capture_output=True, text=True, check=False
    )
    took = time.monotonic() - started
    if out.returncode == 0:
        return True, "", took
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out.stdout, re.MULTILINE)
    if not failed:  # collection errors, an interrupted run: show what pytest said
        tail = "\n".join(out.stdout.splitlines()[-15:] + out.stderr.splitlines()[-15:])
        raise RuntimeError(f"pytest exited {out.returncode} without a failing test:\n{tail}")
    return False, failed[0], took


def check_isolated(copy: Path) -> None:
    """The copy, not the checkout, is what the tests import."""
    env = {**os.environ, "PYTHONPATH": str(copy / "node")}
    where = subprocess.run(
        [sys.executable, "-c", "import raftlog.node.core.raft as r; print(r.__file__)"],
        cwd=copy, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if not where.startswith(str(copy)):
        raise RuntimeError(f"the tests would import {where}, not the mutated copy in {copy}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    ap.add_argument("--seeds", type=int, default=1000, help="SIM_SEEDS (CI's default: 1000)")
    ap.add_argument("--only", default="", help="run the mutants whose name contains this")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--suite", action="append", help=f"test paths to run (default: {' '.join(SUITES)})"
    )
    args = ap.parse_args(argv)
    suites = args.suite or SUITES
    chosen = [m for m in MUTANTS if args.only in m.name]
    if not chosen:
        print(f"no mutant's name contains {args.only!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="raftlog-mutate-") as tmp:
        copy = Path(tmp)
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / "node", copy / "node", ignore=skip)
        shutil.copytree(ROOT / "tests", copy / "tests", ignore=skip)
        shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
        check_isolated(copy)
        originals = {m.path: (copy / m.path).read_text() for m in chosen}
        for m in chosen:  # every mutant must still apply before an hour is spent
            apply(originals[m.path], m)
        ok, failed, took = run_tests(copy, args.seeds, args.workers, suites)
        if not ok:
            print(f"the unmutated core fails {failed}: fix that first", file=sys.stderr)
            return 2
        print(f"baseline: passed in {took:.0f} s ({', '.join(suites)}; SIM_SEEDS={args.seeds})")
        rows: list[tuple[Mutant, str, float]] = []
        for m in chosen:
            target = copy / m.path
            target.write_text(apply(originals[m.path], m))
            try:
                ok, failed, took = run_tests(copy, args.seeds, args.workers, suites)
            finally:
                target.write_text(originals[m.path])
            verdict = f"killed by {failed}" if not ok else "SURVIVED"
            if ok and m.equivalent:
                verdict = "survived (equivalent)"
            rows.append((m, verdict, took))
            print(f"  {m.name}: {verdict} ({took:.0f} s)", flush=True)
    return report(rows)


def report(rows: list[tuple[Mutant, str, float]]) -> int:
    width = max(len(m.name) for m, _, _ in rows)
    print(f"\n{'mutant':<{width}}  real  {'seconds':>7}  result")
    for m, verdict, took in rows:
        print(f"{m.name:<{width}}  {'yes ' if m.real else 'no  '}  {took:7.0f}  {verdict}")
    for m, verdict, _ in rows:
        if m.equivalent:
            note = "killed after all: drop the mark" if verdict.startswith("killed") else "why"
            print(f"- {m.name} is marked equivalent ({note}): {m.equivalent}")
    survivors = [m.name for m, verdict, _ in rows if verdict == "SURVIVED"]
    if survivors:
        print(f"\n{len(survivors)} mutant(s) survived: {', '.join(survivors)}")
        return 1
    print(f"\nevery one of {len(rows)} mutants was killed or is equivalent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
