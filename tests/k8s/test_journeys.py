"""A cluster's life on the real Kubernetes, under an append load through its client Service.

The operator runs in its pod (the chart), the members in theirs; faults are what a node sees: a
member's process stopped (SIGSTOP) or killed by pid, a pod or a PVC deleted with kubectl, the
operator's pod killed. The load comes from pods writing through the Service (tests/k8s/load.py).
At the end every acknowledged record is read back from every member, and
deleting the RaftCluster leaves nothing behind, through the real garbage collector.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import aiohttp

from tests.k8s import kube, load
from tests.steady import STEADY_TICKS

# Long enough for the test to stop the learner once its window opened and before it ends (the
# poll, kubectl and the signal take a few seconds on a loaded machine: 2 s lost that race once).
WINDOW = 6.0
SPEC: dict[str, Any] = {
    "replicas": 3,
    "partitions": 1,
    # The story needs a leader that moves only when told (tests/steady.py): the scale-down
    # asserts Available throughout, and a 1 s stall under the CI's Spark job once elected anew.
    "raft": {"learnerPromotionLag": 10, "learnerPromotionStableWindow": WINDOW,
             "compactEveryOperations": 50, "compactNumberEntries": 10,
             "electionTicks": STEADY_TICKS},
    "storage": {"segmentBytes": 4096},
    # The machine has 2 cores: five members of the default 250m leave room for the rest.
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
}  # fmt: skip


def apply(ns: str, name: str, spec: dict[str, Any]) -> None:
    body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(body))


def status(ns: str, name: str) -> dict[str, Any]:
    return dict(kube.get("raftcluster", name, ns).get("status") or {})


def settled(st: dict[str, Any], n: int) -> bool:
    members = st.get("members", [])
    return (
        st.get("phase") == "Running"
        and len(members) == n
        and all(m["role"] == "voter" and m["ready"] for m in members)
    )


def pods(ns: str, cluster: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p for p in kube.items("pods", ns, f"raftlog.dev/cluster={cluster}")
    }


def member_urls(ns: str, cluster: str) -> dict[str, str]:
    """Each member's client API at its pod IP (the host routes the pod network)."""
    return {n: f"http://{p['status']['podIP']}:7001" for n, p in pods(ns, cluster).items()
            if p["status"].get("podIP")}  # fmt: skip


def reasons(ns: str, name: str) -> list[str]:
    events = kube.items("events", ns)
    return [e["reason"] for e in events if e["involvedObject"].get("name") == name]


def signal_member(ns: str, member: str, sig: signal.Signals) -> None:
    os.kill(kube.container_pid(kube.get("pod", member, ns)), sig)


def member(st: dict[str, Any], name: str) -> dict[str, Any]:
    return next((m for m in st.get("members", []) if m["name"] == name), {})


def write(ns: str, cluster: str, n: int, tag: str) -> list[tuple[str, str]]:
    """`n` records through the client Service, from a pod; the acknowledged ones."""
    written = load.acked(ns, load.start(ns, cluster, tag, n))
    assert len(written) == n
    return written


