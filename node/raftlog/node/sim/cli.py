"""`raftlog-sim`: run simulation scenarios by seed, print a summary or the whole timeline."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time

from raftlog.node import native

native.install()  # compiled, if built for these sources, before anything imports the core

from raftlog.node.sim.invariants import InvariantViolation  # noqa: E402
from raftlog.node.sim.scenarios import SCENARIOS, run_scenario  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="raftlog-sim", description=__doc__)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="chaos")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--seeds", type=int, default=1, help="how many consecutive seeds to run")
    ap.add_argument("--ticks", type=int, default=None, help="length of the fault phase")
    ap.add_argument("--trace", action="store_true", help="print every event as it happens")
    ap.add_argument(
        "--storage",
        choices=["memory", "wal"],
        default="memory",
        help="node storage: in memory, or the durable WAL in a temporary directory per seed",
    )
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name, s in sorted(SCENARIOS.items()):
            print(f"{name:12} {s.description}")
        return 0
    if args.storage == "wal":
        # Simulated crashes are process crashes: the page cache survives them, so fsync is off
        # and its per-open warning would only be noise here.
        logging.getLogger("raftlog.storage").setLevel(logging.ERROR)
    started = time.monotonic()
    steps = acked = 0
    for seed in range(args.seed, args.seed + args.seeds):
        try:
            with tempfile.TemporaryDirectory(prefix=f"raftlog-sim-{seed}-") as tmp:
                result = run_scenario(
                    args.scenario,
                    seed,
                    ticks=args.ticks,
                    on_trace=print if args.trace else None,
                    data_dir=tmp if args.storage == "wal" else None,
                )
        except InvariantViolation as exc:
            print(exc.render(tail=0 if args.trace else 80), file=sys.stderr)
            print(
                f"reproduce: raftlog-sim --scenario {args.scenario} --seed {seed} --trace",
                file=sys.stderr,
            )
            return 1
        steps += result.steps
        acked += result.acked
        if args.seeds == 1:
            print(f"{args.scenario} seed {seed}: ok, {result.steps} steps, {result.acked} acked")
            print(f"  {result.stats}")
    elapsed = time.monotonic() - started
    print(
        f"{args.scenario}: {args.seeds} seeds ok, {steps} steps, {acked} acknowledged entries, "
        f"invariants checked after every step ({elapsed:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
