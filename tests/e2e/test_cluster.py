"""Real node processes on 127.0.0.1 under faults (marker `e2e`)."""

from __future__ import annotations

import asyncio
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from raftlog.client import AsyncClient, Client, ClientError
from raftlog.harness.local import LocalCluster
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.journal import Journal

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_kill_9_the_leader_while_clients_append(tmp_path):
    with LocalCluster(tmp_path, replicas=3, partitions=2) as cluster:
        cluster.wait_ready()
        victim = cluster.leader(0)
        assert victim is not None
        acked: dict[tuple[int, int], str] = {}  # (partition, index) -> value
        failures: list[str] = []

        async def producer(k: int, stop_at: float) -> None:
            async with AsyncClient(cluster.endpoints, retries=20) as c:
                seq = 0
                while time.monotonic() < stop_at:
                    p = seq % 2
                    value = f"producer-{k}-{seq}"
                    try:
                        r = await c.append(p, [{"key": f"k{k}", "value": value}])
                    except (TimeoutError, ClientError, OSError) as e:
                        failures.append(f"{value}: {e}")
                    else:
                        assert (p, r.last_index) not in acked, "two appends acked at one index"
                        acked[(p, r.last_index)] = value
                    seq += 1

        async def run() -> None:
            stop_at = time.monotonic() + 6
            tasks = [asyncio.create_task(producer(k, stop_at)) for k in range(16)]
            await asyncio.sleep(2)
            cluster.kill(victim)
            await asyncio.gather(*tasks)

        asyncio.run(run())
        assert len(acked) > 200, f"only {len(acked)} appends acknowledged"
        # A new leader took over partition 0, and the log kept growing after the kill.
        cluster.wait_ready(timeout=20)
        new_leader = cluster.leader(0)
        assert new_leader is not None and new_leader != victim
        survivors = [n for n in cluster.nodes if n != victim]

        async def read_all(endpoint: str, p: int) -> dict[int, str]:
            # Read-your-writes: wait until this replica's mark covers every acknowledged append.
            top = max((i for (pp, i) in acked if pp == p), default=0)
            out: dict[int, str] = {}
            async with AsyncClient([endpoint]) as c:
                start = 1
                while True:
                    page = await c.read(p, start, 1000, min_index=top, wait_ms=10_000)
                    for r in page["records"]:
                        out[r["index"]] = r["value"]
                    if page["next"] > page["high_water_mark"]:
                        return out
                    start = page["next"]

        for name in survivors:
            for p in (0, 1):
                log = asyncio.run(read_all(cluster.nodes[name].url, p))
                missing = [(i, v) for (pp, i), v in acked.items() if pp == p and log.get(i) != v]
                assert not missing, f"{name} p{p} lost acknowledged appends: {missing[:5]}"
        # The killed node comes back from its disk and converges.
        cluster.start(victim)
        cluster.wait_ready(timeout=20)
        top = max(i for (p, i) in acked if p == 0)

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st = cluster.status(victim)["partitions"][0]
            if st["high_water_mark"] >= top:
                break
            time.sleep(0.2)
        back = asyncio.run(read_all(cluster.nodes[victim].url, 0))
        assert all(back.get(i) == v for (p, i), v in acked.items() if p == 0)
        print(
            f"{len(acked)} acknowledged appends, {len(failures)} failed calls, "
            f"leader {victim} killed, {new_leader} took over"
        )


def test_partitions_raised_member_by_member_under_appends_then_every_member_killed(tmp_path):
    """Raising the count by hand (README: members restarted one at a time with the new count)
    while appends run on the old partitions, the first member raised SIGKILLed while it starts
    with the new count, then every member SIGKILLed and started again: the new partition has a
    leader every member agrees on and takes appends, and the old partitions lost nothing
    acknowledged (the operator's raise is tested in test_local_operator, with no kill)."""
    with LocalCluster(tmp_path, replicas=3, partitions=2) as cluster:
        cluster.wait_ready()
        acked: dict[tuple[int, int], str] = {}
        unknown: list[str] = []  # appends whose outcome is unknown (not counted as acked)
        stop = asyncio.Event()

        async def producer(k: int) -> None:
            async with AsyncClient(cluster.endpoints, retries=30) as c:
                seq = 0
                while not stop.is_set():
                    p, value = seq % 2, f"producer-{k}-{seq}"
                    try:
                        r = await c.append(p, [{"key": f"k{k}", "value": value}])
                    except ClientError as e:
                        # Only a passing fault that outlasted the retries; its outcome unknown.
                        assert e.retryable, f"append to p{p} refused: {e}"
                        unknown.append(str(e))
                    except (TimeoutError, OSError) as e:
                        unknown.append(repr(e))
                    else:
                        assert (p, r.last_index) not in acked, "two appends acked at one index"
                        acked[(p, r.last_index)] = value
                    seq += 1

        async def restart(name: str, kill_at_start: bool) -> None:
            node = cluster.nodes[name]
            assert node.proc is not None
            node.proc.terminate()
            await asyncio.to_thread(node.proc.wait, 15)
            node.proc = None
            cluster.start(name)
            if kill_at_start:  # opening its partitions, the new one among them
                await asyncio.sleep(0.3)
                cluster.kill(name)
                cluster.start(name)

        async def run() -> None:
            tasks = [asyncio.create_task(producer(k)) for k in range(4)]
            await asyncio.sleep(1)
            cluster.partitions = 3
            for i, name in enumerate(cluster.nodes):
                await restart(name, kill_at_start=i == 0)
                await asyncio.sleep(0.5)
            await asyncio.sleep(1)
            stop.set()
            await asyncio.gather(*tasks)

        asyncio.run(run())
        assert len(acked) > 50, f"only {len(acked)} appends acknowledged"
        assert len(unknown) < len(acked) // 10, f"{len(unknown)} appends failed: {unknown[:3]}"
        cluster.wait_ready(timeout=20)
        for name in list(cluster.nodes):
            cluster.kill(name)
        cluster.start()
        cluster.wait_ready(timeout=20)  # every member agrees on a leader of all 3
        with Client(cluster.endpoints) as c:
            r = c.append(2, [{"key": "new", "value": "on the new partition"}])
            acked[(2, r.last_index)] = "on the new partition"
        for name, node in cluster.nodes.items():
            with Client([node.url]) as c:
                for p in range(3):
                    top = max(i for (pp, i) in acked if pp == p)
                    log: dict[int, str] = {}
                    start = 1
                    while start <= top:
                        page = c.read(p, start, 10_000, min_index=top, wait_ms=10_000)
                        log.update({rec["index"]: rec["value"] for rec in page["records"]})
                        start = page["next"]
                    lost = [(i, v) for (pp, i), v in acked.items() if pp == p and log.get(i) != v]
                    assert not lost, f"{name} p{p} lost acknowledged appends: {lost[:5]}"
        print(
            f"{len(acked)} acknowledged appends read back from every member after the raise; "
            f"{len(unknown)} of unknown outcome"
        )


