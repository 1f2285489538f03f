"""A snapshot install's progress in the RaftCluster's status while it runs: the real
`reconcile_pass` decides an install, and while the install (a fake node call, held by the test)
runs, the progress is read from the streaming member's `/v1/status` (real aiohttp servers read
by the real node client) and saved, through the pass's own `save`, with `bytesDone` growing.
Reading or saving the progress never fails the install, and stops when it ends."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tests.operator.test_reconciler import MEMBERS, World, fv, running_status, spec

from raftlog.node.server.archive import S3ObjectStore
from raftlog.operator.actions import Action, InstallSnapshot, Outcome
from raftlog.operator.cluster_views import NodeView
from raftlog.operator.models import RaftClusterSpec, RaftClusterStatus, SnapshotInstall
from raftlog.operator.nodeapi import NodeApi, snapshot_send_progress
from raftlog.operator.runtime import PassResult, PodInfo, reconcile_pass

EVERY = 0.01  # the progress poll's period here (2 s in the operator)
TOTAL = 40 * 1024 * 1024


class FakeNode:
    """A member's `/v1/status`, with `sends` as its partition 1's `snapshot_sends`: each read
    answers the next of them (the last one again once they run out)."""

    def __init__(self, name: str, sends: list[list[dict[str, Any]]] | None = None) -> None:
        self.name = name
        self.sends = sends or [[]]
        self.reads = 0
        self.broken = ""  # "500": answers 500 instead; "garbage": 200 with a body not JSON
        self.partition0: list[dict[str, Any]] = []  # partition 0's snapshot_sends

    async def status(self, request: web.Request) -> web.Response:
        self.reads += 1
        if self.broken == "500":
            return web.json_response({"reason": "boom"}, status=500)
        if self.broken == "garbage":
            return web.Response(text="<html>a proxy's page</html>", content_type="application/json")
        sends = self.sends[min(self.reads - 1, len(self.sends) - 1)]
        parts = [
            {"partition": 0, "snapshot_sends": self.partition0},
            {"partition": 1, "snapshot_sends": sends},
        ]
        return web.json_response({"node": self.name, "partitions": parts})


def send(done: int, target: str = "c-2") -> list[dict[str, Any]]:
    return [{"target": target, "snapshot_index": 90, "sent_bytes": done, "total_bytes": TOTAL}]


@asynccontextmanager
async def serving(nodes: dict[str, FakeNode]) -> AsyncIterator[dict[str, str]]:
    servers = {}
    for name, node in nodes.items():
        app = web.Application()
        app.router.add_get("/v1/status", node.status)
        servers[name] = TestServer(app)
        await servers[name].start_server()
    try:
        yield {name: str(s.make_url("")).rstrip("/") for name, s in servers.items()}
    finally:
        for s in servers.values():
            await s.close()


class FakeRuntime:
    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls

    async def pods(self, spec: RaftClusterSpec, status: RaftClusterStatus) -> dict[str, PodInfo]:
        return {n: PodInfo("running", True, url) for n, url in self.urls.items()}

    async def create_members(self, *args: Any) -> None:
        raise AssertionError("no member is created here")

    async def delete_member(self, name: str, delete_volume: bool) -> None:
        raise AssertionError("no member is deleted here")

    async def stop_member(self, name: str) -> None:
        raise AssertionError("no member is stopped here")

    async def expand_volume(self, name: str, size: str) -> None:
        raise AssertionError("no volume is expanded here")

    async def archive_store(self, spec: RaftClusterSpec, url: str) -> S3ObjectStore:
        raise AssertionError("no archive is read here")


class FakeApi(NodeApi):
    """The node API with the members' views given and the install held by the test (`install`);
    the progress is read by the real `snapshot_send`, through the real client."""

    def __init__(self, world: World, install: Callable[[], Awaitable[Outcome]]) -> None:
        super().__init__(timeout_s=1.0)
        self.world = world
        self.install = install
        self.performed: list[Action] = []
        self.read_errors = 0  # the next reads of progress fail in the client itself

    async def snapshot_send(
        self, urls: Sequence[str], partition: int, target: str
    ) -> tuple[int, int] | None:
        if self.read_errors:
            self.read_errors -= 1
            raise RuntimeError("Session is closed")
        return await super().snapshot_send(urls, partition, target)

    async def views(self, urls: dict[str, str]) -> dict[str, NodeView | None]:
        members = self.world.observed().members.items()  # each knowing every member's URL
        return {n: m.node and dataclasses.replace(m.node, peers=dict(urls)) for n, m in members}

    async def perform(self, action: Action, urls: dict[str, str]) -> Outcome:
        self.performed.append(action)
        assert isinstance(action, InstallSnapshot), action
        return await self.install()


def needs_snapshot() -> World:
    """c-0 leads; c-2 needs a snapshot of partition 1, which c-1 can stream."""
    w = World(MEMBERS)
    w.follower(1, fv("c-2", lag=None, state="snapshot", match=10, snapshot_required=True))
    return w


class Saves:
    """The pass's `save`: a copy of each status written, unchanged ones skipped (as the
    Kubernetes handler's does)."""

    def __init__(self) -> None:
        self.statuses: list[RaftClusterStatus] = []
        self.fail_progress = False  # a save of progress (bytes known, pending) raises
        self.hold: asyncio.Event | None = None  # a save of progress waits for it
        self.entered = asyncio.Event()  # a save of progress began

    async def __call__(self, status: RaftClusterStatus) -> None:
        if self.statuses and self.statuses[-1] == status:
            return
        install = status.snapshot_installs[0] if status.snapshot_installs else None
        if install is not None and install.state == "pending" and install.bytes_done is not None:
            if self.fail_progress:
                raise RuntimeError("HTTP 409: the resource changed")
            self.entered.set()
            if self.hold is not None:
                await self.hold.wait()
        self.statuses.append(status.model_copy(deep=True))

    def progress(self) -> list[tuple[str, int | None, int | None]]:
        return [
            (i.state, i.bytes_done, i.bytes_total)
            for i in (s.snapshot_installs[0] for s in self.statuses if s.snapshot_installs)
        ]


