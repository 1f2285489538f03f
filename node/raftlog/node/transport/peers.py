"""Sending to peers: one long-lived stream and one sender task per peer.

Each peer gets a frame stream (`frames`: an HTTP/1.1 Upgrade on the peer's own port, behind the
same token and TLS as every peer call, then length-prefixed binary frames one way, with
TCP_NODELAY). The messages every partition sends to a peer in one turn of the event loop go out
in one frame at the start of the next (a callback, no task hop): one write here and one read
there for all of the node's partitions, not one per partition. Messages also queue while the
stream is not up or the kernel's buffer for the peer is full, and go out together then. The
frame stream is the only way Raft messages travel between peers: it measured fastest, against a
WebSocket per peer and a POST per frame (bench/RESULTS.md, the sixth and second passes).

A failed send drops its frame (Raft retransmits what matters) and the sender backs off, doubling
from 50 ms to 2 s, until the peer answers again; a peer that refuses the handshake (401: another
token; 404: not a raftlog peer port) is retried the same way, and each new reason is logged once.
A stream that cannot take a write within `SEND_TIMEOUT` (a peer that stopped reading) is dropped.
The queue is bounded: when a peer is down for long, the oldest messages are dropped first.

Snapshots stream in chunks, each with its offset and CRC32C; the receiver appends them to a
partial file, so a transfer cut short resumes where it stopped. Each stream under way is in
`Transport.snapshot_sends` (by partition and target) from its start until it ends, finished or
failed, when it is removed: the node's `/v1/status` and metrics show how far it is.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import urllib.parse
from asyncio import FIRST_COMPLETED
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from raftlog.node.core.messages import Message
from raftlog.node.core.types import SnapshotMeta
from raftlog.node.storage.snapshots import DEFAULT_CHUNK_BYTES, Chunk, encode_snapshot
from raftlog.node.transport import frames
from raftlog.node.transport.codec import Item, Ping, encode_frame, size_hint
from raftlog.node.transport.lograte import OncePer

log = logging.getLogger("raftlog.transport")

MAX_QUEUE = 10_000
BACKOFF_MIN, BACKOFF_MAX = 0.05, 2.0
SEND_TIMEOUT = 5.0
FRAME_BUDGET = 4 * 1024 * 1024  # half of a node's default max_request_bytes
CONNECT_TIMEOUT = 5.0  # TCP, TLS and the frame stream's handshake
REQUEST_CONNECT_S = 2.0  # a peer request's connection (a snapshot's chunks, an ask to stream)
TELL_FOR_S = 60.0  # how long a leader keeps telling its peers a new member's address
SECOND_ROUTE_AFTER = 0.25  # a peer's other address is tried this long after the first


def peer_headers(token: str | None, cluster: str | None = None) -> dict[str, str]:
    """What every peer call says of its sender: the cluster's token, and its cluster's name."""
    out = {"Authorization": f"Bearer {token}"} if token else {}
    if cluster:
        out[frames.CLUSTER_HEADER] = cluster
    return out


@dataclass
class SnapshotSend:
    """A snapshot being streamed to `target`: how far it is."""

    target: str
    snapshot_index: int
    total_bytes: int  # the encoded snapshot's size
    sent_bytes: int = 0  # the target holds this many of them (what it held at the start included)
    resumed_from: int = 0  # what the target already held when the stream began
    started: float = field(default_factory=time.monotonic)

    def as_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "snapshot_index": self.snapshot_index,
            "sent_bytes": self.sent_bytes,
            "total_bytes": self.total_bytes,
            "resumed_from_bytes": self.resumed_from,
            "elapsed_s": round(time.monotonic() - self.started, 3),
        }


class PeerSender:
    def __init__(
        self,
        name: str,
        url: str,
        token: str | None,
        ssl_context: ssl.SSLContext | None = None,
        frame_budget: int = FRAME_BUDGET,
        addresses: dict[str, str] | None = None,
        cluster: str | None = None,
    ):
        self.name = name
        self.cluster = cluster
        self.frame_budget = frame_budget
        self.url = url
        self.token = token
        self.ssl_context = ssl_context
        self.queue: deque[Item] = deque(maxlen=MAX_QUEUE)
        self.ready = asyncio.Event()
        self.sent_frames = 0
        self.failures = 0
        self.connected = False
        self.last_failure = ""  # logged once, until the reason changes or a link works
        self.link: frames.Link | None = None  # the frame stream, while it is up
        self.task: asyncio.Task[None] | None = None
        self._flush_due = False
        # Where each peer was last seen: its transport's, shared (`Transport.seen`).
        self.addresses = addresses if addresses is not None else {}

    def send(self, partition: int, messages: Sequence[Message | Ping]) -> bool:
        """Queue `messages`; True when the frame stream's socket takes them at the start of the
        loop's next turn, with what the other partitions send in this one."""
        self.queue.extend((partition, m) for m in messages)
        link = self.link
        if link is not None and link.writable:
            if not self._flush_due:
                self._flush_due = True
                asyncio.get_running_loop().call_soon(self._flush_now)
            return True
        self.ready.set()
        return False

    def _flush_now(self) -> None:
        self._flush_due = False
        link = self.link
        if link is not None and link.writable:
            self._flush(link)
        if self.queue:
            self.ready.set()

    def _flush(self, link: frames.Link) -> None:
        """Write the queue, frame by frame, until it is empty or the link's buffer is full
        (the rest waits for `resume_writing`)."""
        while self.queue and not link.paused:
            link.write(self._take())
            self.sent_frames += 1

    def _take(self) -> bytes:
        """The oldest queued messages, up to `frame_budget` bytes (at least one): a frame the
        peer takes (it refuses one over its `max_request_bytes`)."""
        items: list[Item] = []
        total = 0
        queue = self.queue
        while queue:
            size = size_hint(queue[0][1])
            if items and total + size > self.frame_budget:
                break
            items.append(queue.popleft())
            total += size
        return encode_frame(items)

    async def run(self) -> None:
        backoff = BACKOFF_MIN
        while True:
            await self.ready.wait()
            if not self.queue:
                self.ready.clear()
                continue
            try:
                await self._frames()
                backoff = BACKOFF_MIN
            except (TimeoutError, OSError, RuntimeError) as e:
                self.failures += 1
                reason = str(e) or type(e).__name__
                if self.connected or reason != self.last_failure:
                    # Once per reason: a peer refusing our token is said, not retried silently.
                    log.warning("peer %s unreachable: %s", self.name, reason)
                    self.last_failure = reason
                if self.connected:  # it worked until now: reconnect soon, not after a long wait
                    backoff = BACKOFF_MIN
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                self.ready.set()

    def _reachable(self) -> None:
        if not self.connected:
            log.info("peer %s reachable at %s", self.name, self.url)
        self.connected = True
        self.last_failure = ""

    async def _frames(self) -> None:
        """Open the frame stream and keep it until it fails (raises) or closes; `send` writes
        to it directly meanwhile, and this writes what queued while it could not."""
        link = await self._open_link()
        self._reachable()
        self.link = link
        try:
            while True:
                if link.lost:
                    raise ConnectionResetError(f"the stream to {self.name} was closed")
                if link.paused:
                    # The peer is not reading: give it SEND_TIMEOUT to take the write.
                    async with asyncio.timeout(SEND_TIMEOUT):
                        while link.paused and not link.lost:
                            await self.ready.wait()
                            self.ready.clear()
                    continue
                self._flush(link)
                await self.ready.wait()
                self.ready.clear()
        finally:
            self.link = None
            link.abort()

    async def _open_link(self) -> frames.Link:
        """The frame stream, at the peer's URL and at the address the peer last connected to
        this node from or its operator told (`addresses`), for the same name, whichever answers
        first: the seen address SECOND_ROUTE_AFTER after the name, or at once when the name
        fails (the name first: an older peer does not refuse a stream meant for another).
        A restarted pod is at a new address that the cluster's DNS may deny, or answer with the
        old one, for up to its cache time (kubeadm's CoreDNS: `ttl 30`, `cache 30`), while the
        pod itself already talks to us; and the seen address may be an old one, of a pod since
        restarted. A route that reaches another node (an old address now another pod's) is
        refused by it (421) and counts as failed."""
        u = urllib.parse.urlsplit(self.url)
        host, tls = u.hostname or "localhost", u.scheme == "https"
        port = u.port or (443 if tls else 80)
        seen = self.addresses.get(self.name)
        if seen is None or seen == host:
            return await self._connect(host, port, host, tls)
        return await first_link(
            [self._connect(host, port, host, tls), self._connect(seen, port, host, tls)],
            SECOND_ROUTE_AFTER,
        )

    async def _connect(self, address: str, port: int, host: str, tls: bool) -> frames.Link:
        hello = frames.handshake(host, port, self.token, self.name, self.cluster)
        link = frames.Link(hello, self.ready.set)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await loop.create_connection(
                    lambda: link,
                    address,
                    port,
                    ssl=(self.ssl_context or True) if tls else None,
                    server_hostname=host if tls else None,  # the certificate names the host
                )
                status = await link.answered
        except BaseException:
            link.abort()
            raise
        if status == 101:
            return link
        link.abort()
        if status == 421:
            raise Misdirected(
                f"{address} refused a stream meant for {self.name}: another node now, "
                "or a member of another cluster (its log says which)"
            )
        raise RuntimeError(f"HTTP {status} to the frame stream's handshake ({frames.PATH})")


