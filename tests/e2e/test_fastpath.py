"""The client listener's fast path for appends (`server/listener.py`): the heads it takes, and a
real node answering over raw sockets exactly as aiohttp does, handing every other request over."""

from __future__ import annotations

import contextlib
import itertools
import json
import select
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from raftlog.harness.local import LocalCluster
from raftlog.node.server.listener import parse_head

pytestmark = [pytest.mark.e2e]

LIMIT = 65536  # the nodes' max_request_bytes
APPEND = b"POST /v1/partitions/1/records HTTP/1.1"
HOST = APPEND + b"\r\nHost: x"
NO_HOST = APPEND + b"\r\nContent-Length: 3"


@pytest.mark.parametrize(
    ("head", "parsed"),
    [
        (APPEND + b"\r\nHost: x\r\nContent-Length: 12", (1, 12, False)),
        (APPEND + b"\r\ncontent-length:0\r\nHOST: x\r\nConnection: keep-alive", (1, 0, False)),
        (
            APPEND + b"\r\nHost: x\r\nContent-Length: 5\r\nConnection: Keep-Alive, close",
            (1, 5, True),
        ),
        (b"POST /v1/partitions/0/records HTTP/1.1\r\nHost: x\r\nContent-Length: 1", (0, 1, False)),
        (APPEND + b"\r\nHost: x\r\nX-Tab:\ta\tb\r\nContent-Length: 3", (1, 3, False)),
        (APPEND + b"\r\nHost: x\r\nContent-Length: 3" + b"\r\nX: y" * 126, (1, 3, False)),
        (APPEND + b"\r\nHost: x\r\nContent-Length:\t7\t", (1, 7, False)),  # tabs are spaces
        (APPEND + b"\r\nHost: x\r\nContent-Length: 999999999999", (1, 10**12 - 1, False)),
    ],
)
def test_the_heads_it_answers(head, parsed):
    assert parse_head(head) == parsed


