"""Storage benchmarks: the WAL with fsync against the raw disk, group commit, backfill reads.

Every WAL figure is next to the raw limit of the same disk measured in the same run: a loop of
`os.write` + `os.fsync` of the same bytes per fsync. Each measurement runs for a fixed time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable
from functools import partial

from raftlog.node.core.types import Entry, HardState, Membership
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.group_commit import GroupCommit
from raftlog.node.storage.segment import encode_entry

SECONDS = float(os.environ.get("BENCH_SECONDS", "1.5"))


def _entries(start: int, n: int, size: int) -> list[Entry]:
    data = os.urandom(size)
    return [Entry(start + i, 1, data=data) for i in range(n)]


def raw_rate(dirpath: str, size: int, batch: int, sync: Callable[[int], None] = os.fsync) -> float:
    """Records/s of a loop writing `batch` records' bytes (as the WAL frames them) + `sync`."""
    buf = b"".join(encode_entry(e) for e in _entries(1, batch, size))
    path = os.path.join(dirpath, f"raw-{size}-{batch}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < SECONDS:
            os.write(fd, buf)
            sync(fd)
            n += batch
    finally:
        os.close(fd)
        os.unlink(path)
    return n / elapsed


def wal_rate(dirpath: str, size: int, batch: int) -> float:
    """Records/s through `DurableStorage.save` (append + one fsync per batch)."""
    s = DurableStorage(os.path.join(dirpath, f"wal-{size}-{batch}"), bootstrap=Membership.of(["a"]))
    s.save(HardState(1, "a", 0), [])
    template = _entries(1, batch, size)
    try:
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < SECONDS:
            s.save(None, [Entry(n + 1 + i, 1, data=e.data) for i, e in enumerate(template)])
            n += batch
    finally:
        s.close()
    return n / elapsed


def group_commit_rate(dirpath: str, size: int, writers: int) -> tuple[float, float]:
    """Records/s with `writers` concurrent appenders, each waiting for durability per record.

    Returns the rate and the records per fsync."""
    s = DurableStorage(
        os.path.join(dirpath, f"gc-{size}-{writers}"), bootstrap=Membership.of(["a"])
    )
    s.save(HardState(1, "a", 0), [])
    gc = GroupCommit(s.sync, write=lambda entries: s.write(None, entries))
    data = os.urandom(size)
    state = {"next": 1, "acked": 0}

    async def writer(deadline: float) -> None:
        while time.perf_counter() < deadline:
            i = state["next"]
            state["next"] += 1
            await gc.append([Entry(i, 1, data=data)])
            state["acked"] += 1

    async def main() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(writer(start + SECONDS) for _ in range(writers)))
        return time.perf_counter() - start

    try:
        elapsed = asyncio.run(main())
    finally:
        gc.close()
        s.close()
    return state["acked"] / elapsed, state["acked"] / max(gc.fsyncs, 1)


def backfill_read_rate(dirpath: str, size: int, total: int, round_size: int = 128) -> float:
    """Entries/s reading random backfill rounds of `round_size` from a WAL of `total` entries."""
    # Durability off only to fill the log quickly; the reads are what is measured.
    s = DurableStorage(
        os.path.join(dirpath, f"read-{size}"), bootstrap=Membership.of(["a"]), durable=False
    )
    for lo in range(1, total + 1, 1000):
        s.save(None, _entries(lo, min(1000, total - lo + 1), size))
    rng = random.Random(1)
    try:
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < SECONDS:
            lo = rng.randint(1, total - round_size + 1)
            n += len(s.entries(lo, lo + round_size))
    finally:
        s.close()
    return n / elapsed


def best(fn: Callable[[], float], runs: int = 3) -> float:
    return max(fn() for _ in range(runs))


def main() -> None:
    logging.getLogger("raftlog.storage").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-", dir=os.environ.get("BENCH_DIR")) as d:
        print(f"disk: {d}; {SECONDS:.1f} s per run, best of 3 runs\n")
        print(
            "| records | per sync | raw write+fsync | raw write+fdatasync | WAL "
            "(`DurableStorage.save`, fdatasync) | WAL / raw fdatasync |"
        )
        print("|---|---|---|---|---|---|")
        raw_single: dict[int, float] = {}
        for size in (100, 4096):
            for batch in (1, 16, 256):
                raw = best(partial(raw_rate, d, size, batch))
                rawd = best(partial(raw_rate, d, size, batch, os.fdatasync))
                if batch == 1:
                    raw_single[size] = raw
                wal = best(partial(wal_rate, d, size, batch))
                print(
                    f"| {_label(size)} | {batch} | {_rate(raw, size)} | {_rate(rawd, size)} | "
                    f"{_rate(wal, size)} | {wal / rawd:.0%} |"
                )
        print()
        print(
            "| group commit | appenders | acknowledged | records per fsync | vs raw write+fsync "
            "of 1 record | vs raw write+fdatasync of as many records as appenders |"
        )
        print("|---|---|---|---|---|---|")
        for size in (100, 4096):
            for writers in (1, 16, 64):
                # This disk's speed drifts by 2x within a minute: each group-commit run is paired
                # with a raw run of the same bytes per sync made right before it, and the median
                # of the pairs' ratios is reported.
                pairs = []
                for _ in range(3):
                    raw = raw_rate(d, size, writers, os.fdatasync)
                    rate, per_sync = group_commit_rate(d, size, writers)
                    pairs.append((rate / raw, rate, per_sync))
                ratio, rate, per_sync = sorted(pairs)[1]
                print(
                    f"| {_label(size)} | {writers} | {_rate(rate, size)} | {per_sync:.1f} | "
                    f"{rate / raw_single[size]:.0%} | {ratio:.0%} (median of 3 pairs) |"
                )
        print()
        print("| backfill reads | WAL size | rounds of 128 |")
        print("|---|---|---|")
        for size, total in ((100, 200_000), (4096, 20_000)):
            rate = backfill_read_rate(d, size, total)
            print(f"| {_label(size)} | {total:,} entries | {rate:,.0f} entries/s |")


def _rate(rate: float, size: int) -> str:
    return f"{rate:,.0f} rec/s ({rate * size / 2**20:.1f} MiB/s)"


def _label(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


if __name__ == "__main__":
    main()
