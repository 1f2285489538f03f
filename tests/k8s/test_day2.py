"""Day-2 controls (issue 20) on the real Kubernetes, under an append load through the client
Service: pause, restart without a spec change, a partition added (issue 18), switchover, fencing,
volume expansion (refused by local-path, said so) and hibernation; then every acknowledged record
is read from every member. Each control's time is printed for the issue's note."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import aiohttp

from raftlog.client import AppendResult, AsyncClient
from raftlog.operator.controls import PAUSE, RESTART, SWITCHOVER
from raftlog.operator.nodeapi import KnownAddresses
from tests.k8s import kube, load
from tests.k8s import test_kubectl_raft as kubectl_raft
from tests.k8s.test_journeys import (
    SPEC,
    apply,
    member,
    member_urls,
    pods,
    reasons,
    settled,
    signal_member,
    status,
)

NAME = "d"
# The journeys' spec without their aggressive compaction: here a member that restarts or stops
# for a while catches up by backfill, and the steps under test are not queued behind the
# snapshot installs the journeys exercise on purpose.
DAY2_SPEC = {**SPEC, "raft": {"learnerPromotionLag": 10, "learnerPromotionStableWindow": 2.0}}


def annotate(ns: str, key: str, value: str | None) -> None:
    kube.kubectl("annotate", "raft", NAME, "-n", ns, "--overwrite",
                 f"{key}={value}" if value is not None else f"{key}-")  # fmt: skip


def patch(ns: str, name: str, spec: dict[str, Any]) -> None:
    kube.kubectl("patch", "raft", name, "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": spec}))  # fmt: skip


def patch_spec(ns: str, spec: dict[str, Any]) -> None:
    patch(ns, NAME, spec)


def condition(ns: str, kind: str) -> str | None:
    return (kube.condition({"status": status(ns, NAME)}, kind) or {}).get("status")


def uids(ns: str) -> dict[str, str]:
    return {n: p["metadata"]["uid"] for n, p in pods(ns, NAME).items()}


def rolled(ns: str, asked: str) -> bool:
    """Every member restarted for `asked` and ready; otherwise fails with the operator's last
    step (what it waits for), which `kube.until` reports on a timeout."""
    st = status(ns, NAME)
    if st.get("restartedAt") == asked and settled(st, 3):
        return True
    raise AssertionError(f"phase {st.get('phase')}, last action {st.get('lastAction')!r}")


def timed(what: str, started: float) -> float:
    took = time.monotonic() - started
    kube.say(f"day-2 {what}: {took:.1f} s")
    return took


def append_to(ns: str, partition: int, key: str) -> tuple[str, str]:
    """One record appended to `partition` through the client; (key, value) once acknowledged.

    Leadership may move after a roll (or an election under load): the client follows the
    leader hints as any user's does. They name members by their cluster DNS names, which this
    host resolves to the pods' addresses as the API server reports them (the operator's
    `KnownAddresses`).
    """
    record = {"key": key, "value": f"{key} in p{partition}"}
    addresses = KnownAddresses()
    addresses.known = {f"{n}.{NAME}-peers.{ns}.svc": p["status"]["podIP"]
                       for n, p in pods(ns, NAME).items() if p["status"].get("podIP")}  # fmt: skip

    async def run() -> AppendResult:
        async with AsyncClient(list(member_urls(ns, NAME).values()), retries=20,
                               resolver=addresses) as client:  # fmt: skip
            return await client.append(partition, [record])

    got = asyncio.run(run())
    assert got.partition == partition, got
    return key, record["value"]


def raised(st: dict[str, Any], before: dict[str, str], now: dict[str, str]) -> bool:
    """The roll is over (every member's pod made again since `before`, all ready) and
    partitions 0-2 are each led. (A leader's view alone is not enough: it lists a voter not
    restarted yet as a follower it probes.)"""
    return (
        settled(st, 3)
        and set(now) == set(before)
        and all(now[n] != before[n] for n in before)
        and set(st.get("leaders", {})) == {"0", "1", "2"}
    )


def read_back(ns: str, name: str, acked: list[tuple[str, str]], partition: int = 0) -> None:
    """Every acknowledged record, from every member (a follower may apply the last ones a
    little later)."""

    async def run() -> None:
        async with aiohttp.ClientSession() as http:
            gate = asyncio.Semaphore(32)

            async def check(member: str, base: str, key: str, value: str) -> None:
                url = f"{base}/v1/partitions/{partition}/keys/{key}?consistency=local"
                last = ""
                async with gate:
                    for _ in range(100):
                        async with http.get(url) as resp:
                            if resp.status == 200:
                                assert (await resp.json())["value"] == value, (member, key)
                                return
                            last = f"{resp.status} {await resp.text()}"
                        await asyncio.sleep(0.1)
                raise AssertionError(f"{member} never applied acknowledged {key}: {last}")

            await asyncio.gather(*(check(member, base, key, value)
                                   for member, base in member_urls(ns, name).items()
                                   for key, value in acked))  # fmt: skip

    asyncio.run(run())


def test_day2_controls_under_load_lose_no_acknowledged_record(operator: str) -> None:
    ns = operator
    apply(ns, NAME, {**DAY2_SPEC, "partitions": 2})
    kube.until("settled at 3", lambda: settled(status(ns, NAME), 3), 240)
    loader = load.start(ns, NAME, "day2")
    kube.until("the load is on", lambda: kube.kubectl("logs", "-n", ns, loader, check=False)
               .count("\n") >= 10, 120)  # fmt: skip

    # ------------------------------------------------------------- pause: nothing is done
    started = time.monotonic()
    annotate(ns, PAUSE, "true")
    kube.until("Paused", lambda: condition(ns, "Paused") == "True", 60, every=0.2)
    timed("pause -> the operator says Paused", started)
    kube.kubectl("delete", "pod", f"{NAME}-2", "-n", ns)
    time.sleep(10)  # ten passes at the chart's interval: none makes the pod again
    assert f"{NAME}-2" not in pods(ns, NAME)
    assert status(ns, NAME)["phase"] == "Paused"
    started = time.monotonic()
    annotate(ns, PAUSE, None)
    kube.until("resumed, the member back", lambda: settled(status(ns, NAME), 3), 180)
    timed("resume -> the deleted member back and ready", started)
    assert {"ReconciliationPaused", "ReconciliationResumed"} <= set(reasons(ns, NAME))

    # ------------------------------------------------------------- restart without a spec change
    before = uids(ns)
    asked = "2026-11-25T16:00:00Z"
    started = time.monotonic()
    annotate(ns, RESTART, asked)
    kube.until("every member restarted", lambda: rolled(ns, asked), 300)
    timed("restart of 3 members (quorum-safe, leaders last)", started)
    after = uids(ns)
    assert all(after[n] != before[n] for n in before), (before, after)
    restarted = [e["message"].split()[1] for e in kube.items("events", ns)
                 if e["reason"] == "RollingRestart"]  # fmt: skip
    # Each once. (Which goes last depends on where the two partitions' leaderships are when
    # the roll reaches them; leader-last is checked with one partition in test_journeys.)
    assert sorted(restarted) == [f"{NAME}-0", f"{NAME}-1", f"{NAME}-2"], restarted

    # ------------------------------------------------------------- switchover of every partition
    st = status(ns, NAME)
    target = next(m["name"] for m in st["members"] if m["name"] not in st["leaders"].values())
    started = time.monotonic()
    annotate(ns, SWITCHOVER, f"{target}@1")
    kube.until("switchover done",
               lambda: (status(ns, NAME).get("switchover") or {}).get("state") == "done", 120,
               every=0.2)  # fmt: skip
    timed(f"switchover of 2 partitions to {target}", started)
    assert set(status(ns, NAME)["leaders"].values()) == {target}

    # ------------------------------------------------------------- fencing the leader
    started = time.monotonic()
    patch_spec(ns, {"fencedMembers": [target]})
    kube.until("fenced and stopped",
               lambda: member(status(ns, NAME), target).get("fenced")
               and target not in pods(ns, NAME), 120)  # fmt: skip
    timed(f"fence {target} (leaderships moved, pod stopped)", started)
    assert target not in status(ns, NAME)["leaders"].values()
    assert kube.get("pvc", f"data-{target}", ns)  # its volume stays
    lines = kube.kubectl("logs", "-n", ns, loader).count("\n")
    kube.until(
        "appends go on while fenced",
        lambda: kube.kubectl("logs", "-n", ns, loader).count("\n") > lines + 20,
        60,
    )
    started = time.monotonic()
    patch_spec(ns, {"fencedMembers": []})
    kube.until("unfenced", lambda: settled(status(ns, NAME), 3), 180)
    timed(f"unfence {target} -> back and ready", started)

    load.stop(ns, loader)
    acked = load.acked(ns, loader)
    assert len(acked) > 50

    # ------------------------------------------------------------- volume expansion, refused here
    before = uids(ns)
    patch_spec(ns, {"storage": {"size": "2Gi"}})
    kube.until("the refusal in status",
               lambda: any("spec.storage.size" in p for p in status(ns, NAME).get("problems", [])),
               60)  # fmt: skip
    problem = next(p for p in status(ns, NAME)["problems"] if "spec.storage.size" in p)
    kube.say(f"day-2 volume expansion on local-path: {problem}")
    assert condition(ns, "Degraded") == "True"
    assert uids(ns) == before  # a size is never a restart
    patch_spec(ns, {"storage": {"size": SPEC.get("storage", {}).get("size", "1Gi")}})

    # ------------------------------------------------------------- hibernation
    claims = {c["metadata"]["name"] for c in kube.items("pvc", ns, f"raftlog.dev/cluster={NAME}")}
    started = time.monotonic()
    patch_spec(ns, {"hibernate": True})
    kube.until("hibernated", lambda: status(ns, NAME).get("phase") == "Hibernated"
               and not pods(ns, NAME), 180)  # fmt: skip
    timed("hibernate (3 pods stopped)", started)
    assert status(ns, NAME).get("leaders", {}) == {}, "no member runs: no partition is led"
    assert {c["metadata"]["name"] for c in kube.items("pvc", ns, f"raftlog.dev/cluster={NAME}")} \
        == claims  # fmt: skip
    started = time.monotonic()
    patch_spec(ns, {"hibernate": False})
    kube.until("awake", lambda: settled(status(ns, NAME), 3), 240)
    timed("resume from hibernation -> 3 ready voters", started)
    assert {"Hibernated", "Resumed"} <= set(reasons(ns, NAME))

    # ------------------------------------------------------------- a partition added (issue 18)
    # Last: with 3 partitions spread over the 3 members, the switchover above would find no member
    # leading none.
    before = uids(ns)
    started = time.monotonic()
    patch_spec(ns, {"partitions": 3})
    kube.until("every member restarted with 3 partitions, each led",
               lambda: raised(status(ns, NAME), before, uids(ns)), 300)  # fmt: skip
    timed("partitions raised 2 -> 3 (members rolled, the new one led)", started)
    added = append_to(ns, 2, "added")
    read_back(ns, NAME, [added], partition=2)

    # ------------------------------------------------------------- every ack on every member
    read_back(ns, NAME, acked)
    kube.say(f"day-2: {len(acked)} acknowledged records read back from each of the 3 members")


def test_named_removal_and_a_cancelled_one_through_kubectl_raft(operator: str) -> None:
    """`kubectl raft remove` names the member a scale-down takes (not the highest ordinal), and
    raising replicas back while a removal waits (here: it would leave no ready majority, one
    member being stopped) cancels it."""
    ns, name = operator, "e"
    apply(ns, name, DAY2_SPEC)
    kube.until("settled at 3", lambda: settled(status(ns, name), 3), 240)
    loader = load.start(ns, name, "removals")
    kube.until("the load is on", lambda: kube.kubectl("logs", "-n", ns, loader, check=False)
               .count("\n") >= 10, 120)  # fmt: skip

    def raft(*args: str) -> str:
        return kubectl_raft.raft(*args, "-n", ns)

    # A removal that must wait: e-2 stopped, so removing e-1 would leave 1 of 2 voters ready.
    signal_member(ns, f"{name}-2", signal.SIGSTOP)
    try:
        kube.until("e-2 not ready", lambda: not member(status(ns, name), f"{name}-2")
                   .get("ready"), 60)  # fmt: skip
        raft("remove", name, f"{name}-1")
        kube.until(
            "e-1 being removed, waiting",
            lambda: member(status(ns, name), f"{name}-1").get("role") == "removing",
            60,
        )
        time.sleep(3)  # passes go by: the removal still waits
        assert member(status(ns, name), f"{name}-1").get("role") == "removing"
        patch(ns, name, {"replicas": 3})
        kube.until(
            "the removal cancelled",
            lambda: member(status(ns, name), f"{name}-1").get("role") == "voter",
            60,
        )
    finally:
        signal_member(ns, f"{name}-2", signal.SIGCONT)
    kube.until("settled at 3 again", lambda: settled(status(ns, name), 3), 120)
    assert "RemovalCancelled" in reasons(ns, name)
    assert sorted(pods(ns, name)) == [f"{name}-0", f"{name}-1", f"{name}-2"]

    # A named removal that goes through: the lowest ordinal, not the highest.
    started = time.monotonic()
    raft("remove", name, f"{name}-0")
    kube.until("e-0 removed", lambda: settled(status(ns, name), 2)
               and f"{name}-0" not in pods(ns, name), 180)  # fmt: skip
    kube.say(f"day-2 named removal of {name}-0: {time.monotonic() - started:.1f} s")
    assert sorted(m["name"] for m in status(ns, name)["members"]) == [f"{name}-1", f"{name}-2"]
    assert "MemberRemoved" in reasons(ns, name)
    load.stop(ns, loader)
    acked = load.acked(ns, loader)
    assert len(acked) > 50
    read_back(ns, name, acked)
    kube.say(f"day-2 removals: {len(acked)} acknowledged records read back from each member")


EXPANDABLE = "raftlog-expandable"


def test_a_larger_size_is_asked_of_every_claim_where_the_class_allows_it(operator: str) -> None:
    """A StorageClass with allowVolumeExpansion (local-path's provisioner, which has no resizer:
    the claims' requests grow, their capacity does not): the operator raises every member's
    claim, restarts nobody, and says the expansion is requested until the volumes grow."""
    ns, name = operator, "x"
    sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
          "metadata": {"name": EXPANDABLE}, "provisioner": "rancher.io/local-path",
          "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
          "allowVolumeExpansion": True}  # fmt: skip
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(sc))
    try:
        spec = {**DAY2_SPEC, "storage": {**DAY2_SPEC["storage"], "storageClassName": EXPANDABLE}}
        apply(ns, name, spec)
        kube.until("settled at 3", lambda: settled(status(ns, name), 3), 240)
        before = {n: p["metadata"]["uid"] for n, p in pods(ns, name).items()}
        started = time.monotonic()
        patch(ns, name, {"storage": {"size": "2Gi"}})

        def claims_asked() -> bool:
            claims = kube.items("pvc", ns, f"raftlog.dev/cluster={name}")
            return len(claims) == 3 and all(
                c["spec"]["resources"]["requests"]["storage"] == "2Gi" for c in claims
            )

        kube.until("every claim asks for 2Gi", claims_asked, 60)
        kube.say(f"day-2 volume expansion asked of 3 claims: {time.monotonic() - started:.1f} s")
        expansion = status(ns, name).get("volumeExpansion") or {}
        assert expansion.get("size") == "2Gi" and expansion.get("state") == "requested"
        assert not any("storage.size" in p for p in status(ns, name).get("problems", []))
        time.sleep(3)
        assert {n: p["metadata"]["uid"] for n, p in pods(ns, name).items()} == before
        assert settled(status(ns, name), 3)
    finally:
        kube.kubectl("delete", "raft", name, "-n", ns, "--timeout=120s", check=False)
        kube.kubectl("delete", "storageclass", EXPANDABLE, check=False)


def test_a_bad_spec_fixed_and_a_token_lost_while_no_operator_ran(operator: str) -> None:
    """Two ways a cluster stayed broken after the user's fix, on this cluster (a helper's
    journeys). An image tag with a typo stops the roll at its first member (named, with why,
    in `Degraded`); removing it again restarts that member with the fix. And an auth Secret
    deleted while no operator ran is not made again with a new token (the restarted members
    were locked out of the others for good): the operator says how to put it back from a
    member, and once it is back a restarted member rejoins."""
    ns, name = operator, "f"
    apply(ns, name, DAY2_SPEC)
    kube.until("settled at 3", lambda: settled(status(ns, name), 3), 240)
    image = pods(ns, name)[f"{name}-0"]["spec"]["containers"][0]["image"]
    started = time.monotonic()
    patch(ns, name, {"image": f"{image}-typo"})

    def named_stuck() -> str | None:
        said = (kube.condition({"status": status(ns, name)}, "Degraded") or {}).get("message")
        return said if said and ("ImagePullBackOff" in said or "ErrImagePull" in said) else None

    said = kube.until("a member stuck on the bad image, named", named_stuck, 180)
    kube.say(f"day-2 bad image: {said}")
    kube.kubectl("patch", "raft", name, "-n", ns, "--type=json",
                 "-p", json.dumps([{"op": "remove", "path": "/spec/image"}]))  # fmt: skip

    def fixed() -> bool:
        now = pods(ns, name)
        return settled(status(ns, name), 3) and all(
            p["spec"]["containers"][0]["image"] == image for p in now.values()
        )

    kube.until("every member back on the image, ready", fixed, 240)
    timed("a bad image, then the spec fixed -> 3 ready on the fix", started)

    # ------------------------------------------------------------- the token, lost
    kube.helm("uninstall", kube.RELEASE, "-n", ns, "--wait", "--timeout", "120s")
    kube.kubectl("delete", "secret", f"{name}-auth", "-n", ns)
    kube.helm("install", kube.RELEASE, str(kube.CHART), "-n", ns, "--wait", "--timeout", "180s")

    def asked() -> str | None:
        return next(
            (
                e["message"]
                for e in kube.items("events", ns)
                if e["reason"] == "ReconcileFailed"
                and f"secret {name}-auth is gone" in e["message"]
            ),
            None,
        )

    kube.say(f"day-2 lost token: {kube.until('the lost token asked for', asked, 120)[:160]}")
    got = kube.run(["kubectl", "-n", ns, "get", "secret", f"{name}-auth"])
    assert got.returncode != 0, "a new token was made while the members run with the old one"
    token = kube.kubectl("-n", ns, "exec", f"{name}-0", "--", "cat", "/etc/raftlog/token/token")
    kube.kubectl("-n", ns, "create", "secret", "generic", f"{name}-auth",
                 f"--from-literal=token={token.strip()}")  # fmt: skip
    gone = pods(ns, name)[f"{name}-2"]["metadata"]["uid"]
    kube.kubectl("delete", "pod", f"{name}-2", "-n", ns)

    def rejoined() -> bool:
        pod = pods(ns, name).get(f"{name}-2")
        return (
            pod is not None
            and pod["metadata"]["uid"] != gone
            and (kube.condition(pod, "Ready") or {}).get("status") == "True"
            and settled(status(ns, name), 3)
        )

    kube.until("f-2 restarted on the token put back, and ready", rejoined, 240)