async def until(cond: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


async def one_pass(
    urls: dict[str, str],
    save: Saves,
    install: Callable[[], Awaitable[Outcome]],
    world: World | None = None,
    read_errors: int = 0,
) -> tuple[PassResult, FakeApi]:
    api = FakeApi(world or needs_snapshot(), install)
    api.read_errors = read_errors
    try:
        result = await reconcile_pass(
            "c", spec(), running_status(MEMBERS), FakeRuntime(urls), api, save,
            progress_every=EVERY,
        )  # fmt: skip
    finally:
        await api.close()
    return result, api


def test_a_running_install_saves_its_progress_growing_then_done() -> None:
    source = FakeNode("c-1", [send(0), send(0), send(5_000_000), send(20_000_000), send(TOTAL)])
    nodes = {"c-0": FakeNode("c-0"), "c-1": source, "c-2": FakeNode("c-2")}
    save = Saves()

    async def install() -> Outcome:  # answers once the stream's last report was saved
        await until(lambda: save.progress()[-1][1] == TOTAL, "the last progress saved")
        return Outcome(True, "status=installed, source=c-1")

    async def run() -> PassResult:
        async with serving(nodes) as urls:
            result, api = await one_pass(urls, save, install)
            assert api.performed == [InstallSnapshot(1, "c-0", "c-2", "c-1")]
            reads = source.reads
            await asyncio.sleep(20 * EVERY)
            assert source.reads == reads, "the progress was still read after the install"
            assert nodes["c-0"].reads == 0  # the source streams: the leader is not asked
            return result

    result = asyncio.run(run())
    assert save.progress() == [
        ("pending", None, None),  # the plan, saved before acting
        ("pending", 0, TOTAL),
        ("pending", 5_000_000, TOTAL),
        ("pending", 20_000_000, TOTAL),
        ("pending", TOTAL, TOTAL),
        ("installed", TOTAL, TOTAL),  # the outcome, folded into the last progress
    ]
    assert result.outcome == Outcome(True, "status=installed, source=c-1")
    assert result.status == save.statuses[-1]


@pytest.mark.parametrize("source_answers", ["", "500"])
def test_progress_is_read_from_the_leader_when_it_streams_itself(source_answers: str) -> None:
    """The named source could not stream it (it streams nothing, or it fails): the leader
    does, and says so in its status."""
    leader = FakeNode("c-0", [send(1024), send(2048)])
    nodes = {"c-0": leader, "c-1": FakeNode("c-1"), "c-2": FakeNode("c-2")}
    nodes["c-1"].broken = source_answers
    save = Saves()

    async def install() -> Outcome:
        await until(lambda: save.progress()[-1][1] == 2048, "the leader's progress saved")
        return Outcome(True, "status=installed, source=leader, fell_back_to_leader=...")

    async def run() -> None:
        async with serving(nodes) as urls:
            await one_pass(urls, save, install)
            assert nodes["c-1"].reads >= 2  # the source first, each time

    asyncio.run(run())
    assert save.progress()[1:] == [
        ("pending", 1024, TOTAL),
        ("pending", 2048, TOTAL),
        ("installed", TOTAL, TOTAL),
    ]


def test_progress_of_another_target_or_partition_is_not_taken() -> None:
    other = [*send(7, target="c-1"), *send(8, target="c-9")]
    nodes = {n: FakeNode(n, [other]) for n in MEMBERS}
    for node in nodes.values():
        node.partition0 = send(9)  # to c-2, of another partition
    save = Saves()

    async def install() -> Outcome:
        await until(lambda: nodes["c-0"].reads >= 3, "a few reads")
        return Outcome(True)

    async def run() -> None:
        async with serving(nodes) as urls:
            await one_pass(urls, save, install)

    asyncio.run(run())
    assert save.progress() == [("pending", None, None), ("installed", None, None)]


def test_failures_to_read_or_save_progress_never_fail_the_install() -> None:
    """The client fails, the source answers 500, then a body that is not JSON, the leader is not
    there at all; then the source answers and its progress cannot be saved (a 409): the install
    still ends as it ends, and the pass saves it."""
    source = FakeNode("c-1", [send(100)])
    source.broken = "500"
    nodes = {"c-1": source, "c-2": FakeNode("c-2")}
    save = Saves()
    save.fail_progress = True

    async def install() -> Outcome:
        await until(lambda: source.reads >= 3, "reads of the broken source")
        source.broken = "garbage"
        await until(lambda: source.reads >= 6, "reads of the source answering garbage")
        source.broken = ""
        reads = source.reads
        await until(lambda: source.reads >= reads + 1, "a read of the mended source")
        await asyncio.sleep(10 * EVERY)  # after a failed save, the reports end
        assert source.reads == reads + 1, "progress was read again after a save failed"
        return Outcome(True, "status=installed")

    async def run() -> PassResult:
        async with serving(nodes) as urls:
            urls["c-0"] = "http://127.0.0.1:9"  # nothing listens there
            result, _ = await one_pass(urls, save, install, read_errors=2)
            return result

    result = asyncio.run(run())
    assert result.outcome == Outcome(True, "status=installed")
    # The progress read last is kept with the outcome, done since it is installed.
    assert save.progress() == [("pending", None, None), ("installed", TOTAL, TOTAL)]


def test_a_failed_install_keeps_the_progress_it_reached() -> None:
    nodes = {n: FakeNode(n) for n in MEMBERS}
    nodes["c-1"].sends = [send(3_000_000)]
    save = Saves()

    async def install() -> Outcome:
        await until(lambda: save.progress()[-1][1] == 3_000_000, "the progress saved")
        return Outcome(False, "HTTP 502: streaming to c-2 failed")

    async def run() -> None:
        async with serving(nodes) as urls:
            await one_pass(urls, save, install)

    asyncio.run(run())
    final = save.statuses[-1].snapshot_installs[0]
    assert (final.state, final.attempts, final.last_error) == (
        "pending", 1, "HTTP 502: streaming to c-2 failed"
    )  # fmt: skip
    assert (final.bytes_done, final.bytes_total) == (3_000_000, TOTAL)  # the next one resumes


def test_a_progress_save_under_way_when_the_install_ends_is_finished_first() -> None:
    """The save's new resourceVersion is what the pass's own save needs: the reports are not
    cancelled in the middle of one, and the outcome is saved after it."""
    nodes = {n: FakeNode(n) for n in MEMBERS}
    nodes["c-1"].sends = [send(1)]
    save = Saves()

    async def install() -> Outcome:
        hold = save.hold = asyncio.Event()
        await until(save.entered.is_set, "a progress save")
        asyncio.get_running_loop().call_later(0.1, hold.set)
        return Outcome(True)  # while the progress save waits

    async def run() -> None:
        async with serving(nodes) as urls:
            await one_pass(urls, save, install)

    asyncio.run(run())
    assert save.progress() == [
        ("pending", None, None),
        ("pending", 1, TOTAL),
        ("installed", TOTAL, TOTAL),
    ]


def test_snapshot_send_progress_from_a_status() -> None:
    status = {"node": "c-1", "partitions": [{"partition": 1, "snapshot_sends": send(5)}]}
    assert snapshot_send_progress(status, 1, "c-2") == (5, TOTAL)
    assert snapshot_send_progress(status, 0, "c-2") is None
    assert snapshot_send_progress(status, 1, "c-1") is None
    older = {"node": "c-1", "partitions": [{"partition": 1}]}  # a node that does not say
    assert snapshot_send_progress(older, 1, "c-2") is None
    assert snapshot_send_progress({"partitions": [{"partition": 1, "snapshot_sends": [
        {"target": "c-2", "sent_bytes": "x", "total_bytes": 1}]}]}, 1, "c-2") is None  # fmt: skip


def test_install_progress_round_trips_through_the_status() -> None:
    install = SnapshotInstall(
        member="c-2", partition=1, source="c-1", started_at=1.0, bytes_done=5, bytes_total=TOTAL
    )
    status = RaftClusterStatus(snapshot_installs=[install])
    wire = status.model_dump(mode="json", by_alias=True)
    assert wire["snapshotInstalls"][0]["bytesDone"] == 5
    assert wire["snapshotInstalls"][0]["bytesTotal"] == TOTAL
    assert RaftClusterStatus.model_validate(wire) == status
    old = {"snapshotInstalls": [{"member": "c-2", "partition": 1, "source": "c-1",
                                 "startedAt": 1.0}]}  # fmt: skip
    back = RaftClusterStatus.model_validate(old).snapshot_installs[0]
    assert (back.bytes_done, back.bytes_total) == (None, None)  # a status saved before


@pytest.mark.parametrize(
    ("answer", "source"),
    [
        (
            {"status": "installed", "source": "leader", "fell_back_to_leader": "c-1 failed"},
            "leader",
        ),
        ({"status": "installed", "source": "c-1"}, "c-1"),
        ({"status": "already_installed", "state": "replicate", "lag": 0}, None),
    ],
)
def test_the_install_outcome_carries_the_source_the_leader_answered(
    answer: dict[str, Any], source: str | None
) -> None:
    """The operator's event and status name where the snapshot came from: the leader's answer,
    not the member the operator asked for, which may have failed and left it to the leader."""

    async def post(request: web.Request) -> web.Response:
        assert await request.json() == {"target": "c-2", "source": "c-1"}
        return web.json_response(answer)

    async def run() -> Any:
        app = web.Application()
        app.router.add_post("/v1/admin/partitions/1/snapshot-install", post)
        server = TestServer(app)
        await server.start_server()
        api = NodeApi()
        try:
            url = str(server.make_url("")).rstrip("/")
            return await api.perform(InstallSnapshot(1, "c-0", "c-2", "c-1"), {"c-0": url})
        finally:
            await api.close()
            await server.close()

    outcome = asyncio.run(run())
    assert outcome.ok and outcome.source == source, outcome
