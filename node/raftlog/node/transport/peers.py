"""Sending to peers: one long-lived HTTP connection pool and one sender task per peer.

Messages for a peer queue up while the previous frame is in flight and go out together in the
next one (binary frames, see `codec`). A failed send drops its frame (Raft retransmits what
matters) and the sender backs off, doubling from 50 ms to 2 s, until the peer answers again. The
queue is bounded: when a peer is down for long, the oldest messages are dropped first.

Snapshots stream in chunks, each with its offset and CRC32C; the receiver appends them to a
partial file, so a transfer cut short resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque

import aiohttp

from raftlog.node.core.messages import Message
from raftlog.node.core.types import SnapshotMeta
from raftlog.node.storage.snapshots import DEFAULT_CHUNK_BYTES, Chunk, encode_snapshot
from raftlog.node.transport.codec import encode_frame

log = logging.getLogger("raftlog.transport")

MAX_QUEUE = 10_000
BACKOFF_MIN, BACKOFF_MAX = 0.05, 2.0


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class PeerSender:
    def __init__(self, name: str, url: str, session: aiohttp.ClientSession, token: str | None):
        self.name = name
        self.url = url
        self.session = session
        self.headers = {**auth_headers(token), "Content-Type": "application/x-raftlog-frame"}
        self.queue: deque[tuple[int, Message]] = deque(maxlen=MAX_QUEUE)
        self.ready = asyncio.Event()
        self.sent_frames = 0
        self.failures = 0
        self.connected = False
        self.task: asyncio.Task[None] | None = None

    def send(self, partition: int, messages: list[Message]) -> None:
        self.queue.extend((partition, m) for m in messages)
        self.ready.set()

    async def run(self) -> None:
        backoff = BACKOFF_MIN
        while True:
            await self.ready.wait()
            self.ready.clear()
            if not self.queue:
                continue
            items = list(self.queue)
            self.queue.clear()
            try:
                async with self.session.post(
                    f"{self.url}/peer/v1/messages", data=encode_frame(items), headers=self.headers
                ) as resp:
                    if resp.status != 204:
                        raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                self.sent_frames += 1
                if not self.connected:
                    log.info("peer %s reachable at %s", self.name, self.url)
                self.connected = True
                backoff = BACKOFF_MIN
            except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError) as e:
                self.failures += 1
                if self.connected:
                    log.warning("peer %s unreachable: %s", self.name, e)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                self.ready.set()


class Transport:
    def __init__(
        self,
        node_id: str,
        peers: dict[str, str],
        token: str | None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.ssl_context = ssl_context
        self.node_id = node_id
        self.peers = peers
        self.token = token
        self.session: aiohttp.ClientSession | None = None
        self.senders: dict[str, PeerSender] = {}

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=10, connect=2)
        connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.ssl_context else None
        self.session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        for name, url in self.peers.items():
            if name != self.node_id:
                self._add(name, url)

    def add_peer(self, name: str, url: str) -> None:
        """Learn (or change) a member's address; its sender starts on the next message."""
        url = url.rstrip("/")
        self.peers[name] = url
        sender = self.senders.pop(name, None)
        if sender is not None and sender.task is not None:
            sender.task.cancel()

    def _add(self, name: str, url: str) -> PeerSender:
        assert self.session is not None
        sender = PeerSender(name, url, self.session, self.token)
        sender.task = asyncio.get_running_loop().create_task(sender.run())
        self.senders[name] = sender
        return sender

    async def close(self) -> None:
        for s in self.senders.values():
            if s.task is not None:
                s.task.cancel()
        if self.session is not None:
            await self.session.close()

    def send(self, partition: int, messages: list[Message]) -> None:
        by_peer: dict[str, list[Message]] = {}
        for m in messages:
            by_peer.setdefault(m.dst, []).append(m)
        for dst, ms in by_peer.items():
            sender = self.senders.get(dst)
            if sender is None:
                url = self.peers.get(dst)
                if url is None:
                    log.warning("p%d: no address for %s; message dropped", partition, dst)
                    continue
                sender = self._add(dst, url)
            sender.send(partition, ms)

    async def request_snapshot_send(
        self, source: str, partition: int, target: str, leader: str, term: int, required: int
    ) -> None:
        """Ask follower `source` to stream its snapshot to `target` (raises when it cannot)."""
        assert self.session is not None
        url = f"{self.peers[source]}/peer/v1/partitions/{partition}/send-snapshot"
        body = {"target": target, "leader": leader, "term": term, "required": required}
        async with self.session.post(
            url, json=body, headers=auth_headers(self.token), timeout=aiohttp.ClientTimeout(600)
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")

    async def send_snapshot(
        self,
        target: str,
        partition: int,
        leader: str,
        term: int,
        meta: SnapshotMeta,
        data: bytes,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> int:
        """Stream a snapshot to `target` in chunks, resuming from what it already holds."""
        assert self.session is not None
        url = self.peers[target]
        raw = encode_snapshot(meta, data)
        base = f"{url}/peer/v1/partitions/{partition}/snapshot"
        params = {"leader": leader, "term": str(term), "index": str(meta.index)}
        params["snap_term"] = str(meta.term)
        async with self.session.get(
            base, params=params, headers=auth_headers(self.token)
        ) as resp:  # how much of it the target already holds
            resp.raise_for_status()
            offset = int((await resp.json())["received"])
        if offset > len(raw):
            offset = 0
        while True:
            chunk = Chunk.of(raw, offset, chunk_bytes)
            headers = {
                **auth_headers(self.token),
                "X-Offset": str(chunk.offset),
                "X-Crc32c": str(chunk.crc32c),
                "X-Total": str(chunk.total),
            }
            async with self.session.post(
                base, params=params, data=chunk.data, headers=headers
            ) as resp:
                if resp.status not in (200, 204):
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            offset += len(chunk.data)
            if chunk.last:
                return len(raw)
