"""The node's HTTP API (aiohttp): client `/v1`, peer `/peer/v1`, health.

Errors are JSON `{"error": code, "field": ..., "reason": ...}` with a 4xx for the caller's
mistakes (never a 500): 400 bad input, 401 missing or wrong token, 404 unknown partition,
410 below the compaction floor (and, with archiving on, not in the archive either: reads below the
floor are served from it, `archive_reads`), 413 too large, 421 not the leader (with a hint), and
503 when the partition cannot take writes now (no leader yet, storage failed, commit timed out) or
the archive cannot be read now; 502 when the archive answered with damaged objects.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any, Literal
from urllib.parse import unquote_to_bytes

import aiohttp
import msgspec
from aiohttp import web

from raftlog.node import native
from raftlog.node.core.errors import Compacted, NotLeader, ProposalRefused
from raftlog.node.core.raft import Role
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import decode_record
from raftlog.node.routing import partition_for
from raftlog.node.server import admin, archive_reads, columnar, timeindex, walpage
from raftlog.node.server.api_common import (
    NODE_KEY,
    ApiError,
    add_route,
    bad,
    driver_of,
    int_param,
    make_guard,
    node_of,
    not_leader,
    query_param,
    stopped,
)
from raftlog.node.server.append_parse import parse_append
from raftlog.node.server.node import Node
from raftlog.node.server.partition import (
    AlreadyAppended,
    LeadershipLost,
    NotCommitted,
    PartitionDriver,
    PartlyAppended,
    ProducerBusy,
    SequenceConflict,
    SnapshotTooOld,
)
from raftlog.node.storage.errors import (
    SnapshotCorruption,
    SnapshotNoRoom,
    StorageFailed,
    WalCorruption,
)
from raftlog.node.storage.snapshots import Chunk


def require_mark(driver: PartitionDriver, min_index: int) -> None:
    """503 `behind` when this replica's high-water mark is below `min_index` (read-your-writes:
    the caller retries, or asks another replica)."""
    hwm = driver.high_water_mark
    if min_index > hwm:
        raise ApiError(
            503,
            "behind",
            f"this replica's high-water mark {hwm} is below {min_index}",
            high_water_mark=hwm,
        )


def refuse_unless_fits(request: web.Request, max_bytes: int) -> None:
    """503 `busy` before a page of up to `max_bytes` is read, when held answers leave it no
    room (`AnswerBudget.may_take`)."""
    answers = node_of(request).answers
    if not answers.may_take(max_bytes):
        raise ApiError(503, "busy", answers.busy_reason(), headers={"Retry-After": "1"})


def _header_json(key: str, value: bytes) -> dict[str, str]:
    try:
        return {"key": key, "value": value.decode()}
    except UnicodeDecodeError:
        return {"key": key, "value_b64": base64.b64encode(value).decode()}


def _record_json(index: int, term: int, data: bytes) -> dict[str, Any]:
    try:
        r = decode_record(data)
    except msgspec.DecodeError:
        return {"index": index, "term": term, "raw_b64": base64.b64encode(data).decode()}
    out: dict[str, Any] = {"index": index, "term": term}
    for name, v in (("key", r.key), ("value", r.value)):
        if v is None:
            out[name] = None
            continue
        try:
            out[name] = v.decode()
        except UnicodeDecodeError:
            out[f"{name}_b64"] = base64.b64encode(v).decode()
    if isinstance(r.headers, dict):
        out["headers"] = r.headers
    else:
        out["headers"] = [_header_json(k, v) for k, v in r.headers]
    out["timestamp_ms"] = r.timestamp_ms
    return out


# ====================================================================== client API
async def append(request: web.Request) -> web.Response:
    node, driver = node_of(request), driver_of(request)
    answer = await append_body(node, driver, await request.read())
    return web.Response(body=answer, headers=_JSON_HEADERS)


async def append_body(node: Node, driver: PartitionDriver, raw: bytes) -> bytes:
    """An append of a raw request body to `driver`: its JSON answer once committed, or `ApiError`.
    (The client listener, `listener.py`, answers its appends with this too.)"""
    limits = node.settings.max_record_bytes, node.settings.max_records_per_append
    return await _append_to(node, driver, *parse_append(raw, *limits))


async def append_by_key(request: web.Request) -> web.Response:
    """Records routed by key: the partition is `partition_for(key)`, the same for every client."""
    node = node_of(request)
    limits = node.settings.max_record_bytes, node.settings.max_records_per_append
    parsed = parse_append(await request.read(), *limits)
    parts = set()
    for i, data in enumerate(parsed[0]):
        key = decode_record(data).key
        if key is None:
            raise bad(f"records[{i}].key", "is required to route a record by key")
        parts.add(partition_for(key, len(node.drivers)))
    if len(parts) > 1:
        raise bad("records", f"the keys map to partitions {sorted(parts)}; send one per partition")
    driver = node.driver(parts.pop())
    assert driver is not None
    answer = await _append_to(node, driver, *parsed)
    return web.Response(body=answer, headers=_JSON_HEADERS)


_JSON_HEADERS = {"Content-Type": "application/json"}
# How often a long poll checks that its client is still there.
LONG_POLL_CHECK_S = 1.0


async def _append_to(
    node: Node, driver: PartitionDriver, records: list[bytes], producer: str | None, first_seq: int
) -> bytes:
    if driver.failed is not None:
        raise stopped(driver.failed)
    if driver.raft.role != Role.LEADER:
        raise not_leader(node, driver)
    timeout = node.settings.append_timeout_s  # the driver checks it (no timer per append)
    try:
        if producer:
            done = await driver.propose_idempotent(producer, first_seq, records, timeout)
        else:
            done = await driver.propose(records, timeout)
    except NotLeader:
        raise not_leader(node, driver) from None
    except ProposalRefused as e:
        raise ApiError(503, "refused", str(e)) from None
    except ProducerBusy as e:
        raise ApiError(503, "producer_busy", str(e)) from None
    except AlreadyAppended as e:
        raise ApiError(409, "already_appended", str(e), "sequence") from None
    except SequenceConflict as e:
        raise ApiError(409, "sequence_conflict", str(e), "sequence") from None
    except NotCommitted as e:
        raise ApiError(503, "not_committed", f"{e}; the append did not happen, retry") from None
    except PartlyAppended as e:
        raise ApiError(
            503,
            "partly_appended",
            f"{e}; retry with the same producer id and sequence to append the rest once "
            "(without a producer id, a retry appends the first records again)",
        ) from None
    except LeadershipLost as e:
        hint = not_leader(node, driver).body
        raise ApiError(
            503,
            "leader_lost",
            f"{e}: the outcome is unknown; retry on the leader (with a producer id, a retry "
            "cannot add it twice)",
            leader=hint["leader"],
            leader_url=hint["leader_url"],
        ) from None
    except TimeoutError:
        raise ApiError(
            503, "timeout", "not committed in time; the outcome is unknown, retry"
        ) from None
    except StorageFailed as e:
        # Its entries may have reached the followers before this member's disk failed.
        raise ApiError(
            503,
            "storage_failed",
            f"{e}: the outcome is unknown (the followers may commit it); retry on the new "
            "leader (with a producer id, a retry cannot add it twice)",
        ) from None
    answer = {
        "partition": done.partition,
        "first_index": done.first_index,
        "last_index": done.last_index,
        "term": done.term,
        "duplicate": done.duplicate,
    }
    return msgspec.json.encode(answer)


async def _long_poll(
    request: web.Request, driver: PartitionDriver, need: int, wait_s: float
) -> None:
    """Wait up to `wait_s` for the mark to reach `need` (then the answer is what is there), or
    until the connection is reset or closed: aiohttp does not cancel a handler whose connection
    was lost, so polls of clients that left would otherwise live on outside the connection cap.
    (A client that half-closed still waits for its answer: the poll runs its course.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while (left := deadline - loop.time()) > 0:
        with contextlib.suppress(TimeoutError):
            await driver.marked.wait_at_least(need, min(left, LONG_POLL_CHECK_S))
            return
        transport = request.transport
        if transport is None or transport.is_closing():
            return


async def read(request: web.Request) -> web.Response:
    driver = driver_of(request)
    start = int_param(request, "from", 1, 1, 2**62)
    limit = int_param(request, "limit", 100, 1, 10_000)
    max_bytes = int_param(request, "max_bytes", 4 << 20, 1, 64 << 20)
    min_index = int_param(request, "min_index", 0, 0, 2**62)
    wait_ms = int_param(request, "wait_ms", 0, 0, 60_000)
    need = max(min_index, start if wait_ms else 0)
    if need > driver.high_water_mark and wait_ms:
        await _long_poll(request, driver, need, wait_ms / 1000)
    require_mark(driver, min_index)
    refuse_unless_fits(request, max_bytes)
    hwm = driver.high_water_mark
    try:
        entries = _read_within(driver, start, limit, max_bytes)
    except (StorageFailed, OSError) as e:  # a read that had to write the WAL's held tail
        raise ApiError(503, "storage_failed", f"{e}; read from another replica") from None
    except Compacted:  # from the archive when archiving is on, else 410
        node = node_of(request)
        entries = await archive_reads.entries_below_floor(
            node, driver, start, start + limit, limit, max_bytes, hwm
        )
    records, nxt = _encode_within(entries, start, max_bytes)
    head = b'{"partition":%d,"high_water_mark":%d,"records":[' % (driver.p, hwm)
    body = b"".join((head, b",".join(records), b'],"next":%d}' % nxt))
    return web.Response(body=body, content_type="application/json")


def _encode_within(entries: list[Entry], start: int, max_bytes: int) -> tuple[list[bytes], int]:
    """The records of `entries` as JSON, up to about `max_bytes` of it (at least one), and the
    index to read next. `max_bytes` bounds the answer, not only the records' own bytes: JSON
    writes a control byte of a value as 6 (`\\u0000`), so 64 MiB of NULs was a 384 MiB
    answer, built in the event loop for 1.9 s (its partitions' leadership lost)."""
    out: list[bytes] = []
    size, nxt = 0, start
    for e in entries:
        if e.kind == EntryKind.NORMAL:
            encoded = msgspec.json.encode(_record_json(e.index, e.term, e.data))
            if out and size + len(encoded) > max_bytes:
                break
            out.append(encoded)
            size += len(encoded) + 1
        nxt = e.index + 1
    return out, nxt


def _read_within(driver: PartitionDriver, start: int, limit: int, max_bytes: int) -> list[Entry]:
    """Committed entries from `start`: at most `limit`, and about `max_bytes` of records (at
    least one), read a few at a time so that a large limit never reads more than it answers."""
    out: list[Entry] = []
    size, at = 0, start
    while len(out) < limit:
        page = driver.read_committed(at, at + min(limit - len(out), 64))
        if not page:
            break
        for e in page:
            if out and size + e.size > max_bytes:
                return out
            out.append(e)
            size += e.size
        at = page[-1].index + 1
    return out


async def read_columns(request: web.Request) -> web.Response:
    """Committed records [from, to) as a column page (`columnar`), for bulk readers: at most
    `limit` entries and about `max_bytes` of records, never above this replica's mark. Below
    the floor, the same page from the archive when archiving is on (`archive_reads`)."""
    driver = driver_of(request)
    start = int_param(request, "from", 1, 1, 2**62)
    stop = int_param(request, "to", 2**62, 1, 2**62)
    limit = int_param(request, "limit", 10_000, 1, 50_000)
    max_bytes = int_param(request, "max_bytes", 8 << 20, 1, 64 << 20)
    min_index = int_param(request, "min_index", 0, 0, 2**62)
    fmt = query_param(request, "format")
    fmt = "columns" if fmt is None else fmt
    if fmt not in ("columns", "wal"):
        raise bad("format", f"format {fmt!r}: columns or wal")
    require_mark(driver, min_index)
    refuse_unless_fits(request, max_bytes)
    try:
        if fmt == "wal":  # the records' bytes, checked and decoded by the reader (`walpage`)
            wal = walpage.read_wal_records(driver, start, stop, limit, max_bytes)
            return web.Response(body=wal, content_type=walpage.CONTENT_TYPE)
        body = await columnar.read_records(driver, start, stop, limit, max_bytes)
    except Compacted:
        body, kind = await archive_reads.page_below_floor(
            node_of(request), driver, fmt, start, stop, limit, max_bytes
        )
        return web.Response(body=body, content_type=kind)
    except WalCorruption as e:
        raise ApiError(503, "storage_corrupt", f"{e}; read from another replica") from None
    return web.Response(body=body, content_type=columnar.CONTENT_TYPE)


async def index_for_time(request: web.Request) -> web.Response:
    """The first committed index of a record stamped at or after `timestamp_ms` that this
    replica holds (`timeindex`); `index` is null when there is none up to its high-water mark,
    `compacted` says a record at or after the time may have been compacted before it. With
    `min_index`, a replica whose mark is below it answers 503 `behind` (ask another)."""
    driver = driver_of(request)
    if "timestamp_ms" not in request.query:
        raise bad("timestamp_ms", "is required: milliseconds since the epoch")
    t = int_param(request, "timestamp_ms", 0, 0, 2**63 - 1)
    require_mark(driver, int_param(request, "min_index", 0, 0, 2**62))
    index = timeindex.of(driver)
    try:
        answer = await index.lookup(driver, t)
    except WalCorruption as e:
        raise ApiError(503, "storage_corrupt", f"{e}; ask another replica") from None
    return web.json_response(
        {
            "partition": driver.p,
            "timestamp_ms": t,
            "index": answer.first,
            "compacted": answer.compacted,
            "high_water_mark": index.end,
            "compaction_floor": driver.storage.compaction_floor(),
        }
    )


async def snapshot_table(request: web.Request) -> web.Response:
    """The keyed table of this replica's latest stored snapshot as a column page (index 0 and no
    rows when there is none): with the log after it, a reader rebuilds the table at any index."""
    body = await columnar.read_table(driver_of(request))
    return web.Response(body=body, content_type=columnar.CONTENT_TYPE)


async def get_key(request: web.Request) -> web.Response:
    """The keyed table's value of a key: `consistency=linearizable` (ReadIndex on the leader,
    the default) or `local` (this replica's applied state, possibly behind)."""
    node, driver = node_of(request), driver_of(request)
    # The key's bytes as the client percent-encoded them: aiohttp's decoded path keeps an
    # escape that is not UTF-8 (%FF) as text, so the key 0xFF would be read as "%FF". The path
    # the route matched: no query, no fragment (a raw target's `#frag` is not the key's).
    key = unquote_to_bytes(request.rel_url.raw_path.split("/keys/", 1)[1])
    consistency = query_param(request, "consistency")
    consistency = "linearizable" if consistency is None else consistency
    if consistency not in ("linearizable", "local"):
        raise bad("consistency", "must be linearizable or local")
    if consistency == "linearizable":
        if driver.raft.role != Role.LEADER:
            raise not_leader(node, driver)
        try:
            await asyncio.wait_for(driver.linearizable_point(), node.settings.append_timeout_s)
        except NotLeader:
            raise not_leader(node, driver) from None
        except TimeoutError:
            raise ApiError(503, "timeout", "leadership not confirmed in time; retry") from None
        except Exception:
            if driver.failed is None:
                raise
            raise stopped(driver.failed) from None  # it stopped writing while the read waited
    value = driver.table.get(key)
    body: dict[str, Any] = {
        "partition": driver.p,
        "key": key.decode(errors="replace"),
        **({} if key.isascii() else {"key_b64": base64.b64encode(key).decode()}),
        "found": value is not None,
        "applied_index": driver.table.applied_index,
        "consistency": consistency,
    }
    if value is not None:
        try:
            body["value"] = value.decode()
        except UnicodeDecodeError:
            body["value_b64"] = base64.b64encode(value).decode()
    return web.json_response(body, status=200 if value is not None else 404)


async def status(request: web.Request) -> web.Response:
    node = node_of(request)
    parts = []
    for p, driver in node.drivers.items():
        st = driver.raft.status()
        parts.append(
            {
                "partition": p,
                "role": str(st.role),
                "member": st.member,
                "term": st.term,
                "leader": st.leader,
                "quiesced": driver.raft.quiesced,
                "high_water_mark": driver.high_water_mark,  # readers' (`PartitionDriver`)
                "applied": st.applied,
                "last_index": st.last_index,
                "compaction_floor": driver.storage.compaction_floor(),
                "snapshot_index": driver.storage.snapshot_meta().index,
                "voters": sorted(st.membership.voters),
                "learners": sorted(st.membership.learners),
                # On the leader: its last membership change (or its term's first entry, which
                # any change waits for) is not committed yet; the voters above may not hold.
                "membership_pending": driver.raft.pending_conf_index > st.high_water_mark
                if st.role == Role.LEADER
                else None,
                "failed": (str(driver.failed) or type(driver.failed).__name__)
                if driver.failed
                else None,
                "counters": {
                    "elections": driver.counters.elections,
                    "backfill_rounds": driver.counters.backfill_rounds,
                    "backfill_entries": driver.counters.backfill_entries,
                    "backfill_largest_round": driver.counters.backfill_largest_round,
                    "snapshots_sent": driver.counters.snapshots_sent,
                    "snapshots_from_followers": driver.counters.snapshots_from_followers,
                    "snapshots_installed": driver.counters.snapshots_installed,
                    "snapshots_taken": driver.counters.snapshots_taken,
                    "compactions": driver.counters.compactions,
                    "events": dict(driver.counters.events),
                },
                "followers": {
                    f.node: {
                        "state": str(f.state),
                        "learner": f.learner,
                        "match": f.match,
                        "next": f.next,
                        "lag": f.lag,
                        "snapshot_required": f.snapshot_required,
                        "recent_active": f.recent_active,
                        "backfilling": f.backfilling,
                        "backfill_rounds": f.backfill_rounds,
                        "backfill_entries": f.backfill_entries,
                    }
                    for f in st.followers.values()
                },
                # Snapshots this node is streaming (as leader or as a follower source), while
                # they stream: bytes the target holds of the encoded snapshot's total.
                "snapshot_sends": [s.as_json() for s in node.transport.snapshot_sends_of(p)],
            }
        )
        floor = driver.storage.compaction_floor()
        parts[-1]["readable_from"] = floor  # the lowest index a read here is served from
        if node.archiver is not None:
            archived = node.archiver.partitions[p]
            parts[-1]["archive"] = archived.as_json(st.high_water_mark)
            parts[-1]["readable_from"] = archived.readable_from(floor)
    loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # uvloop or asyncio
    auth = "token" if node.token else "none (insecure_no_auth: peer and admin calls are open)"
    return web.json_response(
        {
            "node": node.id,
            "cluster": node.settings.cluster,  # `--cluster`; null when not named
            "started_at": node.started_at,
            "event_loop": loop,
            "compiled": native.active(),  # the Raft core compiled by mypyc (raftlog/node/native.py)
            "auth": auth,
            "partitions": parts,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=node_of(request).metrics.render(), content_type="text/plain", charset="utf-8"
    )


async def healthz(request: web.Request) -> web.Response:
    node = node_of(request)
    reason = node.not_live()
    if reason is not None:  # a liveness probe restarts the process, which reopens the storage
        return web.json_response({"status": "failed", "reason": reason}, status=503)
    return web.json_response({"status": "ok", "node": node.id})


async def readyz(request: web.Request) -> web.Response:
    node = node_of(request)
    reason = node.not_ready()
    if reason is not None:
        return web.json_response({"status": "not_ready", "reason": reason}, status=503)
    return web.json_response({"status": "ready", "node": node.id})


# ====================================================================== peers
# Raft messages come over the frame stream (`peer_frames.py`); these routes carry snapshots.
def _snapshot_params(request: web.Request) -> tuple[PartitionDriver, str, int, int, int]:
    driver = driver_of(request)
    leader = query_param(request, "leader") or ""
    if not leader:
        raise bad("leader", "is required")
    term = int_param(request, "term", 0, 1, 2**62)
    index = int_param(request, "index", 0, 0, 2**62)
    snap_term = int_param(request, "snap_term", 0, 0, 2**62)
    return driver, leader, term, index, snap_term


async def snapshot_progress(request: web.Request) -> web.Response:
    driver, _, _, index, snap_term = _snapshot_params(request)
    return web.json_response(
        {"received": driver.storage.snapshots.receiver(index, snap_term).received}
    )


async def snapshot_chunk(request: web.Request) -> web.Response:
    driver, leader, term, index, snap_term = _snapshot_params(request)
    try:
        offset = int(request.headers["X-Offset"])
        crc = int(request.headers["X-Crc32c"])
        total = int(request.headers["X-Total"])
    except (KeyError, ValueError):
        raise bad("headers", "X-Offset, X-Crc32c and X-Total are required integers") from None
    for name, value, top in (("X-Offset", offset, 2**62), ("X-Total", total, 2**62)):
        if not 0 <= value <= top:
            raise bad(name, f"must be between 0 and {top}, not {value}")
    chunk = Chunk(offset, await request.read(), crc, total)
    # After the body: what is on disk may have changed meanwhile (another upload began).
    receiver = driver.storage.snapshots.receiver(index, snap_term)
    try:
        if receiver.write(chunk) and chunk.last:
            meta, data = receiver.verify()
            driver.snapshot_received(leader, term, receiver, meta, data)
    except SnapshotCorruption as e:
        raise ApiError(400, "bad_chunk", e.reason, received=receiver.received) from None
    except SnapshotNoRoom as e:  # nothing written: the sender's retries say why
        raise ApiError(507, "no_room", str(e), "X-Total") from None
    except OSError as e:  # this member's disk (ENOSPC, EIO): the sender's retries say why
        receiver.abort()
        raise ApiError(
            507, "storage_failed", f"{driver.node.id} cannot write the snapshot: {e}"
        ) from None
    return web.Response(status=204)


async def send_snapshot_for_leader(request: web.Request) -> web.Response:
    """The leader asks this member to stream its snapshot to a target (RATIS-2428)."""
    driver = driver_of(request)
    try:
        body = await request.json()
        target, leader = str(body["target"]), str(body["leader"])
        term, required = int(body["term"]), int(body["required"])
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError):  # 1e999 overflows
        raise bad("body", "needs target, leader, term and required") from None
    if driver.raft.leader != leader or driver.raft.term != term:
        raise ApiError(409, "not_my_leader", f"{leader} in term {term} is not the leader here")
    if target not in driver.node.transport.peers:
        raise bad("target", f"{target!r} is not a peer of {driver.node.id}")
    try:
        sent = await driver.stream_own_snapshot(target, term, required)
    except SnapshotTooOld as e:
        raise ApiError(409, "too_old", str(e)) from None
    except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError) as e:
        # The target is down, unreachable or refused a chunk: say which, not a 500.
        raise ApiError(
            502,
            "target_failed",
            f"streaming to {target} failed: {str(e) or type(e).__name__}",
            "target",
            target=target,
        ) from None
    return web.json_response({"sent_bytes": sent})


