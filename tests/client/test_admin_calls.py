"""The client's admin calls against a real 3-node cluster, blocking and asynchronous: the
partition's leader found from the endpoints, follower lag, peers, retention holds, a refused
membership change, a leadership transfer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from tests.steady import STEADY_RAFT

from raftlog.client import AsyncClient, Client, ClientError
from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("admin"), replicas=3, durable=False, raft=STEADY_RAFT
    ) as c:
        c.wait_ready()
        yield c


def leader_name(c: LocalCluster) -> str:
    for _ in range(100):
        name = c.leader(0)
        if name is not None:
            return name
        time.sleep(0.1)
    raise AssertionError("no leader")


def test_the_blocking_client_finds_the_leader_and_administers_the_partition(cluster):
    leader = leader_name(cluster)
    follower = next(n for n in sorted(cluster.nodes) if n != leader)
    urls = {n: node.url for n, node in cluster.nodes.items()}
    with Client(cluster.endpoints) as c:
        assert c.leader(0) == urls[leader]
        lag = c.follower_lag(0, follower)
        assert lag["follower"] == follower and lag["lag"] is not None
        assert c.peers(urls[follower]) == urls  # itself included
        with pytest.raises(ClientError) as refused:
            c.change_membership(0, "promote", follower)
        assert refused.value.status == 409 and refused.value.url == urls[leader]
        with pytest.raises(ClientError) as not_leader:
            c.follower_lag(0, leader, endpoint=urls[follower])
        assert not_leader.value.status == 421, "asked of a follower: not tried elsewhere"

        holder = "reader/one"
        c.set_hold(urls[follower], 0, holder, 1, 60)
        assert [h["holder"] for h in c.holds(urls[follower], 0)["holds"]] == [holder]
        c.delete_hold(urls[follower], 0, holder)
        assert c.holds(urls[follower], 0)["holds"] == []
        with pytest.raises(ClientError) as gone:
            c.delete_hold(urls[follower], 0, holder)
        assert (gone.value.status, gone.value.error) == (404, "unknown_hold")


def test_the_async_client_transfers_leadership_and_appends_at_the_new_leader(cluster):
    leader = leader_name(cluster)
    target = next(n for n in sorted(cluster.nodes) if n != leader)

    async def run() -> tuple[dict[str, object], str, int]:
        async with AsyncClient(cluster.endpoints) as c:
            done = await c.transfer_leader(0, target)
            appended = await c.append(0, [{"value": "after the transfer"}])
            return done, await c.leader(0), appended.first_index

    done, now, index = asyncio.run(run())
    assert done["leader"] == target and now == cluster.nodes[target].url
    assert index > 0
