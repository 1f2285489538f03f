"""CPU per append of each node of a 3-node raftlog cluster: robust to other load on the machine,
unlike rates and latencies, so it is what to compare before and after a change of the node.

A `LocalCluster` (one partition, fsync on), `wrk` against the leader for each case (clients x
records per request), and the user + system CPU time of each node process from
`/proc/<pid>/stat` over the run, divided by the requests. It includes each node's idle ticks
(about 4% of a core per node). Usage, e.g. with the code of another commit on `PYTHONPATH`:

    python -m bench.cpu_per_append [1x1 64x1 8x100]     # BENCH_SECONDS per case, default 4

It also gives the leader's snapshots per second (its `snapshots_taken` counter, where the code
run has one). `BENCH_RAFT` sets RaftConfig overrides as JSON, e.g.
`BENCH_RAFT='{"compact_every_operations": 1000}'`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from bench.compare import raftlog_body, wrk
from raftlog.harness.local import LocalCluster

TICK = os.sysconf("SC_CLK_TCK")
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
RAFT = json.loads(os.environ.get("BENCH_RAFT", "{}"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def snapshots_taken(cluster: LocalCluster, name: str) -> int:
    counters = cluster.status(name)["partitions"][0]["counters"]
    return int(counters.get("snapshots_taken", -1))  # -1: code without the counter


def main(argv: list[str]) -> None:
    cases = [tuple(map(int, a.split("x"))) for a in argv] or [(1, 1), (64, 1), (8, 100)]
    with tempfile.TemporaryDirectory(prefix="raftlog-cpu-") as tmp:
        workdir = Path(tmp)
        with LocalCluster(workdir / "cluster", replicas=3, partitions=1, raft=RAFT) as cluster:
            cluster.wait_ready()
            leader = cluster.leader(0)
            assert leader is not None
            url = cluster.nodes[leader].url + "/v1/partitions/0/records"
            pids = {}
            for name, node in cluster.nodes.items():
                assert node.proc is not None
                pids[name] = node.proc.pid
            wrk(url, raftlog_body(1), 16, 2, workdir)  # warm up
            print(
                "| clients x records | records/s | p50 | p99 | CPU ms/request: leader | followers "
                "| leader snapshots/s |"
            )
            print("|---|---|---|---|---|---|---|")
            for clients, batch in cases:
                snaps = snapshots_taken(cluster, leader)
                before = {n: cpu_seconds(p) for n, p in pids.items()}
                r = wrk(url, raftlog_body(batch), clients, SECONDS, workdir)
                after = {n: cpu_seconds(p) for n, p in pids.items()}
                snaps = snapshots_taken(cluster, leader) - snaps
                requests = max(1, int(r["requests"]))
                per = {n: (after[n] - before[n]) / requests * 1000 for n in pids}
                rate = r["requests"] * batch / (r["duration_us"] / 1e6)
                lat = r["latency_us"]
                followers = ", ".join(f"{v:.3f}" for n, v in per.items() if n != leader)
                print(
                    f"| {clients} x {batch} | {rate:,.0f} | {lat['p50'] / 1000:.2f} ms | "
                    f"{lat['p99'] / 1000:.2f} ms | {per[leader]:.3f} | {followers} | "
                    f"{snaps / (r['duration_us'] / 1e6):.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
