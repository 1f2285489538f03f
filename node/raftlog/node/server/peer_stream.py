"""The receiving end of a peer's stream (`GET /peer/v1/stream`, a WebSocket; see `transport.peers`).

Each binary message is one frame of core messages (`codec`), stepped into the partitions' drivers
as it arrives, in order; nothing is sent back but control frames. A frame that does not decode
closes the stream with the reason (the sender reconnects and goes on with later frames); a message
for a partition this node does not have is dropped and logged, as `POST /peer/v1/messages`
refuses it with 404. Streams are closed (going away) when the server shuts down, so that it does
not wait for peers to hang up before it exits.
"""

from __future__ import annotations

import logging
import weakref

from aiohttp import WSCloseCode, WSMsgType, web

from raftlog.node.core.errors import InvalidMessage
from raftlog.node.server.api_common import node_of
from raftlog.node.transport.codec import decode_frame

log = logging.getLogger("raftlog.transport")
STREAMS_KEY = web.AppKey("peer_streams", weakref.WeakSet[web.WebSocketResponse])


def add_stream_routes(app: web.Application) -> None:
    """The stream's route, its registry (made before the app starts: aiohttp freezes its
    state then) and the shutdown hook that closes the open streams."""
    app[STREAMS_KEY] = weakref.WeakSet()
    app.router.add_get("/peer/v1/stream", peer_stream)
    app.on_shutdown.append(close_peer_streams)


def streams(app: web.Application) -> weakref.WeakSet[web.WebSocketResponse]:
    return app[STREAMS_KEY]


async def close_peer_streams(app: web.Application) -> None:
    """`on_shutdown`: close every open peer stream (else shutting down waits for them)."""
    for ws in list(streams(app)):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"node shutting down")


async def peer_stream(request: web.Request) -> web.WebSocketResponse:
    node = node_of(request)
    ws = web.WebSocketResponse(
        max_msg_size=node.settings.max_request_bytes, compress=False, autoping=True
    )
    await ws.prepare(request)
    streams(request.app).add(ws)
    source = f"peer stream from {request.remote}"  # named in the log
    async for msg in ws:
        if msg.type != WSMsgType.BINARY:
            await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames only")
            break
        try:
            items = decode_frame(msg.data)
        except InvalidMessage as e:
            log.warning(
                "peer stream from %s: bad frame (%s: %s)", request.remote, e.field, e.reason
            )
            reason = f"{e.field}: {e.reason}"[:120].encode()
            await ws.close(code=WSCloseCode.INVALID_TEXT, message=reason)
            break
        node.step_streamed(items, source)
    return ws
