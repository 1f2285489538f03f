"""How many connections a listener holds at once, and the file descriptors that takes.

Without a cap an anonymous client exhausted a node's descriptors with idle sockets, and then
nothing was answered, admin calls included. Each listener admits up to its limit; one more is
answered 503 and closed at once. With the peer plane on its own port (`peer_port`), a full client
listener leaves peers and the admin API answering.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from typing import cast

from prometheus_client import Counter

log = logging.getLogger("raftlog.node")

# Descriptors beside the sockets: WAL segments, snapshots, peers' outgoing connections, logs.
RESERVED_FDS = 256


class ConnectionLimit:
    def __init__(self, listener: str, limit: int, setting: str, refused: Counter) -> None:
        self.listener = listener
        self.limit = limit
        self.setting = setting
        self.open: set[asyncio.BaseTransport] = set()
        self.refused = refused.labels(listener)
        body = json.dumps(
            {
                "error": "too_many_connections",
                "reason": f"the {listener} listener holds its limit of {limit} connections "
                f"({setting}); retry later",
            }
        ).encode()
        self.answer = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count `transport` in, or answer it 503 and close it when the listener is full.

        Connections leave the count when found closing: a connection handed over to aiohttp is
        no longer ours to be told of its end, so the set is pruned when it looks full."""
        if len(self.open) >= self.limit:
            self.open = {t for t in self.open if not t.is_closing()}
        if len(self.open) >= self.limit:
            self.refused.inc()
            # A stream transport (uvloop's do not subclass asyncio's classes).
            cast(asyncio.WriteTransport, transport).write(self.answer)
            transport.close()
            return False
        self.open.add(transport)
        return True

    def release(self, transport: asyncio.BaseTransport) -> None:
        self.open.discard(transport)


def ensure_descriptors(connections: int, partitions: int) -> None:
    """Raise the soft limit of open files to cover the listeners' caps (up to the hard limit);
    say so when even the hard limit is too low."""
    need = connections + RESERVED_FDS + 8 * partitions
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        log.warning(
            "open files are limited to %d (hard limit), below the %d the connection limits "
            "and partitions need: lower max_client_connections/max_peer_connections or raise "
            "the limit (ulimit -n)",
            target,
            need,
        )