def test_create_scale_heal_snapshot_scale_down_under_load_and_delete(operator: str) -> None:
    ns = operator
    created = time.monotonic()
    apply(ns, "c", SPEC)
    kube.until("settled at 3", lambda: settled(status(ns, "c"), 3), 240)
    kube.say(f"created -> 3 ready voters: {time.monotonic() - created:.1f} s")
    uid = kube.get("raftcluster", "c", ns)["metadata"]["uid"]
    st = status(ns, "c")
    assert st["observedGeneration"] == 1 and st["selector"] == "raftlog.dev/cluster=c"
    for kind, name in [("service", "c-peers"), ("service", "c"), ("pdb", "c"),
                       ("secret", "c-auth"), ("pod", "c-0"), ("pvc", "data-c-0")]:  # fmt: skip
        owners = kube.get(kind, name, ns)["metadata"].get("ownerReferences", [])
        assert [o["uid"] for o in owners] == [uid], (kind, name, owners)
    assert kube.get("pdb", "c", ns)["spec"]["minAvailable"] == 2
    for p in pods(ns, "c").values():
        assert p["spec"]["automountServiceAccountToken"] is False
        assert not [v for v in p["spec"]["volumes"] if v["name"].startswith("kube-api-access")]
    acked: list[tuple[str, str]] = []

    # ------------------------------------------------------------- scale 3 -> 5, an excursion
    acked += write(ns, "c", 200, "a")
    # Writes go on while c-3 joins, so that its lag passes learnerPromotionLag as soon as it
    # stops: a loader started after the stop took up to the whole window to start its pod,
    # and the learner was promoted before its lag showed.
    excursion = load.start(ns, "c", "excursion")
    kube.until("the loader writes", lambda: kube.kubectl(
        "logs", "-n", ns, excursion, check=False).count("\n") >= 5, 120)  # fmt: skip
    scaled = time.monotonic()
    kube.kubectl("scale", "raft/c", "-n", ns, "--replicas", "5")
    kube.until("c-3's window opens",
               lambda: member(status(ns, "c"), "c-3").get("promotion", {}).get("windowStartedAt"),
               180)  # fmt: skip
    signal_member(ns, "c-3", signal.SIGSTOP)  # the learner stops; writes go on
    try:
        assert member(status(ns, "c"), "c-3")["role"] == "learner", "promoted before it stopped"
        kube.until("the window restarts",
                   lambda: member(status(ns, "c"), "c-3").get("promotion", {}).get("restarts", 0)
                   >= 1, 60)  # fmt: skip
    finally:
        load.stop(ns, excursion)
        signal_member(ns, "c-3", signal.SIGCONT)
    resumed = time.monotonic()  # before the loader's records are read: that takes seconds
    during = load.acked(ns, excursion)
    assert len(during) > 10, during
    acked += during
    kube.until("c-3 promoted", lambda: member(status(ns, "c"), "c-3").get("role") == "voter", 120)
    assert time.monotonic() - resumed >= WINDOW  # a whole window after the excursion
    kube.until("settled at 5", lambda: settled(status(ns, "c"), 5), 180)
    kube.say(f"scale 3 -> 5 (a window restarted by a stopped learner): "
             f"{time.monotonic() - scaled:.1f} s")  # fmt: skip
    r = reasons(ns, "c")
    assert r.count("LearnerAdded") == 2 and r.count("Promoted") == 2, r
    assert "PromotionWindowRestarted" in r
    # The budget follows the voters (a majority of 5), and the objects the operator owns come
    # back when deleted or edited by hand.
    kube.until("PDB at a majority of 5",
               lambda: kube.get("pdb", "c", ns)["spec"]["minAvailable"] == 3, 60)  # fmt: skip
    client_svc = kube.get("service", "c", ns)["metadata"]["uid"]
    kube.kubectl("delete", "service", "c", "-n", ns)
    kube.kubectl("patch", "pdb", "c", "-n", ns, "--type=merge", "-p",
                 '{"spec": {"minAvailable": 1}}')  # fmt: skip
    kube.until("the client Service made again and the budget put back", lambda: (
        kube.get("service", "c", ns)["metadata"]["uid"] != client_svc
        and kube.get("pdb", "c", ns)["spec"]["minAvailable"] == 3), 90)  # fmt: skip
    # The auth Secret deleted: made again with the token the members hold.
    token = kube.get("secret", "c-auth", ns)["data"]["token"]
    kube.kubectl("delete", "secret", "c-auth", "-n", ns)
    kube.until("the auth Secret made again with the same token",
               lambda: kube.get("secret", "c-auth", ns)["data"]["token"] == token, 60)  # fmt: skip

    # ------------------------------------------------------------- a process killed, a pod deleted
    leader = status(ns, "c")["leaders"]["0"]
    victim = next(m["name"] for m in status(ns, "c")["members"] if m["name"] != leader)
    restarts = kube.get("pod", victim, ns)["status"]["containerStatuses"][0]["restartCount"]
    signal_member(ns, victim, signal.SIGKILL)
    acked += write(ns, "c", 25, "during-crash")  # the cluster stays available
    kube.until(f"{victim} restarted by the kubelet",
               lambda: kube.get("pod", victim, ns)["status"]["containerStatuses"][0]
               ["restartCount"] > restarts, 120)  # fmt: skip
    kube.until("back at 5", lambda: settled(status(ns, "c"), 5), 120)
    old_uid = kube.get("pod", victim, ns)["metadata"]["uid"]
    gone = time.monotonic()
    kube.kubectl("delete", "pod", victim, "-n", ns)
    kube.until("pod recreated and settled",
               lambda: kube.get("pod", victim, ns)["metadata"]["uid"] != old_uid
               and settled(status(ns, "c"), 5), 180)  # fmt: skip
    kube.say(f"deleted pod {victim} back and ready: {time.monotonic() - gone:.1f} s")
    assert reasons(ns, "c").count("PodGone") == 1  # the kubelet's restart of a process is not
    # A pod left in phase Failed, as an eviction for node pressure or a node's graceful
    # shutdown leaves it (its object stays, so creating the member's pod was a 409): the
    # operator deletes it, keeping the volume, and creates the member again.
    old_uid = kube.get("pod", victim, ns)["metadata"]["uid"]
    failed = time.monotonic()

    def marked_failed_until_replaced() -> bool:
        # The kubelet owns the pod's status and may write Running back over the patch before
        # the operator's next pass sees it (one run of three did): marked again until replaced.
        if kube.get("pod", victim, ns)["metadata"]["uid"] != old_uid:
            return True
        kube.kubectl("patch", "pod", victim, "-n", ns, "--subresource=status", "--type=merge",
                     "-p", '{"status": {"phase": "Failed", "reason": "Evicted"}}',
                     check=False)  # fmt: skip
        return False

    kube.until("a Failed pod deleted and made again", marked_failed_until_replaced, 120, 3.0)
    kube.until("a Failed pod replaced and settled", lambda: settled(status(ns, "c"), 5), 180)
    kube.say(f"Failed pod {victim} replaced and ready: {time.monotonic() - failed:.1f} s")

    # ------------------------------------------------------------- SnapshotRequired healed
    leader = status(ns, "c")["leaders"]["0"]
    target = max(m["name"] for m in status(ns, "c")["members"] if m["name"] != leader)
    stopped = time.time()  # the operator's clock: an install of the target before is not this one
    signal_member(ns, target, signal.SIGSTOP)
    try:
        acked += write(ns, "c", 400, "b")
    finally:
        signal_member(ns, target, signal.SIGCONT)
    resumed = time.monotonic()
    inst = kube.until("installed", lambda: next(
        (i for i in status(ns, "c").get("snapshotInstalls", [])
         if i["state"] == "installed" and i["member"] == target and i["startedAt"] >= stopped),
        None), 180)  # fmt: skip
    kube.say(f"SnapshotRequired on {target} healed from {inst['source']} "
             f"{time.monotonic() - resumed:.1f} s after it resumed")  # fmt: skip
    assert inst["source"] not in ("leader", target, leader), inst  # from a follower (RATIS-2428)
    assert {"SnapshotRequired", "SnapshotInstalled"} <= set(reasons(ns, "c"))

    # ------------------------------------------------------------- scale 5 -> 3 under load
    loader = load.start(ns, "c", "p")
    kube.until("the load is on", lambda: kube.kubectl("logs", "-n", ns, loader, check=False)
               .count("\n") >= 10, 120)  # fmt: skip
    down = time.monotonic()
    kube.kubectl("scale", "raft/c", "-n", ns, "--replicas", "3")
    while not settled(st := status(ns, "c"), 3):
        # Never below a majority: the cluster stays Available all the way down.
        available = kube.condition({"status": st}, "Available") or {}
        assert available.get("status") == "True", st.get("conditions")
        assert time.monotonic() - down < 300, "5 -> 3: not within 300 s"
        time.sleep(0.5)
    load.stop(ns, loader)
    under_load = load.acked(ns, loader)
    kube.say(f"scale 5 -> 3 under load: {time.monotonic() - down:.1f} s; "
             f"{len(under_load)} acked meanwhile")  # fmt: skip
    assert len(under_load) > 10
    acked += under_load
    assert sorted(pods(ns, "c")) == ["c-0", "c-1", "c-2"]
    assert reasons(ns, "c").count("MemberRemoved") == 2
    kube.until("PDB at a majority of 3",
               lambda: kube.get("pdb", "c", ns)["spec"]["minAvailable"] == 2, 60)  # fmt: skip

    # ------------------------------------------------------------- a spec change rolls, leader last
    leader = status(ns, "c")["leaders"]["0"]
    uids = {n: p["metadata"]["uid"] for n, p in pods(ns, "c").items()}
    rolled = time.monotonic()
    kube.kubectl("patch", "raft", "c", "-n", ns, "--type=merge", "-p",
                 '{"spec": {"raft": {"compactNumberEntries": 20}}}')  # fmt: skip
    order: list[str] = []

    def all_rolled() -> bool:
        now = {n: p["metadata"]["uid"] for n, p in pods(ns, "c").items()}
        order.extend(n for n in sorted(now) if now[n] != uids[n] and n not in order)
        return len(order) == 3 and settled(status(ns, "c"), 3)

    kube.until("every member restarted with the new settings", all_rolled, 300, every=0.5)
    kube.say(f"rolling restart of 3 members: {time.monotonic() - rolled:.1f} s, order {order}")
    assert order[-1] == leader, (order, leader)  # the leader goes last
    assert reasons(ns, "c").count("RollingRestart") >= 3
    assert reasons(ns, "c").count("PodGone") == 1  # nor a Failed pod's, nor a restart's

    # ------------------------------------------------------------- a member's data lost
    victim = next(n for n in sorted(pods(ns, "c")) if n != status(ns, "c")["leaders"]["0"])
    lost = time.monotonic()
    kube.kubectl("delete", "pvc", f"data-{victim}", "-n", ns, "--wait=false")
    kube.kubectl("delete", "pod", victim, "-n", ns)  # the claim goes once its pod has
    kube.until(f"{victim} replaced by a new member", lambda: (
        victim not in (names := {m["name"] for m in status(ns, "c").get("members", [])})
        and len(names) == 3 and settled(status(ns, "c"), 3)), 300)  # fmt: skip
    kube.say(f"member {victim} with its PVC deleted replaced by "
             f"{sorted(set(pods(ns, 'c')) - {'c-0', 'c-1', 'c-2'})}: "
             f"{time.monotonic() - lost:.1f} s")  # fmt: skip
    assert reasons(ns, "c").count("PodGone") == 2 and "MemberLost" in reasons(ns, "c")

    # ------------------------------------------------------------- every ack on every member
    async def read_back() -> None:
        async with aiohttp.ClientSession() as http:
            gate = asyncio.Semaphore(32)

            async def check(name: str, base: str, key: str, value: str) -> None:
                url = f"{base}/v1/partitions/0/keys/{key}?consistency=local"
                async with gate:
                    for _ in range(100):  # a follower may apply the last ones a little later
                        async with http.get(url) as resp:
                            if resp.status == 200:
                                assert (await resp.json())["value"] == value, (name, key)
                                return
                        await asyncio.sleep(0.1)
                raise AssertionError(f"{name} never applied acknowledged {key}")

            await asyncio.gather(*(check(name, base, key, value)
                                   for name, base in member_urls(ns, "c").items()
                                   for key, value in acked))  # fmt: skip

    asyncio.run(read_back())
    kube.say(f"{len(acked)} acknowledged records read back from each of the 3 members")

    # ------------------------------------------------------------- delete: the real GC
    volumes = {c["spec"]["volumeName"] for c in kube.items("pvc", ns, "raftlog.dev/cluster=c")}
    deleted = time.monotonic()
    kube.kubectl("delete", "raft", "c", "-n", ns, "--timeout=120s")

    def nothing_left() -> bool:
        left = kube.kubectl("get", "pods,pvc,svc,pdb,secret", "-n", ns, "-l",
                            "raftlog.dev/cluster=c", "-o", "name")  # fmt: skip
        pvs = {p["metadata"]["name"] for p in kube.items("pv")}
        return not left.strip() and not (volumes & pvs)

    kube.until("pods, volumes, services, budget and secret gone", nothing_left, 180)
    kube.say(f"delete -> nothing left (PVs too): {time.monotonic() - deleted:.1f} s")


def test_an_operator_killed_mid_scale_up_resumes_without_a_second_learner(operator: str) -> None:
    ns = operator
    apply(ns, "r", {**SPEC, "partitions": 2, "raft": {"learnerPromotionStableWindow": 6}})
    kube.until("settled at 3", lambda: settled(status(ns, "r"), 3), 240)
    kube.kubectl("scale", "raft/r", "-n", ns, "--replicas", "4")
    kube.until("r-3 joined as a learner",
               lambda: member(status(ns, "r"), "r-3").get("role") == "learner", 120)  # fmt: skip
    [op] = kube.items("pods", ns, "app.kubernetes.io/name=raftlog-operator")
    os.kill(kube.container_pid(op), signal.SIGKILL)
    kube.until("settled at 4", lambda: settled(status(ns, "r"), 4), 240)
    op_after = kube.get("pod", op["metadata"]["name"], ns)
    assert op_after["status"]["containerStatuses"][0]["restartCount"] >= 1
    assert sorted(pods(ns, "r")) == ["r-0", "r-1", "r-2", "r-3"]
    assert status(ns, "r")["nextOrdinal"] == 4
    r = reasons(ns, "r")
    assert r.count("ScalingUp") == 1 and r.count("LearnerAdded") == 1, r
