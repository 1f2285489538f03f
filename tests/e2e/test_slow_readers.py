"""Readers that ask for large pages and never read them: the node's memory stays bounded."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from raftlog.client import Client
from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e]
BUDGET = 16 << 20  # max_answer_buffer_bytes
RECORDS, VALUE = 120, 100_000  # a page of all of them: about 12 MB of JSON
READERS = 30


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("slow-readers")
    env = {
        "RAFTLOG_MAX_ANSWER_BUFFER_BYTES": str(BUDGET),
        "RAFTLOG_ANSWER_SEND_TIMEOUT_S": "4",
    }
    with LocalCluster(d, replicas=1, partitions=1, durable=False, env=env) as c:
        c.wait_ready()
        with Client(c.endpoints) as client:
            for i in range(0, RECORDS, 10):
                batch = [{"key": f"k{j}", "value": "x" * VALUE} for j in range(i, i + 10)]
                client.append(0, batch)
        yield c


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match
    return int(match.group(1)) * 1024


def metric(c: LocalCluster, name: str) -> float:
    # Building 30 pages of 12 MB keeps the node busy for seconds: a patient scrape.
    text = urllib.request.urlopen(c.nodes["n1"].url + "/metrics", timeout=60).read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def stalled_reader(port: int) -> socket.socket:
    """A reader with a tiny receive window that asks for every record and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    path = f"/v1/partitions/0/records?from=1&limit=10000&max_bytes={64 << 20}"
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: n1\r\n\r\n".encode())
    return s


def status_line(s: socket.socket) -> bytes:
    s.settimeout(60)  # building 30 pages of 12 MB takes the node a few seconds
    return s.recv(12, socket.MSG_PEEK)


def test_stalled_readers_hold_at_most_the_budget_and_are_let_go(node):
    pid = node.nodes["n1"].proc.pid
    before = rss_bytes(pid)
    readers = [stalled_reader(node.nodes["n1"].port) for _ in range(READERS)]
    try:
        statuses = [status_line(s) for s in readers]  # each read answered, or begun
        deadline = time.monotonic() + 30
        grown = rss_bytes(pid) - before
        held = metric(node, "raftlog_answer_bytes_held")
        # One page of ~12 MB fits the 16 MiB budget; every other read is refused at once,
        # and none of them keeps its page in memory (30 pages would be ~360 MB).
        assert grown < 120 << 20, f"the node grew by {grown >> 20} MiB"  # 720 without a bound
        # One page of ~12 MB fits at a time: a second is answered only once a stalled one was
        # let go (a slow machine can take answer_send_timeout_s to build the 30 pages).
        let_go = int(metric(node, "raftlog_answers_timed_out_total"))
        answered = statuses.count(b"HTTP/1.1 200")
        assert answered <= 1 + let_go, (statuses, let_go)
        assert answered + statuses.count(b"HTTP/1.1 503") == READERS, statuses
        assert held <= BUDGET and (held > 0 or let_go > 0), (held, let_go)
        # Past answer_send_timeout_s each stalled answer's connection is closed, its bytes let
        # go (a loaded machine may have answered a second page once the first was let go).
        while metric(node, "raftlog_answers_timed_out_total") < answered:
            assert time.monotonic() < deadline + 10, "a stalled reader was never let go"
            time.sleep(0.2)
        assert metric(node, "raftlog_answer_bytes_held") == 0
    finally:
        for s in readers:
            s.close()
    # A reader that reads gets the whole page.
    path = f"/v1/partitions/0/records?from=1&limit=10000&max_bytes={64 << 20}"
    code, page = node.get("n1", path, timeout=30)
    assert code == 200 and len(page["records"]) == RECORDS


def test_a_read_that_might_not_fit_is_refused_before_it_is_made(node):
    """While a stalled reader holds most of the budget, a read is refused by what it may
    answer (`max_bytes`), before its page is built; one asking for less is served."""
    held_before = metric(node, "raftlog_answer_bytes_held")
    assert held_before == 0, held_before
    reader = stalled_reader(node.nodes["n1"].port)
    try:
        assert status_line(reader) == b"HTTP/1.1 200"
        held = metric(node, "raftlog_answer_bytes_held")  # for 4 s (answer_send_timeout_s)
        assert held > BUDGET - (8 << 20), held
        base = "/v1/partitions/0/records?from=1&limit=3&max_bytes="  # a record or two
        code, answer = node.get("n1", base + str(8 << 20), timeout=30)
        assert code == 503 and answer["error"] == "busy", answer
        code, page = node.get("n1", base + str(1 << 20), timeout=30)
        assert code == 200 and len(page["records"]) >= 1, page
    finally:
        reader.close()