def _recovered_commit(data_dir: Path) -> int:
    """The high-water mark partition 0 of a node's data directory opens with: what a SIGKILL
    of the node at the moment the directory was copied would come back with."""
    journal = Journal(str(data_dir / "journal"), durable=False)
    storage = DurableStorage(str(data_dir / "p0"), durable=False, journal=journal.partition(0))
    try:
        hs, snap = storage.initial_state()
        return max(hs.commit, snap.index)
    finally:
        storage.close()
        journal.close()


def test_the_mark_a_node_answers_with_is_in_its_files_before_a_kill_could_lose_it(tmp_path):
    """A node under appends and reads is stopped (SIGSTOP) right after a read answered its
    high-water mark, its files copied as a SIGKILL then would leave them, and opened: the mark
    they hold is never below the one answered, so a node killed and restarted never shows a
    lower mark than it showed. It did: a node showed a commit from the moment its core knew it
    (a leader's at its fsync's end, a follower's when the append came), while the commit
    record was still in the journal's buffer until the next sync wrote it (this test failed at
    its 2nd to 8th probe, up to 7 below; a real SIGKILL of a leader under reads came back 4
    below the mark it had answered, in 1 of 10 kills)."""
    env = {"RAFTLOG_JOURNAL_CHECKPOINT_BYTES": str(1 << 20)}  # a small journal to copy
    with LocalCluster(tmp_path / "c", replicas=3, env=env) as cluster:
        cluster.wait_ready()
        stop = threading.Event()
        failures: list[str] = []

        async def appends() -> None:
            async def one(c: AsyncClient, k: int) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        await c.append(0, [{"value": f"v{k}-{n}"}])
                    except ClientError:
                        await asyncio.sleep(0.05)

            async with AsyncClient(cluster.endpoints, timeout_s=3) as c:
                await asyncio.gather(*(one(c, k) for k in range(8)))

        def pages(name: str) -> None:  # whole pages: the node's loop kept busy by readers
            while not stop.is_set():
                try:
                    cluster.get(name, "/v1/partitions/0/records?from=1&limit=3000")
                except OSError:
                    time.sleep(0.05)

        names = list(cluster.nodes)
        threads = [threading.Thread(target=lambda: asyncio.run(appends()))]
        threads += [threading.Thread(target=pages, args=(n,)) for n in names for _ in range(2)]
        for t in threads:
            t.start()
        probes = 0
        try:
            # 12 s, and at least 30 probes however loaded the machine (29 in 12 s once, with
            # other work on both cores), within 180 s.
            started = time.monotonic()
            while not failures and (
                time.monotonic() < started + 12
                or (probes < 30 and time.monotonic() < started + 180)
            ):
                name = names[probes % len(names)]
                node = cluster.nodes[name]
                assert node.proc is not None
                code, page = cluster.get(name, "/v1/partitions/0/records?from=1000000000&limit=1")
                assert code == 200, page
                shown = page["high_water_mark"]
                node.proc.send_signal(signal.SIGSTOP)
                try:
                    copy = tmp_path / f"copy-{probes}"
                    shutil.copytree(node.data_dir, copy)
                finally:
                    node.proc.send_signal(signal.SIGCONT)
                recovered = _recovered_commit(copy)
                shutil.rmtree(copy)
                probes += 1
                if recovered < shown:
                    failures.append(f"{name} answered the mark {shown}; killed then, {recovered}")
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not failures, f"{failures} (probe {probes})"
        assert probes >= 30, probes  # not vacuous: 150 to 225 probes when it held
        print(f"{probes} probes")