class Misdirected(ConnectionError):
    """The address reached another node than the one meant (421 to the handshake)."""


async def first_link(
    attempts: list[Coroutine[Any, Any, frames.Link]], stagger: float
) -> frames.Link:
    """The first of `attempts` to succeed, each started `stagger` after the one before, or at
    once when nothing else is under way; the others are cancelled (a link one of them made
    meanwhile is aborted). Raises the first error when all fail."""
    waiting = list(attempts)
    pending: set[asyncio.Task[frames.Link]] = set()
    errors: list[BaseException] = []
    try:
        while True:
            if waiting and not pending:
                pending.add(asyncio.ensure_future(waiting.pop(0)))
            done, pending = await asyncio.wait(
                pending, timeout=stagger if waiting else None, return_when=FIRST_COMPLETED
            )
            links = [t.result() for t in done if t.exception() is None]
            errors += [e for t in done if (e := t.exception()) is not None]
            if links:
                for extra in links[1:]:
                    extra.abort()
                return links[0]
            if not pending and not waiting:
                raise errors[0]
            if not done and waiting:  # the first is slow: try the next beside it
                pending.add(asyncio.ensure_future(waiting.pop(0)))
    finally:
        # Nothing awaited here: a cancellation of the caller meanwhile would replace the
        # return and leave the winning link open.
        for coro in waiting:
            coro.close()
        for task in pending:
            task.cancel()
            task.add_done_callback(_abort_late_link)


