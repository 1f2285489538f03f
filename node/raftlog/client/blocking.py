"""The blocking client of the node API, over stdlib `http.client`.

For code that blocks anyway: scripts and Spark's Python workers, which call a reader one call
at a time. A kept-alive connection per node and no event loop make a page read a plain
request on an open socket. It makes the same calls as `AsyncClient` (`raftlog.client.calls`).
A `Client` shared by threads makes their calls one at a time (its connections and producer
lanes are one thread's at a time); give each thread its own for calls side by side.
"""

from __future__ import annotations

import functools
import http.client
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, Self, TypeVar

from raftlog.client.calls import Calls, Pause, Plan, Reply, Send, no_answer
from raftlog.client.retry import CONNECT_TIMEOUT_S, RetryPolicy

P = ParamSpec("P")
T = TypeVar("T")


def _blocking(
    plan: Callable[Concatenate[Calls, P], Plan[T]],
) -> Callable[Concatenate[Client, P], T]:
    """The call `plan` describes, as a blocking method of `Client`."""

    @functools.wraps(plan)
    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.run(plan(self.calls, *args, **kwargs))

    return call


class Client:
    def __init__(
        self,
        endpoints: Sequence[str] = (),
        *,
        token: str | None = None,
        retries: int = 8,
        retry: RetryPolicy | None = None,
        timeout_s: float = 15.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        ca_file: str | None = None,
        idempotent: bool = True,
        metadata_max_age_s: float = 30.0,
    ) -> None:
        """As `AsyncClient`'s; `timeout_s` bounds each socket operation of a call,
        `connect_timeout_s` the opening of a connection (and its TLS handshake)."""
        self.calls = Calls(
            endpoints, retry or RetryPolicy(retries=retries), idempotent, metadata_max_age_s
        )
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._ssl = ssl.create_default_context(cafile=ca_file)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._conns: dict[str, http.client.HTTPConnection] = {}
        # Shared by threads, calls interleaved on one connection: one got another's answer,
        # and sockets closed under others (found by a review).
        self._one_call = threading.Lock()

    @property
    def endpoints(self) -> list[str]:
        return self.calls.endpoints

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, plan: Plan[T]) -> T:
        """Carry a plan out: send what it asks, sleep its pauses, return its result."""
        with self._one_call:
            return self._run(plan)

    def _run(self, plan: Plan[T]) -> T:
        reply: Reply | None = None
        while True:
            try:
                step = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, Pause):
                time.sleep(step.seconds)
                reply = None
            else:
                reply = self._send(step)

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

    def _open(self, c: http.client.HTTPConnection, timeout: float) -> None:
        """Connect within `connect_timeout_s` (or `timeout` if shorter), then give the socket
        the call's `timeout`."""
        c.timeout = min(self.connect_timeout_s, timeout)
        try:
            c.connect()
        except TimeoutError:
            raise TimeoutError(
                f"connecting (TCP, and TLS for https) took over {c.timeout:g} s"
            ) from None
        finally:
            c.timeout = timeout
        if c.sock is not None:
            c.sock.settimeout(timeout)

    def _send(self, step: Send) -> Reply:
        r = step.request
        timeout = (r.timeout_s if r.timeout_s is not None else self.timeout_s) + r.wait_s
        payload = r.payload()
        headers = dict(self._headers)
        if payload is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(2):  # a kept-alive connection the node closed is retried once
            c = self._conn(step.base, timeout)
            try:
                if c.sock is None:
                    self._open(c, timeout)
                c.request(r.method, r.path, body=payload, headers=headers)
                resp = c.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                c.close()
                self._conns.pop(step.base, None)
                if attempt == 0 and isinstance(
                    e, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError
                ):
                    continue
                return no_answer(step.base, e, timeout)
            return Reply(step.base, resp.status, resp.getheader("Content-Type", ""), raw)
        raise AssertionError("unreachable: the second attempt returns")

    append = _blocking(Calls.append)
    append_keyed = _blocking(Calls.append_keyed)
    read = _blocking(Calls.read)
    index_for_time = _blocking(Calls.index_for_time)
    columns = _blocking(Calls.columns)
    snapshot_table = _blocking(Calls.snapshot_table)
    status = _blocking(Calls.status)
    peers = _blocking(Calls.peers)
    set_peers = _blocking(Calls.set_peers)
    set_peer_addresses = _blocking(Calls.set_peer_addresses)
    holds = _blocking(Calls.holds)
    set_hold = _blocking(Calls.set_hold)
    delete_hold = _blocking(Calls.delete_hold)
    leader = _blocking(Calls.leader)
    follower_lag = _blocking(Calls.follower_lag)
    change_membership = _blocking(Calls.change_membership)
    transfer_leader = _blocking(Calls.transfer_leader)
    install_snapshot = _blocking(Calls.install_snapshot)
    archive_flush = _blocking(Calls.archive_flush)
