"""The operator's calls to the nodes (status, peers, the admin API), through `raftlog.client`."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.abc

from raftlog.client import NO_ANSWER, AsyncClient, ClientError
from raftlog.operator.actions import (
    Action,
    ChangeMembership,
    InstallSnapshot,
    Outcome,
    SyncPeers,
    TransferLeader,
)
from raftlog.operator.cluster_views import NodeView, parse_node_status

log = logging.getLogger("raftlog.operator")


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


class NodeApi:
    """The operator's calls to the nodes, through the node API's client: each one try with a
    short timeout (the next reconcile pass is the retry), a snapshot install with a long one."""

    def __init__(
        self,
        token: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = 3.0,
        install_timeout_s: float = 600.0,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        self.addresses = KnownAddresses()
        self.client = AsyncClient(
            token=token,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            timeout_s=timeout_s,
            resolver=self.addresses,
        )
        # A snapshot install answers when the whole snapshot is streamed.
        self.install_timeout_s = install_timeout_s
        # What each node was last told of its peers' addresses, with its own address and its
        # process's start then (a container restarted in the same pod forgot them).
        self._told: dict[str, tuple[str, float | None, dict[str, str]]] = {}

    async def close(self) -> None:
        await self.client.close()

    async def view(self, url: str) -> NodeView | None:
        """The node's status and known peers; None when it does not answer (or not fully)."""
        try:
            status = await self.client.status(url)
            peers = await self.client.peers(url)
        except ClientError:
            return None
        return parse_node_status(status, peers)

    async def views(self, urls: dict[str, str]) -> dict[str, NodeView | None]:
        names = list(urls)
        got = await asyncio.gather(*(self.view(urls[n]) for n in names))
        return dict(zip(names, got, strict=True))

    async def snapshot_send(
        self, urls: Sequence[str], partition: int, target: str
    ) -> tuple[int, int] | None:
        """How far a snapshot stream to `target` is, (bytes the target holds, the snapshot's
        size), from the first of `urls` whose node streams one (`snapshot_sends` in its
        status); None when none answers with one."""
        for url in urls:
            try:
                status = await self.client.status(url)
            except ClientError:
                continue
            got = snapshot_send_progress(status, partition, target)
            if got is not None:
                return got
        return None

    async def archive_flush(self, partition: int, url: str) -> int:
        """Have the partition's leader at `url` archive what it has committed: the index
        archived (a backup's point for it). Raises ClientError with the node's reason."""
        reply = await self.client.archive_flush(partition, endpoint=url, timeout_s=120.0)
        return int(reply["archived_index"])

    async def tell_addresses(
        self,
        urls: dict[str, str],
        addresses: dict[str, str],
        views: dict[str, NodeView | None],
    ) -> None:
        """Tell each answering node where the other members' pods are (the API server's pod
        addresses), once per change: a peer's name may resolve to its old pod for a while
        after a restart (see `KnownAddresses`), and two members restarted within that while
        reach each other by these (the node's `/v1/admin/peer-addresses`). Best effort: a node
        not told now is told on the next pass. Addresses that are a URL's own host (local
        processes) are left out; a node restarted (a new address, or a new process in the same
        pod) is told again."""
        for name, view in views.items():
            mine = addresses.get(name)
            if view is None or mine is None:
                continue
            wanted = {
                peer: address
                for peer, address in sorted(addresses.items())
                if peer != name
                and peer in view.peers
                and address != urllib.parse.urlsplit(view.peers[peer]).hostname
            }
            told = (mine, view.started_at, wanted)
            if not wanted or self._told.get(name) == told:
                continue
            try:
                await self.client.set_peer_addresses(urls[name], wanted)
            except ClientError as e:
                log.info("telling %s its peers' addresses failed: %s", name, e)
                continue
            self._told[name] = told

    async def perform(self, action: Action, urls: dict[str, str]) -> Outcome:
        """Carry out an action that is a call to a node; the reply's reason on refusal."""
        c = self.client
        body: dict[str, Any]
        came_from: str | None = None  # the streamer an install's answer names
        try:
            match action:
                case SyncPeers(name, peers):
                    await c.set_peers(urls[name], dict(peers))
                    body = {}  # the peers it answers with are not part of the summary
                case ChangeMembership(p, leader, op, member):
                    url = urls[member] if op == "add_learner" else None
                    body = await c.change_membership(p, op, member, url, endpoint=urls[leader])
                case TransferLeader(p, leader, target):
                    body = await c.transfer_leader(p, target, endpoint=urls[leader])
                case InstallSnapshot(p, leader, target, source):
                    body = await c.install_snapshot(
                        p, target, source, endpoint=urls[leader], timeout_s=self.install_timeout_s
                    )
                    if body.get("source") is not None:
                        came_from = str(body["source"])
                case _:
                    raise TypeError(f"not a node call: {action}")
        except ClientError as e:
            if e.status == NO_ANSWER:
                return Outcome(False, str(e))
            return Outcome(False, f"HTTP {e.status}: {e.reason}")
        except KeyError as e:
            return Outcome(False, f"no address known for {e}")
        return Outcome(True, _summary(body), source=came_from)


def snapshot_send_progress(
    status: Mapping[str, Any], partition: int, target: str
) -> tuple[int, int] | None:
    """(sent, total) bytes of the node's snapshot stream to `target` in `partition`, from its
    `/v1/status`; None when it streams none there (or is a node that does not say)."""
    try:
        for p in status.get("partitions") or []:
            if p.get("partition") != partition:
                continue
            for send in p.get("snapshot_sends") or []:
                if send.get("target") == target:
                    return int(send["sent_bytes"]), int(send["total_bytes"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return None


def _summary(body: dict[str, Any]) -> str:
    keep = ("status", "source", "fell_back_to_leader", "leader", "voters", "learners")
    return ", ".join(f"{k}={body[k]}" for k in keep if k in body)
