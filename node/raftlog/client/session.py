"""An aiohttp session made on first use (inside the running loop) and closed once."""

from __future__ import annotations

import ssl
from typing import Self

import aiohttp
import aiohttp.abc


class SessionHolder:
    def __init__(
        self,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        resolver: aiohttp.abc.AbstractResolver | None = None,
    ) -> None:
        """`ca_file` verifies the nodes; `cert_file` and `key_file` are shown to a listener that
        asks for a client certificate (a peer listener with peer_client_cert_auth). `resolver`
        replaces DNS (and the session's DNS cache: it is asked on every connection)."""
        self._resolver = resolver
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else None
        if cert_file is not None:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            self._ssl.load_cert_chain(cert_file, key_file)
        self._timeout = timeout or aiohttp.ClientTimeout(total=15.0)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = None
            if self._ssl is not None or self._resolver is not None:
                connector = aiohttp.TCPConnector(
                    ssl=self._ssl if self._ssl is not None else True,
                    resolver=self._resolver,
                    use_dns_cache=self._resolver is None,
                )
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, headers=self.headers, connector=connector
            )
        return self._session
