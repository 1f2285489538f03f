"""Free TCP ports on this machine, for the members the local runtime starts (`raftctl local`).

The ports are taken below the kernel's ephemeral range: a port the kernel hands out (bind to 0)
is free when picked but may be taken by any outgoing connection before the member binds it,
which a port the kernel never hands out is not. Each process walks its own stretch of the range
from a random start, so that two processes picking at once (pytest's workers) rarely meet.
"""

from __future__ import annotations

import random
import socket
import threading

LOWEST = 20000
# Kubernetes' NodePort range starts here; a cluster on this machine may hold those ports.
NODE_PORTS = 30000
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"

_lock = threading.Lock()
_cursor: list[int] = []


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


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free when called, below the ephemeral range when it leaves room."""
    ceiling = _ceiling()
    span = ceiling - LOWEST
    if span < 4 * n:
        return _kernel_ports(n, host)
    socks: list[socket.socket] = []
    with _lock:
        if not _cursor:
            _cursor.append(random.randrange(span))
        tried = 0
        while len(socks) < n and tried < span:
            port = LOWEST + _cursor[0] % span
            _cursor[0] += 1
            tried += 1
            s = _bindable(port, host)
            if s is not None:
                socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    if len(ports) < n:
        return ports + _kernel_ports(n - len(ports), host)
    return ports
