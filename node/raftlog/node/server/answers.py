"""Large answers held for slow readers, bounded across the node.

An answer is written to its socket's buffer whole; a reader that does not read leaves it in the
node's memory. Eight readers that never read held 1.4 GB before reads were bounded by bytes, and
even bounded, 4,096 connections each with a 4 MiB page would hold 16 GiB. So an answer above
`SMALL` takes its size from one budget until its socket has taken it (the bytes are then in the
kernel, whose buffers are bounded), and a read that does not fit is refused at once.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

log = logging.getLogger("raftlog.api")
SMALL = 64 * 1024  # aiohttp's own high-water mark: below it an answer is never held back


class AnswerBudget:
    def __init__(self, limit: int, send_timeout_s: float) -> None:
        self.limit = limit
        self.send_timeout_s = send_timeout_s
        self.held = 0
        self.refused = 0
        self.timed_out = 0

    def _take(self, n: int) -> bool:
        if not self.may_take(n):
            return False
        self.held += n
        return True

    def may_take(self, up_to: int) -> bool:
        """Whether an answer of up to `up_to` bytes would fit: checked before a read is made,
        as refused only once made, four 384 MiB answers were built before three were refused.
        One answer alone always fits: a limit below the largest page must not refuse it
        forever."""
        if up_to > SMALL and self.held and self.held + up_to > self.limit:
            self.refused += 1
            return False
        return True

    def busy_reason(self) -> str:
        return (
            f"answers waiting for their readers hold {self.held} bytes "
            f"(max_answer_buffer_bytes {self.limit}); retry, or read less at a time (max_bytes)"
        )

    async def send(self, request: web.Request, resp: web.Response) -> web.StreamResponse:
        """Send a large answer within the budget and the timeout; what the handler returns
        then (aiohttp sends nothing more for an answer already sent). A small answer is
        returned as it is, for aiohttp to send."""
        size = resp.content_length or 0
        if size <= SMALL:
            return resp
        if not self._take(size):
            busy = web.json_response(
                {"error": "busy", "reason": self.busy_reason()},
                status=503,
                headers={"Retry-After": "1"},
            )
            return busy
        try:
            await resp.prepare(request)
            await asyncio.wait_for(resp.write_eof(), self.send_timeout_s)
        except ConnectionError:
            pass  # the reader left: nothing more to send
        except TimeoutError:
            self.timed_out += 1
            log.warning(
                "%s %s: the reader took no %d-byte answer in %s s (answer_send_timeout_s); "
                "connection closed",
                request.method,
                request.path_qs[:200],
                size,
                self.send_timeout_s,
            )
            if request.transport is not None:
                request.transport.abort()  # its buffered bytes go with it
        finally:
            self.held -= size
        return resp


class BodyBudget:
    """Bytes of request bodies held at once, each from its head (its announced length) until
    it is answered: 4,096 connections each sending 8 MiB of a body slowly held 32 GiB, as the
    answers of readers that do not read did. One body alone always fits."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0

    def take(self, n: int) -> bool:
        """Count a body of `n` bytes in (True), or refuse it (False) when it would not fit."""
        if n > SMALL and self.held and self.held + n > self.limit:
            self.refused += 1
            return False
        self.held += n
        return True

    def release(self, n: int) -> None:
        self.held -= n

    def busy(self, n: int) -> dict[str, str]:
        """The 503's body for a request of `n` bytes refused."""
        return {
            "error": "busy",
            "reason": f"request bodies being read hold {self.held} bytes, {n} more would pass "
            f"max_body_buffer_bytes ({self.limit}); retry",
            "field": "Content-Length",
        }
