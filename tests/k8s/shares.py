"""The cluster's CPU shared between test files that run side by side (`pytest -n 2 --dist
loadfile`): each file says what its pods request at most (`CPU_MILLIS`), and runs only once
that fits beside the files running, so no pod waits Pending for another test's CPU. A file that
must be alone on the cluster (a cluster-wide operator would reconcile the others' clusters)
asks for all of it.

The shares live in a file under `.cluster/`, locked with flock: the pytest workers are separate
processes. A share whose process is gone (a worker that crashed) is dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from tests.k8s import kube

SHARES = kube.ROOT / ".cluster" / "k8s-cpu-shares.json"
ALL = 10**9  # the whole cluster: run alone


def _millis(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def free_millis() -> int:
    """The node's allocatable CPU less what the cluster's own pods (kube-system) request."""
    node = kube.items("nodes")[0]
    total = _millis(node["status"]["allocatable"]["cpu"])
    used = 0
    for pod in kube.items("pods", "kube-system"):
        for c in pod["spec"]["containers"]:
            used += _millis(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
    return total - used


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[dict[str, dict[str, list[float]]]]:
    """The shares held and the files waiting (name -> [millis or since, pid]), locked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            text = f.read()
            state = json.loads(text) if text.strip() else {}
            state = {
                part: {k: v for k, v in state.get(part, {}).items() if _alive(int(v[1]))}
                for part in ("held", "waiting")
            }
            yield state
            f.seek(0)
            f.truncate()
            f.write(json.dumps(state))
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def share(name: str, millis: int, budget: int, path: Path = SHARES) -> Iterator[float]:
    """Hold `millis` of the cluster's `budget` while the block runs, once they fit (alone, any
    amount fits) and no file that asked earlier still waits; yields how long it waited."""
    started = time.monotonic()
    since = time.time()
    while True:
        with _locked(path) as state:
            held, waiting = state["held"], state["waiting"]
            waiting.setdefault(name, [since, os.getpid()])
            first = min(waiting, key=lambda k: waiting[k][0])
            used = sum(v[0] for v in held.values())
            if first == name and (not held or used + millis <= budget):
                del waiting[name]
                held[name] = [millis, os.getpid()]
                break
        time.sleep(1)
    try:
        yield time.monotonic() - started
    finally:
        with _locked(path) as state:
            state["held"].pop(name, None)
