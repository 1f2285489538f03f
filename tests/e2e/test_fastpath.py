"""The client listener's fast path for appends (`server/fastpath.py`): the heads it takes, and a
real node answering over raw sockets exactly as aiohttp does, handing every other request over."""

from __future__ import annotations

import json
import socket

import pytest

from raftlog.node.local import LocalCluster
from raftlog.node.server.fastpath import parse_head

pytestmark = [pytest.mark.e2e]

LIMIT = 65536  # the nodes' max_request_bytes
APPEND = b"POST /v1/partitions/1/records HTTP/1.1"


@pytest.mark.parametrize(
    ("head", "parsed"),
    [
        (APPEND + b"\r\nHost: x\r\nContent-Length: 12", (1, 12, False)),
        (APPEND + b"\r\ncontent-length:0\r\nConnection: keep-alive", (1, 0, False)),
        (APPEND + b"\r\nContent-Length: 5\r\nConnection: Keep-Alive, close", (1, 5, True)),
        (b"POST /v1/partitions/0/records HTTP/1.1\r\nContent-Length: 1", (0, 1, False)),
        (APPEND + b"\r\nX-Tab:\ta\tb\r\nContent-Length: 3", (1, 3, False)),
    ],
)
def test_the_heads_it_answers(head, parsed):
    assert parse_head(head) == parsed


@pytest.mark.parametrize(
    "head",
    [
        APPEND,  # no length
        APPEND + b"\r\nContent-Length: 3\r\nContent-Length: 3",  # two lengths: smuggling
        APPEND + b"\r\nContent-Length: +3",
        APPEND + b"\r\nContent-Length: 3 3",
        APPEND + b"\r\nContent-Length: 3\r\nTransfer-Encoding: chunked",
        APPEND + b"\r\nContent-Length: 3\r\nExpect: 100-continue",
        APPEND + b"\r\nContent-Length: 3\r\nContent-Encoding: gzip",
        APPEND + b"\r\nContent-Length: 3\r\nConnection: upgrade",
        APPEND + b"\r\nContent-Length: 3\r\n folded",  # obsolete line folding
        APPEND + b"\r\nContent-Length: 3\r\nBad Name: x",
        APPEND + b"\r\nContent-Length: 3\r\nX: a\x01b",
        APPEND + b"\r\nContent-Length: 3\r\nno colon",
        b"POST /v1/partitions/1/records HTTP/1.0\r\nContent-Length: 3",
        b"POST /v1/partitions/01/records HTTP/1.1\r\nContent-Length: 3",
        b"POST /v1/partitions/1/records?x=1 HTTP/1.1\r\nContent-Length: 3",
        b"POST /v1/records HTTP/1.1\r\nContent-Length: 3",
        b"GET /v1/partitions/1/records HTTP/1.1\r\nContent-Length: 3",
        b"post /v1/partitions/1/records HTTP/1.1\r\nContent-Length: 3",
    ],
)
def test_every_other_head_is_left_to_aiohttp(head):
    assert parse_head(head) is None


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """Two single-node clusters, the fast path on and off, to compare their answers."""
    d = tmp_path_factory.mktemp("fastpath")

    def cluster(name: str, fast: str) -> LocalCluster:
        env = {"RAFTLOG_CLIENT_FAST_PATH": fast, "RAFTLOG_MAX_REQUEST_BYTES": str(LIMIT)}
        return LocalCluster(d / name, replicas=1, partitions=2, env=env, durable=False)

    with cluster("fast", "true") as fast, cluster("off", "false") as off:
        fast.wait_ready()
        off.wait_ready()
        yield {"fast": fast, "aiohttp": off}


Answer = tuple[int, dict[str, str], bytes]


