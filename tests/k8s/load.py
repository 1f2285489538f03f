"""Appends from inside the cluster, as an application does: a pod on raftlog's image writes
through the client Service (`http://<cluster>.<namespace>.svc:7001`), follows the members' leader
hints by their DNS names, and prints one JSON line per acknowledged record, so every line of
its log is a record the cluster acknowledged."""

from __future__ import annotations

import json
import time

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
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
            "containers": [{
                "name": "load", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-c", LOADER, f"http://{cluster}.{ns}.svc:7001", tag,
                            str(count), str(partition)],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                "securityContext": restricted,
            }],
        },
    }  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(pod))
    return name


def stop(ns: str, name: str) -> None:
    kube.kubectl("exec", "-n", ns, name, "--", "touch", "/tmp/stop")


def acked(ns: str, name: str, timeout: float = 300) -> list[tuple[str, str]]:
    """Waits for the loader to finish (it must succeed); the records it saw acknowledged."""
    started = time.monotonic()
    phase = kube.until(f"{name} finished", lambda: (
        p if (p := kube.get("pod", name, ns)["status"].get("phase")) in ("Succeeded", "Failed")
        else None), timeout)  # fmt: skip
    out = kube.kubectl("logs", "-n", ns, name)
    assert phase == "Succeeded", f"{name} {phase} after {time.monotonic() - started:.0f} s:\n{out}"
    return [tuple(json.loads(line)) for line in out.splitlines() if line.startswith("[")]
