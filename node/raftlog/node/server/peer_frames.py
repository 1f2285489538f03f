"""The receiving end of a peer's frame stream (`transport.frames`), once the listener's fast path
has accepted its handshake (`server/listener.py`).

Each frame's messages are stepped into the partitions' drivers in the callback that completes
the frame, in order: no task wakes between the socket and the driver. A frame that does not
decode, or is larger than `max_request_bytes`, closes the stream (the sender reconnects and goes
on with later frames); a message for a partition this node does not have is dropped, counted and
logged (once a minute per sender and partition: `Node.step_streamed`), and the stream stays up.
A stream holding part of a frame, with no frame completed for `peer_frame_timeout_s`, is closed
by the listener's sweep (`Connections`): 1,500 streams each holding a few bytes of a frame once
held 88 MB, for good. A stream with no frame under way is left open however long it is idle: a
sender keeps its stream while it has nothing to send.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from raftlog.node.core.errors import InvalidMessage
from raftlog.node.server.node import Node
from raftlog.node.transport.codec import decode_frame
from raftlog.node.transport.frames import FrameTooLarge, Splitter

log = logging.getLogger("raftlog.transport")


class FrameReceiver(asyncio.Protocol):
    def __init__(self, node: Node, streams: set[FrameReceiver]) -> None:
        self.node = node
        self.streams = streams  # the open frame streams, swept, and closed when the node stops
        self.splitter = Splitter(node.settings.max_request_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address: str | None = None
        self.named = False  # the peer's name (its messages' src) told to the transport
        self.source = "peer frame stream"
        # Loop time since which part of a frame is held with no frame completed (0: none held).
        self.partial_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)
        self.streams.add(self)
        peer = t.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.address = str(peer[0]) if isinstance(peer, tuple) else None
        self.source = f"peer frame stream from {self.peer}"  # named in the log

    def connection_lost(self, exc: Exception | None) -> None:
        self.streams.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        try:
            frames = self.splitter.feed(data)
            if not self.splitter.buf:
                self.partial_since = 0.0
            elif frames or not self.partial_since:
                self.partial_since = asyncio.get_running_loop().time()
            for frame in frames:
                items = decode_frame(frame)
                if items and not self.named and self.address is not None:
                    # Where the peer is now (see `PeerSender._open_link`).
                    self.node.transport.seen(items[0][1].src, self.address)
                    self.named = True
                self.node.step_streamed(items, self.source)
        except (FrameTooLarge, InvalidMessage) as e:
            reason = f"{e.field}: {e.reason}" if isinstance(e, InvalidMessage) else str(e)
            log.warning("peer frame stream from %s: bad frame (%s); closed", self.peer, reason)
            self.transport.close()

    def overdue(self, now: float, timeout: float) -> bool:
        """Part of a frame held, and no frame completed, for longer than `timeout`."""
        return 0.0 < self.partial_since < now - timeout

    def time_out(self, timeout: float) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        held = len(self.splitter.buf)
        log.warning(
            "peer frame stream from %s: %d bytes of a frame not completed in %g s "
            "(peer_frame_timeout_s); closed",
            self.peer,
            held,
            timeout,
        )
        self.node.metrics.peer_streams_timed_out.inc()
        self.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # the sender is done: close our side too
