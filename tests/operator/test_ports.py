"""The local runtime's ports: free, distinct, never ones the kernel gives outgoing connections."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path

import pytest

from raftlog.operator import ports
from raftlog.operator.ports import free_ports, release_ports


@pytest.fixture(autouse=True)
def own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own registry, out of the way of the machine's other pickers."""
    registry = tmp_path / "ports.json"
    monkeypatch.setattr(ports, "REGISTRY", registry)
    return registry


def small_range(monkeypatch: pytest.MonkeyPatch, span: int) -> None:
    monkeypatch.setattr(ports, "_ceiling", lambda: ports.LOWEST + span)


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


def _pick_and_wait(conn, n: int) -> None:
    conn.send(free_ports(n))
    conn.recv()  # lives, holding its picks, until told


def test_ports_another_live_process_picked_are_not_picked_until_it_exits(monkeypatch) -> None:
    """Two processes picking from one stretch (pytest's workers): a port the other picked and
    has not bound yet (or whose member is down) is never given out while that process lives."""
    small_range(monkeypatch, 200)
    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe()
    other = ctx.Process(target=_pick_and_wait, args=(theirs, 40))
    other.start()
    try:
        its = set(mine.recv())
        assert len(its) == 40
        picked = [p for _ in range(4) for p in free_ports(40)]
        assert len(set(picked)) == 160
        assert not its & set(picked), sorted(its & set(picked))
        assert all(ports.LOWEST <= p < ports.LOWEST + 200 for p in picked)
    finally:
        mine.send("done")
        other.join(10)
    # Gone, its ports are free again: the only free ones left in the stretch.
    assert set(free_ports(40)) == its


def test_ports_released_are_picked_again_and_a_full_range_falls_back_to_the_kernel(
    monkeypatch,
) -> None:
    small_range(monkeypatch, 100)
    picked = [p for _ in range(4) for p in free_ports(25)]
    assert len(set(picked)) == 100
    beyond = free_ports(1)[0]
    assert beyond >= ephemeral_start(), "every port of the stretch is held: the kernel's"
    release_ports(picked[:10])
    assert set(free_ports(10)) == set(picked[:10])


def test_a_damaged_registry_is_started_afresh(own_registry: Path) -> None:
    own_registry.write_text('{"cursor": "x", "held": [1, 2')
    picked = free_ports(3)
    assert len(set(picked)) == 3
    own_registry.write_text('{"cursor": 5, "held": {"20001": "nonsense", "20002": [1]}}')
    assert len(set(free_ports(3))) == 3