@pytest.mark.parametrize(
    "head",
    [
        HOST,  # no length
        NO_HOST,
        HOST + b"\r\nContent-Length: 3\r\nHost: y",  # two Hosts
        HOST + b"\r\nContent-Length: 3" + b"\r\nX: y" * 127,  # 129 headers
        HOST + b"\r\nContent-Length: 3\r\nContent-Length: 3",  # two lengths: smuggling
        HOST + b"\r\nContent-Length: +3",
        HOST + b"\r\nContent-Length: 3 3",
        HOST + b"\r\nContent-Length: 3\r\nTransfer-Encoding: chunked",
        HOST + b"\r\nContent-Length: 3\r\nExpect: 100-continue",
        HOST + b"\r\nContent-Length: 3\r\nContent-Encoding: gzip",
        HOST + b"\r\nContent-Length: 3\r\nConnection: upgrade",
        HOST + b"\r\nContent-Length: 3\r\n folded",  # obsolete line folding
        HOST + b"\r\nContent-Length: 3\r\nBad Name: x",
        HOST + b"\r\nContent-Length: 3\r\nX: a\x01b",
        HOST + b"\r\nContent-Length: 3\r\nX: a\x7fb",  # DEL is a control character too
        HOST + b"\r\nContent-Length: 3\r\nTrailer: X-Sum",
        HOST + b"\r\nContent-Length: 1000000000000",  # 13 digits: aiohttp's to refuse
        HOST + b"\r\nContent-Length: 3\r\nno colon",
        b"POST /v1/partitions/1/records HTTP/1.0\r\nHost: x\r\nContent-Length: 3",
        b"POST /v1/partitions/01/records HTTP/1.1\r\nHost: x\r\nContent-Length: 3",
        b"POST /v1/partitions/1/records?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3",
        b"POST /v1/records HTTP/1.1\r\nHost: x\r\nContent-Length: 3",
        b"GET /v1/partitions/1/records HTTP/1.1\r\nHost: x\r\nContent-Length: 3",
        b"post /v1/partitions/1/records HTTP/1.1\r\nHost: x\r\nContent-Length: 3",
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
            answer, buf = read_answer(s, buf)
            out.append(answer)
        return out


def read_answer(s: socket.socket, buf: bytes = b"") -> tuple[Answer, bytes]:
    """The next answer on `s` (after the bytes already read, `buf`), and the bytes after it."""
    while b"\r\n\r\n" not in buf:
        more = s.recv(65536)
        assert more, f"closed before an answer: {buf!r}"
        buf += more
    head, _, buf = buf.partition(b"\r\n\r\n")
    line, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    length = int(headers["content-length"])
    while len(buf) < length:
        more = s.recv(65536)
        assert more, "closed in the answer's body"
        buf += more
    return (int(line.split()[1]), headers, buf[:length]), buf[length:]


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
    b'{"key": "a\xff", "value": "x"}',  # invalid UTF-8 inside a string
    b'{"records": [{"value": "\xed\xa0\x80"}]}',  # an encoded surrogate: not UTF-8 either
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
    assert [s for s, _ in got["fast"]] == [200, 200, 400, 400, 400, 400, 400, 400, 400, 400, 404]


def test_client_fast_path_off_leaves_appends_to_aiohttp(nodes):
    """Which of the two answered shows in aiohttp's own `Server` header."""
    servers = {}
    for name, c in nodes.items():
        [(status, headers, _)] = exchange(c, append_request(b'{"value": "who"}'), 1)
        assert status == 200
        servers[name] = headers.get("server", "")
    assert "aiohttp" in servers["aiohttp"] and servers["fast"] == "", servers


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


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
def test_requests_pipelined_before_a_malformed_one_are_each_answered_before_its_400(nodes, name):
    """An append, two reads and a request aiohttp cannot parse, in one send: the three are
    answered in order, then the 400, and the connection closes. aiohttp parsed the whole send
    at once and, at the malformed head, dropped the requests it had already parsed: the reads
    went unanswered and a pipelining client took the 400 for its first read's answer."""
    c = nodes[name]
    tag = f"before-the-bad-one-{name}"
    status = b"GET /v1/status HTTP/1.1\r\nHost: t\r\n\r\n"
    bad = b"GET /v1/status HTTP/1.1\r\nHost: t\r\nContent-Length: zz\r\n\r\n"
    after = append_request(b'{"value": "%s-after"}' % tag.encode())
    with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
        s.sendall(append_request(b'{"value": "%s"}' % tag.encode()) + status + status + bad + after)
        buf, statuses = b"", []
        for _ in range(4):
            (code, _, body), buf = read_answer(s, buf)
            statuses.append((code, json.loads(body)))
        assert buf == b"" and s.recv(65536) == b""  # then closed: nothing after the 400
    assert [code for code, _ in statuses] == [200, 200, 200, 400], statuses
    assert statuses[1][1]["node"] == statuses[2][1]["node"] == "n1"
    assert statuses[3][1]["error"] == "bad_request" and "Content-Length" in statuses[3][1]["at"]
    first = statuses[0][1]["first_index"]
    code, page = c.get("n1", f"/v1/partitions/1/records?from={first}&limit=10000")
    values = [r["value"] for r in page["records"]]
    assert values.count(tag) == 1 and f"{tag}-after" not in values, values


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    "upgrade",
    [b"Connection: Upgrade\r\nUpgrade: foo/1\r\n", b"Connection: upgrade\r\nUpgrade: h2c\r\n"],
)
def test_a_request_asking_an_upgrade_is_answered_then_its_connection_closed(nodes, name, upgrade):
    """No upgrade but the peers' frame stream is served, so one asked of the client API is
    ignored (as HTTP allows) and the request answered as it is. aiohttp then took the rest of the
    connection as the upgraded protocol's bytes and dropped them: a request pipelined after it
    was never answered, and the connection hung until the keep-alive ended it (75 s). It closes
    after the answer now, so the client knows to send the next request again."""
    c = nodes[name]
    tag = f"upgrade-{name}-{upgrade[-8:-2].decode()}".encode()
    after = append_request(b'{"value": "%s-after"}' % tag)
    with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
        s.sendall(append_request(b'{"value": "%s"}' % tag, extra=upgrade) + after)
        (code, headers, body), buf = read_answer(s)
        assert code == 200, body
        assert headers.get("connection", "").lower() == "close", headers
        assert buf == b"" and s.recv(65536) == b""  # closed, not left hanging
    first = json.loads(body)["first_index"]
    code, page = c.get("n1", f"/v1/partitions/1/records?from={first}&limit=10000")
    values = [r["value"] for r in page["records"]]
    assert values.count(tag.decode()) == 1 and f"{tag.decode()}-after" not in values, values


def test_a_request_in_pieces_is_answered(nodes):
    """A head and body arriving a few bytes at a time, then a second request in one piece."""
    c = nodes["fast"]
    req = append_request(b'{"value": "slow"}')
    pieces = [req[i : i + 7] for i in range(0, len(req), 7)] + [req]
    answers = exchange(c, pieces, 2)
    assert [a[0] for a in answers] == [200, 200]


@pytest.mark.parametrize(
    "request_bytes",
    [
        append_request(b'{"value": "half-closed"}'),  # the fast path's, where it is on
        append_request(b'{"value": "half-closed"}').replace(b"HTTP/1.1", b"HTTP/1.0"),
        b"GET /v1/status HTTP/1.1\r\nHost: t\r\n\r\n",
    ],
    ids=["append", "append-http1.0", "status"],
)
def test_a_request_then_a_half_close_is_answered(nodes, request_bytes):
    """`printf ... | nc` sends its request and shuts its side: the answer must still come (an
    append is committed either way, and an unanswered one may be sent again)."""
    for c in nodes.values():
        with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
            s.sendall(request_bytes)
            s.shutdown(socket.SHUT_WR)
            (status, _, body), _ = read_answer(s)
            assert status == 200, body
            if request_bytes.startswith(b"POST"):
                assert json.loads(body)["last_index"] >= 1


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


def first_status(c: LocalCluster, data: bytes) -> int:
    """The status of the first answer to `data` on a new connection."""
    with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=5) as s:
        s.sendall(data)
        buf = b""
        while b"\r\n" not in buf:
            more = s.recv(65536)
            assert more, "closed without an answer"
            buf += more
        return int(buf.split()[1])


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    "request_bytes",
    [
        append_request(b'{"\\ud800": 1}'),  # an error naming a lone surrogate: still JSON
        b"POST /v1/partitions/1/records HTTP/1.1\nHost: t\nContent-Length: 14\n\n"
        b'{"value": "v"}',  # bare LF: refused at once, not waited on
        b"POST /v1/partitions/1/records HTTP/1.1\r\nContent-Length: 14\r\n\r\n"
        b'{"value": "v"}',  # no Host
        append_request(b'{"value": "v"}', extra=b"Host: u\r\n"),  # two Hosts
        b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
        b"BREW /v1/status HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /v1/status HTTP/9.9\r\nHost: t\r\n\r\n",
        b"GET /v1/status HTTP/1.1\r\nHost: t\r\nNo Colon\r\n\r\n",
        b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /v1/\x00 HTTP/1.1\r\nHost: t\r\n\r\n",
    ],
    ids=["lone surrogate", "bare LF", "no Host", "two Hosts", "Content-Length abc",
         "unknown method", "HTTP/9.9", "header without colon", "bad chunk size", "NUL in path"],
)  # fmt: skip
def test_requests_aiohttp_refuses_are_refused_on_both(nodes, name, request_bytes):
    """400 in the API's JSON error shape, with aiohttp's reason, on both paths: aiohttp's own
    answer to a head it cannot parse is text/plain (`http_errors.JsonErrors`)."""
    [(status, headers, body)] = exchange(nodes[name], request_bytes, 1)
    assert status == 400, body
    assert headers["content-type"].startswith("application/json"), (headers, body)
    answer = json.loads(body)
    assert answer["error"] == "bad_request" and answer["reason"], answer
    assert "^" not in answer["reason"] and "\n" not in answer["reason"], answer


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_does_not_read_its_answers_cannot_grow_the_node(nodes):
    """Pipelined requests from a client that reads nothing: once the node's answers back up,
    it stops reading, so what the client sends stays in the kernel's buffers."""
    c = nodes["fast"]
    proc = c.nodes["n1"].proc
    assert proc is not None
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", c.nodes["n1"].port))
        s.settimeout(1)
        unknown = (
            b"POST /v1/partitions/7/records HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
        )
        with contextlib.suppress(TimeoutError):
            for _ in range(100):
                s.sendall(unknown * 1000)  # 404s, until the node's writes back up
        before = rss_kib(proc.pid)
        sent = 0
        with contextlib.suppress(TimeoutError, OSError):
            while sent < 64 << 20:
                s.sendall(b"x" * (1 << 20))
                sent += 1 << 20
        grown = rss_kib(proc.pid) - before
    assert sent < 16 << 20, f"the node took {sent >> 20} MiB it could not answer yet"
    assert grown < 16 << 10, f"its memory grew by {grown >> 10} MiB"


