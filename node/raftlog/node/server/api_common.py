"""What every handler of the node's HTTP API shares: errors, auth, and finding the partition."""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from raftlog.node.server.node import Node
from raftlog.node.server.partition import PartitionDriver
from raftlog.node.storage.errors import StorageFailed
from raftlog.node.transport.frames import CLUSTER_HEADER

log = logging.getLogger("raftlog.api")
_PARTITION = re.compile(r"0|[1-9][0-9]{0,8}")
_INTEGER = re.compile(r"-?[0-9]{1,30}")  # ASCII only: int() also takes "1_0", " +5", other digits
NODE_KEY = web.AppKey("node", Node)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        error: str,
        reason: str,
        field: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ):
        self.status = status
        self.headers = headers
        self.body = {
            "error": error,
            "reason": reason,
            **({"field": field} if field is not None else {}),
            **extra,
        }
        super().__init__(reason)


def bad(field: str, reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason, field)


def _tokens(request: web.Request, name: str) -> list[str]:
    """A comma-separated header's items (all its lines), lower-cased."""
    return [
        c.strip().lower() for value in request.headers.getall(name, ()) for c in value.split(",")
    ]


def _asks_upgrade(request: web.Request) -> bool:
    """A protocol switch asked (as llhttp reads it: `Connection: upgrade` with an `Upgrade`,
    or a CONNECT)."""
    if request.method == "CONNECT":
        return True
    return "Upgrade" in request.headers and "upgrade" in _tokens(request, "Connection")


_CONTINUE = web.RequestKey("continue_later", bool)


async def expect_continue_later(request: web.Request) -> None:
    """Every route's `Expect` handler. aiohttp's own said `100 Continue` before the guard's
    checks ran: a request then refused from its head (413, 415, 501, 503 `busy`, 401) had asked
    for a body it would never read, and the client, told to send it, ran into a closed
    connection. An unknown expectation is still 417 (aiohttp's); `100-continue` is answered by
    the guard once the head has passed its checks, as it starts reading the body."""
    if request.version != aiohttp.HttpVersion11:
        return  # an HTTP/1.0 request's expectation is ignored (RFC 9110 10.1.1)
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
    request[_CONTINUE] = True


def add_route(app: web.Application, method: str, path: str, handler: Handler) -> None:
    """A route of the API: its `Expect: 100-continue` answered by the guard once the head
    passed its checks (`expect_continue_later`); a GET answers HEAD too."""
    add = {
        "GET": app.router.add_get,
        "POST": app.router.add_post,
        "PUT": app.router.add_put,
        "DELETE": app.router.add_delete,
    }[method]
    add(path, handler, expect_handler=expect_continue_later)


def _refused_unread(
    status: int, error: str, reason: str, field: str, headers: dict[str, str] | None = None
) -> web.Response:
    """An answer from the request's head alone: its body is never read, so the connection
    closes (the unread bytes must not be taken for the next request)."""
    body = {"error": error, "reason": reason, "field": field}
    resp = web.json_response(body, status=status, headers=headers)
    resp.force_close()
    return resp


