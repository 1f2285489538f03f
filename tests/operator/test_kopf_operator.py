"""The real kopf operator (`raftlog-operator`, its own process) against the API emulator, with
a test kubelet that runs each Pod as a real `raftlog-node` process.

One long story per cluster, as a person would live it: create, scale up through learners and
their window, lose a process and a pod, heal SnapshotRequired, scale down under load, delete;
and an operator killed in the middle of a scale-up.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import trustme
from tests.loopback import free_loopback_net
from tests.operator import kube_emulator
from tests.operator.kube_emulator import Cluster

from raftlog.client import AsyncClient, IdempotentProducer
from raftlog.node.local import free_ports
from raftlog.operator.main import default_priority

pytestmark = [pytest.mark.operator, pytest.mark.slow]

NS = "default"
WINDOW = 2.0


class Env:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.k8s = Cluster(root)
        self.k8s.start()
        # Each pod on its own loopback address, as if it had its own network namespace.
        self.net = free_loopback_net()
        self.metrics_port, self.liveness_port = free_ports(2)
        self.operator: subprocess.Popen[bytes] | None = None
        self.others: list[subprocess.Popen[bytes]] = []
        self.start_operator()

    def start_operator(self, *args: str) -> subprocess.Popen[bytes]:
        """The operator; standalone unless `args` say otherwise (peering, priority)."""
        env = {
            **os.environ,
            "KUBECONFIG": str(self.k8s.kubeconfig()),
            "RAFTLOG_OPERATOR_MEMBER_URL": f"{{scheme}}://127.{self.net}.{{ordinal}}.1:{{port}}",
            "RAFTLOG_OPERATOR_INTERVAL_S": "0.3",
            # Each extra operator on a port of its own (as each pod has its own network).
            "RAFTLOG_OPERATOR_METRICS_PORT": str(free_ports(1)[0] if args else self.metrics_port),
        }
        liveness = f"http://127.0.0.1:{self.liveness_port}/healthz"
        flags = list(args) or ["--standalone", "--liveness", liveness]
        log_name = "operator.log" if not args else f"operator-{len(self.others)}.log"
        with (self.root / log_name).open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "raftlog.operator.main", "--all-namespaces", *flags],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        if args:
            self.others.append(proc)
        else:
            self.operator = proc
        return proc

    def kill_operator(self) -> None:
        assert self.operator is not None
        self.operator.send_signal(signal.SIGKILL)
        self.operator.wait(10)

    def close(self) -> None:
        for proc in [self.operator, *self.others]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self.k8s.stop()

    # ----------------------------------------------------------------- the API, as kubectl
    def apply(self, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
        self.k8s.call(lambda: self.k8s.emu.create("raftclusters", NS, body))

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.k8s.call(lambda: self.k8s.emu.patch("raftclusters", NS, name, {"spec": spec}))

    def delete(self, plural: str, name: str) -> None:
        self.k8s.call(lambda: self.k8s.emu.delete(plural, NS, name))

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.k8s.call(lambda: self.k8s.emu.get(plural, NS, name))  # type: ignore[no-any-return]

    def objects(self, plural: str) -> list[dict[str, Any]]:
        return self.k8s.call(lambda: self.k8s.emu.list(plural, NS))  # type: ignore[no-any-return]

    def status(self, name: str) -> dict[str, Any]:
        obj = self.get("raftclusters", name)
        return dict((obj or {}).get("status") or {})

    def events(self) -> list[tuple[str, str]]:
        return [(e.get("reason", ""), e.get("message", "")) for e in self.objects("events")]

    def reasons(self) -> list[str]:
        return [r for r, _ in self.events()]

    def until(self, what: str, pred: Callable[[], Any], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = pred()
            if last:
                return last
            time.sleep(0.2)
        tail = (self.root / "operator.log").read_text()[-3000:]
        raise AssertionError(f"{what}: not within {timeout} s; events {self.reasons()}\n{tail}")

    def url(self, member: str) -> str:
        return f"http://127.{self.net}.{member.rsplit('-', 1)[1]}.1:7001"

    def endpoints(self, name: str) -> list[str]:
        return [self.url(m["name"]) for m in self.status(name).get("members", [])]

    def pids(self) -> dict[str, int]:
        return {k[1]: p.pid for k, p in self.k8s.kubelet.procs.items()}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


def condition(st: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in st.get("conditions", []) if c["type"] == kind), None)


def settled(n: int) -> Callable[[dict[str, Any]], bool]:
    def ok(st: dict[str, Any]) -> bool:
        members = st.get("members", [])
        return (
            st.get("phase") == "Running"
            and len(members) == n
            and all(m["role"] == "voter" and m["ready"] for m in members)
        )

    return ok


def validate_pod(pod: dict[str, Any]) -> None:
    """The pod the operator made, as it would be submitted (server fields removed)."""
    meta = {k: v for k, v in pod["metadata"].items()
            if k in ("name", "namespace", "labels", "annotations", "ownerReferences")}  # fmt: skip
    for version in ("1.28", "1.37"):
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod["spec"]},
            version,
            strict=True,
        )


def test_create_scale_heal_snapshot_scale_down_and_delete(env: Env) -> None:
    spec = {
        "replicas": 3,
        "partitions": 1,
        "raft": {"learnerPromotionLag": 10, "learnerPromotionStableWindow": WINDOW,
                 "compactEveryOperations": 50, "compactNumberEntries": 10},
        "storage": {"segmentBytes": 4096},
    }  # fmt: skip
    created = time.monotonic()
    env.apply("c", spec)
    env.until("Available", lambda: condition(env.status("c"), "Available") == "True", 60)
    print(f"created -> Available in {time.monotonic() - created:.1f} s")
    env.until("settled at 3", lambda: settled(3)(env.status("c")))
    cluster_uid = env.get("raftclusters", "c")["metadata"]["uid"]  # type: ignore[index]
    st = env.status("c")
    assert st["observedGeneration"] == 1 and st["selector"] == "raftlog.dev/cluster=c"
    for plural, name in [("services", "c-peers"), ("services", "c"),
                         ("poddisruptionbudgets", "c"), ("secrets", "c-auth"),
                         ("pods", "c-0"), ("persistentvolumeclaims", "data-c-0")]:  # fmt: skip
        obj = env.get(plural, name)
        assert obj is not None, (plural, name)
        owners = obj["metadata"].get("ownerReferences", [])
        assert [o["uid"] for o in owners] == [cluster_uid], (plural, name, owners)
    for pod in env.objects("pods"):
        validate_pod(pod)
        sc = pod["spec"]["containers"][0]["securityContext"]
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
        assert not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]

    # ------------------------------------------------------------- scale 3 -> 5
    async def write(n: int, tag: str) -> None:
        async with AsyncClient(env.endpoints("c")) as client:
            for i in range(0, n, 25):
                await client.append(
                    0, [{"key": f"{tag}{j}", "value": tag} for j in range(i, i + 25)]
                )

    with urllib.request.urlopen(f"http://127.0.0.1:{env.liveness_port}/healthz", timeout=5) as r:
        assert r.status == 200  # kopf's liveness endpoint, what the Deployment probes

    asyncio.run(write(200, "a"))
    scaled = time.monotonic()
    env.patch_spec("c", {"replicas": 5})

    def window(member: str) -> dict[str, Any]:
        members: list[dict[str, Any]] = env.status("c").get("members", [])
        found = next((m for m in members if m["name"] == member), {})
        return dict(found.get("promotion") or {})

    env.until("c-3's window opens", lambda: window("c-3").get("windowStartedAt"))
    # An excursion: the learner stops while writes go on; its window starts again.
    env.k8s.kubelet.signal(NS, "c-3", signal.SIGSTOP)
    asyncio.run(write(100, "excursion"))
    env.until("the window restarts", lambda: window("c-3").get("restarts", 0) >= 1)
    env.k8s.kubelet.signal(NS, "c-3", signal.SIGCONT)
    resumed = time.monotonic()
    env.until("c-3 promoted", lambda: any(m["name"] == "c-3" and m["role"] == "voter"
                                          for m in env.status("c")["members"]))  # fmt: skip
    assert time.monotonic() - resumed >= WINDOW  # a whole window after the excursion
    env.until("settled at 5", lambda: settled(5)(env.status("c")), 90)
    print(f"scale 3 -> 5 (two learners promoted in turn, one window restarted) in "
          f"{time.monotonic() - scaled:.1f} s")  # fmt: skip
    assert env.status("c")["observedGeneration"] == 2
    reasons = env.reasons()
    assert reasons.count("LearnerAdded") == 2 and reasons.count("Promoted") == 2, reasons
    assert "PromotionWindowRestarted" in reasons

    # ------------------------------------------------------------- a process dies, a pod goes
    leader = env.status("c")["leaders"]["0"]
    victim = next(m["name"] for m in env.status("c")["members"] if m["name"] != leader)
    old = env.pids()[victim]
    env.k8s.kubelet.signal(NS, victim, signal.SIGKILL)
    asyncio.run(write(25, "during-crash"))  # the cluster stays available
    env.until("restarted", lambda: env.pids().get(victim, old) != old)
    env.until("back", lambda: settled(5)(env.status("c")))
    env.delete("pods", victim)
    gone = time.monotonic()
    env.until("pod recreated", lambda: (p := env.get("pods", victim)) is not None
              and p["metadata"]["uid"] and settled(5)(env.status("c")))  # fmt: skip
    print(f"deleted pod {victim} recreated and ready in {time.monotonic() - gone:.1f} s")

    # ------------------------------------------------------------- SnapshotRequired healed
    leader = env.status("c")["leaders"]["0"]
    target = max(m["name"] for m in env.status("c")["members"] if m["name"] != leader)
    stopped = time.time()  # the operator's clock: an install of the target before is not this one
    env.k8s.kubelet.signal(NS, target, signal.SIGSTOP)
    asyncio.run(write(400, "b"))
    env.k8s.kubelet.signal(NS, target, signal.SIGCONT)
    resumed = time.monotonic()
    inst = env.until(
        "installed",
        lambda: next(
            (
                i
                for i in env.status("c").get("snapshotInstalls", [])
                if i["state"] == "installed" and i["member"] == target and i["startedAt"] >= stopped
            ),
            None,
        ),
        90,
    )
    print(f"SnapshotRequired on {target} healed from {inst['source']} "
          f"{time.monotonic() - resumed:.1f} s after it resumed")  # fmt: skip
    assert inst["source"] not in ("leader", target, leader), inst
    assert {"SnapshotRequired", "SnapshotInstalled"} <= set(env.reasons())

    # ------------------------------------------------------------- scale 5 -> 3 under load
    acked: list[tuple[int, str]] = []

    async def produce_while_scaling() -> None:
        async with AsyncClient(env.endpoints("c"), retries=20) as client:
            prod = IdempotentProducer(client, "p")
            env.patch_spec("c", {"replicas": 3})
            i = 0
            while not settled(3)(st := env.status("c")):
                # Never below a majority: the cluster stays Available all the way down.
                assert condition(st, "Available") == "True", st.get("conditions")
                r = await prod.append(0, [{"key": f"k{i}", "value": f"v{i}"}])
                acked.append((r.first_index, f"v{i}"))
                i += 1
            last = max(ix for ix, _ in acked)
            await client.read(0, last, 1, min_index=last)  # a replica has them all
            base = env.url(env.status("c")["leaders"]["0"])  # linearizable key reads
            async with aiohttp.ClientSession() as http:
                for n, (_, value) in enumerate(acked):
                    # Compaction is aggressive here: the keyed table holds every write.
                    async with http.get(f"{base}/v1/partitions/0/keys/k{n}") as resp:
                        assert resp.status == 200 and (await resp.json())["value"] == value

    down = time.monotonic()
    asyncio.run(asyncio.wait_for(produce_while_scaling(), 120))
    print(f"scale 5 -> 3 under load in {time.monotonic() - down:.1f} s; {len(acked)} acked appends")
    assert len(acked) > 10
    assert sorted(p["metadata"]["name"] for p in env.objects("pods")) == ["c-0", "c-1", "c-2"]
    assert env.reasons().count("MemberRemoved") == 2
    with urllib.request.urlopen(f"http://127.0.0.1:{env.metrics_port}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert "raftlog_operator_promotions_total 2.0" in metrics
    assert 'raftlog_operator_snapshot_installs_total{result="ok"}' in metrics

    # ------------------------------------------------------------- delete
    env.delete("raftclusters", "c")
    env.until("everything removed", lambda: env.get("raftclusters", "c") is None
              and not env.objects("pods") and not env.objects("persistentvolumeclaims")
              and not env.objects("services") and not env.objects("secrets")
              and not env.objects("poddisruptionbudgets"), 60)  # fmt: skip
    env.until("processes stopped", lambda: not env.k8s.kubelet.procs)


def test_an_operator_killed_mid_scale_up_resumes_without_a_second_learner(env: Env) -> None:
    env.apply("r", {"replicas": 3, "partitions": 2,
                    "raft": {"learnerPromotionStableWindow": 4}})  # fmt: skip
    env.until("settled at 3", lambda: settled(3)(env.status("r")), 60)
    env.patch_spec("r", {"replicas": 4})
    env.until(
        "r-3 joined as a learner",
        lambda: any(
            m["name"] == "r-3" and m["role"] == "learner"
            for m in env.status("r").get("members", [])
        ),
    )
    env.kill_operator()
    env.start_operator()
    env.until("settled at 4", lambda: settled(4)(env.status("r")), 60)
    assert sorted(p["metadata"]["name"] for p in env.objects("pods")) == [
        "r-0",
        "r-1",
        "r-2",
        "r-3",
    ]
    assert env.status("r")["nextOrdinal"] == 4
    assert env.reasons().count("ScalingUp") == 1
    assert env.reasons().count("LearnerAdded") == 1


def test_a_cluster_with_a_tls_secret_serves_https_and_the_operator_verifies_it(env: Env) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert(*(f"127.{env.net}.{i}.1" for i in range(3)))

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
              "metadata": {"name": "t-tls"},
              "data": {"tls.crt": b64(b"".join(c.bytes() for c in cert.cert_chain_pems)),
                       "tls.key": b64(cert.private_key_pem.bytes()),
                       "ca.crt": b64(ca.cert_pem.bytes())}}  # fmt: skip
    env.k8s.call(lambda: env.k8s.emu.create("secrets", NS, secret))
    env.apply("t", {"replicas": 3, "partitions": 1, "tlsSecretName": "t-tls"})
    env.until("settled at 3 over https", lambda: settled(3)(env.status("t")), 60)
    pod = env.get("pods", "t-0")
    assert pod is not None
    peers = pod["spec"]["containers"][0]["args"]
    assert all(u.split("=", 1)[1].startswith("https://") for u in
               peers[peers.index("--peers") + 1].split(","))  # fmt: skip
    ca_file = env.root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    https = [f"https://127.{env.net}.{i}.1:7001" for i in range(3)]

    async def append() -> int:
        async with AsyncClient(https, ca_file=str(ca_file)) as client:
            return (await client.append(0, [{"key": "k", "value": "over tls"}])).last_index

    assert asyncio.run(append()) >= 1


def test_two_operators_in_peering_one_works_and_the_other_takes_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HA: kopf peering between two replicas (as the chart runs them with replicaCount 2): the
    higher priority works, the other stands by and takes over when it leaves."""
    monkeypatch.setitem(
        kube_emulator.GROUPS,
        ("kopf.dev", "v1"),
        {"kopfpeerings": ("KopfPeering", True),
         "clusterkopfpeerings": ("ClusterKopfPeering", False)},
    )  # fmt: skip
    env = Env(tmp_path)
    try:
        env.kill_operator()  # the standalone one of the fixture; these two peer
        peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                   "metadata": {"name": "raftlog-operator"}}  # fmt: skip
        env.k8s.call(lambda: env.k8s.emu.create("clusterkopfpeerings", "", peering))
        low = env.start_operator("--peering", "raftlog-operator", "--priority", "100",
                                 "--liveness", "")  # fmt: skip
        logs = [(tmp_path / f"operator-{i}.log") for i in range(2)]
        env.until("the first is alone and works", lambda: "Resuming" in logs[0].read_text())
        high = env.start_operator("--peering", "raftlog-operator", "--priority", "200",
                                  "--liveness", "")  # fmt: skip
        env.until("the first stands by for the higher priority",
                  lambda: "Pausing operations in favour of" in logs[0].read_text())  # fmt: skip
        env.apply("h", {"replicas": 3, "partitions": 1})
        env.until("settled at 3", lambda: settled(3)(env.status("h")), 60)
        assert "Pausing all operators" not in logs[0].read_text() + logs[1].read_text()
        high.terminate()  # leaves the peering on its way out
        high.wait(30)
        env.until("the first resumes", lambda: logs[0].read_text().count("Resuming") >= 2)
        env.patch_spec("h", {"replicas": 4})
        env.until("settled at 4 by the survivor", lambda: settled(4)(env.status("h")), 90)
        assert low.poll() is None
    finally:
        env.close()


def test_replicas_never_tie_on_the_default_priority() -> None:
    # kopf pauses every operator of a tied priority, for good; its own default is 0 for all.
    drawn = {default_priority() for _ in range(50)}
    assert len(drawn) > 45 and all(1 <= p < 2**31 for p in drawn)
