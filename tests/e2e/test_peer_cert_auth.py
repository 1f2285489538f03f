"""Mutual TLS on the peer port (`--peer-client-cert-auth`): members replicate showing their
certificates; a caller without one the cluster's CA signed is refused at the handshake, even with
the token; the client port asks for no certificate."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from tests.e2e.loopback import free_loopback_net, kill_nodes, start_split_nodes
from tests.steady import STEADY_ENV

from raftlog.cli.main import main
from raftlog.client import AsyncClient

pytestmark = [pytest.mark.e2e]
CLIENT, PEER = 7001, 7002
TOKEN = "mtls-secret"


def pem_files(ca: trustme.CA, folder: Path, hosts: list[str]) -> tuple[Path, Path, Path]:
    folder.mkdir()
    cert = ca.issue_cert(*hosts)
    files = folder / "tls.crt", folder / "tls.key", folder / "ca.crt"
    cert.private_key_and_cert_chain_pem.write_to_path(str(files[0]))
    cert.private_key_pem.write_to_path(str(files[1]))
    ca.cert_pem.write_to_path(str(files[2]))
    return files


@pytest.fixture
def mtls_cluster(tmp_path: Path) -> Iterator[tuple[list[str], trustme.CA, Path]]:
    net = free_loopback_net(members=3, ports=(CLIENT, PEER))
    hosts = [f"127.{net}.{i}.1" for i in range(3)]
    ca = trustme.CA()
    cert, key, ca_file = pem_files(ca, tmp_path / "tls", hosts)
    tls = ("--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-file", str(ca_file))
    procs = start_split_nodes(
        tmp_path, hosts, (CLIENT, PEER), TOKEN, scheme="https",
        args=(*tls, "--peer-client-cert-auth"), env=STEADY_ENV,  # admin calls at its leader
    )  # fmt: skip
    try:
        yield hosts, ca, ca_file
    finally:
        kill_nodes(procs)


def context(ca_file: Path, client: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if client is not None:
        client.configure_cert(ctx)
    return ctx


def get(url: str, ctx: ssl.SSLContext, token: str | None = TOKEN) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
        return json.loads(r.read())


def leader_of(hosts: list[str], ctx: ssl.SSLContext) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for i, h in enumerate(hosts):
            try:
                st = get(f"https://{h}:{CLIENT}/v1/status", ctx, token=None)
            except OSError:
                continue
            if st["partitions"][0]["role"] == "leader":
                return i
        time.sleep(0.2)
    raise AssertionError("no leader within 30 s: the peers did not reach each other")


def test_members_replicate_over_mutual_tls_and_refuse_callers_without_a_certificate(
    mtls_cluster,
):
    hosts, ca, ca_file = mtls_cluster
    plain = context(ca_file)  # verifies the nodes, shows no certificate
    leader = leader_of(hosts, plain)  # an election: the members showed each other theirs
    client_urls = [f"https://{h}:{CLIENT}" for h in hosts]

    async def append_and_read() -> list[list[str]]:
        async with AsyncClient(client_urls, ca_file=str(ca_file)) as c:
            done = await c.append(0, [{"key": "k", "value": "over mutual tls"}])
            pages = [
                await c.read(0, 1, 10, endpoint=u, min_index=done.last_index, wait_ms=5000)
                for u in client_urls
            ]
            return [[r["value"] for r in p["records"]] for p in pages]

    assert asyncio.run(append_and_read()) == [["over mutual tls"]] * 3

    admin = (
        f"https://{hosts[leader]}:{PEER}/v1/admin/partitions/0/followers/n{(leader + 1) % 3}/lag"
    )
    # The token alone is not enough: the handshake itself fails without a certificate...
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        get(admin, plain)
    # ...or with one another CA signed...
    stranger = trustme.CA().issue_cert("mallory")
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        get(admin, context(ca_file, stranger))
    # ...while a certificate of the cluster's CA, with the token, is served.
    operator = ca.issue_cert("raftlog-operator")
    lag = get(admin, context(ca_file, operator))
    assert isinstance(lag, dict)
    # The certificate does not stand in for the token.
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(admin, context(ca_file, operator), token="wrong")
    assert refused.value.code == 401


def test_raftctl_reaches_a_tls_cluster_with_its_ca_and_the_admin_api_with_a_certificate(
    mtls_cluster, tmp_path, capsys
):
    """raftctl had no TLS options: an https cluster signed by its own CA was unreachable
    (certificate verify failed), and its admin API (peer port, mutual TLS) too."""
    hosts, ca, ca_file = mtls_cluster
    leader = leader_of(hosts, context(ca_file))
    follower = f"n{(leader + 1) % 3}"
    token = tmp_path / "token"
    token.write_text(TOKEN)
    cert, key, _ = pem_files(ca, tmp_path / "operator", ["raftlog-operator"])
    endpoints = ",".join(f"https://{h}:{CLIENT}" for h in hosts)
    common = ["--endpoints", endpoints, "--token-file", str(token)]

    def ctl(*args: str) -> tuple[int, str, str]:
        code = main([*args, *common])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = ctl("status")
    assert code == 1 and "unreachable" in out and "CERTIFICATE_VERIFY_FAILED" in err, err
    code, out, err = ctl("status", "--ca-file", str(ca_file))
    assert code == 0 and out.count("leader") >= 1, (out, err)
    code, out, err = ctl("append", "--ca-file", str(ca_file), "over tls")
    assert code == 0 and "indexes" in out, err
    # The admin API asks for a certificate of the cluster's CA...
    code, out, err = ctl("lag", follower, "--ca-file", str(ca_file))
    assert code == 1 and f"{PEER}: no answer: " in err, (out, err)  # the handshake refused
    tls = ("--ca-file", str(ca_file), "--cert-file", str(cert), "--key-file", str(key))
    code, out, err = ctl("lag", follower, *tls, "--json")
    assert code == 0, err
    assert json.loads(out)["follower"] == follower, out
    # ...and a file that is not there is named, before any call.
    code, out, err = ctl("status", "--ca-file", str(tmp_path / "nope.pem"))
    assert code == 1 and err.strip() == f"raftctl: --ca-file {tmp_path / 'nope.pem'}: no such file"
    code, out, err = ctl("lag", follower, "--ca-file", str(ca_file), "--cert-file", str(cert))
    assert code == 1 and "--cert-file and --key-file go together" in err
