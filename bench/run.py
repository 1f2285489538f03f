"""`make bench`: the Raft core and the simulator (CPU only), storage (`bench.storage`), then the
comparison of appends through HTTP with etcd, PySyncObj and a null server (`bench.compare`),
then the Spark source against Parquet and the archive job (`bench.spark`).

The first part has no disk and no network: it is the ceiling the core itself puts on a node, per
partition and per core of CPU. Results are printed as Markdown tables; bench/RESULTS.md records
runs with their command. `python -m bench.run core` or `... storage` runs one part.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from functools import partial

from bench import compare as compare_bench
from bench import spark as spark_bench
from bench import storage as storage_bench
from raftlog.node.core.config import RaftConfig
from raftlog.node.core.messages import Message
from raftlog.node.core.raft import Raft, Role
from raftlog.node.core.types import Membership
from raftlog.node.record import Record, encode_record
from raftlog.node.sim.scenarios import run_scenario
from raftlog.node.storage.memory import MemoryStorage

PAYLOAD = encode_record(Record(key=b"key-0001", value=b"x" * 86))  # 100 bytes encoded


def _drive(nodes: dict[str, tuple[Raft, MemoryStorage]]) -> None:
    """Deliver messages and process Readies until quiet."""
    busy = True
    while busy:
        busy = False
        outbox: list[Message] = []
        for raft, storage in nodes.values():
            while raft.has_ready():
                busy = True
                rd = raft.ready()
                storage.save(rd.hard_state, rd.entries)
                outbox.extend(rd.messages)
                raft.advance(rd)
        for m in outbox:
            nodes[m.dst][0].step(m)
            busy = True


def _cluster(n: int) -> dict[str, tuple[Raft, MemoryStorage]]:
    ids = [f"n{i}" for i in range(n)]
    cfg = RaftConfig(
        max_entries_per_append=256, compact_every_operations=10**9, compact_every_bytes=0
    )
    nodes = {}
    for i in ids:
        s = MemoryStorage(Membership.of(ids))
        nodes[i] = (Raft(i, cfg, s), s)
    leader = nodes[ids[0]][0]
    leader.hup()
    _drive(nodes)
    assert leader.role == Role.LEADER
    return nodes


def bench_replication(n: int, batch: int, total: int) -> float:
    nodes = _cluster(n)
    leader = nodes["n0"][0]
    start = time.perf_counter()
    done = 0
    while done < total:
        leader.propose_batch([PAYLOAD] * batch)
        _drive(nodes)
        done += batch
    elapsed = time.perf_counter() - start
    assert leader.commit >= total
    return total / elapsed


def bench_simulator(scenario: str, seeds: int) -> tuple[float, float]:
    start = time.perf_counter()
    steps = 0
    for seed in range(seeds):
        steps += run_scenario(scenario, seed).steps
    elapsed = time.perf_counter() - start
    return steps / elapsed, seeds / elapsed


def best_of(runs: int, fn: Callable[[], float]) -> float:
    return max(fn() for _ in range(runs))


def main() -> None:
    print(f"python {platform.python_version()} on {platform.machine()}, one process, best of 3\n")
    print("| measurement | result |")
    print("|---|---|")
    for n in (1, 3):
        for batch in (1, 16, 256):
            total = 20_000 if batch > 1 else 5_000
            rate = best_of(3, partial(bench_replication, n, batch, total))
            print(
                f"| core, {n} voter{'s' if n > 1 else ''}, proposals of {batch} x 100 B, "
                f"in-memory storage | {rate:,.0f} entries/s committed and applied |"
            )
    for scenario in ("chaos", "crash"):
        steps, seeds = bench_simulator(scenario, 40)
        print(
            f"| simulator, scenario `{scenario}` (all invariants checked) | "
            f"{steps:,.0f} steps/s, {seeds:.1f} seeds/s |"
        )


if __name__ == "__main__":
    parts = sys.argv[1:] or ["core", "storage", "compare", "spark"]
    if "core" in parts:
        main()
    if "storage" in parts:
        print()
        storage_bench.main()
    if "compare" in parts:
        print()
        compare_bench.main()
    if "spark" in parts:
        print()
        spark_bench.main()
