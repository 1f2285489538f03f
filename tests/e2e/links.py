"""A TCP proxy per ordered pair of nodes, which a test cuts and heals: network faults without
root, for `LocalCluster(peer_url=links.url)`.

Node A reaches node B through the link (A, B) only; B's messages to A go through (B, A), so a
fault may be one-way. A cut link does one of two things, as networks do:

- `stall`: nothing passes either way and nothing is refused (packets dropped): bytes wait in
  the kernel's buffers until the sender's fill, and what waited is delivered once the link
  heals, as TCP's retransmissions would; new connections are taken and stall as well.
- `reset`: every connection through the link is reset, and new ones are reset at once (a
  firewall's REJECT, a peer's host rebooted).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from raftlog.harness.local import free_ports

CHUNK = 65536
T = TypeVar("T")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class _Link:
    port: int  # where the proxy listens on 127.0.0.1
    target: int  # the peer's port on 127.0.0.1
    up: asyncio.Event = field(default_factory=asyncio.Event)
    mode: str = "up"
    conns: set[asyncio.StreamWriter] = field(default_factory=set)


class Links:
    """Proxies for every ordered pair of `ports` (node name -> port), on their own event loop
    in a thread; `cut`, `heal` and `heal_all` may be called from any thread."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        pairs = [(a, b) for a in ports for b in ports if a != b]
        proxy_ports = free_ports(len(pairs))
        self.links = self._call(self._start(pairs, proxy_ports, ports))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    async def _start(
        self, pairs: list[tuple[str, str]], proxy_ports: list[int], ports: dict[str, int]
    ) -> dict[tuple[str, str], _Link]:
        links = {}
        self._servers: list[asyncio.Server] = []
        for (a, b), port in zip(pairs, proxy_ports, strict=True):
            link = _Link(port, ports[b])
            link.up.set()
            links[(a, b)] = link
            handler = self._handler(link)
            self._servers.append(await asyncio.start_server(handler, "127.0.0.1", port))
        return links

    def url(self, src: str, dst: str) -> str:
        return f"http://127.0.0.1:{self.links[(src, dst)].port}"

    def _handler(self, link: _Link) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if link.mode == "reset":
                _reset(writer)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", link.target)
            except OSError:
                _reset(writer)
                return
            link.conns.update((writer, up_writer))
            try:
                await asyncio.gather(_pump(link, reader, up_writer), _pump(link, up_reader, writer))
            finally:
                link.conns.difference_update((writer, up_writer))
                for w in (writer, up_writer):
                    w.close()

        return handle

    def cut(self, src: str, dst: str, mode: str) -> None:
        assert mode in ("stall", "reset"), mode
        self.loop.call_soon_threadsafe(self._cut, self.links[(src, dst)], mode)

    def _cut(self, link: _Link, mode: str) -> None:
        link.mode = mode
        link.up.clear()
        if mode == "reset":
            for w in list(link.conns):
                _reset(w)

    def heal_all(self) -> None:
        for link in self.links.values():
            self.loop.call_soon_threadsafe(self._heal, link)

    @staticmethod
    def _heal(link: _Link) -> None:
        link.mode = "up"
        link.up.set()

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
            for link in self.links.values():
                for w in list(link.conns):
                    _reset(w)

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


def _reset(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if not transport.is_closing():
        transport.abort()  # RST where the socket allows it, never a graceful close


async def _pump(link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while True:
            await link.up.wait()  # a stalled link reads nothing: the sender's buffers fill
            data = await reader.read(CHUNK)
            if not data:
                break
            await link.up.wait()  # cut while a read waited: what was read waits too
            if link.mode == "reset" or writer.transport.is_closing():
                break
            writer.write(data)
            await writer.drain()
    if link.mode != "reset" and not writer.transport.is_closing():
        with contextlib.suppress(OSError):
            writer.write_eof()


@contextlib.contextmanager
def proxied(ports: dict[str, int]) -> Iterator[Links]:
    links = Links(ports)
    try:
        yield links
    finally:
        links.close()
