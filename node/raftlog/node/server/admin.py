"""The admin API, `/v1/admin/...` (a bearer token is required when the node has one).

Membership changes, leadership transfer, snapshot-and-compaction on demand, retention holds,
follower lag, and peer addresses. Membership and transfer are decided by the partition's leader
(others answer 421 with a hint); the leader's own checks are the last word (a learner that lags is
refused with the reason, as 409).
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any, cast
from urllib.parse import urlsplit

from aiohttp import web

from raftlog.node.core.errors import Compacted, MembershipError, NotLeader, ProposalRefused
from raftlog.node.core.raft import MembershipOp, Role
from raftlog.node.server.api_common import (
    ApiError,
    add_route,
    bad,
    driver_of,
    json_body,
    node_of,
    not_leader,
    stopped,
)
from raftlog.node.server.node import Node
from raftlog.node.server.partition import LeadershipLost, NotCommitted, PartitionDriver
from raftlog.node.storage.errors import StorageFailed

OPS = ("add_learner", "promote", "remove")


async def _json(request: web.Request) -> dict[str, Any]:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad("body", "must be a JSON object")
    return body


def _str(body: dict[str, Any], name: str) -> str:
    v = body.get(name)
    if not isinstance(v, str) or not v:
        raise bad(name, "is required (a non-empty string)")
    return v


MAX_NAME_CHARS = 253  # a DNS name's: members are named by their pods' names


def _name(field: str, name: object) -> str:
    """A member's name: it goes into logs, metrics' labels and the peer stream's handshake."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_NAME_CHARS
        or not name.isprintable()
        or any(c.isspace() for c in name)
    ):
        raise bad(field, f"a member's name is 1 to {MAX_NAME_CHARS} characters, no spaces or "
                  "control characters")  # fmt: skip
    return name


def _url(field: str, url: object) -> str:
    """A member's http(s) URL, with a host (and a port in range, when given)."""
    ok = isinstance(url, str) and url.isprintable() and not any(c.isspace() for c in url)
    if ok:
        try:
            parts = urlsplit(str(url))
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            ok = ok and parts.port != 0  # .port raises ValueError out of range
        except ValueError:
            ok = False
    if not ok:
        raise bad(field, "must be an http(s) URL with a host, such as http://n2:8080")
    return str(url)


def _refusal(node: Node, driver: PartitionDriver, e: Exception) -> ApiError:
    """The answer when the leader's own checks refuse an admin change: a follower names the
    leader (421), the leader gives its reason (409), so the caller can fix the request."""
    if isinstance(e, NotLeader):
        return not_leader(node, driver, admin=True)
    return ApiError(409, "refused", str(e))


def _unknown(driver: PartitionDriver, name: str, field: str) -> ApiError:
    """404 `unknown_member` naming the field: the same answer from every admin call that
    names a member its partition's leader does not know."""
    return ApiError(404, "unknown_member", f"{name} is not a member of partition {driver.p}", field)


def _known(driver: PartitionDriver, name: str, field: str) -> None:
    if name not in driver.raft.membership.members:
        raise _unknown(driver, name, field)


async def members(request: web.Request) -> web.Response:
    node, driver = node_of(request), driver_of(request)
    body = await _json(request)
    raw_op, member = _str(body, "op"), _name("node", body.get("node"))
    if raw_op not in OPS:
        raise bad("op", f"must be one of {', '.join(OPS)}")
    op = cast(MembershipOp, raw_op)
    url = None if body.get("url") is None else _url("url", body["url"])
    if op == "add_learner" and url is None and member not in node.transport.peers:
        raise bad("url", f"the address of {member} is unknown here; give its url")
    if driver.raft.role != Role.LEADER:  # before anything changes here, the address included
        raise not_leader(node, driver, admin=True)
    if op != "add_learner":
        _known(driver, member, "node")
    previous = node.transport.peers.get(member)
    if url is not None:
        node.transport.add_peer(member, url)  # the leader's appends to a new learner need it
    try:
        done = await driver.propose_membership(op, member, node.settings.append_timeout_s)
    except (NotLeader, MembershipError, ProposalRefused) as e:
        if url is not None:  # a refused change changes nothing
            node.transport.restore_peer(member, previous)
        raise _refusal(node, driver, e) from None
    except NotCommitted as e:
        raise ApiError(503, "not_committed", f"{e}; the change did not happen") from None
    except LeadershipLost as e:
        hint = not_leader(node, driver, admin=True).body
        raise ApiError(
            503,
            "leader_lost",
            f"{e}: the outcome is unknown; see the partition's members",
            leader=hint.get("leader"),
            leader_url=hint.get("leader_url"),
        ) from None
    except TimeoutError as e:
        raise ApiError(503, "timeout", f"{e}; see the partition's members") from None
    except Exception:
        if driver.failed is None:
            raise
        # The partition stopped under the change (its disk failed, or a bug stopped it): as an
        # append is answered, not a 500; another member may still commit it.
        raise stopped(driver.failed) from None
    index, term = done.last_index, done.term
    if op == "add_learner" and url is not None:
        node.transport.tell_address(member, url)
    st = driver.raft.status()
    return web.json_response(
        {
            "partition": driver.p,
            "index": index,
            "term": term,
            "voters": sorted(st.membership.voters),
            "learners": sorted(st.membership.learners),
        }
    )


