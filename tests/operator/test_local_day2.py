"""Day-2 controls (issue 20) on real node processes through the local runtime, under appends:
pause, restart, switchover, fencing and hibernation, with every acknowledged record read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator.test_local_operator import Harness, manifest, running

from raftlog.client import AsyncClient, IdempotentProducer
from raftlog.operator.controls import PAUSE, RESTART, SWITCHOVER
from raftlog.operator.models import RaftClusterStatus

pytestmark = [pytest.mark.operator, pytest.mark.slow, pytest.mark.asyncio]


def edit(h: Harness, change: Callable[[dict[str, Any]], None]) -> None:
    """What a user does to the resource: the manifest the local operator reads."""
    path = h.base / "raftcluster.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def annotate(h: Harness, key: str, value: str | None) -> None:
    def change(doc: dict[str, Any]) -> None:
        annotations = doc.setdefault("metadata", {}).setdefault("annotations", {})
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value

    edit(h, change)


def set_spec(h: Harness, key: str, value: Any) -> None:
    edit(h, lambda doc: doc["spec"].__setitem__(key, value))


class Load:
    """An idempotent producer appending to every partition until stopped."""

    def __init__(self, h: Harness, partitions: int) -> None:
        self.h, self.partitions = h, partitions
        self.acked: list[tuple[int, int, str]] = []  # partition, index, value
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.runs = 0  # each run is a producer of its own (its sequences start at 0)

    async def _run(self) -> None:
        async with AsyncClient(self.h.op.endpoints(), retries=40) as client:
            producer = IdempotentProducer(client, f"day2-{self.runs}")
            i = 0
            while not self.stop.is_set():
                p = i % self.partitions
                value = f"v{i}"
                r = await producer.append(p, [{"key": f"k{i}", "value": value}])
                self.acked.append((p, r.first_index, value))
                i += 1

    def start(self) -> None:
        self.runs += 1
        self.stop.clear()
        self.task = asyncio.create_task(self._run())

    async def halt(self) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 60)  # raises what the producer met

    async def all_read_back(self) -> None:
        async with AsyncClient(self.h.op.endpoints()) as client:
            for p in range(self.partitions):
                mine = {i: v for q, i, v in self.acked if q == p}
                if not mine:
                    continue
                last, got, start = max(mine), {}, 1
                while start <= last:
                    reply = await client.read(p, start, limit=1000, min_index=last)
                    got.update({r["index"]: r["value"] for r in reply["records"]})
                    start = reply["next"]
                lost = [i for i, v in mine.items() if got.get(i) != v]
                assert not lost, f"partition {p}: acknowledged but not read back: {lost[:10]}"


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, text: str) -> AsyncIterator[Harness]:
    h = Harness(tmp_path, text)
    try:
        yield h
    finally:
        await h.op.close()


async def test_pause_restart_switchover_and_fencing_under_appends(tmp_path: Path) -> None:
    async with cluster(tmp_path, manifest(3, partitions=2)) as h:
        await h.until("bootstrap", running(3), 30)
        load = Load(h, 2)
        load.start()

        # Paused: a killed member is not made again, and the status says why.
        annotate(h, PAUSE, "true")
        st = await h.until("paused", lambda s: s.phase == "Paused", 10)
        h.signal("c-2", signal.SIGKILL)
        for _ in range(15):  # 1.5 s of passes: nothing is done
            result = await h.op.step()
            assert result.action is None
            await asyncio.sleep(0.1)
        assert h.op.runtime.procs["c-2"].poll() is not None  # still down
        annotate(h, PAUSE, None)
        await h.until("resumed, c-2 back", running(3), 60)
        assert "ReconciliationPaused" in h.reasons() and "ReconciliationResumed" in h.reasons()

        # Restart without a spec change: every member once, the leader last.
        before = dict(h.op.runtime.hashes)
        annotate(h, RESTART, "2026-11-25T16:00:00Z")
        st = await h.until(
            "restarted", lambda s: s.restarted_at == "2026-11-25T16:00:00Z" and running(3)(s), 120
        )
        assert all(h.op.runtime.hashes[n] != before[n] for n in before)
        restarted = [e.message.split()[1] for _, e in h.events if e.reason == "RollingRestart"]
        assert sorted(restarted) == ["c-0", "c-1", "c-2"], restarted

        # Switchover of every partition to a member that leads none.
        target = next(m.name for m in st.members if m.name not in st.leaders.values())
        annotate(h, SWITCHOVER, f"{target}@1")
        st = await h.until(
            "switched over",
            lambda s: s.switchover is not None and s.switchover.state != "pending",
            60,
        )
        assert st.switchover is not None and st.switchover.state == "done", st.switchover
        assert set(st.leaders.values()) == {target}

        # Fencing the leader: its leaderships move, then it stops; appends go on.
        set_spec(h, "fencedMembers", [target])
        st = await h.until(
            "fenced",
            lambda s: (m := s.member(target)) is not None and m.fenced and not m.ready,
            60,
        )
        assert target not in st.leaders.values()
        assert h.op.runtime.procs.get(target) is None
        # The other two commit. The producer may be in a retry pause (up to 4.8 s) from the
        # hand-over, so progress is awaited, not sampled over a fixed second.
        acked_while_fenced = len(load.acked)
        for _ in range(300):
            if len(load.acked) > acked_while_fenced:
                break
            await asyncio.sleep(0.1)
        assert len(load.acked) > acked_while_fenced, "no append committed while fenced for 30 s"
        set_spec(h, "fencedMembers", [])
        await h.until("unfenced", running(3), 60)

        await load.halt()
        assert len(load.acked) > 50
        await load.all_read_back()


def hibernated(s: RaftClusterStatus) -> bool:
    return s.phase == "Hibernated"


async def test_hibernation_stops_every_member_and_wakes_the_cluster_as_it_was(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, manifest(3, partitions=2)) as h:
        await h.until("bootstrap", running(3), 30)
        load = Load(h, 2)
        load.start()
        await asyncio.sleep(1.0)
        await load.halt()  # appends end before the members stop (none is accepted meanwhile)
        set_spec(h, "hibernate", True)
        st = await h.until("hibernated", hibernated, 60)
        assert not h.op.runtime.pids()
        assert all((h.op.runtime.data_dir(m.name) / "p0").is_dir() for m in st.members)
        set_spec(h, "hibernate", False)
        st = await h.until("awake", running(3), 60)
        assert sorted(m.name for m in st.members) == ["c-0", "c-1", "c-2"]
        assert "Hibernated" in h.reasons() and "Resumed" in h.reasons()
        await load.all_read_back()
        load.start()  # and it takes appends again
        await asyncio.sleep(0.5)
        await load.halt()
        await load.all_read_back()
