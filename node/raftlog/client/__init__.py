"""Clients of the raftlog node API: `AsyncClient` (aiohttp) and `Client` (blocking)."""

from raftlog.client.client import (
    AppendResult,
    AsyncClient,
    Client,
    ClientError,
    IdempotentProducer,
)

__all__ = ["AppendResult", "AsyncClient", "Client", "ClientError", "IdempotentProducer"]