async def transfer(request: web.Request) -> web.Response:
    node, driver = node_of(request), driver_of(request)
    target = _str(await _json(request), "target")
    if driver.raft.role != Role.LEADER:  # the leader's membership is the one to check against
        raise not_leader(node, driver, admin=True)
    _known(driver, target, "target")
    try:
        await driver.run_on_core(lambda: driver.raft.transfer_leadership(target))
    except (NotLeader, ProposalRefused) as e:
        raise _refusal(node, driver, e) from None
    deadline = asyncio.get_running_loop().time() + node.settings.append_timeout_s
    while asyncio.get_running_loop().time() < deadline:
        # Stepped down at the target's vote request, this node learns the new leader only from
        # its first append: answered then, so the answer names who leads.
        if driver.raft.role != Role.LEADER and driver.raft.leader is not None:
            return web.json_response({"partition": driver.p, "leader": driver.raft.leader})
        await asyncio.sleep(0.02)
    raise ApiError(503, "timeout", f"{target} did not take over in time")


async def snapshot_install(request: web.Request) -> web.Response:
    node, driver = node_of(request), driver_of(request)
    body = await _json(request)
    target, source = _str(body, "target"), body.get("source", "leader")
    if not isinstance(source, str) or not source:
        raise bad("source", 'must be a member\'s name or "leader"')
    if driver.raft.role != Role.LEADER:  # the leader's membership is the one to check against
        raise not_leader(node, driver, admin=True)
    if target == node.id:
        raise ApiError(409, "is_leader", f"{target} is the leader of partition {driver.p}",
                       "target")  # fmt: skip
    if source != "leader":
        _known(driver, source, "source")
    _known(driver, target, "target")
    try:
        result = await driver.install_on(target, source)
    except (NotLeader, ProposalRefused) as e:
        raise _refusal(node, driver, e) from None
    except Exception as e:  # the transfer itself failed (network, the target's disk)
        raise ApiError(503, "transfer_failed", str(e)) from None
    return web.json_response({"partition": driver.p, **result})


async def compact(request: web.Request) -> web.Response:
    driver = driver_of(request)
    try:
        done = await driver.compact_now()
    except (StorageFailed, OSError) as e:  # the snapshot's write (ENOSPC, EIO)
        raise ApiError(503, "storage_failed", f"{e}; the partition stops writing") from None
    return web.json_response(
        {
            "partition": driver.p,
            "snapshot_index": driver.storage.snapshot_meta().index,
            "compacted_entries": done.dropped if done else 0,
            "compaction_floor": driver.storage.compaction_floor(),
        }
    )


async def archive_flush(request: web.Request) -> web.Response:
    """Archive everything committed now (the leader's; a follower answers 421): the backup
    point of a partition. 409 when archiving is off, 503 naming the store's error."""
    node, driver = node_of(request), driver_of(request)
    if node.archiver is None:
        raise ApiError(409, "archive_off", "archiving is off on this node (no archive_url)")
    commit = driver.raft.commit
    try:
        archived = await node.archiver.flush(driver.p)
    except NotLeader:
        raise not_leader(node, driver, admin=True) from None
    except Exception as e:
        raise ApiError(503, "archive_failed", f"{type(e).__name__}: {e}"[:500]) from None
    return web.json_response(
        {
            "partition": driver.p,
            "archived_index": archived,
            "commit": commit,
            "term": driver.raft.term,
            "archive_url": node.settings.archive_url,
        }
    )


async def lag(request: web.Request) -> web.Response:
    node, driver = node_of(request), driver_of(request)
    follower = request.match_info["follower"]
    if driver.raft.role != Role.LEADER:
        raise not_leader(node, driver, admin=True)
    st = driver.raft.status().followers.get(follower)
    if st is None and follower == node.id:
        raise ApiError(
            409, "is_leader", f"{follower} is the leader of partition {driver.p}: it has no lag"
        )
    if st is None:
        raise _unknown(driver, follower, "follower")
    return web.json_response(
        {
            "partition": driver.p,
            "follower": follower,
            "lag": st.lag,
            "state": str(st.state),
            "snapshot_required": st.snapshot_required,
            "learner": st.learner,
        }
    )


async def holds_list(request: web.Request) -> web.Response:
    driver = driver_of(request)
    return web.json_response(
        {
            "partition": driver.p,
            "compaction_floor": driver.storage.compaction_floor(),
            "holds": [
                {"holder": h.holder, "min_index": h.min_index, "expires_at": h.expires_at}
                for h in driver.storage.holds.live()
            ],
        }
    )


