"""Node benchmark (first part of issue 4's): appends per second through the HTTP API.

A Python load generator (aiohttp, one process) against (a) a local 3-node raftlog cluster with
fsync on and (b) a null aiohttp server that answers at once, in the same run, so the generator's
own ceiling is visible. One 100-byte record per request at 1 and 64 concurrent clients, and
batched producers (100 records per request, 8 clients). The comparison with etcd and PySyncObj,
and a C generator (wrk), are still to come.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from raftlog.harness.local import LocalCluster, free_ports

SECONDS = 5.0
VALUE = "x" * 90  # about 100 bytes encoded


async def load(url: str, clients: int, batch: int) -> tuple[float, float, float]:
    """(records/s, p50 ms, p99 ms) of `clients` closed-loop clients posting to `url`."""
    lat: list[float] = []
    body = {"records": [{"value": VALUE} for _ in range(batch)]} if batch > 1 else {"value": VALUE}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as s:
        stop = time.monotonic() + SECONDS

        async def client() -> None:
            while time.monotonic() < stop:
                t = time.perf_counter()
                async with s.post(url, json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}")
                lat.append(time.perf_counter() - t)

        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.monotonic() - started
    q = statistics.quantiles(lat, n=100)
    return len(lat) * batch / elapsed, q[49] * 1000, q[98] * 1000


NULL_SERVER = """
import sys
from aiohttp import web
async def ok(request):
    await request.read()
    return web.json_response({"partition": 0, "first_index": 1, "last_index": 1, "term": 1})
app = web.Application()
app.router.add_post("/v1/partitions/0/records", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-node-") as d:
        port = free_ports(1)[0]
        null = subprocess.Popen([sys.executable, "-c", NULL_SERVER, str(port)])
        try:
            time.sleep(1.5)
            null_url = f"http://127.0.0.1:{port}/v1/partitions/0/records"
            with LocalCluster(Path(d), replicas=3, partitions=1) as cluster:
                cluster.wait_ready()
                leader = cluster.leader(0)
                assert leader is not None
                url = cluster.nodes[leader].url + "/v1/partitions/0/records"
                for clients, batch in ((1, 1), (64, 1), (8, 100)):
                    for name, target in (
                        ("raftlog, 3 nodes, fsync on", url),
                        ("null server", null_url),
                    ):
                        rate, p50, p99 = asyncio.run(load(target, clients, batch))
                        rows.append((name, clients, batch, rate, p50, p99))
        finally:
            null.terminate()
    print(f"Python generator (aiohttp), {SECONDS:.0f} s per run\n")
    print("| target | clients | records per request | records/s | p50 | p99 |")
    print("|---|---|---|---|---|---|")
    for name, clients, batch, rate, p50, p99 in rows:
        print(f"| {name} | {clients} | {batch} | {rate:,.0f} | {p50:.1f} ms | {p99:.1f} ms |")


if __name__ == "__main__":
    main()
