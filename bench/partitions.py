"""Appends spread over partitions: the same load on 1, 4, 16 and 64 partitions (issue 18).

A 3-node `LocalCluster` (fsync on) per partition count; every partition's leadership is moved to
n1, and `wrk -t1 -c64` sends 100-byte records to n1, each request to the next partition
(`bench/spread.lua`). Per case: appends/s, p50 and p99, the nodes' CPU per append, and n1's
fsyncs per append (`raftlog_fsync_seconds_count`). Usage, e.g. with another commit's code:

    python -m bench.partitions [1 4 16 64]          # BENCH_SECONDS per case, default 8
    BENCH_CODE=/tmp/old/node python -m bench.partitions 16   # nodes run that code
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.compare import raftlog_body, wrk
from bench.cpu_per_append import cpu_seconds
from raftlog.node.local import LocalCluster

HERE = Path(__file__).parent
SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "64"))


def fsyncs(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(r"^raftlog_fsync_seconds_count\S* (\S+)$", text, re.M))


def lead_all_from(cluster: LocalCluster, target: str, partitions: int) -> None:
    for p in range(partitions):
        for _ in range(50):
            leader = cluster.leader(p)
            if leader == target:
                break
            if leader is not None:
                path = f"/v1/admin/partitions/{p}/transfer"
                cluster.request(leader, "POST", path, b'{"target": "%s"}' % target.encode())
            time.sleep(0.1)
        else:
            raise RuntimeError(f"partition {p}: {target} did not take the leadership")


def run(partitions: int, workdir: Path) -> str:
    env = {"PYTHONPATH": os.environ["BENCH_CODE"]} if "BENCH_CODE" in os.environ else {}
    with LocalCluster(workdir / f"c{partitions}", replicas=3, partitions=partitions, env=env) as c:
        c.wait_ready(timeout=120)
        lead_all_from(c, "n1", partitions)
        url = c.nodes["n1"].url
        body = raftlog_body(1)
        script, more = HERE / "spread.lua", (str(partitions),)
        wrk(url, body, 16, 2, workdir, script, more)  # warm up
        pids = {n: node.proc.pid for n, node in c.nodes.items() if node.proc is not None}
        cpu = {n: cpu_seconds(p) for n, p in pids.items()}
        syncs = fsyncs(url)
        r = wrk(url, body, CLIENTS, SECONDS, workdir, script, more)
        syncs = fsyncs(url) - syncs
        per = {n: (cpu_seconds(p) - cpu[n]) * 1e6 / max(1, r["requests"]) for n, p in pids.items()}
        rate = r["requests"] / (r["duration_us"] / 1e6)
        lat = r["latency_us"]
        errors = sum(r["errors"].values())
        followers = ", ".join(f"{v:.0f}" for n, v in per.items() if n != "n1")
        p50, p99 = lat["p50"] / 1000, lat["p99"] / 1000
        return (
            f"| {partitions} | {rate:,.0f} | {p50:.2f} ms | {p99:.2f} ms | {per['n1']:.0f} "
            f"| {followers} | {r['requests'] / max(syncs, 1):.1f} | {errors} |"
        )


def main(argv: list[str]) -> None:
    counts = [int(a) for a in argv] or [1, 4, 16, 64]
    print(
        f"| partitions | appends/s | p50 | p99 | CPU µs/append: n1 (leader) | followers "
        f"| appends per fsync (n1) | errors |   ({CLIENTS} clients, {SECONDS:g} s)"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="raftlog-partitions-") as tmp:
        for n in counts:
            print(run(n, Path(tmp)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
