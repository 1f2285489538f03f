"""Two clusters on one network: a member of one never takes a message of the other's
(`settings.cluster`, the `Raftlog-Cluster` header), even where their addresses and member names
meet, and a data directory stays with its cluster (marker `e2e`)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from raftlog.client import Client
from raftlog.harness.local import LocalCluster
from raftlog.node.transport.frames import handshake

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def values_on(cluster: LocalCluster, name: str, top: int) -> list[str]:
    with Client([cluster.nodes[name].url]) as c:
        page = c.read(0, 1, 1000, min_index=top, wait_ms=5000)
    return [r["value"] for r in page["records"]]


def until(what, timeout: float = 20.0):
    """`what()` once it stops raising (a leader being elected meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return what()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def leader_of(cluster: LocalCluster) -> str:
    leader = cluster.leader(0)
    if leader is None:
        raise RuntimeError("no leader agreed yet")
    return leader


def local_values(url: str) -> list[str]:
    with Client([url], retries=0, timeout_s=2) as c:
        return [r["value"] for r in c.read(0, 1, 1000)["records"]]


def test_members_of_two_clusters_whose_ports_meet_refuse_each_other(tmp_path):
    """Cluster b's member n1 is at a's n1's port (a port handed out twice, an address reused).
    b's n2 and n3 elect a leader, commit, and move its leadership until their term is well
    past a's; then a starts. Without the cluster's name on their calls, a's n1 took b's terms
    and a's leaders were deposed until a's term passed b's (2 runs of 2 before the fix)."""
    a = LocalCluster(tmp_path / "a", replicas=3, durable=False)
    b = LocalCluster(tmp_path / "b", replicas=3, durable=False)
    b.nodes["n1"].port = a.nodes["n1"].port
    try:
        b.start("n2")
        b.start("n3")
        b_urls = [b.nodes["n2"].url, b.nodes["n3"].url]
        with Client(b_urls, timeout_s=2) as c:
            for i in range(30):
                until(lambda i=i: c.append(0, [{"value": f"b{i}"}]))
            for _ in range(8):  # each handover is a new term
                leader = until(lambda: leader_of(b))
                until(lambda t="n3" if leader == "n2" else "n2": c.transfer_leader(0, t))
        b_term = max(p["term"] for name in ("n2", "n3") for p in b.status(name)["partitions"])
        assert b_term >= 8, b_term
        a.start()
        seen: list[str] = []
        reads = 0
        # At least 6 s of a's n1 among b's members, and 10 reads of it (a loaded machine
        # starts it slowly: 8 reads in 6 s were seen), for at most 60 s.
        started = time.monotonic()
        while time.monotonic() - started < 6 or (reads < 10 and time.monotonic() - started < 60):
            with contextlib.suppress(Exception):  # a's n1 starting
                seen += local_values(a.nodes["n1"].url)
                reads += 1
            time.sleep(0.1)
        assert reads >= 10, reads
        assert not [v for v in seen if v.startswith("b")], "a's n1 served b's records"
        a.wait_ready()
        with Client(a.endpoints) as c:
            for i in range(20):
                top = c.append(0, [{"value": f"a{i}"}]).last_index
        for name in a.nodes:
            assert values_on(a, name, top) == [f"a{i}" for i in range(20)], name
        a_term = max(p["term"] for name in a.nodes for p in a.status(name)["partitions"])
        assert a_term < b_term, "b's terms reached a"
        log = a.nodes["n1"].log_path.read_text()
        assert "refused a peer frame stream" in log
        assert f"the caller of cluster {b.cluster!r}" in log
    finally:
        b.stop()
        a.stop()


def raw_handshake(port: int, cluster: str | None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(handshake("127.0.0.1", port, None, "n1", cluster))
        head = b""
        while b"\r\n\r\n" not in head:
            got = s.recv(4096)
            if not got:
                break
            head += got
        if head.startswith(b"HTTP/1.1 421"):
            while got := s.recv(4096):  # the body, then the close
                head += got
        return head


def peer_post(url: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"{url}/peer/v1/partitions/0/snapshot?leader=n2&term=1&index=1&snap_term=1",
        data=b"x",
        method="POST",
        headers={"X-Offset": "0", "X-Crc32c": "0", "X-Total": "1", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def peer_post_named(
    port: int,
    clusters: tuple[str, ...],
    path: str = "/peer/v1/partitions/0/snapshot?leader=n2&term=1&index=1",
    method: str = "POST",
) -> tuple[int, dict[str, Any], str | None]:
    """`peer_post` with the cluster header given once per name (urllib keeps one): the
    status, the JSON body and the `Connection` header of the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest(method, path)
        for name in clusters:
            conn.putheader("Raftlog-Cluster", name)
        body = b"x" if method == "POST" else None
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}"), r.getheader("Connection")
    finally:
        conn.close()


def test_a_peer_naming_another_cluster_is_refused_421_naming_both(tmp_path):
    with LocalCluster(tmp_path, replicas=1, durable=False, cluster="ns/a") as c:
        c.wait_ready()
        assert c.status("n1")["cluster"] == "ns/a"
        port = c.nodes["n1"].port
        refused = raw_handshake(port, "ns/b")
        assert refused.startswith(b"HTTP/1.1 421"), refused[:200]
        body = json.loads(refused.split(b"\r\n\r\n", 1)[1])
        assert body["error"] == "misdirected"
        assert "'ns/a'" in body["reason"] and "'ns/b'" in body["reason"], body
        assert raw_handshake(port, "ns/a").startswith(b"HTTP/1.1 101")
        # A member that names no cluster (started before it was set) is not judged.
        assert raw_handshake(port, None).startswith(b"HTTP/1.1 101")
        # The peer routes over HTTP: refused from the head, the same way.
        status, body = peer_post(c.nodes["n1"].url, {"Raftlog-Cluster": "ns/b"})
        assert (status, body["error"], body["field"]) == (421, "misdirected", "Raftlog-Cluster")
        status, body = peer_post(c.nodes["n1"].url, {"Raftlog-Cluster": "ns/a"})
        assert status != 421, body
        # Named twice, whichever is its own: a 400 naming the header, never judged by one.
        for names in (("ns/a", "ns/b"), ("ns/b", "ns/a"), ("ns/a", "ns/a")):
            status, body, _ = peer_post_named(port, names)
            assert (status, body["field"]) == (400, "Raftlog-Cluster"), (names, body)
            assert "given 2 times" in body["reason"], body
        # So is a frame stream's handshake naming it twice (left to aiohttp, then the guard).
        twice = handshake("127.0.0.1", port, None, "n1", "ns/a").replace(
            b"Raftlog-Cluster: ns/a\r\n", b"Raftlog-Cluster: ns/a\r\nRaftlog-Cluster: ns/b\r\n"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(twice)
            answer = b""
            while got := s.recv(4096):
                answer += got
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert (body["field"], body["reason"]) == ("Raftlog-Cluster", "given 2 times; send it once")
        # A client route does not judge it, once or twice.
        status, _, _ = peer_post_named(port, ("ns/b", "ns/a"), path="/v1/status", method="GET")
        assert status == 200
        # A foreign peer's call is refused from its head: its body is not read, the
        # connection is closed.
        status, body, connection = peer_post_named(port, ("ns/d",))
        assert (status, body["error"], connection) == (421, "misdirected", "close"), body
        # Logged, once a minute per cluster named, however often it calls.
        for _ in range(5):
            raw_handshake(port, "ns/b")
        raw_handshake(port, "ns/c")  # another cluster within the minute is logged too
        log = c.nodes["n1"].log_path.read_text()
        assert log.count("the caller of cluster 'ns/b'") == 1, log[-2000:]
        assert log.count("the caller of cluster 'ns/c'") == 1, log[-2000:]
        assert "refused /peer/v1/partitions/0/snapshot from 127.0.0.1: " in log, log[-2000:]


def test_a_data_directory_of_another_cluster_is_refused_at_start(tmp_path):
    with LocalCluster(tmp_path, replicas=1, durable=False, cluster="ns/a") as c:
        c.wait_ready()
        data = c.nodes["n1"].data_dir
    assert (data / "cluster").read_text() == "ns/a\n"
    cmd = [
        sys.executable, "-m", "raftlog.node.server.main", "--node-id", "n1",
        "--peers", "n1=http://127.0.0.1:1", "--port", "1", "--data-dir", str(data),
        "--insecure-no-auth", "--cluster", "ns/b",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--cluster ns/b" in done.stderr and "belongs to cluster 'ns/a'" in done.stderr
    assert "--cluster ns/a" in done.stderr, done.stderr  # what to do
    # The same name starts, and so does a node given no name (nothing is checked).
    for name in ("ns/a", ""):
        with LocalCluster(tmp_path, replicas=1, durable=False, cluster=name) as again:
            again.wait_ready()
            assert again.status("n1")["cluster"] == (name or None)
