"""Free TCP ports on this machine, for the members the local runtime starts (`raftctl local`)."""

from __future__ import annotations

import socket


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free at the time of the call; all bound at once so that none repeats."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind((host, 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports
