"""The calls of the node API, written once for both clients as sans-I/O plans.

A plan is a generator: it yields the requests to send (`Send`) and the pauses to make (`Pause`),
is sent each request's `Reply`, and returns the call's result or raises `ClientError`. Which
node to ask, what to retry, when to follow a leader hint and how long to wait live here; the
clients only carry plans out, `AsyncClient` with aiohttp and `Client` with blocking
`http.client`, so the two behave alike by construction (and the plans are tested without I/O).

Appends are idempotent by default, as Kafka's producers are since 3.0: a retry after a lost
answer (a timeout, a dropped connection, a leader deposed mid-append) must not add the records
twice, so each append carries a producer id and sequence (see `_Lanes`).
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.parse
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from raftlog.client.retry import NO_ANSWER, RetryPolicy, retried
from raftlog.node.routing import FieldError, field_bytes, partition_for

T = TypeVar("T")


class ClientError(Exception):
    """A node refused a call (its HTTP status and JSON body), or none answered it (status
    `NO_ANSWER`, 0, and why in the body's `reason`)."""

    def __init__(self, status: int, body: dict[str, Any], url: str = "") -> None:
        self.status = status
        self.body = body
        self.url = url  # the node's base URL, when one was asked
        self.error = str(body.get("error", "error" if status else "no_answer"))
        self.reason = str(body.get("reason") or self.error)
        where = f"{url}: " if url else ""
        if status != NO_ANSWER:
            # The field a refusal names, as the node's answer gives it (400s, 409s, 413s).
            field = f" (field {body['field']})" if body.get("field") else ""
            reason = body.get("reason", "")
            super().__init__(f"{where}HTTP {status} {self.error}{field}: {reason}")
        else:
            super().__init__(f"{where}no answer: {self.reason}")

    @property
    def retryable(self) -> bool:
        """Whether another try (or another replica) may answer otherwise."""
        return retried(self.status)

    def __reduce__(self) -> tuple[type[ClientError], tuple[int, dict[str, Any], str]]:
        # Spark sends a task's exception back to the driver pickled.
        return ClientError, (self.status, self.body, self.url)


@dataclass(frozen=True)
class AppendResult:
    partition: int
    first_index: int
    last_index: int
    term: int
    duplicate: bool = False  # an idempotent retry answered with the first attempt's indexes


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # percent-encoded, with its query
    body: Any = None  # sent as JSON when not None
    timeout_s: float | None = None  # None: the client's
    wait_s: float = 0.0  # how long the node may hold the answer (a long poll), on top of it

    def payload(self) -> bytes | None:
        return None if self.body is None else json.dumps(self.body).encode()


@dataclass(frozen=True)
class Send:
    base: str  # the node's URL
    request: Request


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Reply:
    """A node's answer to a `Send`, or that none came (`status` NO_ANSWER, `reason` why)."""

    base: str
    status: int
    content_type: str = ""
    raw: bytes = b""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def _object(self) -> dict[str, Any] | None:
        try:
            body = json.loads(self.raw) if self.raw else {}
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _bad(self, why: str) -> ClientError:
        return ClientError(self.status, {"error": "bad_response", "reason": why}, self.base)

    def error(self) -> ClientError:
        if self.status == NO_ANSWER:
            return ClientError(NO_ANSWER, {"error": "no_answer", "reason": self.reason}, self.base)
        body = self._object()
        if body is None:  # a proxy's page, say: its start is the best reason there is
            return self._bad(self.raw[:200].decode(errors="replace"))
        return ClientError(self.status, body, self.base)

    def json(self) -> dict[str, Any]:
        """The JSON object of a 2xx answer (an empty body: {})."""
        body = self._object()
        if body is None:
            raise self._bad(f"not a JSON object: {self.raw[:200]!r}")
        return body

    def msgpack(self) -> dict[str, Any]:
        """The msgpack map of a 2xx answer (a column page, a table)."""
        try:
            return dict(msgspec.msgpack.decode(self.raw))
        except (msgspec.DecodeError, TypeError, ValueError) as e:
            raise self._bad(f"not a msgpack map: {e}") from None


Step = Send | Pause
Plan = Generator[Step, Reply | None, T]  # what a call does, carried out by a client


def no_answer(base: str, error: BaseException, timeout_s: float) -> Reply:
    """`base` gave no answer: the error says why, or the time waited when it says nothing (a
    call's own timeout has no message in asyncio, "timed out" in a socket)."""
    said, kind = str(error), type(error).__name__
    if isinstance(error, TimeoutError) and said in ("", "timed out"):
        return Reply(base, NO_ANSWER, reason=f"timed out after {timeout_s:g} s ({kind})")
    return Reply(base, NO_ANSWER, reason=f"{kind}: {said}")


def _routing_key(i: int, record: dict[str, Any]) -> bytes:
    """A record's key bytes as the node takes them (`key`, or `key_b64`), or ValueError naming
    the field as the node's 400 would (a bare KeyError was all a keyless record got)."""
    key = field_bytes(record.get("key"), record.get("key_b64"), f"records[{i}].key")
    if key is None:
        raise FieldError(f"records[{i}].key", "is required to route a record by key")
    return key


def ask(base: str, request: Request) -> Plan[Reply]:
    """One try of `request` at `base`, whatever the answer."""
    reply = yield Send(base.rstrip("/"), request)
    assert reply is not None, "a client answers every Send with a Reply"
    return reply


def once(base: str, request: Request) -> Plan[Reply]:
    """One try of `request` at `base`: its 2xx answer, or ClientError."""
    reply = yield from ask(base, request)
    if not reply.ok:
        raise reply.error()
    return reply


def _q(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _next(order: list[str], last: str, usable: Callable[[str], bool], avoid: set[str]) -> str:
    """The first usable endpoint of `order` after `last` (cyclically), one not in `avoid` if
    any is usable."""
    at = order.index(last) if last in order else -1
    turn = [order[(at + k) % len(order)] for k in range(1, len(order) + 1)]
    pool = [t for t in turn if usable(t)]
    return next((t for t in pool if t not in avoid), pool[0])


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


class Calls:
    """The calls of the node API as plans, and what a client remembers between calls (each
    partition's leader, the partition count, the producer lanes).

    Appends and reads choose the node among `endpoints` and retry under `retry`. Every other
    call is one try at one node: the node's own calls (status, peers, holds, pages) at the
    `endpoint` given, and the admin calls on a partition at its leader (`endpoint`, else the
    leader found among `endpoints`). Those are not retried here: a membership change or a
    transfer that timed out may still happen, and the caller (a person, the operator's next
    pass, a reader's loop over replicas) knows better whether to ask again. The one exception
    is the archive flush at a leader this client finds: asking again is always safe (it
    archives what is committed then), and a leader answers "ask again" when its leadership
    moved during the flush.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        retry: RetryPolicy,
        idempotent: bool,
        metadata_max_age_s: float = 30.0,
    ) -> None:
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.retry = retry
        self.idempotent = idempotent
        # How long the partition count that keys are routed by is trusted (Kafka's
        # metadata.max.age.ms): a count kept for good never routed to partitions added since.
        self.metadata_max_age_s = metadata_max_age_s
        self._partitions_at = 0.0
        self._leaders: dict[int, str] = {}
        # The admin API's leaders apart: with split ports, their URLs are the peer port's.
        self._admin_leaders: dict[int, str] = {}
        self._partitions: int | None = None
        self._producer = f"client-{uuid.uuid4().hex}"  # unique per client: never shared
        self._lanes: dict[int, _Lanes] = {}

    def _targets(self, endpoint: str | None = None) -> list[str]:
        if endpoint:
            return [endpoint.rstrip("/")]
        if not self.endpoints:
            raise ValueError("endpoints: at least one node URL is needed for this call")
        return self.endpoints

    def _retried(
        self,
        request: Request,
        targets: list[str],
        leader_of: int | None = None,
        final: frozenset[str] = frozenset(),
        admin: bool = False,
    ) -> Plan[Reply]:
        """`request` until a 2xx answer, to `targets` in turn; with `leader_of`, to that
        partition's leader when known, following the hints of nodes that are not. An answer
        whose error is in `final` is raised at once, retryable or not."""
        leaders = self._admin_leaders if admin else self._leaders
        tries = self.retry.start()
        lacking: set[str] = set()  # nodes that answered they have no such partition
        silent: dict[str, int] = {}  # nodes that gave no answer: the ask that found it
        asks = 0
        base = ""
        while True:
            known = leaders.get(leader_of) if leader_of is not None else None
            # Silent until each other node was asked once since (then asked again: a live
            # leader that missed one answer is still the one to ask).
            quiet = {n for n, at in silent.items() if asks - at < len(targets)}
            # The endpoint after the last one asked, skipping those that lack the partition and,
            # while any other is left, those quiet: after a leader's crash, the rotation would
            # otherwise spend every other try on it.
            base = known or _next(targets, base, lambda t: t not in lacking, quiet)
            asks += 1
            reply = yield from ask(base, request)
            if reply.ok:
                if leader_of is not None:
                    leaders[leader_of] = base
                return reply
            error = reply.error()
            if error.status == NO_ANSWER:
                silent[base] = asks
            else:
                silent.pop(base, None)
            if error.status == 404 and error.error == "unknown_partition":
                # While a raised partition count rolls out, members not yet restarted lack the
                # new partitions: the others are asked at once, and the call fails only once
                # every node said so (a partition that does not exist fails without a pause).
                lacking.add(base)
                if leader_of is not None:
                    leaders.pop(leader_of, None)
                if lacking.issuperset(targets):
                    raise error
                continue
            if not error.retryable or error.error in final:
                raise error
            hint = error.body.get("leader_url") if leader_of is not None else None
            if hint and asks - silent.get(str(hint).rstrip("/"), -len(targets)) < len(targets):
                # Followers name a crashed leader until their election timeout: its silence
                # this round outweighs their word, so the others are asked, after a pause.
                hint = None
            if leader_of is not None:
                if hint:
                    leaders[leader_of] = str(hint).rstrip("/")
                else:
                    leaders.pop(leader_of, None)
            pause = tries.again()
            if pause is None:
                raise error
            if not hint:  # a hint is followed at once
                yield Pause(pause)

    # ------------------------------------------------------------------ records
    def append(
        self,
        partition: int,
        records: list[dict[str, Any]],
        *,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> Plan[AppendResult]:
        """Append records (each `{"key": ..., "value": ...}`) as one batch; returns after commit.

        The retries this call makes land the records exactly once: under this client's own
        producer ids (unless made with `idempotent=False`), or under `producer_id` and
        `sequence` (of the first record) when given, which also makes a retry of the same call
        by the caller land once.
        """
        if producer_id is not None or not self.idempotent:
            return (yield from self._append(partition, records, producer_id, sequence))
        lanes = self._lanes.setdefault(partition, _Lanes(f"{self._producer}.p{partition}"))
        lane = lanes.take()
        result = yield from self._append(partition, records, lane.producer_id, lane.next_sequence)
        lane.next_sequence += len(records)  # not reached on failure: the lane is dropped
        lanes.free.append(lane)
        return result

    def _append(
        self,
        partition: int,
        records: list[dict[str, Any]],
        producer_id: str | None,
        sequence: int | None,
    ) -> Plan[AppendResult]:
        body: dict[str, Any] = {"records": records}
        if producer_id is not None:
            body["producer_id"], body["sequence"] = producer_id, sequence
        request = Request("POST", f"/v1/partitions/{partition}/records", body)
        # Without a producer id, a retry of a batch whose first records went in would append
        # them twice: told at once instead (with one, the retry appends only the rest).
        final = frozenset() if producer_id is not None else frozenset({"partly_appended"})
        reply = (yield from self._retried(request, self._targets(), partition, final)).json()
        return AppendResult(
            reply["partition"],
            reply["first_index"],
            reply["last_index"],
            reply["term"],
            bool(reply.get("duplicate", False)),
        )

    def append_keyed(
        self,
        records: list[dict[str, Any]],
        *,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> Plan[AppendResult]:
        """Append records routed by key (all of them must map to one partition), by a
        partition count asked again once older than `metadata_max_age_s`."""
        now = time.monotonic()
        if self._partitions is None or now - self._partitions_at >= self.metadata_max_age_s:
            self._partitions = len((yield from self._any_status())["partitions"])
            self._partitions_at = now
        parts = {partition_for(_routing_key(i, r), self._partitions) for i, r in enumerate(records)}
        if len(parts) != 1:
            raise ValueError(f"the keys map to partitions {sorted(parts)}; append them apart")
        return (
            yield from self.append(parts.pop(), records, producer_id=producer_id, sequence=sequence)
        )

    def _any_status(self) -> Plan[dict[str, Any]]:
        last: ClientError | None = None
        for url in self._targets():
            reply = yield from ask(url, Request("GET", "/v1/status"))
            if reply.ok:
                return reply.json()
            last = reply.error()
        assert last is not None
        raise last

    def read(
        self,
        partition: int,
        start: int = 1,
        limit: int = 100,
        *,
        endpoint: str | None = None,
        min_index: int = 0,
        wait_ms: int = 0,
    ) -> Plan[dict[str, Any]]:
        """Committed records from `start`, from one replica (any, unless `endpoint`)."""
        query = f"from={start}&limit={limit}&min_index={min_index}&wait_ms={wait_ms}"
        # A long poll past the client's timeout timed out on a quiet partition, every time.
        request = Request(
            "GET", f"/v1/partitions/{partition}/records?{query}", wait_s=max(wait_ms, 0) / 1000
        )
        return (yield from self._retried(request, self._targets(endpoint))).json()

    def index_for_time(
        self, endpoint: str, partition: int, timestamp_ms: int, *, min_index: int = 0
    ) -> Plan[dict[str, Any]]:
        """The first index stamped at or after `timestamp_ms` that `endpoint` holds
        (`{"index": ..., "compacted": ...}`); 503 `behind` below `min_index`."""
        query = f"timestamp_ms={timestamp_ms}&min_index={min_index}"
        path = f"/v1/partitions/{partition}/index-for-time?{query}"
        return (yield from once(endpoint, Request("GET", path))).json()

    def columns(
        self, endpoint: str, partition: int, start: int, stop: int, limit: int
    ) -> Plan[dict[str, Any]]:
        """A column page of committed records [start, stop) from `endpoint` (503 `behind` when
        it has not committed `stop` - 1 yet)."""
        # Integers need no encoding, and urlencode took most of a page call's own time.
        query = f"from={start}&to={stop}&limit={limit}&min_index={stop - 1}"
        path = f"/v1/partitions/{partition}/columns?{query}"
        return (yield from once(endpoint, Request("GET", path))).msgpack()

    def snapshot_table(self, endpoint: str, partition: int) -> Plan[dict[str, Any]]:
        """The keyed table of `endpoint`'s latest snapshot of the partition."""
        path = f"/v1/partitions/{partition}/snapshot/table"
        return (yield from once(endpoint, Request("GET", path))).msgpack()

    # ------------------------------------------------------------------ one node
    def status(self, endpoint: str, *, timeout_s: float | None = None) -> Plan[dict[str, Any]]:
        request = Request("GET", "/v1/status", timeout_s=timeout_s)
        return (yield from once(endpoint, request)).json()

    def peers(self, endpoint: str) -> Plan[dict[str, str]]:
        """The peers the node knows, name -> URL."""
        reply = (yield from once(endpoint, Request("GET", "/v1/admin/peers"))).json()
        return dict(reply.get("peers", {}))

    def set_peers(self, endpoint: str, peers: Mapping[str, str]) -> Plan[dict[str, str]]:
        """Tell the node these peers' URLs; the peers it knows after."""
        request = Request("POST", "/v1/admin/peers", dict(peers))
        return dict((yield from once(endpoint, request)).json().get("peers", {}))

    def set_peer_addresses(
        self, endpoint: str, addresses: Mapping[str, str]
    ) -> Plan[dict[str, str]]:
        """Tell the node where these peers' pods are (IP addresses, tried beside their names);
        every address it holds after."""
        request = Request("POST", "/v1/admin/peer-addresses", dict(addresses))
        return dict((yield from once(endpoint, request)).json().get("addresses", {}))

    def holds(self, endpoint: str, partition: int) -> Plan[dict[str, Any]]:
        """The node's retention holds on the partition, and its compaction floor."""
        path = f"/v1/admin/partitions/{partition}/holds"
        return (yield from once(endpoint, Request("GET", path))).json()

    def set_hold(
        self, endpoint: str, partition: int, holder: str, min_index: int, ttl_s: float
    ) -> Plan[dict[str, Any]]:
        """Keep the node from compacting the partition past `min_index` for `ttl_s` (set again
        to renew); 410 when it already has."""
        path = f"/v1/admin/partitions/{partition}/holds/{_q(holder)}"
        request = Request("PUT", path, {"min_index": min_index, "ttl_seconds": ttl_s})
        return (yield from once(endpoint, request)).json()

    def delete_hold(self, endpoint: str, partition: int, holder: str) -> Plan[None]:
        path = f"/v1/admin/partitions/{partition}/holds/{_q(holder)}"
        yield from once(endpoint, Request("DELETE", path))

    # ------------------------------------------------------------------ a partition's leader
    def leader(self, partition: int) -> Plan[str]:
        """The endpoint that leads the partition, as the endpoints' statuses say: else why
        not (the last endpoint's own error when none answered; 404 `unknown_partition` when
        those that answered host no such partition; 503 `no_leader` otherwise)."""
        failed: ClientError | None = None
        hosted: set[int] = set()
        for url in self._targets():
            reply = yield from ask(url, Request("GET", "/v1/status"))
            if not reply.ok:
                failed = reply.error()
                continue
            for p in reply.json().get("partitions", []):
                hosted.add(p.get("partition"))
                if p.get("partition") == partition and p.get("role") == "leader":
                    return url
        if not hosted and failed is not None:
            raise failed
        if partition not in hosted:
            known = f"0..{max(hosted)}" if hosted else "none"
            reason = f"partition {partition} does not exist ({known})"
            raise ClientError(404, {"error": "unknown_partition", "reason": reason})
        reason = f"no leader found for partition {partition}"
        raise ClientError(503, {"error": "no_leader", "reason": reason})

    def _at_leader(
        self, partition: int, endpoint: str | None, request: Request
    ) -> Plan[dict[str, Any]]:
        base = endpoint or (yield from self.leader(partition))
        reply = yield from ask(base, request)
        if not reply.ok:
            error = reply.error()
            if error.error != "admin_on_peer_port":
                raise error
            # Split ports: the leader's client URL names its peer URL, where the admin API is.
            reply = yield from once(str(error.body.get("leader_url") or base), request)
        return reply.json()

    def follower_lag(
        self, partition: int, node: str, *, endpoint: str | None = None
    ) -> Plan[dict[str, Any]]:
        """How far `node` lags behind the partition's leader, and its replication state."""
        path = f"/v1/admin/partitions/{partition}/followers/{_q(node)}/lag"
        return (yield from self._at_leader(partition, endpoint, Request("GET", path)))

    def change_membership(
        self,
        partition: int,
        op: str,
        node: str,
        url: str | None = None,
        *,
        endpoint: str | None = None,
    ) -> Plan[dict[str, Any]]:
        """`op` ("add_learner" with the new member's `url`, "promote", "remove") on `node`;
        the partition's voters and learners after."""
        body: dict[str, Any] = {"op": op, "node": node}
        if url is not None:
            body["url"] = url
        request = Request("POST", f"/v1/admin/partitions/{partition}/members", body)
        return (yield from self._at_leader(partition, endpoint, request))

    def transfer_leader(
        self, partition: int, target: str, *, endpoint: str | None = None
    ) -> Plan[dict[str, Any]]:
        """Hand the partition's leadership to the voter `target`."""
        path = f"/v1/admin/partitions/{partition}/transfer"
        request = Request("POST", path, {"target": target})
        return (yield from self._at_leader(partition, endpoint, request))

    def install_snapshot(
        self,
        partition: int,
        target: str,
        source: str = "leader",
        *,
        endpoint: str | None = None,
        timeout_s: float | None = None,
    ) -> Plan[dict[str, Any]]:
        """Install a snapshot on `target` from `source` (a follower's name, or "leader"); the
        answer comes once the whole snapshot is streamed, so give a `timeout_s` to match."""
        path = f"/v1/admin/partitions/{partition}/snapshot-install"
        request = Request("POST", path, {"target": target, "source": source}, timeout_s)
        return (yield from self._at_leader(partition, endpoint, request))

    def archive_flush(
        self, partition: int, *, endpoint: str | None = None, timeout_s: float | None = None
    ) -> Plan[dict[str, Any]]:
        """Have the partition's leader archive everything committed now (a backup point): its
        `archived_index`, at least the `commit` it read when asked. Without `endpoint`, retried
        under the client's policy at the leader found (`raftctl backup create`); at an
        `endpoint` (the operator's pass), one try."""
        request = Request("POST", f"/v1/admin/partitions/{partition}/archive", {}, timeout_s)
        if endpoint:
            return (yield from self._at_leader(partition, endpoint, request))
        reply = yield from self._retried(request, self._targets(), leader_of=partition, admin=True)
        return reply.json()
