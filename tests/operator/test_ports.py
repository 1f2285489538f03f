"""The local runtime's ports: free, distinct, never ones the kernel gives outgoing connections."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import threading
import time
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


# A stretch of this test's own: the machine's other pickers (pytest's other worker, its members)
# walk from LOWEST, and a port one of them holds there would move this test's picks.
BASE = 14000


def small_range(monkeypatch: pytest.MonkeyPatch, span: int) -> None:
    monkeypatch.setattr(ports, "LOWEST", BASE)
    monkeypatch.setattr(ports, "_ceiling", lambda: BASE + span)


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
        assert all(BASE <= p < BASE + 200 for p in picked)
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


def test_a_registry_of_another_shape_is_started_afresh(own_registry: Path) -> None:
    """JSON that parses but is no registry (a cursor not a number, no cursor, not an object)."""
    for text in ('{"cursor": "x", "held": {}}', '{"held": {}}', "[]", '{"cursor": 1}'):
        own_registry.write_text(text)
        assert len(set(free_ports(3))) == 3, text


def test_a_damaged_entry_leaves_the_others_held(monkeypatch, own_registry: Path) -> None:
    small_range(monkeypatch, 40)
    now = time.time()
    own_registry.write_text(
        json.dumps(
            {"cursor": 0, "held": {str(BASE + 1): "nonsense", str(BASE + 5): [os.getppid(), now]}}
        )
    )
    picked = free_ports(9)
    assert BASE + 5 not in picked, "a live process's port after a damaged entry stays its"
    assert BASE + 1 in picked, "a damaged entry frees its port"


def test_a_pick_keeps_the_time_other_holds_were_taken(monkeypatch, own_registry: Path) -> None:
    """A hold lasts HELD_S from its pick, so a recycled pid does not keep a port for ever."""
    small_range(monkeypatch, 10)
    taken = time.time() - 3600
    own_registry.write_text(
        json.dumps({"cursor": 0, "held": {str(BASE + 5): [os.getppid(), taken]}})
    )
    free_ports(1)
    assert json.loads(own_registry.read_text())["held"][str(BASE + 5)] == [os.getppid(), taken]
    expired = time.time() - ports.HELD_S - 1
    own_registry.write_text(
        json.dumps({"cursor": 5, "held": {str(BASE + 5): [os.getppid(), expired]}})
    )
    assert free_ports(1) == [BASE + 5], "held longer than HELD_S: free again"


def test_a_process_releases_only_its_own_picks(monkeypatch, own_registry: Path) -> None:
    small_range(monkeypatch, 10)
    now = time.time()
    own_registry.write_text(json.dumps({"cursor": 0, "held": {str(BASE + 5): [os.getppid(), now]}}))
    mine = free_ports(2)
    release_ports([BASE + 5, *mine])
    held = json.loads(own_registry.read_text())["held"]
    assert str(BASE + 5) in held, "another live process's port is not this one's to release"
    assert not {str(p) for p in mine} & set(held)


def test_the_ceiling_is_the_ephemeral_start_when_below_the_node_ports(
    monkeypatch, tmp_path: Path
) -> None:
    span = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", str(span))
    span.write_text("25000\t60999\n")
    assert ports._ceiling() == 25000
    span.write_text("32768\t60999\n")
    assert ports._ceiling() == ports.NODE_PORTS
    span.write_text("garbage\n")
    assert ports._ceiling() == ports.NODE_PORTS


def test_a_range_shorter_than_four_picks_goes_to_the_kernel(monkeypatch) -> None:
    small_range(monkeypatch, 10)
    assert all(p >= ephemeral_start() for p in free_ports(3))


def test_the_last_free_port_of_the_range_is_found(monkeypatch, own_registry: Path) -> None:
    small_range(monkeypatch, 8)
    now = time.time()
    held = {str(BASE + i): [os.getppid(), now] for i in range(1, 8)}
    own_registry.write_text(json.dumps({"cursor": 1, "held": held}))
    assert free_ports(1) == [BASE]


def test_threads_picking_at_once_get_distinct_ports_all_recorded(
    monkeypatch, own_registry: Path
) -> None:
    small_range(monkeypatch, 400)
    real = ports._bindable

    def slow(port: int, host: str) -> socket.socket | None:
        time.sleep(0.002)  # widens the window between reading the registry and writing it
        return real(port, host)

    monkeypatch.setattr(ports, "_bindable", slow)
    picks: list[list[int]] = []
    threads = [threading.Thread(target=lambda: picks.append(free_ports(3))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    every = [p for pick in picks for p in pick]
    assert len(every) == 24 and len(set(every)) == 24, sorted(every)
    assert {str(p) for p in every} <= set(json.loads(own_registry.read_text())["held"])


def _pick_slowly(conn, n: int) -> None:
    real = ports._bindable

    def slow(port: int, host: str) -> socket.socket | None:
        time.sleep(0.005)
        return real(port, host)

    ports._bindable = slow  # this forked child's own module
    conn.send(free_ports(n))
    conn.recv()


def test_processes_picking_at_once_keep_each_others_picks(monkeypatch) -> None:
    """The registry is read, walked and written under one exclusive lock: two processes picking
    at the same moment both find their picks recorded (with a shared lock, the last writer's
    registry would drop the other's)."""
    small_range(monkeypatch, 200)
    ctx = multiprocessing.get_context("fork")
    children = []
    for _ in range(2):
        mine, theirs = ctx.Pipe()
        child = ctx.Process(target=_pick_slowly, args=(theirs, 20))
        children.append((mine, child))
    for _, child in children:
        child.start()
    try:
        theirs_picked = [set(mine.recv()) for mine, _ in children]
        a, b = theirs_picked
        assert len(a) == len(b) == 20 and not a & b
        held = set(json.loads(ports.REGISTRY.read_text())["held"])
        assert {str(p) for p in a | b} <= held, "one process's picks were written over"
    finally:
        for mine, child in children:
            mine.send("done")
            child.join(10)
