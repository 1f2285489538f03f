"""What the Spark tests share: a local Spark session, appends that record what was acknowledged,
waits with deadlines, and a fake node that answers as a test says."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster
from raftlog.node.core.types import Entry
from raftlog.node.server import columnar
from raftlog.node.storage.segment import Rows
from raftlog.spark.session import local_session

# (partition, index, term, key, value, headers, timestamp) as the source returns it
Row = tuple[int, int, int, bytes | None, bytes | None, dict[str, str], datetime | None]


# The tests' JVMs (Spark's launcher and driver, here and in the jobs tests start) compile with
# C1 only and collect with the serial collector: they live for minutes on small data, where C2's
# compile threads cost more CPU than they return. tests/spark on 2 workers, alternated: 389 and
# 441 -> 353 and 335 CPU-s, 218 and 246 -> 196 and 190 s (docs/testing.md). The `java` launcher
# reads this variable (JDK 9 and later), so Spark's launcher JVM gets it too.
JVM_ENV = {"JDK_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def start_spark(stderr: Path | None = None) -> SparkSession:
    """A local Spark; with `stderr`, the JVM (and the Python workers it starts, whose warnings
    it passes on) writes its standard error to that file instead of this process's."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.update(JVM_ENV)
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "1g",
        "spark.sql.streaming.pollingDelay": "50ms",
    }
    saved = None
    if stderr is not None:
        saved = os.dup(2)
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)  # the JVM inherits it
        os.close(fd)
    try:
        return local_session("raftlog-tests", conf=conf)
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)


def append(cluster: LocalCluster, partition: int, records: list[dict[str, Any]]) -> list[Row]:
    """Append `records` (one batch) and return the rows the source must show for them."""

    async def go() -> Any:
        async with AsyncClient(cluster.endpoints) as c:
            return await c.append(partition, records)

    done = asyncio.run(go())
    rows: list[Row] = []
    for i, r in zip(range(done.first_index, done.last_index + 1), records, strict=True):
        ts = r.get("timestamp_ms", 0)
        rows.append(
            (
                partition,
                i,
                done.term,
                None if r.get("key") is None else str(r["key"]).encode(),
                None if r.get("value") is None else str(r["value"]).encode(),
                dict(r.get("headers", {})),
                datetime.fromtimestamp(ts / 1000, UTC).replace(tzinfo=None) if ts else None,
            )
        )
    return rows


def records(n: int, tag: str, keys: int = 0, pad: int = 0) -> list[dict[str, Any]]:
    """`n` records: keyed (`keys` distinct) or not, some with headers and a timestamp; `pad`
    bytes more in each value (to fill WAL segments)."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        r: dict[str, Any] = {"value": f"{tag}-{i}" + "." * pad}
        if keys:
            r["key"] = f"k{i % keys}"
        if i % 3 == 0:
            r["headers"] = {"source": tag, "n": str(i)}
        if i % 2 == 0:
            r["timestamp_ms"] = 1_700_000_000_000 + i
        out.append(r)
    return out


def _b(v: Any) -> bytes | None:
    return None if v is None else bytes(v)


def rows_of(df: DataFrame) -> list[Row]:
    """The DataFrame's rows as tuples, sorted by (partition, index)."""
    out: list[Row] = [
        (r["partition"], r["index"], r["term"], _b(r["key"]), _b(r["value"]),
         dict(r["headers"] or {}), r["timestamp"])
        for r in df.collect()
    ]  # fmt: skip
    return sorted(out, key=lambda t: (t[0], t[1] or 0, t[3] or b""))


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def hwm(cluster: LocalCluster, name: str, partition: int) -> int:
    return int(cluster.status(name)["partitions"][partition]["high_water_mark"])


def wait_replicated(cluster: LocalCluster, partition: int, index: int) -> None:
    """Until every running node's high-water mark reaches `index` (followers learn it late)."""
    names = [n for n, node in cluster.nodes.items() if node.running]
    wait_until(
        f"every replica to commit {index}",
        lambda: all(hwm(cluster, n, partition) >= index for n in names),
        timeout=30,
    )


def raftlog_df(
    spark: SparkSession,
    cluster: LocalCluster,
    options: dict[str, str] | None = None,
    stream: bool = False,
    fmt: str = "raftlog",
) -> DataFrame:
    """`spark.read` (or `readStream`) of the `raftlog` format (or `fmt`, e.g. `raftlog-jvm`)
    over `cluster`, with `options`."""
    r: Any = (spark.readStream if stream else spark.read).format(fmt)
    r = r.option("endpoints", ",".join(cluster.endpoints))
    for k, v in (options or {}).items():
        r = r.option(k, v)
    return r.load()  # type: ignore[no-any-return]


# (status, content type, body) for the n-th request (from 0) of a path; None: the connection is
# closed unanswered (a node that went down)
Answer = Callable[[str, int], tuple[int, str, bytes] | None]


class FakeNode:
    """A node that answers as `answer` says, and counts the requests per path kind. With
    `piece`, a body is sent in pieces of that many bytes, a millisecond apart (so that a reader
    gets it in many socket reads), and with `chunked` too, without a length: chunked (HTTP/1.1,
    the connection kept alive)."""

    def __init__(self, answer: Answer, piece: int = 0, chunked: bool = False) -> None:
        self.requests: list[str] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.puts: list[tuple[str, bytes]] = []  # (path, body) of each PUT, answered as a GET
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if chunked else "HTTP/1.0"

            def do_GET(self) -> None:
                n = len(fake.requests)
                fake.requests.append(self.path)
                fake.authorizations.append(self.headers.get("Authorization"))
                got = answer(self.path, n)
                if got is None:
                    self.close_connection = True
                    return
                status, ctype, body = got
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for at in range(0, len(body), piece or max(1, len(body))):
                    part = body[at : at + piece] if piece else body
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                    self.wfile.flush()
                    if piece:
                        time.sleep(0.001)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")

            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.puts.append((self.path, body))
                self.do_GET()

            def log_message(self, *args: object) -> None:
                """Silent: the test reads the requests recorded above, not a log."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def error(status: int, code: str, **extra: object) -> tuple[int, str, bytes]:
    body = {"error": code, "reason": f"{code} (fake)", **extra}
    return status, "application/json", json.dumps(body).encode()


def column_page(
    partition: int, entries: list[Entry], start: int, nxt: int, floor: int = 1
) -> bytes:
    """The column page a node makes of `entries` [start, nxt) (all committed)."""
    rows = Rows()
    rows.add_entries([e for e in entries if start <= e.index < nxt])
    hwm = entries[-1].index if entries else 0
    return columnar.record_page(partition, rows, high_water_mark=hwm, next_index=nxt, floor=floor)


def serving(
    entries: list[Entry], floor: int = 1, partition: int = 0
) -> Callable[[str, int], tuple[int, str, bytes]]:
    """A replica holding `entries` (all committed) from `floor` on: their column pages, as a
    node answers `/columns`, and 410 `compacted` below its floor."""
    hwm = entries[-1].index if entries else 0

    def answer(path: str, n: int) -> tuple[int, str, bytes]:
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))
        start = int(q["from"])
        if start < floor:
            return error(410, "compacted", compaction_floor=floor)
        nxt = min(int(q["to"]), start + int(q["limit"]), hwm + 1)
        return 200, columnar.CONTENT_TYPE, column_page(partition, entries, start, nxt, floor)

    return answer
