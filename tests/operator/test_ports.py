"""The local runtime's ports: free, distinct, never ones the kernel gives outgoing connections."""

from __future__ import annotations

import socket

from raftlog.operator import ports
from raftlog.operator.ports import free_ports


def ephemeral_start() -> int:
    with open(ports.EPHEMERAL_RANGE) as f:
        return int(f.read().split()[0])


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range_and_node_ports() -> None:
    picked = free_ports(50)
    assert len(set(picked)) == 50
    assert all(ports.LOWEST <= p < min(ephemeral_start(), ports.NODE_PORTS) for p in picked)
    socks = []
    try:
        for p in picked:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", p))
    finally:
        for s in socks:
            s.close()


def test_a_port_held_by_a_listener_is_not_picked() -> None:
    nxt = free_ports(1)[0] + 1
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", nxt))
        held.listen()
        # The cursor walks on from the last pick, so the held port is the next candidate.
        assert nxt not in free_ports(3)
    finally:
        held.close()


def test_successive_calls_do_not_repeat_a_port() -> None:
    seen: list[int] = []
    for _ in range(20):
        seen += free_ports(3)
    assert len(set(seen)) == len(seen)


def test_a_range_with_no_room_falls_back_to_the_kernel(monkeypatch) -> None:
    monkeypatch.setattr(ports, "_ceiling", lambda: ports.LOWEST + 2)
    picked = free_ports(5)
    assert len(set(picked)) == 5
    assert all(p >= ephemeral_start() for p in picked)
