"""TLS: nodes serve https with a certificate, verify each other against a CA, and so do clients."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
import trustme

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e]
FRAMES_ACCEPTED = 'raftlog_request_seconds_count{method="GET",route="/peer/v1/frames",status="101"}'


def test_a_cluster_over_tls(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "node.pem", tmp_path / "node.key", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    tls = (cert_file, key_file, ca_file)
    with LocalCluster(tmp_path / "data", replicas=3, durable=False, tls=tls) as cluster:
        cluster.wait_ready()  # elections need the peers to talk over TLS
        assert all(e.startswith("https://") for e in cluster.endpoints)

        async def go() -> dict[str, Any]:
            async with AsyncClient(cluster.endpoints, ca_file=str(ca_file)) as c:
                done = await c.append(0, [{"key": "k", "value": "over tls"}])
                # Any replica may answer: read-your-writes is what min_index is for.
                return await c.read(0, 1, 10, min_index=done.last_index, wait_ms=5_000)

        page = asyncio.run(go())
        assert [r["value"] for r in page["records"]] == ["over tls"]
        # The peers' Raft traffic took the frame stream, over TLS.
        trusted = ssl.create_default_context(cafile=str(ca_file))
        for name, node in cluster.nodes.items():
            with urllib.request.urlopen(node.url + "/metrics", context=trusted, timeout=5) as r:
                metrics = r.read().decode()
            assert FRAMES_ACCEPTED in metrics, name
        plain = cluster.endpoints[0].replace("https://", "http://") + "/healthz"
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(plain, timeout=3).read()
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(cluster.endpoints[0] + "/healthz", timeout=3)