def test_a_client_that_sent_ahead_gets_every_answer_once_it_reads(nodes):
    """Pipelined requests sent until the node stops reading them (its answers backed up, its
    buffer full): once the client reads, the node writes again, takes the rest, and answers
    every request, in order, then the one completed after."""
    c = nodes["fast"]
    one = b"POST /v1/partitions/7/records HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
    data = one * 200_000
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", c.nodes["n1"].port))
        s.setblocking(False)
        sent = 0
        while sent < len(data):
            _, writable, _ = select.select([], [s], [], 1.0)
            if not writable:
                break  # the node stopped reading: the client's buffers are full
            sent += s.send(data[sent : sent + 65536])
        assert sent < len(data), "the node took 15 MiB of requests it could not answer yet"
        whole = sent // len(one)
        s.setblocking(True)
        s.settimeout(10)
        buf = b""
        for _ in range(whole):
            (status, _, _), buf = read_answer(s, buf)
            assert status == 404
        s.sendall(data[sent : (whole + 1) * len(one)])  # the rest of a request cut short
        (status, _, _), buf = read_answer(s, buf)
        assert status == 404 and buf == b""


def test_a_burst_larger_than_the_buffer_is_read_on_as_the_buffer_empties(nodes):
    """Pipelined requests sent faster than the node answers them, past what it buffers, while
    the client reads every answer: the node stops reading at its buffer's limit and goes on
    once it has answered its way below it."""
    c = nodes["fast"]
    one = b"POST /v1/partitions/7/records HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
    count = 20_000  # 1.5 MiB: over 20 times the node's buffer (max_request_bytes and a head)
    with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
        sender = threading.Thread(target=s.sendall, args=(one * count,))
        sender.start()
        buf = b""
        try:
            for _ in range(count):
                (status, _, _), buf = read_answer(s, buf)
                assert status == 404
        finally:
            sender.join(timeout=30)
    assert buf == b""


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
def test_requests_pipelined_before_a_half_close_are_all_answered(nodes, name):
    """`printf "$req1$req2$req3" | nc`: three appends, then the client's side shut, all read by
    the node at once (sent while it was stopped). Each is answered, in order, and appended once.
    The fast path answered the first and closed: the end, read while it was answered, dropped
    the two after it unanswered."""
    c = nodes[name]
    tag = f"pipelined-then-half-closed-{name}"
    sent = [f"{tag}-{i}" for i in range(3)]
    data = b"".join(append_request(json.dumps({"value": v}).encode()) for v in sent)
    with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
        c.pause("n1")
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        finally:
            c.resume("n1")
        buf, firsts = b"", []
        for _ in sent:
            (status, _, body), buf = read_answer(s, buf)
            assert status == 200, body
            firsts.append(json.loads(body)["first_index"])
    assert firsts == sorted(firsts), firsts
    code, page = c.get("n1", f"/v1/partitions/1/records?from={firsts[0]}&limit=10000")
    assert code == 200, page
    values = [r["value"] for r in page["records"] if r["value"].startswith(tag)]
    assert values == sent, values