async def hold_set(request: web.Request) -> web.Response:
    driver = driver_of(request)
    holder = request.match_info["holder"]
    body = await _json(request)
    for name in body:
        if name not in ("min_index", "ttl_seconds"):
            raise bad(name, "unknown field (a hold has min_index and ttl_seconds)")
    min_index, ttl = body.get("min_index"), body.get("ttl_seconds", 60)
    if not isinstance(min_index, int) or isinstance(min_index, bool):
        raise bad("min_index", "is required (an integer)")
    if not isinstance(ttl, int | float) or isinstance(ttl, bool):
        raise bad("ttl_seconds", "must be a number")
    try:
        h = driver.storage.set_hold(holder, min_index, float(ttl))
    except Compacted as e:
        raise ApiError(410, "compacted", str(e), "min_index") from None
    except ValueError as e:
        field, _, reason = str(e).partition(": ")
        raise bad(field, reason) from None
    return web.json_response(
        {"holder": h.holder, "min_index": h.min_index, "expires_at": h.expires_at}
    )


async def hold_delete(request: web.Request) -> web.Response:
    driver = driver_of(request)
    holder = request.match_info["holder"]
    if not driver.storage.holds.release(holder):
        raise ApiError(404, "unknown_hold", f"no hold named {holder!r}")
    return web.Response(status=204)


async def peers(request: web.Request) -> web.Response:
    node = node_of(request)
    if request.method == "POST":
        body = await _json(request)
        told = {_name(name, name): _url(name, url) for name, url in body.items()}
        for name, url in told.items():
            node.transport.add_peer(name, url)
    return web.json_response({"peers": dict(sorted(node.transport.peers.items()))})


async def peer_addresses(request: web.Request) -> web.Response:
    """Where peers' pods are (their operator reads it from the API server): tried beside their
    names, which the cluster's DNS may answer with an old address for a while after a restart.
    Two members restarted within that while could otherwise not reach each other by name, nor
    have connected to each other first (`PeerSender._open_link`)."""
    node = node_of(request)
    if request.method == "POST":
        body = await _json(request)
        told = {}
        for name, address in body.items():
            if name not in node.transport.peers or name == node.id:
                raise bad(name, "is not a peer of this node")
            try:
                ip = ipaddress.ip_address(address if isinstance(address, str) else "")
            except ValueError:
                raise bad(name, "must be an IP address") from None
            if ip.is_unspecified or (isinstance(ip, ipaddress.IPv6Address) and ip.scope_id):
                raise bad(name, "must be a pod's address (not unspecified, no IPv6 scope)")
            told[name] = str(ip)
        for name, address in told.items():
            node.transport.seen(name, address)
    return web.json_response({"addresses": dict(sorted(node.transport.addresses.items()))})


def add_routes(app: web.Application) -> None:
    base = "/v1/admin/partitions/{partition}"
    add_route(app, "POST", f"{base}/members", members)
    add_route(app, "POST", f"{base}/transfer", transfer)
    add_route(app, "POST", f"{base}/compact", compact)
    add_route(app, "POST", f"{base}/snapshot-install", snapshot_install)
    add_route(app, "POST", f"{base}/archive", archive_flush)
    add_route(app, "GET", f"{base}/followers/{{follower}}/lag", lag)
    add_route(app, "GET", "/v1/admin/peers", peers)
    add_route(app, "POST", "/v1/admin/peers", peers)
    add_route(app, "GET", "/v1/admin/peer-addresses", peer_addresses)
    add_route(app, "POST", "/v1/admin/peer-addresses", peer_addresses)


async def on_the_peer_port(request: web.Request) -> web.Response:
    node = node_of(request)
    url = node.settings.peers[node.id]
    raise ApiError(
        421,
        "admin_on_peer_port",
        f"{node.id} serves the admin API on its peer port: ask {url}",
        leader_url=url,
    )


def add_peer_port_hints(app: web.Application) -> None:
    """The admin routes on a client listener of split ports: 421 naming this member's peer
    URL, which the client follows as it follows a leader's. They were a 404 `no route`, so a
    client given the client URLs it appends through could reach the admin API only through a
    follower's hint, never at the leader itself."""
    for method in ("GET", "POST"):
        add_route(app, method, "/v1/admin/{tail:.*}", on_the_peer_port)


def add_hold_routes(app: web.Application) -> None:
    """Retention holds, on every listener (with the token, as all of /v1/admin): a reader holds
    what it has not read yet through the client port it reads from, which a NetworkPolicy on
    the peer port, or its client certificates, leave open to it."""
    base = "/v1/admin/partitions/{partition}"
    add_route(app, "GET", f"{base}/holds", holds_list)
    add_route(app, "PUT", f"{base}/holds/{{holder}}", hold_set)
    add_route(app, "DELETE", f"{base}/holds/{{holder}}", hold_delete)
