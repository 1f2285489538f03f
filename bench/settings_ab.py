"""Two node configurations of the same code, alternated round by round in one sitting: what a
setting (or the code path it selects) is worth, with the machine's drift hitting both alike.

Each configuration is a 3-node `LocalCluster` (one partition, fsync on) started once with its
`RAFTLOG_` environment; then `wrk` (as in `bench.compare`) runs against each leader in turn,
`--rounds` times, and the medians are printed. Usage, e.g.:

    python -m bench.settings_ab --clients 64 --rounds 5 \\
        off:RAFTLOG_CLIENT_FAST_PATH=false on:RAFTLOG_CLIENT_FAST_PATH=true

`BENCH_SECONDS` sets each run's length (default 3 here); `--batch 100` posts 100 records a request.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from pathlib import Path

from bench.compare import Run, Target, measure, raftlog_body
from raftlog.harness.local import LocalCluster


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    if not name or any(not k.startswith("RAFTLOG_") for k in env):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME:RAFTLOG_X=V[,RAFTLOG_Y=W]")
    return name, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs=2, type=parse_config, metavar="NAME:RAFTLOG_X=V")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import bench.compare

    bench.compare.SECONDS = float(os.environ.get("BENCH_SECONDS", "3"))
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        targets: dict[str, Target] = {}
        for name, env in args.configs:
            cluster = stack.enter_context(
                LocalCluster(Path(d) / name, replicas=3, partitions=1, env=env)
            )
            cluster.wait_ready()
            leader = cluster.leader(0)
            assert leader is not None
            url = cluster.nodes[leader].url + "/v1/partitions/0/records"
            targets[name] = Target(name, url, raftlog_body(1), raftlog_body(args.batch))
        for t in targets.values():  # warm up
            measure(t, args.clients, args.batch, Path(d))
        runs: dict[str, list[Run]] = {name: [] for name in targets}
        for i in range(args.rounds):
            for name, t in targets.items():
                r = measure(t, args.clients, args.batch, Path(d))
                runs[name].append(r)
                print(
                    f"round {i + 1} {name}: {r.records_per_s:,.0f} records/s, p50 "
                    f"{r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
        print(f"\n| {args.clients} clients x {args.batch} | records/s | p50 | p99 |")
        print("|---|---|---|---|")
        for name, rs in runs.items():
            rate = statistics.median(r.records_per_s for r in rs)
            p50 = statistics.median(r.p50_ms for r in rs)
            p99 = statistics.median(r.p99_ms for r in rs)
            print(f"| {name} (median of {len(rs)}) | {rate:,.0f} | {p50:.2f} ms | {p99:.2f} ms |")


if __name__ == "__main__":
    main()
