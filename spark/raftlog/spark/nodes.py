"""What the data source asks of the nodes, over plain blocking HTTP (stdlib `http.client`).

Spark calls the reader from its own Python workers, one call at a time, so a blocking client with
a kept-alive connection per node is the simplest fast thing. Every call has a timeout; every
retry loop a deadline and a bounded back-off.
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import msgspec

from raftlog.spark.options import OptionError, Options

COLUMNS = "application/vnd.raftlog.columns+msgpack"
_RETRYABLE = {421, 500, 502, 503, 504}


class NodeError(Exception):
    """A node answered with an error (status and its JSON body), or did not answer (status 0)."""

    def __init__(self, url: str, status: int, body: dict[str, Any]) -> None:
        self.url = url
        self.status = status
        self.body = body
        reason = body.get("reason") or body.get("error") or "no answer"
        super().__init__(f"{url}: {f'HTTP {status}: ' if status else ''}{reason}")

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status in _RETRYABLE


class DataLoss(Exception):
    """Records the read needs were compacted away on every replica."""


class Nodes:
    """Kept-alive connections to the cluster's nodes."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._ssl = (
            ssl.create_default_context(cafile=options.ca_file)
            if options.ca_file
            else ssl.create_default_context()
        )
        self._headers = {"Authorization": f"Bearer {options.token}"} if options.token else {}

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def _conn(self, base: str, timeout: float) -> http.client.HTTPConnection:
        c = self._conns.get(base)
        if c is None:
            u = urllib.parse.urlsplit(base)
            host, port = u.hostname or "127.0.0.1", u.port
            if u.scheme == "https":
                c = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl)
            else:
                c = http.client.HTTPConnection(host, port, timeout=timeout)
            self._conns[base] = c
        c.timeout = timeout
        if c.sock is not None:
            c.sock.settimeout(timeout)
        return c

    def request(
        self,
        base: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[str, bytes]:
        """(content type, body) of a 2xx answer; NodeError otherwise (status 0: no answer)."""
        timeout = timeout if timeout is not None else self.options.timeout_s
        payload = json.dumps(body).encode() if body is not None else None
        headers = dict(self._headers)
        if payload is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(2):  # a kept-alive connection the node closed is retried once
            c = self._conn(base, timeout)
            try:
                c.request(method, path, body=payload, headers=headers)
                resp = c.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                c.close()
                self._conns.pop(base, None)
                if attempt == 0 and isinstance(
                    e, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError
                ):
                    continue
                raise NodeError(base, 0, {"reason": f"{type(e).__name__}: {e}"}) from None
            if 200 <= resp.status < 300:
                return resp.getheader("Content-Type", ""), raw
            try:
                parsed = json.loads(raw) if raw else {}
            except ValueError:
                parsed = {"reason": raw[:200].decode(errors="replace")}
            raise NodeError(base, resp.status, parsed if isinstance(parsed, dict) else {})
        raise AssertionError("unreachable")

    def json(self, base: str, method: str, path: str, body: dict[str, Any] | None = None,
             timeout: float | None = None) -> dict[str, Any]:  # fmt: skip
        _, raw = self.request(base, method, path, body, timeout)
        return dict(json.loads(raw)) if raw else {}

    def columns(
        self, base: str, partition: int, start: int, stop: int, limit: int
    ) -> dict[str, Any]:
        """A column page of committed records [start, stop) (the node's `/columns`)."""
        q = urllib.parse.urlencode(
            {"from": start, "to": stop, "limit": limit, "min_index": stop - 1}
        )
        _, raw = self.request(base, "GET", f"/v1/partitions/{partition}/columns?{q}")
        return dict(msgspec.msgpack.decode(raw))

    def snapshot_table(self, base: str, partition: int) -> dict[str, Any]:
        _, raw = self.request(base, "GET", f"/v1/partitions/{partition}/snapshot/table")
        return dict(msgspec.msgpack.decode(raw))

    def set_hold(self, base: str, partition: int, holder: str, min_index: int, ttl: float) -> None:
        path = f"/v1/admin/partitions/{partition}/holds/{urllib.parse.quote(holder, safe='')}"
        self.json(base, "PUT", path, {"min_index": min_index, "ttl_seconds": ttl})


@dataclass(frozen=True)
class Replica:
    url: str
    leader: bool
    high_water_mark: int
    floor: int  # the first index this replica still has in its log


@dataclass
class PartitionView:
    partition: int
    replicas: list[Replica] = field(default_factory=list)

    @property
    def high_water_mark(self) -> int:
        """The highest committed index any answering replica knows (each is committed)."""
        return max((r.high_water_mark for r in self.replicas), default=0)

    @property
    def earliest(self) -> int:
        """The lowest index some replica still has."""
        return min((r.floor for r in self.replicas), default=1)

    def read_order(self, prefer_followers: bool, rotate: int = 0) -> list[str]:
        """Replicas to read from, best first: followers first when `prefer_followers` (spread
        over splits by `rotate`), the leader first otherwise."""
        followers = [r.url for r in self.replicas if not r.leader]
        leaders = [r.url for r in self.replicas if r.leader]
        if followers:
            k = rotate % len(followers)
            followers = followers[k:] + followers[:k]
        return followers + leaders if prefer_followers else leaders + followers


def index_for_time(nodes: Nodes, view: PartitionView, t: int) -> tuple[int | None, bool]:
    """The first committed index of `view`'s partition stamped at or after `t` (ms), or None
    when there is none, and whether a record at or after `t` may have been compacted before it.
    Asked of the replica holding the most first (the lowest floor), never of one whose mark is
    below the planned one (it answers 503 `behind`); NodeError when no replica answers."""
    last: NodeError | None = None
    path = f"/v1/partitions/{view.partition}/index-for-time?timestamp_ms={t}"
    path += f"&min_index={view.high_water_mark}"
    for r in sorted(view.replicas, key=lambda r: (r.floor, -r.high_water_mark)):
        try:
            answer = nodes.json(r.url, "GET", path)
        except NodeError as e:
            if not e.retryable:
                raise
            last = e
            continue
        index = answer.get("index")
        return (None if index is None else int(index)), bool(answer.get("compacted"))
    assert last is not None
    raise last


@dataclass
class ClusterView:
    partitions: dict[int, PartitionView]
    unreachable: dict[str, str]  # endpoint -> why


def survey(nodes: Nodes, timeout: float | None = None) -> ClusterView:
    """Every endpoint's status; OptionError naming `endpoints` when none answers."""
    opts = nodes.options
    timeout = min(opts.timeout_s, 10.0) if timeout is None else timeout
    views: dict[int, PartitionView] = {}
    unreachable: dict[str, str] = {}
    counts: set[int] = set()
    for base in opts.endpoints:
        try:
            st = nodes.json(base, "GET", "/v1/status", timeout=timeout)
        except NodeError as e:
            unreachable[base] = str(e)
            continue
        parts = st.get("partitions", [])
        counts.add(len(parts))
        for p in parts:
            view = views.setdefault(int(p["partition"]), PartitionView(int(p["partition"])))
            view.replicas.append(
                Replica(
                    base,
                    p.get("role") == "leader",
                    int(p["high_water_mark"]),
                    int(p["compaction_floor"]),
                )
            )
    if not views:
        why = "; ".join(f"{u}: {r}" for u, r in unreachable.items())
        raise OptionError("endpoints", f"no node answered /v1/status ({why})")
    if len(counts) > 1:
        raise OptionError(
            "endpoints", f"the nodes disagree on the number of partitions {sorted(counts)}"
        )
    if opts.partitions is not None:
        missing = [p for p in opts.partitions if p not in views]
        if missing:
            raise OptionError(
                "partitions", f"{missing} do not exist (the cluster has 0..{len(views) - 1})"
            )
        views = {p: views[p] for p in opts.partitions}
    return ClusterView(views, unreachable)


def backoff(attempt: int, base: float = 0.05, cap: float = 1.0) -> None:
    time.sleep(min(cap, base * 2**attempt) * random.uniform(0.5, 1.0))
