"""Peers' pod addresses told to a node (`/v1/admin/peer-addresses`, the operator's
`NodeApi.tell_addresses`): members that cannot reach each other by the names in their flags (a
DNS cache still giving restarted pods' old addresses) reach each other at the addresses told."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

import pytest
from tests.e2e.node_metrics import requests_counted

from raftlog.harness.local import LocalCluster
from raftlog.operator.cluster_views import NodeView
from raftlog.operator.nodeapi import NodeApi

pytestmark = [pytest.mark.e2e]

NOBODY = "127.0.0.9"  # nodes listen on 127.0.0.1: a connection here is refused at once


@dataclass
class KnownByStaleNames(LocalCluster):
    """Each member's flags give the others at an address where nobody listens."""

    @property
    def peers(self) -> str:
        return ",".join(f"{n.name}=http://{NOBODY}:{n.port}" for n in self.nodes.values())


def post(c: LocalCluster, name: str, body: dict[str, str]) -> tuple[int, dict[str, object]]:
    return c.request(name, "POST", "/v1/admin/peer-addresses", json.dumps(body).encode())


def posts_counted(c: LocalCluster, name: str) -> float:
    return requests_counted(c, name, "POST", "/v1/admin/peer-addresses", 200)


def serving(c: LocalCluster, name: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError):  # not listening yet
            if c.request(name, "GET", "/healthz")[0] == 200:
                return
        assert time.monotonic() < deadline, f"{name} never served"
        time.sleep(0.1)


def test_members_unreachable_by_name_elect_once_told_their_addresses(tmp_path):
    with KnownByStaleNames(tmp_path, replicas=2, partitions=1, durable=False) as c:
        for name in c.nodes:
            serving(c, name)
        time.sleep(3)  # 2 voters, neither reaching the other: no leader
        assert c.leaders() == {}
        assert post(c, "n1", {"n2": "not an address"}) == (
            400,
            {"error": "bad_request", "reason": "must be an IP address", "field": "n2"},
        )
        assert post(c, "n1", {"n7": "127.0.0.1"})[0] == 400
        assert post(c, "n1", {"n1": "127.0.0.1"})[0] == 400  # itself
        for odd in ("0.0.0.0", "::", "fe80::1%eth0"):
            assert post(c, "n1", {"n2": odd})[0] == 400, odd
        status, body = c.request(
            "n1", "POST", "/v1/admin/peers", json.dumps({"n2\r\nX: y": "http://a:1"}).encode()
        )
        assert status == 400 and "control characters" in body["reason"], body
        assert post(c, "n1", {"n2": "127.0.0.1"}) == (200, {"addresses": {"n2": "127.0.0.1"}})
        assert post(c, "n2", {"n1": "127.0.0.1"})[0] == 200
        c.wait_ready(timeout=30)
        status, body = c.request(
            c.leaders()[0], "POST", "/v1/partitions/0/records", b'{"key": "k", "value": "v"}'
        )
        assert status == 200, body


def test_the_operator_tells_each_node_once_per_change(tmp_path):
    with KnownByStaleNames(tmp_path, replicas=2, partitions=1, durable=False) as c:
        urls = {n: node.url for n, node in c.nodes.items()}
        stale = {n: f"http://{NOBODY}:{node.port}" for n, node in c.nodes.items()}
        views = {
            "n1": NodeView("n1", {}, {"n1": stale["n1"], "n2": stale["n2"]}),
            "n2": None,  # not answering: not told
        }

        async def tell(addresses: dict[str, str]) -> None:
            api = NodeApi()
            api._told = told
            try:
                await api.tell_addresses(urls, addresses, views)
            finally:
                await api.close()

        told: dict[str, tuple[str, float | None, dict[str, str]]] = {}
        serving(c, "n1")
        asyncio.run(tell({"n1": "127.0.0.1", "n2": "127.0.0.1"}))
        assert posts_counted(c, "n1") == 1.0
        assert c.request("n1", "GET", "/v1/admin/peer-addresses")[1] == {
            "addresses": {"n2": "127.0.0.1"}
        }
        before = posts_counted(c, "n1")
        asyncio.run(tell({"n1": "127.0.0.1", "n2": "127.0.0.1"}))
        assert posts_counted(c, "n1") == before  # nothing changed: not told again
        asyncio.run(tell({"n1": "127.0.0.3", "n2": "127.0.0.1"}))  # n1 restarted elsewhere
        assert posts_counted(c, "n1") == before + 1
        asyncio.run(tell({"n1": "127.0.0.3", "n2": f"{NOBODY}"}))  # the URL's own host
        assert posts_counted(c, "n1") == before + 1
        # A new process in the same pod (a container restart keeps the address) forgot them.
        views["n1"] = NodeView("n1", {}, views["n1"].peers, started_at=1.0)  # type: ignore[union-attr]
        asyncio.run(tell({"n1": "127.0.0.3", "n2": "127.0.0.1"}))
        assert posts_counted(c, "n1") == before + 2
        asyncio.run(tell({"n1": "127.0.0.3", "n2": "127.0.0.1"}))
        assert posts_counted(c, "n1") == before + 2
