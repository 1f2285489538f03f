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
from http import HTTPStatus
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.http_parser import HttpRequestParser
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

_ERRORS = {
    400: "bad_request",
    413: "too_large",
    431: "too_large",
    500: "internal",
    504: "timeout",
}
# A request's head, all its lines: aiohttp takes 128 lines of 8,190 bytes, and an unfinished head
# held about 2 MB of memory per connection until its keep-alive time closed it (75 s).
MAX_HEAD_BYTES = 64 * 1024
# aiohttp's bounds of a request line and of one header field: its own (8,190), but the line's
# two bytes longer, so that its `LineTooLong`, which names only the bound it passed, tells a
# request line too long (414) from a header field too long (431).
MAX_FIELD_BYTES = 8190
MAX_LINE_BYTES = MAX_FIELD_BYTES + 2
MAX_HEADER_FIELDS = 128  # aiohttp's own bound of a head's fields, named here for its 431


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


def too_large(exc: BaseException | None) -> tuple[int, bytes] | None:
    """aiohttp's 400 for a head past one of its bounds, as HTTP names it: 414 for a request line
    past MAX_LINE_BYTES, 431 for a header field past MAX_FIELD_BYTES or for more than
    MAX_HEADER_FIELDS fields (RFC 6585: the fields together too large); None for any other
    error. (Its 400 quoted the start of a long line as a `bytearray` repr.)"""
    if isinstance(exc, LineTooLong):
        if str(exc.args[1]) == str(MAX_LINE_BYTES):
            status, what = 414, f"the request line passes {MAX_LINE_BYTES} bytes"
        else:
            status, what = 431, f"a header field passes {MAX_FIELD_BYTES} bytes"
    elif isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc.message):
        status, what = 431, f"the request has more than {MAX_HEADER_FIELDS} header fields"
    else:
        return None
    return status, json.dumps({"error": "too_large", "reason": what}).encode()


class JsonErrors(RequestHandler):
    """aiohttp's request handler (one per connection), answering its own errors in JSON, and
    parsing one request ahead at most.

    aiohttp parses all the bytes it receives at once, and when a head in them is malformed it
    drops the requests it had parsed before it: of `GET a, GET b, <malformed>` sent together only
    the 400 was answered, which a pipelining client takes for its answer to `GET a`. Its parser
    can stop after each complete request and keep the rest until that request is taken (its
    queue of parsed requests, 32 deep, made one deep here): a malformed request is then parsed
    only once those before it are queued, and answered after them.

    The heads it reads are held to the fast path's rules: complete within
    `request_head_timeout_s` of their first byte it reads (else 408), and within MAX_HEAD_BYTES
    (else 431). aiohttp has no deadline for a head: one trickled in was closed by its keep-alive
    time (75 s), without a word, holding up to 2 MB meanwhile."""

    __slots__ = ("_answered", "_body", "_client_done", "_head", "_head_timeout_s", "_head_timer")

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        head_timeout_s: float = 10.0,
        **kw: Any,
    ):
        super().__init__(manager, loop=loop, **kw)
        self._client_done = False
        # A head is held to request_head_timeout_s and MAX_HEAD_BYTES, as the fast path holds
        # the heads it reads (`listener.py`): the bytes parsed since the last request's head
        # that are not its body, and the timer running since the first of them.
        self._head_timeout_s = head_timeout_s
        self._head = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None  # the last request's body
        self._answered = 0  # requests answered (`_request_count` counts those parsed)
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

    def data_received(self, data: bytes) -> None:
        parsed = self._request_count
        in_body = self._body is not None and not self._body.is_eof()
        super().data_received(data)
        if self._force_close or self._close:
            return
        if self._request_count != parsed:  # a head ended: a request, with its body to come
            self._body = self._messages[-1][1] if self._messages else None
            self._head = 0
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            return
        if in_body or not data:
            return  # a body (the guard holds it to its own deadline), or a parse resumed
        self._head += len(data)
        if self._head > MAX_HEAD_BYTES:
            reason = f"the request's head passed {MAX_HEAD_BYTES} bytes"
            self._refuse(431, {"error": "too_large", "reason": reason})
        elif self._head_timer is None:
            self._head_timer = self._loop.call_later(
                self._head_timeout_s, self._head_overdue, self._request_count
            )

    def _head_overdue(self, parsed: int) -> None:
        self._head_timer = None
        if self._request_count != parsed or self._force_close or self._close:
            return  # its head ended meanwhile, or the connection is closing
        if self._answered != self._request_count:  # it waits behind a request being answered
            self._head_timer = self._loop.call_later(
                self._head_timeout_s, self._head_overdue, parsed
            )
            return
        self._refuse(408, {"error": "timeout", "reason": "the request was not sent in time"})

    def _refuse(self, status: int, body: dict[str, str]) -> None:
        """Answer an unfinished head and close (silently when an answer is under way: the
        refusal must not cut into it)."""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self.transport is not None and self._answered == self._request_count:
            text = json.dumps(body).encode()
            self.transport.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s"
                % (status, HTTPStatus(status).phrase.encode(), len(text), text)
            )
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

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
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._answered += 1  # written (or the client gone): a refusal may be written now

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own first: it logs the error and refuses to answer after a partial answer.
        super().handle_error(request, status, exc, message)
        refused = too_large(exc)
        if refused is not None:
            status, body = refused
        else:
            body = error_body(status, message)
        resp = web.Response(status=status, body=body, content_type="application/json")
        resp.force_close()
        return resp
