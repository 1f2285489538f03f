"""The asynchronous client of the node API (aiohttp), and idempotent producers on top of it.

Appends go to the partition's leader: the client remembers it per partition, follows a
`not_leader` answer's hint, and otherwise tries the other endpoints. Transient failures (a node
down, no leader yet, an election: see `raftlog.client.retry`) are retried with exponential
back-off; a client mistake is raised at once as `ClientError`. What each call sends and retries
is in `raftlog.client.calls`, shared with the blocking `Client`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import aiohttp
import aiohttp.abc
import yarl

from raftlog.client.calls import (
    AppendResult,
    Calls,
    ClientError,
    Pause,
    Plan,
    Reply,
    Send,
    no_answer,
)
from raftlog.client.retry import CONNECT_TIMEOUT_S, RetryPolicy
from raftlog.client.session import SessionHolder

P = ParamSpec("P")
T = TypeVar("T")


def _awaitable(
    plan: Callable[Concatenate[Calls, P], Plan[T]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """The call `plan` describes, as a coroutine method of `AsyncClient`."""

    @functools.wraps(plan)
    async def call(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.run(plan(self.calls, *args, **kwargs))

    return call


class AsyncClient(SessionHolder):
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
        cert_file: str | None = None,
        key_file: str | None = None,
        resolver: aiohttp.abc.AbstractResolver | None = None,
        idempotent: bool = True,
        metadata_max_age_s: float = 30.0,
    ) -> None:
        """`endpoints` are the nodes appends and reads choose from (the other calls name their
        node). `retries` is short for `retry=RetryPolicy(retries=...)`. `timeout_s` bounds a
        call's request; `connect_timeout_s` bounds opening a connection within it, so that a
        node whose address answers nothing (a machine gone, a network dropping its packets)
        costs that long before the next endpoint is tried, not the whole `timeout_s`.
        `idempotent=False` sends plain appends without a producer id (as Kafka's
        `enable.idempotence=false`): a retry after a lost answer may then add records twice.
        `metadata_max_age_s`: how long `append_keyed` trusts the partition count it routes
        keys by before asking a node again (partitions added to a running cluster are routed
        to within that long). `cert_file`, `key_file` and `resolver`: see `SessionHolder`."""
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        super().__init__(
            token=token,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            timeout=self._timeout_of(timeout_s),
            resolver=resolver,
        )
        self.calls = Calls(
            endpoints, retry or RetryPolicy(retries=retries), idempotent, metadata_max_age_s
        )

    def _timeout_of(self, total_s: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total_s, sock_connect=self._connect_timeout_s)

    @property
    def endpoints(self) -> list[str]:
        return self.calls.endpoints

    async def run(self, plan: Plan[T]) -> T:
        """Carry a plan out: send what it asks, sleep its pauses, return its result."""
        reply: Reply | None = None
        while True:
            try:
                step = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                reply = None
            else:
                reply = await self._send(step)

    async def _send(self, step: Send) -> Reply:
        r = step.request
        payload = r.payload()
        kw: dict[str, Any] = {}
        if payload is not None:
            kw["data"], kw["headers"] = payload, {"Content-Type": "application/json"}
        total_s = (r.timeout_s or self._timeout_s) + r.wait_s
        if r.timeout_s is not None or r.wait_s:  # else the session's
            kw["timeout"] = self._timeout_of(total_s)
        try:
            async with self.session.request(
                r.method, yarl.URL(step.base + r.path, encoded=True), **kw
            ) as resp:  # (the plans encode their paths)
                raw = await resp.read()
                return Reply(step.base, resp.status, resp.content_type, raw)
        except (TimeoutError, OSError, aiohttp.ClientError) as e:
            return no_answer(step.base, e, total_s)

    append = _awaitable(Calls.append)
    append_keyed = _awaitable(Calls.append_keyed)
    read = _awaitable(Calls.read)
    index_for_time = _awaitable(Calls.index_for_time)
    columns = _awaitable(Calls.columns)
    snapshot_table = _awaitable(Calls.snapshot_table)
    status = _awaitable(Calls.status)
    peers = _awaitable(Calls.peers)
    set_peers = _awaitable(Calls.set_peers)
    set_peer_addresses = _awaitable(Calls.set_peer_addresses)
    holds = _awaitable(Calls.holds)
    set_hold = _awaitable(Calls.set_hold)
    delete_hold = _awaitable(Calls.delete_hold)
    leader = _awaitable(Calls.leader)
    follower_lag = _awaitable(Calls.follower_lag)
    change_membership = _awaitable(Calls.change_membership)
    transfer_leader = _awaitable(Calls.transfer_leader)
    install_snapshot = _awaitable(Calls.install_snapshot)
    archive_flush = _awaitable(Calls.archive_flush)


class IdempotentProducer:
    """Appends that land exactly once, however often a call is retried (Kafka's idempotence).

    Each partition's records get consecutive sequence numbers under this producer's id; a failed
    append keeps its sequence numbers, so calling `append` again with the same records retries
    it safely. Concurrent appends to one partition go one at a time, in the order they were
    called (the node takes a producer's sequences in order). Use one producer id per writer.

    Its sequences live in this object: a writer that restarts under the same id must give
    `next_sequences` (each partition's `next_sequence`, kept with its own progress), or use a
    new id. Started at 0 again, its first records were taken for ones already in the log (409
    `already_appended`, or `sequence_conflict` while the node still compares them) and not
    appended.
    """

    def __init__(
        self,
        client: AsyncClient,
        producer_id: str,
        next_sequences: Mapping[int, int] | None = None,
    ) -> None:
        self.client = client
        self.producer_id = producer_id
        self._next: dict[int, int] = dict(next_sequences or {})
        self._pending: dict[int, list[dict[str, Any]]] = {}
        self._turns: dict[int, asyncio.Lock] = {}  # asyncio's Lock wakes its waiters in order

    def next_sequence(self, partition: int) -> int:
        """The sequence this producer's next record to `partition` gets."""
        return self._next.get(partition, 0)

    async def append(self, partition: int, records: list[dict[str, Any]]) -> AppendResult:
        async with self._turns.setdefault(partition, asyncio.Lock()):
            pending = self._pending.get(partition)
            if pending is not None and pending != records:
                raise ValueError(
                    "the previous append to this partition failed: retry it with the same "
                    "records before appending others"
                )
            self._pending[partition] = list(records)  # a copy: the caller may reuse its list
            seq = self._next.get(partition, 0)
            try:
                result = await self.client.append(
                    partition, records, producer_id=self.producer_id, sequence=seq
                )
            except ClientError as e:
                if not e.retryable:  # a definite answer: nothing of it to retry
                    del self._pending[partition]
                    if e.error == "already_appended":  # in the log: its sequences are used
                        self._next[partition] = seq + len(records)
                raise
            self._next[partition] = seq + len(records)
            del self._pending[partition]
            return result