def exchange(c: LocalCluster, data: bytes | list[bytes], answers: int) -> list[Answer]:
    """Send raw bytes (a list: one send each) on one connection; read `answers` responses."""
    port = c.nodes["n1"].port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for chunk in data if isinstance(data, list) else [data]:
            s.sendall(chunk)
        buf = b""
        out: list[Answer] = []
        while len(out) < answers:
            while b"\r\n\r\n" not in buf:
                more = s.recv(65536)
                assert more, f"closed after {len(out)} answers: {buf!r}"
                buf += more
            head, _, buf = buf.partition(b"\r\n\r\n")
            line, *lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
            length = int(headers["content-length"])
            while len(buf) < length:
                more = s.recv(65536)
                assert more
                buf += more
            out.append((int(line.split()[1]), headers, buf[:length]))
            buf = buf[length:]
        return out


def append_request(body: bytes, partition: int = 1, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/partitions/%d/records HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s"
        % (partition, len(body), extra, body)
    )


BODIES = [
    b'{"value": "v"}',
    b'{"records": [{"key": "k", "value": "a"}, {"value_b64": "AAE="}]}',
    b'{"value": ',
    b"[1, 2]",
    b'{"colour": "red"}',
    b'{"producer_id": "p", "value": "v"}',
    b"\xff\xfe",
    b"",
]


def test_answers_are_the_same_as_aiohttp_s(nodes):
    """Every body, good or bad, gets the same status and JSON from the fast path as from the
    aiohttp route (indexes aside), including an unknown partition."""
    cases = [(b, 1) for b in BODIES] + [(b'{"value": "v"}', 7)]
    got: dict[str, list[tuple[int, dict[str, object]]]] = {}
    for name, c in nodes.items():
        got[name] = []
        for body, p in cases:
            [(status, headers, answer)] = exchange(c, append_request(body, p), 1)
            assert headers["content-type"].startswith("application/json"), headers
            assert "date" in headers
            doc = json.loads(answer)
            for k in ("first_index", "last_index", "term"):
                doc.pop(k, None)
            got[name].append((status, doc))
    assert got["fast"] == got["aiohttp"]
    assert [s for s, _ in got["fast"]] == [200, 200, 400, 400, 400, 400, 400, 400, 404]


def test_pipelined_requests_are_answered_in_order_across_the_hand_over(nodes):
    """Two appends, a status read (aiohttp's) and an append, in one send: four answers, in
    order; the connection stays on aiohttp after the hand-over."""
    c = nodes["fast"]
    one = append_request(b'{"value": "a"}')
    status = b"GET /v1/status HTTP/1.1\r\nHost: t\r\n\r\n"
    answers = exchange(c, one + one + status + one, 4)
    assert [a[0] for a in answers] == [200, 200, 200, 200]
    first, second, st, last = (json.loads(a[2]) for a in answers)
    assert second["first_index"] == first["last_index"] + 1
    assert st["node"] == "n1" and "partitions" in st
    assert last["first_index"] == second["last_index"] + 1


def test_a_request_in_pieces_is_answered(nodes):
    """A head and body arriving a few bytes at a time, then a second request in one piece."""
    c = nodes["fast"]
    req = append_request(b'{"value": "slow"}')
    pieces = [req[i : i + 7] for i in range(0, len(req), 7)] + [req]
    answers = exchange(c, pieces, 2)
    assert [a[0] for a in answers] == [200, 200]


def test_handed_over_requests_are_served_by_aiohttp(nodes):
    """A chunked body, a body past `max_request_bytes` and HTTP/1.0: aiohttp's answers."""
    c = nodes["fast"]
    body = b'{"value": "chunked"}'
    chunked = (
        b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    [(status, _, answer)] = exchange(c, chunked, 1)
    assert status == 200 and json.loads(answer)["partition"] == 1
    [(status, _, _)] = exchange(c, append_request(b"x" * (LIMIT + 1)), 1)
    assert status == 413
    old = (
        b"POST /v1/partitions/1/records HTTP/1.0\r\nContent-Length: 14\r\n\r\n" + b'{"value": "v"}'
    )
    [(status, _, _)] = exchange(c, old, 1)
    assert status == 200


def test_connection_close_is_honoured(nodes):
    c = nodes["fast"]
    port = c.nodes["n1"].port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(append_request(b'{"value": "bye"}', extra=b"Connection: close\r\n"))
        data = b""
        while more := s.recv(65536):  # ends when the node closes the connection
            data += more
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nConnection: close\r\n" in data