STATUS = b"GET /v1/status HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    ("data", "answers"),
    [
        (STATUS, 1),
        (STATUS + STATUS, 2),
        (append_request(b'{"value": "fast, then a read"}') + STATUS, 2),
        (b"POST /v1/records HTTP/1.1\r\nHost: t\r\nContent-Length: 30\r\n\r\n"
         b'{"key": "k", "value": "keyed"}', 1),
    ],
    ids=["read", "two reads", "append then read", "keyed append"],
)  # fmt: skip
def test_a_half_closed_connection_served_by_aiohttp_is_closed_once_answered(
    nodes, name, data, answers
):
    """A request aiohttp serves (every one but the fast path's appends), then the client's side
    shut: answered, then closed, as the fast path does. aiohttp kept the connection after the
    answer for its keep-alive time: `printf ... | nc` waited 75 s, holding a connection slot."""
    c = nodes[name]
    with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
        c.pause("n1")  # the requests and the end read together
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        finally:
            c.resume("n1")
        buf = b""
        for _ in range(answers):
            (status, _, body), buf = read_answer(s, buf)
            assert status == 200, body
        s.settimeout(5)
        assert buf == b"" and s.recv(65536) == b""  # closed, not kept alive


def test_a_half_closed_connection_is_closed_once_answered(nodes):
    with socket.create_connection(("127.0.0.1", nodes["fast"].nodes["n1"].port), timeout=10) as s:
        s.sendall(append_request(b'{"value": "then closed"}'))
        s.shutdown(socket.SHUT_WR)
        (status, headers, _), rest = read_answer(s)
        # Said `Connection: close` when the node read the end before it answered (a CI run had
        # the answer first: the end is read on a later turn of the loop than the request).
        assert status == 200 and headers.get("connection", "close") == "close", headers
        assert rest == b"" and s.recv(65536) == b""  # closed by the node, not kept alive


