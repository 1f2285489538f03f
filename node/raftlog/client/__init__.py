"""The one client of the raftlog node API: `AsyncClient` (aiohttp) and `Client` (blocking), with
the same calls (records, pages, the admin API) and the same retry policy."""

from raftlog.client.blocking import Client
from raftlog.client.calls import AppendResult, ClientError
from raftlog.client.client import AsyncClient, IdempotentProducer
from raftlog.client.retry import NO_ANSWER, RETRIED_STATUSES, RetryPolicy

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
