"""Free TCP ports on this machine, for the members the local runtime starts (`raftctl local`).

The ports are taken below the kernel's ephemeral range: a port the kernel hands out (bind to 0)
is free when picked but may be taken by any outgoing connection before the member binds it,
which a port the kernel never hands out is not.

A port picked is free, but nothing holds it until its member binds it, and a member that stops
leaves it free until it starts again. So that another process picking at once (pytest's workers,
a second `raftctl local`) does not take it meanwhile, each pick is written, with the picking
process's pid, to a registry shared by every process on the machine (a JSON file under a lock).
A port stays taken while its picker lives, until `release_ports`, or for `HELD_S` at most (a
recycled pid). The registry also keeps one cursor for all, so a port just given up is the last
to be picked again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

LOWEST = 20000
# Kubernetes' NodePort range starts here; a cluster on this machine may hold those ports.
NODE_PORTS = 30000
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
REGISTRY = Path(tempfile.gettempdir()) / "raftlog-ports.json"
HELD_S = 6 * 3600.0


def _ceiling() -> int:
    """The first port not to use: where the ephemeral range or the NodePorts start, if lower."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return min(low, NODE_PORTS)


def _bindable(port: int, host: str) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        return None
    return s


def _kernel_ports(n: int, host: str) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind((host, 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def _registry() -> Iterator[dict[str, Any]]:
    """The registry, read under its lock and written back (atomically) when the block ends.
    Unreadable or damaged, it starts empty; unwritable (another user's), picks go on without it.
    The lock also keeps a process's threads apart: each opens the lock file itself, and flock
    judges each open file on its own."""
    try:
        lock = open(f"{REGISTRY}.lock", "a")  # noqa: SIM115 - held for the whole block
    except OSError:
        yield {"cursor": random.randrange(1 << 16), "held": {}}
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(REGISTRY.read_text())
            if not isinstance(state.get("held"), dict) or not isinstance(state["cursor"], int):
                raise ValueError("not a registry")
        except (OSError, ValueError, KeyError, AttributeError):
            state = {"cursor": random.randrange(1 << 16), "held": {}}
        yield state
        tmp = REGISTRY.with_name(f"{REGISTRY.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(state))
            os.replace(tmp, REGISTRY)


def _still_held(held: dict[str, Any], now: float) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for port, entry in held.items():
        try:
            pid, at = int(entry[0]), float(entry[1])
        except (TypeError, ValueError, IndexError, KeyError):
            continue  # damaged: the port is free again
        if now - at < HELD_S and _alive(pid):
            out[port] = (pid, at)
    return out


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free when called and picked by no live process, below the ephemeral
    range when it leaves room; they stay this process's until `release_ports` or its exit."""
    ceiling = _ceiling()
    span = ceiling - LOWEST
    if span < 4 * n:
        return _kernel_ports(n, host)
    socks: list[socket.socket] = []
    with _registry() as state:
        now = time.time()
        held = _still_held(state["held"], now)
        tried = 0
        while len(socks) < n and tried < span:
            port = LOWEST + state["cursor"] % span
            state["cursor"] = (state["cursor"] + 1) % span
            tried += 1
            if str(port) in held:
                continue
            s = _bindable(port, host)
            if s is not None:
                socks.append(s)
        ports = [s.getsockname()[1] for s in socks]
        for s in socks:
            s.close()
        for port in ports:
            held[str(port)] = (os.getpid(), now)
        state["held"] = held
    if len(ports) < n:
        return ports + _kernel_ports(n - len(ports), host)
    return ports


def release_ports(ports: Iterable[int]) -> None:
    """Give back ports this process picked (its members are gone for good)."""
    mine = {str(p) for p in ports}
    with _registry() as state:
        held = _still_held(state["held"], time.time())
        state["held"] = {
            port: (pid, at)
            for port, (pid, at) in held.items()
            if not (port in mine and pid == os.getpid())
        }
