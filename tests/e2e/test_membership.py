"""A learner joins a loaded cluster, is refused promotion while it lags, then promoted."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from tests.steady import STEADY_RAFT

from raftlog.client import AsyncClient
from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def load(cluster: LocalCluster, n: int) -> None:
    async def go() -> None:
        async with AsyncClient(cluster.endpoints) as c:
            for i in range(0, n, 50):
                await c.append(0, [{"key": f"k{j}", "value": f"v{j}"} for j in range(i, i + 50)])

    asyncio.run(go())


def test_learner_catches_up_and_is_promoted_only_within_the_lag(tmp_path):
    with LocalCluster(tmp_path, replicas=3, durable=False, raft=STEADY_RAFT) as cluster:
        cluster.wait_ready()
        load(cluster, 2000)
        leader = cluster.leader(0)
        assert leader is not None
        new = cluster.add_node()
        cluster.start(new.name)
        cluster.pause(new.name)  # it cannot catch up yet

        def admin(body: dict[str, str]) -> tuple[int, dict[str, Any]]:
            code, reply = cluster.request(
                leader, "POST", "/v1/admin/partitions/0/members", json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            return code, reply

        code, reply = admin({"op": "add_learner", "node": new.name, "url": new.url})
        assert code == 200 and new.name in reply["learners"], reply
        code, reply = admin({"op": "promote", "node": new.name})
        assert code == 409, reply
        assert "lag" in str(reply["reason"]), reply
        cluster.resume(new.name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            code, lag = cluster.get(leader, f"/v1/admin/partitions/0/followers/{new.name}/lag")
            if code == 200 and lag["lag"] is not None and lag["lag"] <= 10:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the learner never caught up: {lag}")
        code, reply = admin({"op": "promote", "node": new.name})
        assert code == 200 and new.name in reply["voters"], reply
        load(cluster, 100)  # the cluster keeps committing with four voters
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # a follower learns the commit index a little later
            st = cluster.status(new.name)["partitions"][0]
            if st["high_water_mark"] >= 2100:
                break
            time.sleep(0.05)
        assert st["member"] == "voter" and st["high_water_mark"] >= 2100, st


def test_a_refused_member_change_leaves_the_peer_addresses_alone(tmp_path):
    with LocalCluster(tmp_path, replicas=3, durable=False, raft=STEADY_RAFT) as cluster:
        cluster.wait_ready()
        leader = cluster.leader(0)
        assert leader is not None
        follower = next(n for n in cluster.nodes if n != leader)
        other = next(n for n in cluster.nodes if n not in (leader, follower))

        def admin(on: str, body: dict[str, str]) -> tuple[int, dict[str, Any]]:
            code, reply = cluster.request(
                on, "POST", "/v1/admin/partitions/0/members", json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            return code, reply

        def peers(on: str) -> dict[str, str]:
            code, reply = cluster.get(on, "/v1/admin/peers")
            assert code == 200
            return dict(reply["peers"])

        bad = "http://127.0.0.1:9"
        before = {n: peers(n) for n in cluster.nodes}
        # On a follower: 421 (not the leader), and nothing changed there.
        code, reply = admin(follower, {"op": "remove", "node": other, "url": bad})
        assert code == 421, reply
        # On the leader, refused by the core (a voter is no learner to promote): 409; a
        # brand-new name with an address is no member: 404. Nothing changed either way.
        code, reply = admin(leader, {"op": "promote", "node": other, "url": bad})
        assert code == 409, reply
        code, reply = admin(leader, {"op": "promote", "node": "n9", "url": bad})
        assert (code, reply["error"]) == (404, "unknown_member"), reply
        assert {n: peers(n) for n in cluster.nodes} == before
        load(cluster, 50)  # and the cluster still commits through every member


def test_the_leader_says_a_removal_is_pending_until_it_commits(tmp_path):
    """`membership_pending` in `/v1/status`: the leader's voters lack a removed member as soon
    as the change is appended; the operator deletes that member only once this is false."""
    env = {"RAFTLOG_APPEND_TIMEOUT_S": "1"}  # the admin call's wait for the commit
    with LocalCluster(tmp_path, replicas=3, durable=False, raft=STEADY_RAFT, env=env) as cluster:
        cluster.wait_ready()
        leader = cluster.leader(0)
        assert leader is not None
        removed, lagging = (n for n in cluster.nodes if n != leader)
        assert cluster.status(leader)["partitions"][0]["membership_pending"] is False
        assert cluster.status(removed)["partitions"][0]["membership_pending"] is None
        cluster.pause(lagging)  # the new voters {leader, lagging} cannot commit without it
        body = json.dumps({"op": "remove", "node": removed}).encode()
        code, reply = cluster.request(
            leader, "POST", "/v1/admin/partitions/0/members", body,
            {"Content-Type": "application/json"},
        )  # fmt: skip
        assert code == 503 and reply["error"] == "timeout", reply
        st = cluster.status(leader)["partitions"][0]
        assert removed not in st["voters"] and st["membership_pending"] is True, st
        cluster.resume(lagging)
        deadline = time.monotonic() + 20
        while st["membership_pending"] and time.monotonic() < deadline:
            time.sleep(0.05)
            st = cluster.status(leader)["partitions"][0]
        assert st["membership_pending"] is False and removed not in st["voters"], st


def test_new_voters_elect_without_the_leader_that_added_them(tmp_path):
    """Found by a fault-injection review: a new member's address, given to the leader with
    `add_learner`, reached that leader only (a membership entry carries names). Two members
    added and promoted, two old ones (the leader last) removed and killed: the three voters
    left could not reach each other and never elected. The leader now tells its peers."""
    with LocalCluster(tmp_path, replicas=3, durable=False) as cluster:
        cluster.wait_ready()

        def leading() -> str | None:
            """The running node leading partition 0 in the highest term (a joining node, no
            member yet, follows no leader: `cluster.leader` wants every node to agree)."""
            best: tuple[int, str] | None = None
            for name, n in cluster.nodes.items():
                if not n.running:
                    continue
                try:
                    p = cluster.status(name)["partitions"][0]
                except (OSError, RuntimeError):
                    continue
                if p["role"] == "leader" and (best is None or p["term"] > best[0]):
                    best = (p["term"], name)
            return None if best is None else best[1]

        def change(body: dict[str, str]) -> dict[str, Any]:
            code, reply = 0, None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                leader = leading()
                if leader is not None:
                    code, reply = cluster.request(
                        leader, "POST", "/v1/admin/partitions/0/members",
                        json.dumps(body).encode(), {"Content-Type": "application/json"},
                    )  # fmt: skip
                    if code == 200:
                        return dict(reply)
                time.sleep(0.1)  # 409 while the last change is applied, 503, no leader
            raise AssertionError(f"{body} never done: {code} {reply}")

        for _ in range(2):
            new = cluster.add_node()  # started with the members it is given, --join
            cluster.start(new.name)
            change({"op": "add_learner", "node": new.name, "url": new.url})
            change({"op": "promote", "node": new.name})
        first = leading()
        assert first is not None
        other = next(n for n in ("n1", "n2", "n3") if n != first)
        change({"op": "remove", "node": other})
        change({"op": "remove", "node": first})
        cluster.kill(other)
        cluster.kill(first)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            leader = leading()
            if leader is not None and leader not in (first, other):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the voters left never elected a leader")
