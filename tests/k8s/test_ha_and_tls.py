"""Two operator replicas in kopf peering (the chart's HA), and a cluster that serves HTTPS."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
import urllib.request
from typing import Any

import aiohttp
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


def logs(ns: str, pod: str) -> str:
    return kube.kubectl("logs", "-n", ns, pod, check=False)


def test_two_replicas_in_peering_one_works_and_the_other_takes_over(namespace: str) -> None:
    ns = namespace
    kube.helm("install", "raftlog-operator", str(kube.CHART), "-n", ns,
              "--set", "replicaCount=2", "--wait", "--timeout", "180s")  # fmt: skip
    try:
        apply(ns, "h", {"replicas": 3, "partitions": 1})
        kube.until("settled at 3", lambda: settled(ns, "h", 3), 240)
        pods = {p["metadata"]["name"] for p in operator_pods(ns)}
        assert len(pods) == 2
        # kopf: the lower priority stands by for the higher one; never a tie (both paused).
        standby = kube.until(
            "one replica stands by",
            lambda: next(
                (p for p in pods if "Pausing operations in favour of" in logs(ns, p)), None
            ),
            60,
        )
        [active] = pods - {standby}
        assert "Pausing all operators" not in logs(ns, active) + logs(ns, standby)
        gone = time.monotonic()
        kube.kubectl("delete", "pod", active, "-n", ns)  # it leaves the peering on its way out
        kube.until("the standby resumes", lambda: "Resuming operations after the pause"
                   in logs(ns, standby), 120)  # fmt: skip
        kube.say(f"peering: standby resumed {time.monotonic() - gone:.1f} s after the delete")
        # Someone else keeps writing the resource meanwhile: the operator's status writes carry
        # the resourceVersion they were based on, get 409s, read again and go on.
        kube.kubectl("scale", "raft/h", "-n", ns, "--replicas", "4")
        writes = 0
        deadline = time.monotonic() + 240
        while not settled(ns, "h", 4):
            assert time.monotonic() < deadline, "settled at 4: not within 240 s"
            kube.kubectl("annotate", "raft", "h", "-n", ns, "--overwrite", f"test/tick={writes}")
            writes += 1
        ip = kube.get("pod", standby, ns)["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=10) as r:
            metrics = r.read().decode()
        [conflicts] = [float(line.split()[1]) for line in metrics.splitlines()
                       if line.startswith("raftlog_operator_status_conflicts_total ")]  # fmt: skip
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

    async def append() -> int:
        async with aiohttp.ClientSession() as http:
            for _ in range(20):  # t-0 may not lead: a 421 names the leader
                async with http.post(
                    f"{url}/v1/partitions/0/records",
                    ssl=ctx,
                    json={"records": [{"key": "k", "value": "tls"}]},
                ) as r:
                    if r.status == 200:
                        return int((await r.json())["last_index"])
                    hint = (await r.json()).get("leader_url")
                    assert r.status == 421, (r.status, await r.text())
                await asyncio.sleep(0.5)
            raise AssertionError(f"no append over https through {url}: last hint {hint}")

    async def plain_refused() -> None:
        async with aiohttp.ClientSession() as http:
            try:
                async with http.get(f"http://{pod['status']['podIP']}:7001/healthz") as r:
                    raise AssertionError(f"plain http answered {r.status}")
            except aiohttp.ClientError:
                pass

    leader = kube.get("raftcluster", "t", ns)["status"]["leaders"]["0"]
    url = f"https://{kube.get('pod', leader, ns)['status']['podIP']}:7001"
    assert asyncio.run(append()) >= 1
    asyncio.run(plain_refused())
