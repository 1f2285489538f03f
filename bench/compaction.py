"""Disk use and restart time of a node over a long run at the default settings (issue 16).

A single durable node (fsync on, every setting at its default: 64 MiB segments, a snapshot every
10,000 applied operations, 1,000 entries kept, at most 100,000 removed per pass) takes
`BENCH_SMALL_RECORDS` records of 100 bytes (2,000,000 by default), then `BENCH_LARGE_RECORDS`
records of 64 KiB (20,000: 1.3 GB), from 8 writers in batches. Every so often it prints the
partition directory's size on disk, its WAL segments, the compaction floor and the snapshot
index; at the end it stops the node and times its restart until it answers as leader again.

Bounded means: the disk stays near two segments plus the snapshot whatever the number of
records, and the restart time does not grow with the history.

    python -m bench.compaction            # BENCH_SMALL_RECORDS=... BENCH_LARGE_RECORDS=...
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster

SMALL = int(os.environ.get("BENCH_SMALL_RECORDS", "2000000"))
LARGE = int(os.environ.get("BENCH_LARGE_RECORDS", "20000"))
WRITERS = 8


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk (preallocated segments count: they are what the disk holds)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def report(cluster: LocalCluster, part: Path, written: int, started: float) -> str:
    st = cluster.status("n1")["partitions"][0]
    segments = len(list((part / "wal").glob("*.wal")))
    return (
        f"| {written:,} | {time.monotonic() - started:.0f} | {disk_bytes(part) / 2**20:,.0f} | "
        f"{segments} | {st['compaction_floor']:,} | {st['snapshot_index']:,} | "
        f"{st['last_index']:,} |"
    )


async def write(
    endpoint: str, total: int, value: str, batch: int, progress: Callable[[int], None]
) -> None:
    done = 0
    lock = asyncio.Lock()

    async def writer(c: AsyncClient) -> None:
        nonlocal done
        while True:
            async with lock:
                n = min(batch, total - done)
                if n <= 0:
                    return
                done += n
                mark = done
            await c.append(0, [{"key": f"k{i % 5000}", "value": value} for i in range(n)])
            progress(mark)

    async with AsyncClient([endpoint]) as c:
        await asyncio.gather(*(writer(c) for _ in range(WRITERS)))


def run_phase(cluster: LocalCluster, part: Path, name: str, total: int, size: int) -> None:
    batch = max(1, min(1000, (4 << 20) // size // 2))  # well within a request's 8 MiB
    every = max(batch * WRITERS, total // 10)
    value = "x" * (size - 14)  # key, value and framing: about `size` bytes per record
    started = time.monotonic()
    next_at = [every]
    print(f"\n{name}: {total:,} records of ~{size:,} bytes, {WRITERS} writers, {batch} a batch\n")
    print("| records | s | disk MiB | segments | floor | snapshot | last index |")
    print("|---:|---:|---:|---:|---:|---:|---:|")

    def progress(mark: int) -> None:
        if mark >= next_at[0]:
            next_at[0] += every
            print(report(cluster, part, mark, started), flush=True)

    asyncio.run(write(cluster.nodes["n1"].url, total, value, batch, progress))
    time.sleep(1)  # the last snapshot and compaction pass
    print(report(cluster, part, total, started))


def restart_seconds(cluster: LocalCluster) -> float:
    """SIGKILL (no clean shutdown), then the time until the node leads its partition again."""
    proc = cluster.nodes["n1"].proc
    assert proc is not None
    cluster.kill("n1")
    proc.wait()
    started = time.monotonic()
    cluster.start("n1")
    cluster.wait_ready(timeout=600)
    return time.monotonic() - started


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp,
        LocalCluster(Path(tmp), replicas=1, partitions=1, durable=True) as cluster,
    ):
        cluster.wait_ready()
        part = cluster.nodes["n1"].data_dir / "p0"
        print(f"empty node: restart in {restart_seconds(cluster):.2f} s")
        if SMALL:
            run_phase(cluster, part, "small records", SMALL, 100)
            print(f"\nrestart after the small records: {restart_seconds(cluster):.2f} s")
        if LARGE:
            run_phase(cluster, part, "large records", LARGE, 64 * 1024)
            print(f"\nrestart after the large records: {restart_seconds(cluster):.2f} s")
        print(f"disk after the restart: {disk_bytes(part) / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