def test_a_head_whose_end_arrives_in_pieces_is_answered(nodes):
    """The blank line ending a head split across reads, at each of its bytes."""
    req = append_request(b'{"value": "split"}')
    end = req.index(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", nodes["fast"].nodes["n1"].port), timeout=15) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        for cut in (end + 1, end + 2, end + 3):
            s.sendall(req[:cut])
            time.sleep(0.1)  # read by the node apart from what follows
            s.sendall(req[cut:])
            (status, _, _), buf = read_answer(s, buf)
            assert status == 200


def test_a_body_has_its_own_deadline_from_the_end_of_its_head(strict_nodes):
    """A head sent within its deadline (1 s), then its body within the body's (2 s from the
    head's end, more than 2 s from the head's start): answered, on both paths."""
    body = b'{"value": "on time"}'
    head = b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n" % len(
        body
    )
    for name, c in strict_nodes.items():
        with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
            s.sendall(head)
            time.sleep(0.7)  # within the head's deadline
            s.sendall(b"\r\n")
            time.sleep(1.5)  # past the head's deadline, within the body's
            s.sendall(body)
            (status, _, answer), _ = read_answer(s)
        assert status == 200, (name, answer)


def test_appends_under_way_at_sigterm_are_answered_before_the_node_exits(tmp_path):
    """Clients appending unique values when the node gets SIGTERM: every value the restarted
    node holds was answered 200 (an append that commits is never left without its answer, which
    a client would retry into a duplicate)."""
    with LocalCluster(tmp_path, replicas=1, partitions=1) as c:
        c.wait_ready()
        port = c.nodes["n1"].port
        answered: set[str] = set()
        stop = threading.Event()

        def client(k: int) -> None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=15) as s,
            ):
                for i in itertools.count():
                    value = f"c{k}-{i}"
                    s.sendall(append_request(json.dumps({"value": value}).encode(), 0))
                    head = b""
                    while b"\r\n" not in head:
                        more = s.recv(4096)
                        if not more:
                            return
                        head += more
                    if head.startswith(b"HTTP/1.1 200"):
                        answered.add(value)
                    if stop.is_set():
                        return

        threads = [threading.Thread(target=client, args=(k,)) for k in range(32)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        c.signal("n1", signal.SIGTERM)
        proc = c.nodes["n1"].proc
        assert proc is not None and proc.wait(timeout=30) == 0
        stop.set()
        for t in threads:
            t.join(timeout=30)
        c.start("n1")
        c.wait_ready()
        stored: set[str] = set()
        start = 1
        while True:
            code, page = c.get("n1", f"/v1/partitions/0/records?from={start}&limit=10000")
            assert code == 200
            if not page["records"]:
                break
            stored |= {r["value"] for r in page["records"] if r["value"]}
            start = page["next"]
    assert answered, "no append was answered before the SIGTERM"
    assert stored - answered == set(), "committed, but the client was never told"


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (b"Content-Length: %d\r\n" % (7 * 2**20), 413),
        (b"Content-Length: 20\r\nContent-Encoding: gzip\r\n", 415),
        (b"Transfer-Encoding: gzip, chunked\r\n", 501),
    ],
    ids=["too large", "Content-Encoding", "Transfer-Encoding"],
)
def test_expect_100_continue_is_refused_before_the_body_is_asked_for(nodes, name, extra, status):
    """`Expect: 100-continue` (curl sends it for bodies over 1 MiB) asks whether to send the
    body: a request refused from its head is answered at once with its final status, never
    `100 Continue`. aiohttp said 100 Continue before the node's checks ran, then refused the
    body it had just asked for, unread, and closed: the client's upload ran into a closed
    connection (a reset, which can lose the answer)."""
    head = b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
    with socket.create_connection(("127.0.0.1", nodes[name].nodes["n1"].port), timeout=5) as s:
        s.sendall(head + extra + b"\r\n")
        first = s.recv(65536)
        assert not first.startswith(b"HTTP/1.1 100 "), first
        (code, headers, body), _ = read_answer(s, first)
    assert code == status, body
    assert headers.get("connection", "").lower() == "close", headers
    assert json.loads(body)["error"] == "unsupported_encoding" or status == 413, body


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
def test_expect_100_continue_is_answered_once_the_head_is_taken(nodes, name):
    """A request the node will read: 100 Continue, then the body, then its answer."""
    body = b'{"value": "after 100"}'
    head = b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
    with socket.create_connection(("127.0.0.1", nodes[name].nodes["n1"].port), timeout=5) as s:
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        buf = b""
        while b"\r\n\r\n" not in buf:
            more = s.recv(65536)
            assert more, buf
            buf += more
        assert buf.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), buf
        s.sendall(body)
        (code, _, answer), _ = read_answer(s, buf[len(b"HTTP/1.1 100 Continue\r\n\r\n") :])
    assert code == 200 and json.loads(answer)["last_index"] >= 1, answer


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize("path", [b"/v1/partitions/1/records", b"/v1/records"])
def test_a_content_length_over_the_limit_is_refused_at_once(nodes, name, path):
    """413 from the head alone: the node does not wait for (or buffer) a body it will refuse."""
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (path, 7 * 2**20)
    with socket.create_connection(("127.0.0.1", nodes[name].nodes["n1"].port), timeout=5) as s:
        s.sendall(head + b"{")  # one byte of the 7 MiB announced
        s.settimeout(3)
        buf = s.recv(65536)
    assert buf.startswith(b"HTTP/1.1 413 "), buf[:200]


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
def test_a_malformed_request_is_one_log_line(nodes, name):
    c = nodes[name]
    log_file = Path(c.nodes["n1"].log_path)
    before = log_file.read_text()
    bad = b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n"
    for _ in range(3):
        assert first_status(c, bad) == 400
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and log_file.read_text().count("abc") < 3:
        time.sleep(0.05)
    new = log_file.read_text()[len(before) :].splitlines()
    about = [line for line in new if "Content-Length" in line]
    assert len(about) == 3, new
    assert "Traceback" not in "\n".join(new) and all(" WARNING " in line for line in about), new


