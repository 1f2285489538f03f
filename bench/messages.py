"""Raft messages a leader and its followers send per append, by kind (issue 18).

The same load as `bench/partitions.py` (3 nodes, fsync on, every partition led by n1, `wrk` of
64 clients spreading 100-byte records over N partitions); each node process counts what its
peer senders are given, by message kind (an append with entries or without: a commit-only
append), through a `sitecustomize` this bench puts on the nodes' `PYTHONPATH` (the node itself
has no such counter: it would cost every message a dictionary update). Usage:

    python -m bench.messages [16 1]
    BENCH_CODE=/tmp/old/node python -m bench.messages 16   # nodes run that code
"""

from __future__ import annotations

import ast
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.compare import raftlog_body, wrk
from bench.partitions import CLIENTS, HERE, SECONDS, lead_all_from
from raftlog.harness.local import LocalCluster

COUNTER = """
import collections, os, signal
from raftlog.node.transport import peers

counts = collections.Counter()
send = peers.PeerSender.send


def counted(self, partition, messages):
    for m in messages:
        kind = type(m).__name__
        if kind == "AppendRequest":
            kind += " (entries)" if m.entries else " (commit only)"
        counts[kind] += 1
    return send(self, partition, messages)


def dump(*_):
    with open(os.path.join(os.environ["BENCH_COUNTS"], str(os.getpid())), "w") as f:
        f.write(repr(dict(counts)))


peers.PeerSender.send = counted
signal.signal(signal.SIGUSR1, dump)
"""


def snapshot(pids: dict[str, int], where: Path) -> dict[str, dict[str, int]]:
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    time.sleep(0.5)
    return {n: ast.literal_eval((where / str(pid)).read_text()) for n, pid in pids.items()}


def run(partitions: int, workdir: Path) -> list[str]:
    hook = workdir / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(COUNTER)
    path = [str(hook)] + ([os.environ["BENCH_CODE"]] if "BENCH_CODE" in os.environ else [])
    env = {"PYTHONPATH": os.pathsep.join(path), "BENCH_COUNTS": str(hook)}
    with LocalCluster(workdir / f"m{partitions}", replicas=3, partitions=partitions, env=env) as c:
        c.wait_ready(timeout=120)
        lead_all_from(c, "n1", partitions)
        url = c.nodes["n1"].url
        body, script, more = raftlog_body(1), HERE / "spread.lua", (str(partitions),)
        wrk(url, body, 16, 2, workdir, script, more)  # warm up
        pids = {n: node.proc.pid for n, node in c.nodes.items() if node.proc is not None}
        before = snapshot(pids, hook)
        r = wrk(url, body, CLIENTS, SECONDS, workdir, script, more)
        after = snapshot(pids, hook)
    appends = max(1, r["requests"])
    rows = []
    for n in pids:
        kinds = sorted(k for k in after[n] if after[n][k] - before[n].get(k, 0) > 0)
        per = ", ".join(f"{k} {(after[n][k] - before[n].get(k, 0)) / appends:.3f}" for k in kinds)
        rows.append(f"| {partitions} | {n} | {appends / (r['duration_us'] / 1e6):,.0f} | {per} |")
    return rows


def main(argv: list[str]) -> None:
    head = "| partitions | node | appends/s | messages sent per append, by kind |"
    print(f"{head}  ({CLIENTS} clients, {SECONDS:g} s)")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="raftlog-messages-") as tmp:
        for n in [int(a) for a in argv] or [16, 1]:
            for row in run(n, Path(tmp)):
                print(row, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