Plane = Literal["client", "peer"]
ALL_PLANES: frozenset[Plane] = frozenset({"client", "peer"})


def build_app(node: Node, planes: frozenset[Plane] = ALL_PLANES) -> web.Application:
    """The routes of the given planes: `client` (the `/v1` client API) and `peer` (Raft traffic,
    snapshot streams and the admin API). Status, metrics, health and retention holds are on
    every listener."""
    middlewares: list[Any] = [make_guard(node.token)]
    app = web.Application(middlewares=middlewares, client_max_size=node.settings.max_request_bytes)
    app[NODE_KEY] = node
    add_route(app, "GET", "/v1/status", status)
    add_route(app, "GET", "/metrics", metrics)
    add_route(app, "GET", "/healthz", healthz)
    add_route(app, "GET", "/readyz", readyz)
    admin.add_hold_routes(app)
    if "client" in planes:
        add_route(app, "POST", "/v1/partitions/{partition}/records", append)
        add_route(app, "POST", "/v1/records", append_by_key)
        add_route(app, "GET", "/v1/partitions/{partition}/records", read)
        add_route(app, "GET", "/v1/partitions/{partition}/columns", read_columns)
        add_route(app, "GET", "/v1/partitions/{partition}/snapshot/table", snapshot_table)
        add_route(app, "GET", "/v1/partitions/{partition}/index-for-time", index_for_time)
        add_route(app, "GET", "/v1/partitions/{partition}/keys/{key}", get_key)
    if "peer" not in planes:
        admin.add_peer_port_hints(app)
    if "peer" in planes:
        admin.add_routes(app)
        add_route(app, "GET", "/peer/v1/partitions/{partition}/snapshot", snapshot_progress)
        add_route(app, "POST", "/peer/v1/partitions/{partition}/snapshot", snapshot_chunk)
        add_route(
            app, "POST", "/peer/v1/partitions/{partition}/send-snapshot", send_snapshot_for_leader
        )
    return app
