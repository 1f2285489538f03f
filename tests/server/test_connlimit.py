"""A listener's connection limit (`server.connlimit.ConnectionLimit`): up to the limit taken,
one more answered 503 naming the setting and closed, and a slot freed by a connection that
closed (told or found closing)."""

from __future__ import annotations

import asyncio
import json
from typing import cast

from prometheus_client import CollectorRegistry, Counter

from raftlog.node.server.connlimit import ConnectionLimit


class Conn:
    def __init__(self) -> None:
        self.sent = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _limit(n: int) -> tuple[ConnectionLimit, CollectorRegistry]:
    registry = CollectorRegistry()
    refused = Counter("refused", "", ["listener"], registry=registry)
    return ConnectionLimit("client", n, "max_client_connections", refused), registry


def _refused(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("refused_total", {"listener": "client"})


def _t(c: Conn) -> asyncio.BaseTransport:
    return cast(asyncio.BaseTransport, c)


def test_one_connection_past_the_limit_is_answered_503_naming_the_setting_and_closed():
    limit, registry = _limit(2)
    a, b, c = Conn(), Conn(), Conn()
    assert limit.admit(_t(a)) and limit.admit(_t(b))
    assert not limit.admit(_t(c))
    assert c.closed and not a.closed and not b.closed and a.sent == b""
    head, _, body = c.sent.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in head
    answer = json.loads(body)
    assert answer["error"] == "too_many_connections"
    assert "max_client_connections" in answer["reason"] and "2 connections" in answer["reason"]
    assert _refused(registry) == 1


def test_a_slot_comes_back_when_a_connection_is_released_or_found_closed():
    limit, registry = _limit(2)
    a, b = Conn(), Conn()
    assert limit.admit(_t(a)) and limit.admit(_t(b))
    limit.release(_t(a))
    assert limit.admit(_t(Conn()))
    b.closed = True  # handed over to aiohttp and closed there: never released here
    assert limit.admit(_t(Conn()))
    assert not limit.admit(_t(Conn()))
    assert _refused(registry) == 1