def _abort_late_link(task: asyncio.Task[frames.Link]) -> None:
    """An attempt that lost the race (or was cancelled): a link it made after all is closed."""
    if not task.cancelled() and task.exception() is None:
        task.result().abort()


@dataclass(frozen=True)
class _Route:
    """A peer's URL for one request: its own, or its last seen address for the same name (the
    `Host` it is called by, and the name its certificate must carry)."""

    url: str
    host: str | None = None
    tls_name: str | None = None

    def headers(self, token: str | None, cluster: str | None = None) -> dict[str, str]:
        out = peer_headers(token, cluster)
        return {**out, "Host": self.host} if self.host is not None else out


class Transport:
    def __init__(
        self,
        node_id: str,
        peers: dict[str, str],
        token: str | None,
        ssl_context: ssl.SSLContext | None = None,
        frame_budget: int = FRAME_BUDGET,
        cluster: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.ssl_context = ssl_context
        self.frame_budget = frame_budget
        self.node_id = node_id
        self.peers = peers
        self.token = token
        self.session: aiohttp.ClientSession | None = None
        self._telling: set[asyncio.Task[None]] = set()  # `tell_address` under way
        self.senders: dict[str, PeerSender] = {}
        self.addresses: dict[str, str] = {}  # where each peer was last seen (`seen`)
        self._no_address = OncePer(60.0)
        self.snapshot_chunk_bytes = DEFAULT_CHUNK_BYTES
        # The snapshot streams under way, by (partition, target); each leaves when it ends.
        self.snapshot_sends: dict[tuple[int, str], SnapshotSend] = {}

    def snapshot_sends_of(self, partition: int) -> list[SnapshotSend]:
        """The partition's snapshot streams under way from this node, by target."""
        return sorted(
            (s for (p, _), s in self.snapshot_sends.items() if p == partition),
            key=lambda s: s.target,
        )

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=10, connect=REQUEST_CONNECT_S)
        connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.ssl_context else None
        self.session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        for name, url in self.peers.items():
            if name != self.node_id:
                self._add(name, url)

    def add_peer(self, name: str, url: str) -> None:
        """Learn (or change) a member's address; its sender starts on the next message."""
        url = url.rstrip("/")
        if self.peers.get(name) != url:
            self.addresses.pop(name, None)  # where it was seen belongs to its old URL
        self.peers[name] = url
        self._stop_sender(name)

    def restore_peer(self, name: str, url: str | None) -> None:
        """Put back the address `name` had before (None: it had none)."""
        if url is not None:
            self.add_peer(name, url)
        elif self.peers.pop(name, None) is not None:
            self._stop_sender(name)

    def _stop_sender(self, name: str) -> None:
        sender = self.senders.pop(name, None)
        if sender is not None and sender.task is not None:
            sender.task.cancel()

    def _add(self, name: str, url: str) -> PeerSender:
        sender = PeerSender(
            name, url, self.token, self.ssl_context, self.frame_budget, self.addresses,
            self.cluster,
        )  # fmt: skip
        sender.task = asyncio.get_running_loop().create_task(sender.run())
        self.senders[name] = sender
        return sender

    async def close(self) -> None:
        for s in self.senders.values():
            if s.task is not None:
                s.task.cancel()
        for t in list(self._telling):
            t.cancel()
        if self.session is not None:
            await self.session.close()

    def tell_address(self, member: str, url: str, for_s: float = TELL_FOR_S) -> None:
        """Tell every other peer `member`'s URL (their `POST /v1/admin/peers`), in the
        background: a leader given it by an admin call is the only member that knows it (a
        membership entry carries names), and once that leader was gone, a majority of the new
        voters could not reach each other to elect. Each is asked again, a second apart, for
        `for_s` until it answers; an operator tells them all again anyway (`SyncPeers`)."""
        task = asyncio.get_running_loop().create_task(self._tell(member, url, for_s))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def _tell(self, member: str, url: str, for_s: float) -> None:
        assert self.session is not None
        left = {n: u for n, u in self.peers.items() if n not in (self.node_id, member)}
        deadline = time.monotonic() + for_s
        while left and time.monotonic() < deadline:
            for name, base in list(left.items()):
                route = _Route(f"{base}/v1/admin/peers")
                try:
                    async with self.session.post(
                        route.url,
                        json={member: url},
                        headers=route.headers(self.token, self.cluster),
                        timeout=aiohttp.ClientTimeout(5, connect=REQUEST_CONNECT_S),
                    ) as resp:  # fmt: skip
                        if resp.status == 200:
                            del left[name]
                except (aiohttp.ClientError, TimeoutError, OSError):
                    pass  # asked again in a second
            if left:
                await asyncio.sleep(1.0)
        if left:
            log.warning("%s's address was not told to %s", member, ", ".join(sorted(left)))

    def seen(self, name: str, address: str) -> None:
        """`name` is at `address`: it connected to this node from there (an authenticated
        peer), or its operator says its pod is there. Tried beside its name (`_open_link`).
        Kept for this node's peers only: a stream's sender names itself, and every name was kept."""
        if name in self.peers and name != self.node_id:
            self.addresses[name] = address

    def ping(self, names: set[str]) -> None:
        """A liveness ping to each of `names` (`core/liveness.py`), with what else goes to it."""
        for name in sorted(names):
            url = self.peers.get(name)
            if url is not None and name != self.node_id:
                sender = self.senders.get(name) or self._add(name, url)
                sender.send(-1, [Ping(self.node_id)])

    def send(self, partition: int, messages: list[Message]) -> bool:
        """Send each message to its peer; True when all went straight to sockets (frame
        streams up and taking writes), False when some wait for a sender task."""
        written = True
        by_peer: dict[str, list[Message]] = {}
        for m in messages:
            by_peer.setdefault(m.dst, []).append(m)
        for dst, ms in by_peer.items():
            sender = self.senders.get(dst)
            if sender is None:
                url = self.peers.get(dst)
                if url is None:
                    # A reply to a sender that is no member (its name is its own to choose).
                    if self._no_address((dst, partition)):
                        log.warning(
                            "p%d: no address for %s; message dropped (said once a minute per "
                            "name and partition)",
                            partition,
                            dst,
                        )
                    continue
                sender = self._add(dst, url)
            written = sender.send(partition, ms) and written
        return written

    async def request_snapshot_send(
        self, source: str, partition: int, target: str, leader: str, term: int, required: int
    ) -> None:
        """Ask follower `source` to stream its snapshot to `target` (raises when it cannot).
        Only a connection that could not be made is tried again at `source`'s last seen
        address (`_routes`): a request that reached it is never sent twice."""
        assert self.session is not None
        base = f"{self.peers[source]}/peer/v1/partitions/{partition}/send-snapshot"
        body = {"target": target, "leader": leader, "term": term, "required": required}
        failure: Exception | None = None
        for route in self._routes(source, base):
            try:
                async with self.session.post(
                    route.url, json=body, headers=route.headers(self.token, self.cluster),
                    server_hostname=route.tls_name,
                    # The source streams for as long as the snapshot takes; a connection that
                    # does not open (an old address whose packets go nowhere) gives up as
                    # any other request's does, for the next route.
                    timeout=aiohttp.ClientTimeout(600, connect=REQUEST_CONNECT_S),
                ) as resp:  # fmt: skip
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                    return
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                failure = e
        assert failure is not None
        raise failure

    def _routes(self, peer: str, base: str) -> list[_Route]:
        """`base` (a URL of `peer`), then the same at the address `peer` last connected to this
        node from or its operator told (`addresses`), for the same name: a restarted pod is at a
        new address while the cluster DNS may still answer its old one for its cache time."""
        seen = self.addresses.get(peer)
        u = urllib.parse.urlsplit(base)
        routes = [_Route(base)]
        if seen is not None and u.hostname is not None and seen != u.hostname:
            host = f"[{seen}]" if ":" in seen else seen
            netloc = f"{host}:{u.port}" if u.port is not None else host
            tls_name = u.hostname if u.scheme == "https" else None  # the certificate names it
            routes.append(_Route(u._replace(netloc=netloc).geturl(), u.netloc, tls_name))
        return routes

    async def _snapshot_route(
        self, target: str, base: str, params: dict[str, str]
    ) -> tuple[_Route, int]:
        """Where `target` takes snapshot chunks (`_routes`: installs right after a restart had
        timed out at the old address, attempt after attempt, on the real cluster), and how
        much it holds already."""
        assert self.session is not None
        failure: Exception | None = None
        for route in self._routes(target, base):
            try:
                async with self.session.get(
                    route.url,
                    params=params,
                    headers=route.headers(self.token, self.cluster),
                    server_hostname=route.tls_name,
                ) as resp:  # how much of it the target already holds
                    resp.raise_for_status()
                    return route, int((await resp.json())["received"])
            except (aiohttp.ClientConnectionError, TimeoutError) as e:
                failure = e
        assert failure is not None
        raise failure

    async def send_snapshot(
        self,
        target: str,
        partition: int,
        leader: str,
        term: int,
        meta: SnapshotMeta,
        data: bytes,
        chunk_bytes: int | None = None,
    ) -> int:
        """Stream a snapshot to `target` in chunks, resuming from what it already holds; its
        progress is in `snapshot_sends` meanwhile."""
        assert self.session is not None
        url = self.peers[target]
        raw = encode_snapshot(meta, data)
        chunk_bytes = chunk_bytes or self.snapshot_chunk_bytes
        base = f"{url}/peer/v1/partitions/{partition}/snapshot"
        params = {"leader": leader, "term": str(term), "index": str(meta.index)}
        params["snap_term"] = str(meta.term)
        key, progress = (partition, target), SnapshotSend(target, meta.index, len(raw))
        self.snapshot_sends[key] = progress
        try:
            route, offset = await self._snapshot_route(target, base, params)
            if offset > len(raw):
                offset = 0
            progress.sent_bytes = progress.resumed_from = offset
            while True:
                chunk = Chunk.of(raw, offset, chunk_bytes)
                headers = {
                    **peer_headers(self.token, self.cluster),
                    "X-Offset": str(chunk.offset),
                    "X-Crc32c": str(chunk.crc32c),
                    "X-Total": str(chunk.total),
                }
                async with self.session.post(
                    route.url, params=params, data=chunk.data,
                    headers={**headers, **route.headers(None)}, server_hostname=route.tls_name,
                ) as resp:  # fmt: skip
                    if resp.status not in (200, 204):
                        raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                offset += len(chunk.data)
                progress.sent_bytes = offset
                if chunk.last:
                    return len(raw)
        finally:
            if self.snapshot_sends.get(key) is progress:  # not a newer stream to the same target
                del self.snapshot_sends[key]
