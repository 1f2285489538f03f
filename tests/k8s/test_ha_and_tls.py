"""Two operator replicas in kopf peering (the chart's HA), and a cluster that serves HTTPS."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import ssl
import threading
import time
import urllib.request
from typing import Any

import aiohttp
import pytest
import trustme

from tests.k8s import kube

SMALL = {"resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}


def apply(ns: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": name}, "spec": {**SMALL, **spec}}  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(body))


def settled(ns: str, name: str, n: int) -> bool:
    st = kube.get("raftcluster", name, ns).get("status") or {}
    members = st.get("members", [])
    return (st.get("phase") == "Running" and len(members) == n
            and all(m["role"] == "voter" and m["ready"] for m in members))  # fmt: skip


def operator_pods(ns: str) -> list[dict[str, Any]]:
    return kube.items("pods", ns, "app.kubernetes.io/name=raftlog-operator")


def peers_of(ns: str) -> dict[str, int]:
    """The operator replicas kopf's peering knows of (their pod names), with their priority."""
    obj = kube.get("kopfpeering", kube.RELEASE, ns)
    return {peer: int(v["priority"]) for peer, v in (obj.get("status") or {}).items()}


def logs(ns: str, pod: str) -> str:
    return kube.kubectl("logs", "-n", ns, pod, check=False)


def running_beside(ns: str, stop: threading.Event) -> list[set[str]]:
    """Each time a standalone operator pod and one in peering were seen running together (the
    two would both act): polled until `stop`."""
    seen: list[set[str]] = []
    while not stop.is_set():
        live = {p["metadata"]["name"]: "--standalone" in p["spec"]["containers"][0]["args"]
                for p in operator_pods(ns)
                if p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")}  # fmt: skip
        if len(set(live.values())) == 2:
            seen.append(set(live))
        stop.wait(0.2)
    return seen


def test_two_replicas_in_peering_one_works_and_the_other_takes_over(namespace: str) -> None:
    ns = namespace
    # The chart's default first (one standalone replica), then `helm upgrade` to two: the
    # standalone one must be gone before a replica in peering starts, or both would act.
    kube.helm("install", "raftlog-operator", str(kube.CHART), "-n", ns,
              "--wait", "--timeout", "180s")  # fmt: skip
    before = {p["metadata"]["name"] for p in operator_pods(ns)}
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        watch = pool.submit(running_beside, ns, stop)
        try:
            kube.helm("upgrade", "raftlog-operator", str(kube.CHART), "-n", ns,
                      "--set", "replicaCount=2", "--wait", "--timeout", "180s")  # fmt: skip
        finally:
            stop.set()
        assert watch.result() == [], "a standalone operator ran beside one in peering"
    # And back and forth: a rollback replays a revision as it was stored, which must not run a
    # standalone operator beside replicas in peering either (with the replicas' RollingUpdate
    # it did: two standalone pods and one in peering for 9 s).
    stop.clear()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        watch = pool.submit(running_beside, ns, stop)
        try:
            kube.helm("rollback", "raftlog-operator", "1", "-n", ns, "--wait", "--timeout", "180s")
            kube.helm("rollback", "raftlog-operator", "2", "-n", ns, "--wait", "--timeout", "180s")
        finally:
            stop.set()
        assert watch.result() == [], "a standalone operator ran beside one in peering"
    try:
        apply(ns, "h", {"replicas": 3, "partitions": 1})
        kube.until("settled at 3", lambda: settled(ns, "h", 3), 240)
        pods = {p["metadata"]["name"] for p in operator_pods(ns)}
        assert len(pods) == 2 and not pods & before, (pods, before)
        # Both replicas keep themselves alive in the KopfPeering's status with their priority:
        # the highest works, the other stands by (never a tie: kopf would pause both).
        peering = kube.until("both replicas in the peering", lambda: (
            peers if len(peers := peers_of(ns)) == 2 else None), 120)  # fmt: skip
        assert set(peering) == pods and len(set(peering.values())) == 2, peering
        active = max(peering, key=lambda p: peering[p])
        [standby] = pods - {active}
        # Only the higher priority acted on the cluster (the other stood by, paused).
        acted = {p for p in pods if "raftlog.operator: h: create" in logs(ns, p)}
        assert acted == {active}, (acted, peering)
        assert "Pausing all operators" not in logs(ns, active) + logs(ns, standby)
        gone = time.monotonic()
        kube.kubectl("delete", "pod", active, "-n", ns)  # it leaves the peering on its way out
        # The standby resumes, unless the Deployment's new replica drew a higher priority and
        # works instead: either way one operator scales the cluster, while someone else keeps
        # writing the resource: status writes carry the resourceVersion they were based on,
        # get 409s, read again and go on.
        kube.kubectl("scale", "raft/h", "-n", ns, "--replicas", "4")
        writes = 0
        deadline = time.monotonic() + 240
        while not settled(ns, "h", 4):
            assert time.monotonic() < deadline, "settled at 4: not within 240 s"
            kube.kubectl("annotate", "raft", "h", "-n", ns, "--overwrite", f"test/tick={writes}")
            writes += 1
        kube.say(f"peering: the active replica deleted, 3 -> 4 by the other "
                 f"{time.monotonic() - gone:.1f} s later")  # fmt: skip
        conflicts = 0.0
        for p in operator_pods(ns):
            if p["metadata"].get("deletionTimestamp") or not p["status"].get("podIP"):
                continue
            url = f"http://{p['status']['podIP']}:8000/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                conflicts += sum(
                    float(line.split()[1])
                    for line in r.read().decode().splitlines()
                    if line.startswith("raftlog_operator_status_conflicts_total ")
                )
        kube.say(f"peering: {writes} foreign writes during the scale, {conflicts:.0f} conflicts")
        assert conflicts >= 1
        assert "ReconcileFailed" not in [e["reason"] for e in kube.items("events", ns)]
    finally:
        kube.kubectl("delete", "raft", "--all", "-n", ns, "--timeout=180s", check=False)
        kube.helm("uninstall", "raftlog-operator", "-n", ns, "--wait", "--timeout", "120s")


