"""The operator's calls to the nodes: status, peers and the admin API, each with a timeout."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.abc

from raftlog.client.session import SessionHolder
from raftlog.operator.actions import (
    Action,
    ChangeMembership,
    InstallSnapshot,
    Outcome,
    SyncPeers,
    TransferLeader,
)
from raftlog.operator.observed import NodeView, parse_node_status


class NodeApiError(Exception):
    pass


@dataclass(frozen=True)
class MemberTls:
    """A cluster's TLS secret: its CA verifies the members, and its certificate is what the
    operator shows a peer listener that asks for one (peer_client_cert_auth)."""

    ca: str
    cert: str
    key: str

    def write(self, name: str) -> tuple[str, str, str]:
        """The three as files (ssl reads files only), the key readable by this user alone."""
        folder = Path(tempfile.gettempdir()) / f"raftlog-tls-{name}"
        folder.mkdir(mode=0o700, exist_ok=True)
        paths = []
        for file, text in (("ca.crt", self.ca), ("tls.crt", self.cert), ("tls.key", self.key)):
            path = folder / file
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            paths.append(str(path))
        return paths[0], paths[1], paths[2]


class KnownAddresses(aiohttp.abc.AbstractResolver):
    """Members' host names resolved to their pods' addresses as the API server reports them,
    any other name by DNS. A restarted pod is at a new address that the cluster's DNS may deny
    for up to its negative-cache time (CoreDNS's default `cache 30`): the operator saw a member
    it could not reach for 30 s after each restart, and a rolling restart waited that long for
    every member."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}  # host name -> address
        self._dns: aiohttp.abc.AbstractResolver | None = None

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        address = self.known.get(host)
        if address is None:
            if self._dns is None:
                self._dns = aiohttp.ThreadedResolver()
            return await self._dns.resolve(host, port, family)
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        if self._dns is not None:
            await self._dns.close()


class NodeApi(SessionHolder):
    def __init__(
        self,
        token: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = 3.0,
        install_timeout_s: float = 600.0,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.addresses = KnownAddresses()
        super().__init__(
            token=token,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            timeout=self.timeout,
            resolver=self.addresses,
        )
        # A snapshot install answers when the whole snapshot is streamed.
        self.install_timeout = aiohttp.ClientTimeout(total=install_timeout_s)

    async def call(
        self,
        method: str,
        url: str,
        body: Any = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> tuple[int, dict[str, Any]]:
        try:
            async with self.session.request(
                method, url, json=body, timeout=timeout or self.timeout
            ) as r:
                data = await r.json(content_type=None) if r.content_length != 0 else {}
                return r.status, data if isinstance(data, dict) else {"value": data}
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise NodeApiError(f"{method} {url}: {type(e).__name__}: {e}") from None

    async def view(self, url: str) -> NodeView | None:
        """The node's status and known peers; None when it does not answer (or not fully)."""
        try:
            code, status = await self.call("GET", f"{url}/v1/status")
            pcode, peers = await self.call("GET", f"{url}/v1/admin/peers")
        except NodeApiError:
            return None
        if code != 200 or pcode != 200:
            return None
        return parse_node_status(status, peers.get("peers", {}))

    async def views(self, urls: dict[str, str]) -> dict[str, NodeView | None]:
        names = list(urls)
        got = await asyncio.gather(*(self.view(urls[n]) for n in names))
        return dict(zip(names, got, strict=True))

    async def perform(self, action: Action, urls: dict[str, str]) -> Outcome:
        """Carry out an action that is a call to a node; the reply's reason on refusal."""
        try:
            match action:
                case SyncPeers(name, peers):
                    code, body = await self.call(
                        "POST", f"{urls[name]}/v1/admin/peers", dict(peers)
                    )
                case ChangeMembership(p, leader, op, member):
                    req: dict[str, Any] = {"op": op, "node": member}
                    if op == "add_learner":
                        req["url"] = urls[member]
                    code, body = await self.call(
                        "POST", f"{urls[leader]}/v1/admin/partitions/{p}/members", req
                    )
                case TransferLeader(p, leader, target):
                    code, body = await self.call(
                        "POST", f"{urls[leader]}/v1/admin/partitions/{p}/transfer",
                        {"target": target},
                    )  # fmt: skip
                case InstallSnapshot(p, leader, target, source):
                    code, body = await self.call(
                        "POST", f"{urls[leader]}/v1/admin/partitions/{p}/snapshot-install",
                        {"target": target, "source": source}, timeout=self.install_timeout,
                    )  # fmt: skip
                case _:
                    raise TypeError(f"not a node call: {action}")
        except NodeApiError as e:
            return Outcome(False, str(e))
        except KeyError as e:
            return Outcome(False, f"no address known for {e}")
        if code != 200:
            return Outcome(False, f"HTTP {code}: {body.get('reason') or body.get('error')}")
        return Outcome(True, _summary(body))


def _summary(body: dict[str, Any]) -> str:
    keep = ("status", "source", "fell_back_to_leader", "leader", "voters", "learners")
    return ", ".join(f"{k}={body[k]}" for k in keep if k in body)
