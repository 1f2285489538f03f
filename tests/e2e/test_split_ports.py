"""Clients on one port, peers and the admin API on another (`--peer-port`), as operator pods run:
each listener serves only its own routes, so a NetworkPolicy on the ports separates the traffic."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.loopback import free_loopback_net, kill_nodes, start_split_nodes
from tests.e2e.raw_frame_stream import open_frame_stream
from tests.steady import STEADY_ENV

from raftlog.client import AsyncClient

pytestmark = [pytest.mark.e2e]

CLIENT, PEER = 7001, 7002
CLIENT_CAP = 16  # the client listener's max_client_connections here
TOKEN = "split-secret"


def call(url: str, method: str = "GET", token: str | None = None, body: Any = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def get_json(url: str, token: str | None = None) -> Any:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture
def split_cluster(tmp_path: Path) -> Iterator[list[str]]:
    net = free_loopback_net(members=3, ports=(CLIENT, PEER))
    hosts = [f"127.{net}.{i}.1" for i in range(3)]
    env = {"RAFTLOG_MAX_CLIENT_CONNECTIONS": str(CLIENT_CAP), **STEADY_ENV}  # 421s name it
    procs = start_split_nodes(tmp_path, hosts, (CLIENT, PEER), TOKEN, env=env)
    try:
        yield hosts
    finally:
        kill_nodes(procs)


def leader_of(hosts: list[str]) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for i, h in enumerate(hosts):
            try:
                st = get_json(f"http://{h}:{CLIENT}/v1/status")
            except OSError:
                continue
            if st["partitions"][0]["role"] == "leader":
                return i
        time.sleep(0.2)
    raise AssertionError("no leader within 30 s")


def test_clients_and_peers_are_served_on_their_own_ports(split_cluster):
    hosts = split_cluster
    leader = leader_of(hosts)  # an election: the peers reached each other on the peer port
    follower = hosts[(leader + 1) % 3]
    client_urls = [f"http://{h}:{CLIENT}" for h in hosts]

    async def append() -> int:
        # Starting at a follower: its leader hint must name the leader's client port.
        async with AsyncClient([client_urls[(leader + 1) % 3]]) as c:
            return (await c.append(0, [{"key": "k", "value": "v"}])).last_index

    assert asyncio.run(append()) >= 1
    req = urllib.request.Request(
        f"http://{follower}:{CLIENT}/v1/partitions/0/records",
        data=json.dumps({"value": "x"}).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 421
    assert json.loads(info.value.read())["leader_url"] == client_urls[leader]

    # The client port has no admin or peer routes, even with the token: an admin call there
    # is sent on to the member's peer port (421 naming it), after the token's check.
    assert call(f"http://{follower}:{CLIENT}/v1/admin/peers") == 401
    req = urllib.request.Request(f"http://{follower}:{CLIENT}/v1/admin/peers")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 421
    said = json.loads(info.value.read())
    assert said["error"] == "admin_on_peer_port"
    assert said["leader_url"] == f"http://{follower}:{PEER}"
    for port, status in ((CLIENT, 404), (PEER, 101)):  # the frame stream: peer port only
        s, got, _ = open_frame_stream(follower, port, TOKEN)
        s.close()
        assert got == status, port
    assert call(f"http://{follower}:{CLIENT}/peer/v1/partitions/0/snapshot", token=TOKEN) == 404
    # Retention holds are on both (a reader holds through the port it reads from), token first.
    hold = f"http://{follower}:{CLIENT}/v1/admin/partitions/0/holds/reader"
    assert call(hold, "PUT", None, {"min_index": 1, "ttl_seconds": 60}) == 401
    assert call(hold, "PUT", TOKEN, {"min_index": 1, "ttl_seconds": 60}) == 200
    holds = get_json(f"http://{follower}:{PEER}/v1/admin/partitions/0/holds", TOKEN)["holds"]
    assert [h["holder"] for h in holds] == ["reader"]
    assert call(hold, "DELETE", TOKEN) == 204
    # The peer port has no client routes; its admin API wants the token.
    assert call(f"http://{follower}:{PEER}/v1/partitions/0/records?from=1") == 404
    assert call(f"http://{follower}:{PEER}/v1/admin/peers") == 401
    peers = get_json(f"http://{follower}:{PEER}/v1/admin/peers", TOKEN)["peers"]
    assert peers == {f"n{i}": f"http://{h}:{PEER}" for i, h in enumerate(hosts)}
    # Status, metrics and health on both (probes use the client port, the operator the peer one).
    for port in (CLIENT, PEER):
        assert call(f"http://{follower}:{port}/healthz") == 200
        assert call(f"http://{follower}:{port}/metrics") == 200
        assert call(f"http://{follower}:{port}/v1/status") == 200


def test_an_admin_call_at_a_follower_names_the_leaders_peer_port(split_cluster):
    """The admin API is on the peer port: a follower's 421 there named the leader's client
    port, where the route is a 404, so `raftctl backup create` (which follows hints) failed."""
    hosts = split_cluster
    leader = leader_of(hosts)
    follower = hosts[(leader + 1) % 3]
    lag = f"/v1/admin/partitions/0/followers/n{(leader + 2) % 3}/lag"
    req = urllib.request.Request(f"http://{follower}:{PEER}{lag}")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 421
    hint = json.loads(info.value.read())["leader_url"]
    assert hint == f"http://{hosts[leader]}:{PEER}"
    assert "lag" in get_json(hint + lag, TOKEN)


def test_a_full_client_listener_refuses_clearly_and_leaves_peers_and_admin_answering(
    split_cluster,
):
    hosts = split_cluster
    leader = hosts[leader_of(hosts)]
    idle = [socket.create_connection((leader, CLIENT), timeout=5) for _ in range(CLIENT_CAP)]
    try:
        with socket.create_connection((leader, CLIENT), timeout=5) as extra:
            extra.settimeout(5)
            answer = b""
            while chunk := extra.recv(4096):  # answered, then closed by the node
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer
        reply = json.loads(body)
        assert reply["error"] == "too_many_connections", reply
        assert "max_client_connections" in reply["reason"], reply
        # The peer and admin listener has its own cap: it answers, and Raft goes on.
        assert get_json(f"http://{leader}:{PEER}/v1/admin/peers", TOKEN)["peers"]
        metrics = urllib.request.urlopen(f"http://{leader}:{PEER}/metrics", timeout=5).read()
        assert b'raftlog_connections_refused_total{listener="client"} 1.0' in metrics
    finally:
        for s in idle:
            s.close()
    # Closed connections free their places.
    deadline = time.monotonic() + 10
    while call(f"http://{leader}:{CLIENT}/healthz") != 200:
        assert time.monotonic() < deadline, "the client listener stayed full"
        time.sleep(0.1)


def test_admin_calls_given_the_client_urls_reach_the_leaders_peer_port(split_cluster):
    """A client (raftctl) given the client URLs it appends through: the leader's client port
    answered its admin calls with a 404 `no route`; it names its peer port now."""
    hosts = split_cluster
    leader = leader_of(hosts)

    async def lag() -> dict[str, object]:
        async with AsyncClient([f"http://{h}:{CLIENT}" for h in hosts], token=TOKEN) as c:
            return await c.follower_lag(0, f"n{(leader + 1) % 3}")

    said = asyncio.run(lag())
    assert said["follower"] == f"n{(leader + 1) % 3}", said
