"""The continuous archive's upload rate against a raw copy, and a restore's rate (issue 21).

One node (fsync off: the disk is not what is measured) with archiving on and a pass interval
long enough that nothing is archived until asked, a real SeaweedFS server (`S3Server`) on
127.0.0.1. N records of 100 bytes are appended in batches of 1,000, then, alternated ROUNDS
times in one sitting:

- archive: a fresh node filled, then `POST /v1/admin/partitions/0/archive` (its first pass ran
  at its start, on an empty log): the WAL bytes uploaded per second;
- raw copy: the same WAL segment files put to the same server by obstore, one after the
  other, as the archiver does: bytes per second;
- restore: `restore_partition` of the archived partition into a new directory: records/s.

Usage: python -m bench.archive [N]    (default 1,000,000)
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import obstore
from obstore.store import S3Store

from raftlog.harness.local import LocalCluster
from raftlog.harness.s3 import S3Server
from raftlog.node.server.archive import S3ObjectStore
from raftlog.node.server.restore import restore_partition

BUCKET = "bench"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BATCH = 1000


def post(url: str, body: object) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return doc


def fill(url: str, n: int) -> int:
    last = 0
    value = "x" * 100
    for i in range(0, n, BATCH):
        recs = [{"key": f"k{j % 1000}", "value": value} for j in range(i, min(n, i + BATCH))]
        last = int(post(f"{url}/v1/partitions/0/records", {"records": recs})["last_index"])
    return last


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as tmp, S3Server(Path(tmp) / "s3", buckets=(BUCKET,)) as s3:
        creds = Path(tmp) / "creds"
        creds.write_text(f"{s3.access_key}\n{s3.secret_key}\n")
        env = {
            "RAFTLOG_ARCHIVE_ENDPOINT": s3.endpoint,
            "RAFTLOG_ARCHIVE_REGION": s3.region,
            "RAFTLOG_ARCHIVE_CREDENTIALS_FILE": str(creds),
            "RAFTLOG_ARCHIVE_INTERVAL_S": "3600",
        }
        raw_store = S3Store(BUCKET, **s3.obstore_config())
        archive_mb, raw_mb, restore_rps = [], [], []
        for r in range(ROUNDS):
            data = Path(tmp) / f"node{r}"  # a fresh node: nothing archived before the flush
            prefix = f"run{r}"
            env["RAFTLOG_ARCHIVE_URL"] = f"s3://{BUCKET}/{prefix}"
            with LocalCluster(data, replicas=1, durable=False, env=env) as c:
                c.wait_ready()
                url = c.endpoints[0]
                t = time.perf_counter()
                last = fill(url, n)
                print(
                    f"appended {n} records (last index {last}) in {time.perf_counter() - t:.1f} s"
                )
                wal = sorted((data / "n1" / "p0" / "wal").glob("*.wal"))
                t = time.perf_counter()
                reply = post(f"{url}/v1/admin/partitions/0/archive", {})
                took = time.perf_counter() - t
            size = sum(
                o["size"] for o in obstore.list(raw_store, prefix=f"{prefix}/p0/segments").collect()
            )
            archive_mb.append(size / took / 1e6)
            print(
                f"round {r}: archive {size / 1e6:.1f} MB to {reply['archived_index']} in "
                f"{took:.2f} s: {archive_mb[-1]:.1f} MB/s"
            )

            t = time.perf_counter()
            total = 0
            for f in wal:
                body = f.read_bytes()
                obstore.put(raw_store, f"raw{r}/{f.name}", body)
                total += len(body)
            took = time.perf_counter() - t
            raw_mb.append(total / took / 1e6)
            print(
                f"round {r}: raw copy {total / 1e6:.1f} MB in {took:.2f} s: {raw_mb[-1]:.1f} MB/s"
            )

            store = S3ObjectStore(
                f"s3://{BUCKET}/{prefix}", s3.endpoint, s3.region, (s3.access_key, s3.secret_key)
            )
            target = Path(tmp) / f"restored{r}"
            t = time.perf_counter()
            done = asyncio.run(
                restore_partition(
                    store, prefix, 0, int(reply["archived_index"]), str(target), ["n1"]
                )
            )
            took = time.perf_counter() - t
            restore_rps.append(done.entries / took)
            print(
                f"round {r}: restore of {done.entries} entries in {took:.2f} s: "
                f"{restore_rps[-1]:,.0f} entries/s"
            )
        print(
            f"median of {ROUNDS}: archive {statistics.median(archive_mb):.1f} MB/s, raw copy "
            f"{statistics.median(raw_mb):.1f} MB/s "
            f"({statistics.median(archive_mb) / statistics.median(raw_mb):.2f}x), restore "
            f"{statistics.median(restore_rps):,.0f} entries/s"
        )


if __name__ == "__main__":
    main()
