"""Quiesced partitions on real node processes (marker `e2e`): idle partitions stop ticking, and
a quiesced leader's death (SIGKILL) or stall (SIGSTOP) is noticed from the node pair's pings,
and so is a leader that no longer hears its followers."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from tests.e2e.links import proxied

from raftlog.client import Client
from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def partitions(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    return list(cluster.status(name)["partitions"])


def until(what: str, pred: Any, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if pred():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def all_quiesced(cluster: LocalCluster, names: list[str]) -> bool:
    return all(p["quiesced"] for n in names for p in partitions(cluster, n))


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_quiesced_leader_that_dies_or_stalls_is_replaced(tmp_path, fault):
    with LocalCluster(tmp_path, replicas=3, partitions=4) as cluster:
        cluster.wait_ready()
        names = list(cluster.nodes)
        until("every partition quiesced", lambda: all_quiesced(cluster, names), 20)
        # Quiesced: the terms and leaders stay put while nothing happens.
        before = {p["partition"]: (p["term"], p["leader"]) for p in partitions(cluster, "n1")}
        time.sleep(1.5)
        assert {p["partition"]: (p["term"], p["leader"]) for p in partitions(cluster, "n1")} == (
            before
        )
        victim = before[0][1]
        led = [p for p, (_, leader) in before.items() if leader == victim]
        if fault == "kill":
            cluster.kill(victim)
        else:
            cluster.signal(victim, signal.SIGSTOP)
        try:
            survivors = [n for n in names if n != victim]

            def replaced() -> bool:
                parts = {p["partition"]: p for p in partitions(cluster, survivors[0])}
                return all(parts[p]["leader"] not in (None, victim) for p in led)

            took = until("new leaders of the victim's partitions", replaced, 20)
            leader = {p["partition"]: p["leader"] for p in partitions(cluster, survivors[0])}[0]
            code, body = cluster.request(
                leader, "POST", "/v1/partitions/0/records", b'{"value": "after"}',
                {"Content-Type": "application/json"}, timeout=10,
            )  # fmt: skip
            assert code == 200, body  # the woken partition commits again
            print(f"{fault}: {len(led)} partitions led by {victim} had new leaders in {took:.1f} s")
        finally:
            if fault == "stop":
                cluster.signal(victim, signal.SIGCONT)


def test_a_quiesced_leader_that_hears_nobody_is_replaced(tmp_path):
    """The links from its followers to the leader of quiesced partitions cut (one way: they
    still hear it): it steps down and the followers elect one of them, within a few election
    timeouts, and the partition commits again; never two leaders in one term. It re-quiesced
    on what they had answered before and led on, unable to commit, its followers asleep behind
    it, for as long as the cut lasted (not replaced after 25 s; 2 s without quiescence)."""
    cluster = LocalCluster(tmp_path, replicas=3, partitions=2)
    ports = {name: node.port for name, node in cluster.nodes.items()}
    claims: dict[tuple[int, int], set[str]] = {}  # (partition, term) -> who said it led

    def leaders_of(p: int, names: list[str]) -> set[str | None]:
        out: set[str | None] = set()
        for name in names:
            for part in partitions(cluster, name):
                if part["role"] == "leader":
                    claims.setdefault((part["partition"], part["term"]), set()).add(name)
            out.add(partitions(cluster, name)[p]["leader"])
        return out

    with proxied(ports) as links:
        cluster.peer_url = links.url
        with cluster:
            cluster.wait_ready()
            names = list(cluster.nodes)
            with Client(cluster.endpoints) as client:
                last = client.append(0, [{"value": "before"}]).last_index
            until("every partition quiesced", lambda: all_quiesced(cluster, names), 20)
            victim = partitions(cluster, names[0])[0]["leader"]
            others = [n for n in names if n != victim]
            for name in others:
                links.cut(name, victim, "stall")
            took = until(
                "a new leader of partition 0 on the followers' side",
                lambda: len(s := leaders_of(0, others)) == 1 and s <= set(others),
                10,
            )
            with Client([cluster.nodes[n].url for n in others]) as client:
                after = client.append(0, [{"value": "after"}])
            assert after.last_index > last
            leaders_of(0, names)
            links.heal_all()
            until("the old leader follows", lambda: len(leaders_of(0, names)) == 1, 10)
    two = {k: v for k, v in claims.items() if len(v) > 1}
    assert not two, f"two leaders in one term: {two}"
    print(f"{victim}, cut off from its followers, replaced in {took:.1f} s")


def high_water_mark(cluster: LocalCluster, name: str) -> int | None:
    """The node's own high-water mark of partition 0 (None while it does not answer)."""
    try:
        code, page = cluster.get(name, "/v1/partitions/0/records?from=1&limit=1")
    except OSError:
        return None
    return int(page["high_water_mark"]) if code == 200 else None


@pytest.mark.parametrize("role", ["follower", "leader"])
def test_a_member_killed_on_an_idle_partition_keeps_its_high_water_mark(tmp_path, role):
    """SIGKILL a member of a quiesced partition once every member shows the last append, and
    start it again: the first high-water mark it answers is not below the one it showed, and
    a follower is not left a record behind while the partition stays idle (its leader sends
    heartbeats only)."""
    with LocalCluster(tmp_path, replicas=3, partitions=1) as cluster:
        cluster.wait_ready()
        with Client(cluster.endpoints) as client:  # it follows a leader moved under load
            for i in range(20):
                last = client.append(0, [{"value": f"r{i}"}]).last_index
        names = list(cluster.nodes)
        marks: list[int | None] = []

        def agreed() -> bool:  # on the last append, or past it (a new leader's no-op)
            marks[:] = [high_water_mark(cluster, n) for n in names]
            return len(set(marks)) == 1 and (marks[0] or 0) >= last

        until("every member at the last append", agreed, 10)
        last = int(marks[0] or 0)
        until("quiesced", lambda: all_quiesced(cluster, names), 20)
        leader = cluster.leader(0)
        assert leader is not None
        victim = leader if role == "leader" else next(n for n in names if n != leader)
        cluster.kill(victim)
        cluster.start(victim)
        first: list[int] = []

        def answers() -> bool:
            h = high_water_mark(cluster, victim)
            if h is not None:
                first.append(h)
            return bool(first)

        until("the restarted member answers", answers, 20)
        assert first[0] >= last, f"{victim} showed {last}, then {first[0]} after its restart"
        # At the last append, or past it: with the leader killed, its peers may have elected
        # a new one meanwhile, whose no-op commits one more.
        until(f"{victim} at {last}", lambda: (high_water_mark(cluster, victim) or 0) >= last, 20)
        cluster.wait_ready()  # and the partition has a leader every member agrees on
