"""Appends from inside the cluster, as an application does: a pod on raftlog's image writes
through the client Service (`http://<cluster>.<namespace>.svc:7001`), follows the members' leader
hints by their DNS names, and prints one JSON line per acknowledged record, so every line of
its log is a record the cluster acknowledged."""

from __future__ import annotations

import json

from tests.k8s import kube

IMAGE = "ghcr.io/raftlog/raftlog:0.1.0"

# argv: service URL, producer tag, count (0: single records until /tmp/stop exists), partition.
LOADER = r"""
import asyncio, json, os, sys
from raftlog.client import AsyncClient, IdempotentProducer

async def main(url, tag, count, partition):
    async with AsyncClient([url], retries=60) as client:
        producer, i = IdempotentProducer(client, tag), 0
        while (i < count) if count else not os.path.exists("/tmp/stop"):
            n = min(25, count - i) if count else 1
            batch = [{"key": f"{tag}{j}", "value": f"{tag}-v{j}"} for j in range(i, i + n)]
            await producer.append(partition, batch)
            for r in batch:
                print(json.dumps([r["key"], r["value"]]), flush=True)
            i += n

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def start(ns: str, cluster: str, tag: str, count: int = 0, partition: int = 0) -> str:
    """A loader pod writing `count` records (0: until `stop`) to `partition`; returns its name."""
    name = f"load-{tag}"
    url = f"http://{cluster}.{ns}.svc:7001"
    command = ["python", "-c", LOADER, url, tag, str(count), str(partition)]
    kube.start_pod(ns, name, IMAGE, command, 10001, requests={"cpu": "50m", "memory": "64Mi"})
    return name


def stop(ns: str, name: str) -> None:
    kube.kubectl("exec", "-n", ns, name, "--", "touch", "/tmp/stop")


def acked(ns: str, name: str, timeout: float = 300) -> list[tuple[str, str]]:
    """Waits for the loader to finish (it must succeed); the records it saw acknowledged."""
    out = kube.pod_output(ns, name, timeout)
    return [tuple(json.loads(line)) for line in out.splitlines() if line.startswith("[")]
