"""`make demo`: the operator's reconciler running a local cluster of real node processes.

Three members with two partitions, durable (fsync on), started and healed by the same reconciler
the Kubernetes operator runs (`raftctl local up -f` uses it too). It writes, pauses a follower
past the backfill threshold and shows the bounded rounds, stops a follower while the others
compact past it and shows SnapshotRequired healed by an install the operator schedules, scales
to four members and shows the learner's promotion window (the leader refusing a promotion while
the learner lags), and prints a summary. Everything shown is read from the nodes' status API and
the operator's status and events.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from raftlog.cli.cluster_cmds import status_table
from raftlog.client import AsyncClient
from raftlog.operator.actions import Event
from raftlog.operator.local import LocalOperator
from raftlog.operator.models import RaftClusterStatus

MANIFEST = """\
apiVersion: raftlog.dev/v1alpha1
kind: RaftCluster
metadata:
  name: demo
spec:
  replicas: 3
  partitions: 2
  raft:
    compactEveryOperations: 300
    compactNumberEntries: 1000
    learnerPromotionLag: 10
    learnerPromotionStableWindow: 3
  storage:
    segmentBytes: 16384
"""


class Demo:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.started = time.monotonic()
        self.acked = 0
        self.latest: dict[str, str] = {}  # what each key of partition 0 must hold
        self.op = LocalOperator.create(base, MANIFEST, interval_s=0.2, on_event=self.event)
        self.token = self.op.token_file.read_text().strip()
        self._stop = asyncio.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_operator, daemon=True)

    # ----------------------------------------------------------------- the operator
    def _run_operator(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.op.run(self._stop))
        self._loop.run_until_complete(self.op.close())

    def event(self, e: Event) -> None:
        mark = "!" if e.type == "Warning" else ">"
        print(f"    {mark} operator: {e.reason}: {e.message}", flush=True)

    def status(self) -> RaftClusterStatus:
        return self.op.status

    def until(self, what: str, pred: Callable[[RaftClusterStatus], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.op.status):
                return
            time.sleep(0.1)
        raise TimeoutError(
            f"{what}: not within {timeout} s (last step: {self.op.status.last_action})"
        )

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    # ----------------------------------------------------------------- the cluster
    def chapter(self, title: str) -> None:
        print(f"\n== {title}  [{time.monotonic() - self.started:.1f} s]", flush=True)

    def endpoints(self) -> list[str]:
        return list(self.op.endpoints())

    def url(self, name: str) -> str:
        return self.op.runtime.url(name)

    def signal(self, name: str, sig: int) -> None:
        self.op.runtime.procs[name].send_signal(sig)

    def write(self, n: int, partition: int = 0, batch: int = 20) -> None:
        # The leader the operator last saw first: a new client otherwise starts with the first
        # endpoint, and a member this story paused answers nothing until the client's timeout.
        endpoints = self.endpoints()
        lead = self.op.status.leaders.get(str(partition))
        if lead is not None and self.url(lead) in endpoints:
            endpoints.remove(self.url(lead))
            endpoints.insert(0, self.url(lead))

        async def go() -> None:
            async with AsyncClient(endpoints, retries=20) as client:
                for i in range(0, n, batch):
                    records = [
                        {"key": f"user-{j % 97}", "value": f"event-{self.acked + j}"}
                        for j in range(i, min(n, i + batch))
                    ]
                    await client.append(partition, records)
                    if partition == 0:
                        self.latest.update((r["key"], r["value"]) for r in records)
            self.acked += n

        asyncio.run(go())

    def call(
        self, name: str, method: str, path: str, body: Any = None, timeout: float = 30
    ) -> tuple[int, Any]:
        async def go() -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {self.token}"}
            async with (
                aiohttp.ClientSession(headers=headers) as s,
                s.request(
                    method, self.url(name) + path, json=body, timeout=aiohttp.ClientTimeout(timeout)
                ) as r,
            ):
                return r.status, await r.json(content_type=None)

        return asyncio.run(go())

    def p0(self, name: str) -> dict[str, Any]:
        return dict(self.call(name, "GET", "/v1/status")[1]["partitions"][0])

    def leader(self) -> str:
        """The member leading partition 0 now, by its own word: the operator's view may be a
        pass old, and a member that lost the leadership meanwhile lists no followers."""
        self.until("a leader of partition 0", lambda s: "0" in s.leaders, 60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            named = self.op.status.leaders.get("0")
            others = [m.name for m in self.status().members if m.name != named]
            for name in [named, *others] if named else others:  # a paused one: 1 s lost
                with contextlib.suppress(OSError, aiohttp.ClientError, KeyError, TimeoutError):
                    if (
                        self.call(name, "GET", "/v1/status", timeout=1)[1]["partitions"][0]["role"]
                        == "leader"
                    ):
                        return name
            time.sleep(0.1)
        raise TimeoutError("no member leads partition 0 after 60 s")

    def converge(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.p0(name)["applied"] >= self.p0(self.leader())["high_water_mark"]:
                    return
            except (OSError, aiohttp.ClientError, KeyError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{name} did not catch up within {timeout} s")

    # ----------------------------------------------------------------- the story
    def run(self) -> None:
        self._thread.start()
        self.chapter("1. The operator creates three members; each partition elects a leader")
        self.until("Running", lambda s: s.phase == "Running", 60)
        st = self.status()
        for p, lead in sorted(st.leaders.items()):
            print(f"    partition {p}: leader {lead}")
        self.write(200)
        lead = self.leader()
        print(f"    200 records acknowledged (after fsync on a quorum); high-water mark "
              f"{self.p0(lead)['high_water_mark']}")  # fmt: skip

        self.chapter("2. A follower is paused (SIGSTOP); 600 writes later, bounded backfill")
        slow = next(m.name for m in self.status().members if m.name != lead)
        self.signal(slow, signal.SIGSTOP)
        self.write(600)
        st0 = self.p0(self.leader())
        behind = st0["high_water_mark"] - st0["followers"][slow]["match"]
        raft = self.op.desired()[1].raft
        print(f"    {slow} is {behind} entries behind "
              f"(backfill_threshold={raft.backfill_threshold}); writes went on")  # fmt: skip
        self.signal(slow, signal.SIGCONT)
        self.write(100)
        self.converge(slow)
        st0 = self.p0(self.leader())
        f, counters = st0["followers"][slow], st0["counters"]
        print(f"    {slow} caught up in {f['backfill_rounds']} backfill rounds "
              f"({f['backfill_entries']} entries, largest round "
              f"{counters['backfill_largest_round']} <= max_backfill_entries_per_round="
              f"{raft.max_backfill_entries_per_round}), "
              "then rejoined live replication")  # fmt: skip

        self.chapter("3. A follower stops; the others compact past it; the operator heals it")
        lead = self.leader()
        stopped = next(m.name for m in self.status().members if m.name != lead)
        last = self.p0(stopped)["last_index"]
        self.signal(stopped, signal.SIGSTOP)
        self.write(1500)
        st0 = self.p0(self.leader())
        print(f"    {stopped} stopped at index {last}; the leader's compaction floor is now "
              f"{st0['compaction_floor']} (snapshot at {st0['snapshot_index']})")  # fmt: skip
        self.signal(stopped, signal.SIGCONT)
        self.until(
            "the install",
            lambda s: any(
                i.member == stopped and i.state == "installed" for i in s.snapshot_installs
            ),
            90,
        )
        self.converge(stopped)
        inst = next(i for i in self.status().snapshot_installs if i.member == stopped)
        required = self.p0(self.leader())["counters"]["events"].get("snapshot_required", 0)
        print(f"    the leader reported SnapshotRequired for it {required} time(s); the operator "
              f"installed a snapshot streamed by {inst.source}"
              f"{' (a follower: RATIS-2428)' if inst.source != 'leader' else ''}; "
              f"{stopped} caught up to {self.p0(stopped)['high_water_mark']}")  # fmt: skip

        self.chapter("4. Scale to four: a learner, its promotion window, then a voter")
        self.op.base.joinpath("raftcluster.yaml").write_text(
            MANIFEST.replace("replicas: 3", "replicas: 4")
        )  # what `raftctl local scale demo --replicas 4` does
        self.until("the learner", lambda s: any(m.role == "learner" for m in s.members), 60)
        new = next(m.name for m in self.status().members if m.role == "learner")
        self.signal(new, signal.SIGSTOP)  # hold it back, to show the leader's own check
        self.write(300)
        code, reply = self.call(self.leader(), "POST", "/v1/admin/partitions/0/members",
                                {"op": "promote", "node": new})  # fmt: skip
        print(f"    promote while it lags: {code} {reply.get('reason')}")
        self.signal(new, signal.SIGCONT)
        seen: list[Any] = []

        def promoted(s: RaftClusterStatus) -> bool:
            m = s.member(new)
            if m is not None and m.promotion is not None:
                seen.append(m.promotion)
            return m is not None and m.role == "voter"

        self.until("promoted", promoted, 90)
        window = seen[-1] if seen else None
        if window is not None:
            print(f"    the operator promoted {new} once its lag stayed within "
                  f"learnerPromotionLag=10 for the whole {window.window_seconds:g} s window "
                  f"(window restarts: {window.restarts})")  # fmt: skip

        self.chapter("5. Summary")
        self.write(100)
        self.until("Running", lambda s: s.phase == "Running", 60)
        lead = self.leader()
        self.converge(new)
        for node, mode in ((lead, "linearizable"), (new, "local")):
            right = sum(
                self.call(node, "GET", f"/v1/partitions/0/keys/{k}?consistency={mode}")[1].get(
                    "value"
                )
                == v
                for k, v in self.latest.items()
            )
            print(f"    {node} ({mode} reads): {right} of {len(self.latest)} keys hold the "
                  "latest value written")  # fmt: skip
            if right != len(self.latest):
                raise AssertionError(f"{node} lost writes")
        st = self.status()
        cond = {c.type: f"{c.status} ({c.reason})" for c in st.conditions}
        print(f"    {self.acked} records acknowledged; RaftCluster demo: phase {st.phase}, "
              f"{st.ready_replicas}/{st.replicas} ready, "
              f"Available {cond.get('Available')}")  # fmt: skip
        for line in status_table(self.endpoints()).splitlines():
            print(f"    {line}")
        self.chapter("6. Spark reads what is committed")
        from raftlog.spark.demo import spark_reads  # the `spark` extra (in `make install`)

        spark_reads(self.endpoints(), self.latest)
        print(f"    ({time.monotonic() - self.started:.1f} s; data and logs were in {self.base})")


def main() -> int:
    print("raftlog demo: the operator's reconciler running a local cluster of real node "
          "processes (3 members, 2 partitions, fsync on)")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="raftlog-demo-") as d:
        demo = Demo(Path(d))
        try:
            demo.run()
        except Exception as e:
            print(f"demo failed: {e}; node logs follow", file=sys.stderr)
            for log in sorted(Path(d).glob("*.log")):
                print(f"--- {log}", file=sys.stderr)
                print(log.read_text()[-3000:], file=sys.stderr)
            return 1
        finally:
            demo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