def test_a_cluster_with_a_tls_secret_serves_https_and_the_operator_verifies_it(
    operator: str,
) -> None:
    ns = operator
    ca = trustme.CA()
    # What the members and the operator dial: the headless Service's names.
    cert = ca.issue_cert(*(f"t-{i}.t-peers.{ns}.svc" for i in range(3)))

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
              "metadata": {"name": "t-tls"},
              "data": {"tls.crt": b64(b"".join(c.bytes() for c in cert.cert_chain_pems)),
                       "tls.key": b64(cert.private_key_pem.bytes()),
                       "ca.crt": b64(ca.cert_pem.bytes())}}  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(secret))
    apply(ns, "t", {"replicas": 3, "partitions": 1, "tlsSecretName": "t-tls"})
    kube.until("settled at 3 over https", lambda: settled(ns, "t", 3), 240)
    pod = kube.get("pod", "t-0", ns)
    args = pod["spec"]["containers"][0]["args"]
    peers = args[args.index("--peers") + 1].split(",")
    assert all(u.split("=", 1)[1].startswith("https://") for u in peers), peers

    # From the host, by pod IP: the chain must be the cluster's CA (the name is the DNS one).
    ctx = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    ctx.check_hostname = False

    def leader_url() -> str:
        leader = kube.get("raftcluster", "t", ns)["status"]["leaders"]["0"]
        return f"https://{kube.get('pod', leader, ns)['status']['podIP']}:7001"

    async def append() -> int:
        async with aiohttp.ClientSession() as http:
            for _ in range(20):  # leadership may have moved since the status said (421, 503)
                url = leader_url()
                async with http.post(
                    f"{url}/v1/partitions/0/records",
                    ssl=ctx,
                    json={"records": [{"key": "k", "value": "tls"}]},
                ) as r:
                    if r.status == 200:
                        return int((await r.json())["last_index"])
                    answer = await r.text()
                    assert r.status in (421, 503), (r.status, answer)
                await asyncio.sleep(0.5)
            raise AssertionError(f"no append over https through {url}: {answer}")

    async def plain_refused() -> None:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):  # no answer over plain http
                await http.get(f"http://{pod['status']['podIP']}:7001/healthz")

    assert asyncio.run(append()) >= 1
    asyncio.run(plain_refused())

    # Mutual TLS on the peer port: the members roll, and still elect and commit (they show
    # each other the secret's certificate), and the operator still reads and changes them
    # (it shows it too): the cluster settles again with every member a ready voter.
    kube.kubectl(
        "patch", "raftcluster", "t", "-n", ns, "--type=merge",
        "-p", json.dumps({"spec": {"peerClientCertAuth": True}}),
    )  # fmt: skip

    def rolled() -> bool:
        pods = {p["metadata"]["name"]: p for p in kube.items("pods", ns, "raftlog.dev/cluster=t")}
        flagged = [
            n
            for n, p in pods.items()
            if "--peer-client-cert-auth" in p["spec"]["containers"][0]["args"]
        ]
        return len(flagged) == 3 and settled(ns, "t", 3)

    kube.until("rolled to mutual TLS and settled", rolled, 300)
    assert asyncio.run(append()) >= 2  # the client port asks for no certificate
    leader = kube.get("raftcluster", "t", ns)["status"]["leaders"]["0"]
    ip = kube.get("pod", leader, ns)["status"]["podIP"]  # any member's peer port will do

    async def peer_port(client: trustme.LeafCert | None) -> int:
        peer_ctx = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
        peer_ctx.check_hostname = False
        if client is not None:
            client.configure_cert(peer_ctx)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"https://{ip}:7002/v1/admin/partitions/0/holds", ssl=peer_ctx) as r,
        ):
            return r.status

    with pytest.raises(aiohttp.ClientError):  # no certificate: the handshake fails
        asyncio.run(peer_port(None))
    with pytest.raises(aiohttp.ClientError):  # one another CA signed: refused too
        asyncio.run(peer_port(trustme.CA().issue_cert("mallory")))
    assert asyncio.run(peer_port(ca.issue_cert("someone"))) == 401  # past TLS: the token next
