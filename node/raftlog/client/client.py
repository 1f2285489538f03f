"""A client of the node API with leader discovery and bounded retries.

Appends go to the partition's leader: the client remembers it per partition, follows a
`not_leader` answer's hint, and otherwise tries the other endpoints. Transient failures (a node
down, no leader yet, an election) are retried with exponential back-off up to `retries` times;
a client mistake (4xx other than 421) is raised at once as `ClientError`.

Appends are idempotent by default, as Kafka's producers are since 3.0: a retry after a lost
answer (a timeout, a dropped connection, a leader deposed mid-append) must not add the records
twice, so each append carries a producer id and sequence (see `_Lanes`).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from raftlog.client.session import SessionHolder
from raftlog.node.routing import partition_for


class ClientError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.error = body.get("error", "error")
        super().__init__(f"HTTP {status} {self.error}: {body.get('reason', '')}")


@dataclass(frozen=True)
class AppendResult:
    partition: int
    first_index: int
    last_index: int
    term: int
    duplicate: bool = False  # an idempotent retry answered with the first attempt's indexes


_RETRYABLE = {421, 502, 503, 504}


@dataclass
class _Lane:
    producer_id: str
    next_sequence: int = 0


@dataclass
class _Lanes:
    """The producer ids one client's plain appends to one partition go under.

    The node admits a producer's sequences strictly in order, so a lane carries one append at a
    time; concurrent appends each take a free lane (made on demand), so they still run in
    parallel. A lane whose append failed is dropped: whether its records landed is unknown, and a
    fresh producer id never collides with them.
    """

    prefix: str
    free: list[_Lane] = field(default_factory=list)
    made: itertools.count[int] = field(default_factory=itertools.count)

    def take(self) -> _Lane:
        return self.free.pop() if self.free else _Lane(f"{self.prefix}.{next(self.made)}")


class AsyncClient(SessionHolder):
    def __init__(
        self,
        endpoints: list[str],
        *,
        token: str | None = None,
        retries: int = 8,
        backoff_s: float = 0.05,
        timeout_s: float = 15.0,
        ca_file: str | None = None,
        idempotent: bool = True,
    ) -> None:
        """`idempotent=False` sends plain appends without a producer id (as Kafka's
        `enable.idempotence=false`): a retry after a lost answer may then add records twice."""
        if not endpoints:
            raise ValueError("endpoints: at least one node URL is needed")
        super().__init__(
            token=token, ca_file=ca_file, timeout=aiohttp.ClientTimeout(total=timeout_s)
        )
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.retries = retries
        self.backoff_s = backoff_s
        self._leaders: dict[int, str] = {}
        self._partitions: int | None = None
        self.idempotent = idempotent
        self._producer = f"client-{uuid.uuid4().hex}"  # unique per client: never shared
        self._lanes: dict[int, _Lanes] = {}

    async def _request(self, method: str, url: str, **kw: Any) -> tuple[int, dict[str, Any]]:
        async with self.session.request(method, url, **kw) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = {"error": "bad_response", "reason": (await resp.text())[:200]}
            return resp.status, body

    async def append(
        self,
        partition: int,
        records: list[dict[str, Any]],
        *,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> AppendResult:
        """Append records (each `{"key": ..., "value": ...}`) as one batch; returns after commit.

        The retries this method makes land the records exactly once: under this client's own
        producer ids (unless made with `idempotent=False`), or under `producer_id` and
        `sequence` (of the first record) when given, which also makes a retry of the same call
        by the caller land once.
        """
        if producer_id is not None or not self.idempotent:
            return await self._append(partition, records, producer_id, sequence)
        lanes = self._lanes.setdefault(partition, _Lanes(f"{self._producer}.p{partition}"))
        lane = lanes.take()
        result = await self._append(partition, records, lane.producer_id, lane.next_sequence)
        lane.next_sequence += len(records)  # not reached on failure: the lane is dropped
        lanes.free.append(lane)
        return result

    async def _append(
        self,
        partition: int,
        records: list[dict[str, Any]],
        producer_id: str | None,
        sequence: int | None,
    ) -> AppendResult:
        body: dict[str, Any] = {"records": records}
        if producer_id is not None:
            body["producer_id"], body["sequence"] = producer_id, sequence
        last_error: Exception | None = None
        for attempt in range(self.retries + 1):
            base = self._leaders.get(partition) or self.endpoints[attempt % len(self.endpoints)]
            try:
                status, reply = await self._request(
                    "POST", f"{base}/v1/partitions/{partition}/records", json=body
                )
            except (TimeoutError, aiohttp.ClientError) as e:
                last_error = e
                self._leaders.pop(partition, None)
            else:
                if status == 200:
                    self._leaders[partition] = base
                    return AppendResult(
                        reply["partition"],
                        reply["first_index"],
                        reply["last_index"],
                        reply["term"],
                        bool(reply.get("duplicate", False)),
                    )
                if status not in _RETRYABLE:
                    raise ClientError(status, reply)
                last_error = ClientError(status, reply)
                hint = reply.get("leader_url")
                if hint:
                    self._leaders[partition] = hint
                    continue  # follow the hint at once
                self._leaders.pop(partition, None)
            await asyncio.sleep(self.backoff_s * (2 ** min(attempt, 6)) * random.uniform(0.5, 1.5))
        raise last_error or RuntimeError("append failed")

    async def append_keyed(self, records: list[dict[str, Any]], **kw: Any) -> AppendResult:
        """Append records routed by key (all of them must map to one partition)."""
        if self._partitions is None:
            st = await self._any_status()
            self._partitions = len(st["partitions"])
        parts = {partition_for(str(r["key"]).encode(), self._partitions) for r in records}
        if len(parts) != 1:
            raise ValueError(f"the keys map to partitions {sorted(parts)}; append them apart")
        return await self.append(parts.pop(), records, **kw)

    async def _any_status(self) -> dict[str, Any]:
        last: Exception | None = None
        for url in self.endpoints:
            try:
                return await self.status(url)
            except (TimeoutError, aiohttp.ClientError, ClientError) as e:
                last = e
        raise last or RuntimeError("no endpoint answered")

    async def read(
        self,
        partition: int,
        start: int = 1,
        limit: int = 100,
        *,
        endpoint: str | None = None,
        min_index: int = 0,
        wait_ms: int = 0,
    ) -> dict[str, Any]:
        """Committed records from `start`, from one replica (any, unless `endpoint`)."""
        params = {"from": start, "limit": limit, "min_index": min_index, "wait_ms": wait_ms}
        targets = [endpoint] if endpoint else self.endpoints
        last_error: Exception | None = None
        for attempt in range(self.retries + 1):
            base = targets[attempt % len(targets)]
            try:
                status, reply = await self._request(
                    "GET", f"{base}/v1/partitions/{partition}/records", params=params
                )
            except (TimeoutError, aiohttp.ClientError) as e:
                last_error = e
            else:
                if status == 200:
                    return reply
                if status not in _RETRYABLE:
                    raise ClientError(status, reply)
                last_error = ClientError(status, reply)
            await asyncio.sleep(self.backoff_s * (2 ** min(attempt, 6)))
        raise last_error or RuntimeError("read failed")

    async def status(self, endpoint: str) -> dict[str, Any]:
        status, reply = await self._request("GET", f"{endpoint.rstrip('/')}/v1/status")
        if status != 200:
            raise ClientError(status, reply)
        return reply


class Client:
    """The blocking face of `AsyncClient` (for scripts and the CLI)."""

    def __init__(self, endpoints: list[str], **kw: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = AsyncClient(endpoints, **kw)

    def append(self, partition: int, records: list[dict[str, Any]]) -> AppendResult:
        return self._loop.run_until_complete(self._client.append(partition, records))

    def read(self, partition: int, start: int = 1, limit: int = 100, **kw: Any) -> dict[str, Any]:
        return self._loop.run_until_complete(self._client.read(partition, start, limit, **kw))

    def status(self, endpoint: str) -> dict[str, Any]:
        return self._loop.run_until_complete(self._client.status(endpoint))

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IdempotentProducer:
    """Appends that land exactly once, however often a call is retried (Kafka's idempotence).

    Each partition's records get consecutive sequence numbers under this producer's id; a failed
    append keeps its sequence numbers, so calling `append` again with the same records retries
    it safely. Concurrent appends to one partition go one at a time, in the order they were
    called (the node takes a producer's sequences in order). Use one producer id per writer,
    and a new id after losing its state.
    """

    def __init__(self, client: AsyncClient, producer_id: str) -> None:
        self.client = client
        self.producer_id = producer_id
        self._next: dict[int, int] = {}
        self._pending: dict[int, list[dict[str, Any]]] = {}
        self._turns: dict[int, asyncio.Lock] = {}  # asyncio's Lock wakes its waiters in order

    async def append(self, partition: int, records: list[dict[str, Any]]) -> AppendResult:
        async with self._turns.setdefault(partition, asyncio.Lock()):
            pending = self._pending.get(partition)
            if pending is not None and pending != records:
                raise ValueError(
                    "the previous append to this partition failed: retry it with the same "
                    "records before appending others"
                )
            self._pending[partition] = records
            seq = self._next.get(partition, 0)
            result = await self.client.append(
                partition, records, producer_id=self.producer_id, sequence=seq
            )
            self._next[partition] = seq + len(records)
            del self._pending[partition]
            return result