@pytest.fixture(scope="module")
def budget_nodes(tmp_path_factory):
    """Fast path on and off, with room for two bodies of 1.5 MiB being read at once."""
    d = tmp_path_factory.mktemp("bodies")
    env = {"RAFTLOG_MAX_REQUEST_BYTES": str(2 << 20), "RAFTLOG_MAX_BODY_BUFFER_BYTES": str(4 << 20)}

    def cluster(name: str, fast: str) -> LocalCluster:
        fast_env = {**env, "RAFTLOG_CLIENT_FAST_PATH": fast}
        return LocalCluster(d / name, replicas=1, partitions=2, env=fast_env, durable=False)

    with cluster("fast", "true") as fast, cluster("off", "false") as off:
        fast.wait_ready()
        off.wait_ready()
        yield {"fast": fast, "aiohttp": off}


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize("path", [b"/v1/partitions/1/records", b"/v1/records"])
def test_bodies_being_read_hold_at_most_the_budget_and_one_more_is_refused_unread(
    budget_nodes, name, path
):
    """Each connection may send up to max_request_bytes and then stall for the body's 30 s:
    60 connections holding 7 MiB each grew a node by 420 MiB (aiohttp's path by 720 MiB), and
    4,096 connections could hold 32 GiB. Bodies being read now take their length from
    `max_body_buffer_bytes` from their heads on: one that does not fit is 503 `busy` at once,
    naming Content-Length, and closed unread; the room is there again once the others leave."""
    c = budget_nodes[name]
    port = c.nodes["n1"].port
    size = 1536 * 1024
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (path, size)
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    try:
        for s in held:
            s.sendall(head + b"{" + b" " * (1 << 20))  # two thirds of the body, then nothing
        time.sleep(0.5)  # their heads read
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head + b"{")
            (status, headers, body), _ = read_answer(s)
            assert status == 503, body
            answer = json.loads(body)
            assert answer["error"] == "busy" and answer["field"] == "Content-Length", answer
            assert "max_body_buffer_bytes" in answer["reason"], answer
            assert headers.get("connection", "").lower() == "close", headers
            assert headers.get("retry-after") == "1", headers  # the fast path's had none
    finally:
        for s in held:  # reset: gone, not half-closed (which aiohttp's path holds for the answer)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
    record = b'{"key": "k", "value": "after"}'
    full = head + record + b" " * (size - len(record))
    deadline = time.monotonic() + 10
    while True:  # the two left: their room is let go as the node sees them go
        [(status, _, body)] = exchange(c, full, 1)
        if status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200, body


