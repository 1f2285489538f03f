"""Appends spread over partitions: the same load on 1, 4, 16 and 64 partitions (issue 18).

A 3-node `LocalCluster` (fsync on) per partition count; every partition's leadership is moved to
n1, and `wrk -t1 -c64` sends 100-byte records to n1, each request to the next partition
(`bench/spread.lua`). Per case: appends/s, p50 and p99, the nodes' CPU per append, and n1's
fsyncs per append (`raftlog_fsync_seconds_count`). Usage, e.g. with another commit's code:

    python -m bench.partitions [1 4 16 64]          # BENCH_SECONDS per case, default 8
    BENCH_CODE=/tmp/old/node python -m bench.partitions 16   # nodes run that code
    python -m bench.partitions --idle 1000          # idle CPU, memory and restart time
    python -m bench.partitions --balanced 1 16      # leaders spread over the three nodes

`--balanced`: partition p is led by node p % 3 (what a cluster's elections tend to, rather than
the worst case of one node leading everything), and one `wrk` per node spreads its share of the
clients over the partitions that node leads. Figures are the sums of the three (p99: the worst).

`--idle N`: a 3-node cluster with N partitions and no load: the time until every partition has a
leader, each node's CPU over 10 s once they settled, its resident memory, and the same after
every node is killed (SIGKILL) and restarted on its data.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.compare import apt_install, raftlog_body, wrk
from bench.cpu_per_append import cpu_seconds
from raftlog.harness.local import LocalCluster

HERE = Path(__file__).parent
SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "64"))


def fsyncs(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(r"^raftlog_fsync_seconds_count\S* (\S+)$", text, re.M))


def lead_all_from(cluster: LocalCluster, target: str, partitions: int) -> None:
    lead(cluster, {p: target for p in range(partitions)})


def lead(cluster: LocalCluster, leaders: dict[int, str]) -> None:
    for p, target in leaders.items():
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


def run_balanced(partitions: int, workdir: Path) -> str:
    env = {"PYTHONPATH": os.environ["BENCH_CODE"]} if "BENCH_CODE" in os.environ else {}
    with LocalCluster(workdir / f"b{partitions}", replicas=3, partitions=partitions, env=env) as c:
        c.wait_ready(timeout=120)
        names = sorted(c.nodes)
        leaders = {p: names[p % len(names)] for p in range(partitions)}
        lead(c, leaders)
        led = {n: [p for p, t in leaders.items() if t == n] for n in names}
        led = {n: ps for n, ps in led.items() if ps}
        # Clients shared out by the partitions each node leads (64 over 16: 22, 21, 21).
        share = {n: CLIENTS * len(ps) // partitions for n, ps in led.items()}
        share[names[0]] += CLIENTS - sum(share.values())
        body = raftlog_body(1)
        script = HERE / "spread.lua"

        def load(seconds: float, clients: dict[str, int]) -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {}

            def one(n: str) -> None:
                parts = ",".join(map(str, led[n])) + ","
                out[n] = wrk(c.nodes[n].url, body, clients[n], seconds, workdir, script, (parts,))

            threads = [threading.Thread(target=one, args=(n,)) for n in led]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return out

        load(2, {n: max(1, k // 4) for n, k in share.items()})  # warm up
        pids = {n: node.proc.pid for n, node in c.nodes.items() if node.proc is not None}
        cpu = {n: cpu_seconds(p) for n, p in pids.items()}
        syncs = {n: fsyncs(c.nodes[n].url) for n in names}
        results = load(SECONDS, share)
        requests = sum(r["requests"] for r in results.values())
        syncs = {n: fsyncs(c.nodes[n].url) - v for n, v in syncs.items()}
        per = [(cpu_seconds(p) - cpu[n]) * 1e6 / max(1, requests) for n, p in pids.items()]
        rate = sum(r["requests"] / (r["duration_us"] / 1e6) for r in results.values())
        p50 = max(r["latency_us"]["p50"] for r in results.values()) / 1000
        p99 = max(r["latency_us"]["p99"] for r in results.values()) / 1000
        errors = sum(sum(r["errors"].values()) for r in results.values())
        nodes_cpu = ", ".join(f"{v:.0f}" for v in per)
        return (
            f"| {partitions} | {rate:,.0f} | {p50:.2f} ms | {p99:.2f} ms | {nodes_cpu} "
            f"| {sum(per):.0f} | {requests / max(sum(syncs.values()), 1):.1f} | {errors} |"
        )


def idle(partitions: int, workdir: Path) -> None:
    env = {"PYTHONPATH": os.environ["BENCH_CODE"]} if "BENCH_CODE" in os.environ else {}
    with LocalCluster(workdir / "idle", replicas=3, partitions=partitions, env=env) as c:
        for run in ("first start", "restart after SIGKILL"):
            started = time.monotonic()
            c.wait_ready(timeout=600)
            ready = time.monotonic() - started
            time.sleep(5)  # elections settle, partitions quiesce
            pids = {n: node.proc.pid for n, node in c.nodes.items() if node.proc is not None}
            cpu = {n: cpu_seconds(p) for n, p in pids.items()}
            time.sleep(10)
            use = ", ".join(f"{(cpu_seconds(p) - cpu[n]) / 10:.1%}" for n, p in pids.items())
            rss = ", ".join(f"{rss_mib(p):.0f}" for p in pids.values())
            print(f"| {partitions} | {run} | {ready:.1f} s | {use} | {rss} MiB |", flush=True)
            if run == "first start":
                for node in c.nodes.values():
                    if node.proc is not None:
                        node.proc.kill()
                        node.proc.wait()
                c.start()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str]) -> None:
    if argv[:1] != ["--idle"] and shutil.which("wrk") is None:
        why = apt_install(["wrk"])  # as `make bench` does (`bench.compare`)
        if why:
            sys.exit(f"bench.partitions: wrk is needed and could not be installed: {why}")
    if argv[:1] == ["--idle"]:
        print("| partitions | | every partition led after | CPU per node (idle) | RSS per node |")
        print("|---|---|---|---|---|")
        with tempfile.TemporaryDirectory(prefix="raftlog-idle-") as tmp:
            idle(int(argv[1]) if len(argv) > 1 else 1000, Path(tmp))
        return
    if argv[:1] == ["--balanced"]:
        print(
            f"| partitions | appends/s | p50 (worst node) | p99 (worst node) | CPU µs/append: "
            f"n1, n2, n3 | sum | appends per fsync (all) | errors |   ({CLIENTS} clients, "
            f"{SECONDS:g} s)"
        )
        print("|---|---|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory(prefix="raftlog-partitions-") as tmp:
            for n in [int(a) for a in argv[1:]] or [1, 4, 16, 64]:
                print(run_balanced(n, Path(tmp)), flush=True)
        return
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