def make_guard(token: str | None) -> Middleware:
    """The one middleware of every request: the bearer token of peer and admin calls (401
    without it), a peer call naming another cluster (421), errors as JSON (an `ApiError` with
    its status, a bug as a 500 without internals), and the request's latency in
    `raftlog_request_seconds`."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        taken = 0  # bytes of `node.bodies` this request's body holds until it is answered
        try:
            guarded = token and request.path.startswith(("/peer/", "/v1/admin/"))
            if guarded and len(given := request.headers.getall("Authorization", ())) > 1:
                # One of two tokens checked would let a proxy that judges by the other (or
                # joins them) disagree with the node on who is calling.
                raise bad("Authorization", f"given {len(given)} times; send it once")
            peer = request.path.startswith("/peer/")
            if peer and len(named := request.headers.getall(CLUSTER_HEADER, ())) > 1:
                # Judging the first would let a caller name two clusters and be taken by both.
                raise bad(CLUSTER_HEADER, f"given {len(named)} times; send it once")
            if guarded and not hmac.compare_digest(
                # aiohttp reads header bytes as UTF-8 with surrogateescape: encode them
                # back the same way, so a non-UTF-8 byte is a mismatch (401), not a 500
                request.headers.get("Authorization", "").encode("utf-8", "surrogateescape"),
                expected,
            ):
                resp: web.StreamResponse = web.json_response(
                    {"error": "unauthorized", "reason": "a valid bearer token is required"},
                    status=401,
                )
            elif peer and (
                foreign := node_of(request).foreign_caller(
                    request.headers.get(CLUSTER_HEADER), request.path, request.remote
                )
            ):
                resp = _refused_unread(421, "misdirected", foreign, CLUSTER_HEADER)
            elif request.headers.get("Content-Encoding", "identity").lower() != "identity":
                # Bodies are taken as sent (aiohttp's decompression is off: a 1 MB gzip body of
                # 1 GB held the loop 0.8 s before its 413).
                resp = _refused_unread(
                    415,
                    "unsupported_encoding",
                    f"bodies are taken as sent, not "
                    f"{request.headers['Content-Encoding']!r} (use identity)",
                    "Content-Encoding",
                )
            elif (codings := _tokens(request, "Transfer-Encoding")) not in ([], ["chunked"]):
                # aiohttp reads a body whose last coding is chunked and passes it on still
                # encoded (gzip, say): it would be refused later as JSON it is not.
                resp = _refused_unread(
                    501,
                    "unsupported_encoding",
                    f"no transfer coding but chunked is taken, not "
                    f"{', '.join(codings)!r} (send the body as it is)",
                    "Transfer-Encoding",
                )
            elif (request.content_length or 0) > node_of(request).settings.max_request_bytes:
                # Refused from the head: the body is neither waited for nor buffered.
                limit = node_of(request).settings.max_request_bytes
                resp = _refused_unread(
                    413,
                    "too_large",
                    f"the body is {request.content_length} bytes, limit {limit} "
                    "(max_request_bytes)",
                    "Content-Length",
                )
            elif (
                request.body_exists
                and not request.path.startswith("/peer/")
                and not node_of(request).bodies.take(
                    taken := request.content_length or node_of(request).settings.max_request_bytes
                )
            ):
                # Refused before it is read: clients' bodies being read fill no more memory
                # than max_body_buffer_bytes (a chunked one counts as max_request_bytes). Peers'
                # snapshot chunks (with the token, checked above) are not held up by them.
                resp = web.json_response(
                    node_of(request).bodies.busy(taken), status=503, headers={"Retry-After": "1"}
                )
                resp.force_close()
                taken = 0
            else:
                if request.body_exists:
                    if request.get(_CONTINUE):  # `expect_continue_later`
                        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                        request.writer.output_size = 0  # as aiohttp's: not the answer's size
                    # The whole body in time however it trickles in (handlers then read it
                    # from aiohttp's cache); the fast path holds its own bodies to the same.
                    within = node_of(request).settings.request_body_timeout_s
                    try:
                        await asyncio.wait_for(request.read(), within)
                    except TimeoutError:
                        raise ApiError(
                            408, "timeout", f"the body was not sent within {within} s"
                        ) from None
                resp = await handler(request)
        except ApiError as e:
            resp = web.json_response(e.body, status=e.status, headers=e.headers)
            if e.status == 408:
                resp.force_close()
        except web.HTTPException as e:
            resp = e if e.status < 400 else _json_error(request, e)
        except ConnectionResetError as e:
            if request.transport is not None and not request.transport.is_closing():
                resp = _internal(request, e)  # another connection's (a peer's, a store's)
            else:
                # The client went away mid-request (its body cut short): nobody to answer, and
                # not the node's fault; counted under 499 (nginx's "client closed request").
                log.debug("%s %s: the client closed the connection", request.method, request.path)
                resp = web.Response(status=499)
                resp.force_close()
        except Exception as e:  # a bug: logged with its trace, answered without internals
            resp = _internal(request, e)
        finally:
            if taken:
                node_of(request).bodies.release(taken)
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        node_of(request).metrics.request_latency(name, request.method, resp.status).observe(
            time.perf_counter() - started
        )
        if _asks_upgrade(request):
            # None is taken here (the frame stream's is the listener's): aiohttp's parser drops
            # what follows such a request in the same read, so a request pipelined after it
            # would never be answered. Closing tells the client to send it again.
            resp.force_close()
        if isinstance(resp, web.HTTPException):
            raise resp  # a redirect (below 400): aiohttp's own
        if isinstance(resp, web.Response):
            return await node_of(request).answers.send(request, resp)
        return resp

    return guard


def _internal(request: web.Request, e: Exception) -> web.Response:
    log.error("%s %s failed", request.method, request.path, exc_info=e)
    return web.json_response({"error": "internal", "reason": "see the node's log"}, status=500)


def _json_error(request: web.Request, e: web.HTTPException) -> web.Response:
    """aiohttp's own answers (no route, a method not allowed, a chunked body past the limit) in
    the API's JSON, as every other error. The path is named as sent (decoded, `1%2Frecords`
    read as a route that exists)."""
    path = request.rel_url.raw_path
    if e.status == 404:
        body = {"error": "not_found", "reason": f"no route {request.method} {path}"}
    elif e.status == 405:
        allowed = e.headers.get("Allow", "")
        body = {
            "error": "method_not_allowed",
            "reason": f"{request.method} is not allowed on {path} (allowed: {allowed})",
        }
    elif e.status == 413:
        limit = node_of(request).settings.max_request_bytes
        body = {
            "error": "too_large",
            "reason": f"the body passed {limit} bytes (max_request_bytes)",
            "field": "body",
        }
    else:
        body = {"error": e.reason.lower().replace(" ", "_"), "reason": e.text or e.reason}
    resp = web.json_response(body, status=e.status)
    if "Allow" in e.headers:
        resp.headers["Allow"] = e.headers["Allow"]
    if e.status == 413:
        resp.force_close()  # the rest of the body is not read
    return resp


# ====================================================================== helpers
def node_of(request: web.Request) -> Node:
    return request.app[NODE_KEY]


def driver_of(request: web.Request) -> PartitionDriver:
    raw = request.match_info["partition"]
    if not _PARTITION.fullmatch(raw):
        # As the fast path reads it: int() would also take "+0", " 0" and other scripts' digits.
        raise bad("partition", f"{raw!r} is not a partition number (0, 1, 2, ...)")
    return partition_driver(node_of(request), int(raw))


def partition_driver(node: Node, p: int) -> PartitionDriver:
    driver = node.driver(p)
    if driver is None:
        n = len(node.drivers)
        raise ApiError(404, "unknown_partition", f"partition {p} does not exist (0..{n - 1})")
    return driver


def query_param(request: web.Request, name: str) -> str | None:
    """The query parameter `name`, None when absent; 400 when given more than once (which was
    meant cannot be known: a proxy in front may judge a request by the last one)."""
    values = request.query.getall(name, ())
    if len(values) > 1:
        raise bad(name, f"is given more than once ({len(values)} times); give it once")
    return values[0] if values else None


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = query_param(request, name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        raise bad(name, f"{raw[:40]!r} is not an integer (ASCII digits, an optional '-')")
    v = int(raw)
    if not lo <= v <= hi:
        raise bad(name, f"must be between {lo} and {hi}, got {v}")
    return v


def stopped(failed: Exception) -> ApiError:
    """503 for a partition that stopped writing here (it follows no leader any more)."""
    kind = "storage_failed" if isinstance(failed, StorageFailed) else "partition_failed"
    return ApiError(503, kind, f"{failed or type(failed).__name__}; ask another member")


def not_leader(node: Node, driver: PartitionDriver, *, admin: bool = False) -> ApiError:
    """421 naming the leader when known; `stopped` when this member's partition stopped. The
    hint is the leader's URL of the listener the call is served on: its client port, or its
    peer port for the admin API (`admin`), which is served there when the ports are split."""
    if driver.failed is not None:
        return stopped(driver.failed)
    leader = driver.raft.leader
    peer_url = node.settings.peers.get(leader) if leader else None
    url = peer_url if admin or not peer_url else node.settings.client_url_of(peer_url)
    return ApiError(
        421,
        "not_leader",
        f"{node.id} is not the leader of partition {driver.p}",
        leader=leader,
        leader_url=url,
    )


async def json_body(request: web.Request) -> Any:
    """The request's JSON body; 400 naming `body` when it is not JSON (or nested too deep)."""
    try:
        return await request.json()
    except (ValueError, RecursionError):
        raise bad("body", "is not valid JSON") from None