@pytest.fixture(scope="module")
def strict_nodes(tmp_path_factory):
    """The fast path on and off, with short head and body deadlines."""
    d = tmp_path_factory.mktemp("deadlines")
    timeouts = {"RAFTLOG_REQUEST_HEAD_TIMEOUT_S": "1", "RAFTLOG_REQUEST_BODY_TIMEOUT_S": "2"}

    def cluster(name: str, fast: str) -> LocalCluster:
        env = {"RAFTLOG_CLIENT_FAST_PATH": fast, **timeouts}
        return LocalCluster(d / name, replicas=1, partitions=2, env=env, durable=False)

    with cluster("fast", "true") as fast, cluster("off", "false") as off:
        fast.wait_ready()
        off.wait_ready()
        yield {"fast": fast, "aiohttp": off}


def trickle(c: LocalCluster, start: bytes, for_s: float) -> tuple[bytes, float]:
    """Send `start`, then a byte every 0.2 s; (what the node answered, seconds until it closed)."""
    with socket.create_connection(("127.0.0.1", c.nodes["n1"].port), timeout=10) as s:
        began = time.monotonic()
        s.sendall(start)
        s.setblocking(False)
        got = b""
        while time.monotonic() - began < for_s:
            try:
                s.send(b"x")
            except OSError:
                break  # closed by the node
            time.sleep(0.2)
            try:
                chunk = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got, time.monotonic() - began


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    "start",
    [
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/status HTTP/1.1\r\nX-Slow: ",
        b"GET /v1/status HTTP/1.1\r\nX-A: " + b"a" * 5000 + b"\r\nX-B: " + b"b" * 5000
        + b"\r\nX-Slow: ",
    ],
    ids=["after a request aiohttp answered", "past the fast path's 8 KiB"],
)  # fmt: skip
def test_a_head_aiohttp_reads_is_cut_off_at_its_deadline_too(strict_nodes, name, start):
    """request_head_timeout_s holds for every head, not only those the fast path reads: a head
    on a connection aiohttp serves (after a request it answered, or longer than the fast path
    reads) trickled on until aiohttp's keep-alive time (75 s) closed it without a word."""
    got, took = trickle(strict_nodes[name], start, 15)
    assert took < 8, f"a head trickled for {took:.1f} s"
    assert b"HTTP/1.1 408 " in got and b"not sent" in got, got[-300:]


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize("first", [b"", b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"])
def test_a_head_past_64_kib_is_a_431(nodes, name, first):
    """aiohttp takes 128 header lines of 8,190 bytes: an unfinished head held about 2 MB of the
    node's memory, 100 such connections 188 MB, for 75 s. A head past 64 KiB is now answered
    431 and closed (and the fast path reads 8 KiB of one at most, as before)."""
    head = b"GET /v1/status HTTP/1.1\r\nHost: t\r\n" + b"X-%d: %s\r\n" * 9
    head = head % tuple(x for i in range(9) for x in (i, b"v" * 8000))
    with socket.create_connection(("127.0.0.1", nodes[name].nodes["n1"].port), timeout=5) as s:
        s.sendall(first)
        buf = b""
        if first:
            (status, _, _), buf = read_answer(s)
            assert status == 200
        with contextlib.suppress(ConnectionResetError):
            s.sendall(head)  # not finished: no blank line
        (status, headers, body), buf = read_answer(s, buf)
        assert status == 431, body
        assert json.loads(body)["error"] == "too_large", body
        assert headers.get("connection", "").lower() == "close", headers


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    ("head", "status", "reason"),
    [
        (b"GET /v1/status?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414,
         "the request line passes 8192 bytes"),
        (b"POST /v1/partitions/0/records?" + b"a" * 9000
         + b" HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}", 414,
         "the request line passes 8192 bytes"),
        (b"GET /v1/status HTTP/1.1\r\nHost: t\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n", 431,
         "a header field passes 8190 bytes"),
        (b"GET /v1/status HTTP/1.1\r\nHost: t\r\nX" + b"a" * 9000 + b": 1\r\n\r\n", 431,
         "a header field passes 8190 bytes"),
        (b"GET /v1/status HTTP/1.1\r\nHost: t\r\n"
         + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n", 431,
         "the request has more than 128 header fields"),
        (append_request(b'{"value": "v"}', extra=b"".join(b"X-%d: a\r\n" % i for i in range(130))),
         431, "the request has more than 128 header fields"),
    ],
    ids=["query", "append's query", "header value", "header name", "fields", "append's fields"],
)  # fmt: skip
def test_a_request_line_or_header_field_too_long_is_a_414_or_a_431(
    nodes, name, head, status, reason
):
    """aiohttp answered both with 400, quoting the line's start as a `bytearray` repr."""
    with socket.create_connection(("127.0.0.1", nodes[name].nodes["n1"].port), timeout=5) as s:
        s.sendall(head)
        (got, _, body), rest = read_answer(s)
        assert (got, json.loads(body)) == (status, {"error": "too_large", "reason": reason})
        assert rest == b"" and s.recv(1) == b"", "closed after the answer"


@pytest.mark.parametrize("name", ["fast", "aiohttp"])
def test_a_trickled_head_or_body_is_cut_off_at_its_deadline(strict_nodes, name):
    c = strict_nodes[name]
    got, took = trickle(c, b"POST /v1/partitions/1/records HTTP/1.1\r\nX-Slow: ", 15)
    assert took < 8, f"a head trickled for {took:.1f} s"
    if name == "fast":  # aiohttp's own parser holds an unfinished head: it is closed, not told
        assert got.startswith(b"HTTP/1.1 408 "), got
    head = b"POST /v1/partitions/1/records HTTP/1.1\r\nHost: t\r\nContent-Length: 200\r\n\r\n"
    got, took = trickle(c, head + b'{"value": "', 15)
    assert took < 8 and got.startswith(b"HTTP/1.1 408 "), (took, got)
    assert b"not sent" in got
