"""The one client of the raftlog node API: `AsyncClient` (aiohttp) and `Client` (blocking), with
the same calls (records, pages, the admin API) and the same retry policy.

`AsyncClient` and `IdempotentProducer` are loaded when first asked for: a process that only
blocks (Spark's workers, `raftctl`) does not import aiohttp (about 0.13 s of CPU a process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftlog.client.blocking import Client
from raftlog.client.calls import AppendResult, ClientError
from raftlog.client.retry import NO_ANSWER, RETRIED_STATUSES, RetryPolicy

if TYPE_CHECKING:
    from raftlog.client.client import AsyncClient, IdempotentProducer

__all__ = [
    "NO_ANSWER",
    "RETRIED_STATUSES",
    "AppendResult",
    "AsyncClient",
    "Client",
    "ClientError",
    "IdempotentProducer",
    "RetryPolicy",
]


def __getattr__(name: str) -> Any:
    if name in ("AsyncClient", "IdempotentProducer"):
        from raftlog.client import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
