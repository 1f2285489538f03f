"""aiohttp's own answers (a request it cannot parse, a handler that failed) in the API's JSON
error shape.

aiohttp answers a malformed request head (a bad method or version, a header without a colon, a
Content-Length that is not a number, a bad chunk size) itself, before any handler or middleware
runs, in text/plain with a caret under the offending byte. A client of this API reads every
error as `{"error": ..., "reason": ...}`, so these are rewritten to that shape: the same status,
aiohttp's reason on one line, and the offending text where aiohttp names it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.http_parser import HttpRequestParser
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

_ERRORS = {400: "bad_request", 413: "too_large", 431: "too_large", 500: "internal", 504: "timeout"}


def error_body(status: int, message: str | None) -> bytes:
    """`{"error", "reason"[, "at"]}` from aiohttp's status and message (its first line is the
    reason; a line after it quotes the offending bytes; a caret line is dropped)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    lines = [line for line in lines if line != "^"]
    fallback = "bad_request" if status < 500 else "internal"
    body: dict[str, Any] = {"error": _ERRORS.get(status, fallback)}
    if status >= 500:
        body["reason"] = "see the node's log"
    else:
        body["reason"] = lines[0].rstrip(":") if lines else "the request is not valid HTTP/1.1"
        if len(lines) > 1:
            body["at"] = " ".join(lines[1:])[:200]
    return json.dumps(body).encode()


class JsonErrors(RequestHandler):
    """aiohttp's request handler (one per connection), answering its own errors in JSON, and
    parsing one request ahead at most.

    aiohttp parses all the bytes it receives at once, and when a head in them is malformed it
    drops the requests it had parsed before it: of `GET a, GET b, <malformed>` sent together only
    the 400 was answered, which a pipelining client takes for its answer to `GET a`. Its parser
    can stop after each complete request and keep the rest until that request is taken (its
    queue of parsed requests, 32 deep, made one deep here): a malformed request is then parsed
    only once those before it are queued, and answered after them."""

    __slots__ = ("_client_done",)

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, **kw: Any):
        super().__init__(manager, loop=loop, **kw)
        self._client_done = False
        if not hasattr(self, "_max_msg_queue_size"):
            return  # an aiohttp before the queue's bound (3.14): its parser as it is
        self._max_msg_queue_size = 1
        self._msg_queue_resume_size = 0
        self._parser = HttpRequestParser(
            self,
            loop,
            self._read_bufsize,
            max_line_size=self.max_line_size,
            max_field_size=self.max_field_size,
            max_headers=self.max_headers,
            payload_exception=RequestPayloadError,
            auto_decompress=kw.get("auto_decompress", True),
            max_msg_queue_size=1,
        )

    def client_done(self) -> bool:
        """The client shut its side of the connection (`printf ... | nc`): the requests it sent
        are still answered, the last one closing the connection (`finish_response`); aiohttp
        kept it for its keep-alive time (75 s). False when none is left to answer: waiting for
        a request, whatever part of one came can never be completed, so it may close now."""
        self._client_done = True
        waiting = self._waiter is not None and not self._waiter.done()
        return not (waiting and not self._messages)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if self._client_done and not self._messages:
            resp.force_close()  # no complete request after it: the last answer
        # An HTTP error raised before the app's middleware (`api_common.make_guard`) ran, which
        # would answer it in JSON: aiohttp's 417 for an `Expect` other than 100-continue.
        if isinstance(resp, web.HTTPException) and resp.status >= 400:
            body = {"error": resp.reason.lower().replace(" ", "_"), "reason": resp.text}
            if resp.status == 417:
                body["field"] = "Expect"
            resp = web.json_response(body, status=resp.status)
        return await super().finish_response(request, resp, start_time)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own first: it logs the error and refuses to answer after a partial answer.
        super().handle_error(request, status, exc, message)
        resp = web.Response(
            status=status, body=error_body(status, message), content_type="application/json"
        )
        resp.force_close()
        return resp
