"""`make demo`: a local cluster of real node processes, through the story of the design.

Three nodes on 127.0.0.1 with two partitions, durable (fsync on). It writes, pauses a follower
past the backfill threshold and shows the bounded rounds, stops a follower while the others
compact past it and shows SnapshotRequired and the install, adds a learner and promotes it once
it has caught up, and prints a summary. Everything shown is read from the nodes' status API.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from raftlog.cli.cluster_cmds import status_table
from raftlog.client import AsyncClient
from raftlog.node.local import LocalCluster

RAFT = {"compact_every_operations": 300, "compact_number_entries": 100}
ENV = {"RAFTLOG_SEGMENT_BYTES": "16384"}


class Demo:
    def __init__(self, cluster: LocalCluster) -> None:
        self.c = cluster
        self.acked = 0
        self.latest: dict[str, str] = {}  # what each key of partition 0 must hold
        self.started = time.monotonic()

    def chapter(self, title: str) -> None:
        print(f"\n== {title}  [{time.monotonic() - self.started:.1f} s]", flush=True)

    def write(self, n: int, partition: int = 0, batch: int = 20) -> None:
        async def go() -> None:
            async with AsyncClient(self.c.endpoints) as client:
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

    def p0(self, name: str) -> dict[str, Any]:
        return dict(self.c.status(name)["partitions"][0])

    def leader(self, timeout: float = 30) -> str:
        """The node that leads partition 0 (in the highest term seen), once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            best: tuple[int, str] | None = None
            for name, node in self.c.nodes.items():
                if not node.running:
                    continue
                try:
                    st = self.c.get(name, "/v1/status", timeout=0.5)[1]["partitions"][0]
                except (OSError, KeyError, TypeError):
                    continue
                if st["role"] == "leader" and (best is None or st["term"] > best[0]):
                    best = (st["term"], name)
            if best is not None:
                return best[1]
            time.sleep(0.05)
        raise TimeoutError("no leader for partition 0")

    def converge(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            top = self.p0(self.leader())["high_water_mark"]
            try:
                if self.p0(name)["applied"] >= top:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{name} did not catch up within {timeout} s")

    def run(self) -> None:
        c = self.c
        self.chapter("1. Three node processes start and elect a leader per partition")
        c.wait_ready(timeout=60)
        for p in (0, 1):
            print(f"    partition {p}: leader {c.leader(p)}")
        self.write(200)
        lead = self.leader()
        print(f"    200 records acknowledged (after fsync on a quorum); high-water mark "
              f"{self.p0(lead)['high_water_mark']}")  # fmt: skip

        self.chapter("2. A follower is paused (SIGSTOP); 600 writes later, bounded backfill")
        slow = next(n for n in c.nodes if n != lead)
        c.pause(slow)
        self.write(600)
        behind = self.p0(lead)["high_water_mark"] - self.p0(lead)["followers"][slow]["match"]
        print(f"    {slow} is {behind} entries behind (backfill_threshold=10); writes went on")
        c.resume(slow)
        self.write(100)
        self.converge(slow)
        st = self.p0(lead)
        f, counters = st["followers"][slow], st["counters"]
        largest = counters["backfill_largest_round"]
        print(f"    {slow} caught up in {f['backfill_rounds']} backfill rounds "
              f"({f['backfill_entries']} entries, largest round {largest} <= "
              "max_backfill_entries_per_round=128), then rejoined live replication")  # fmt: skip

        self.chapter("3. A follower stops (SIGKILL); the others compact past it")
        lead = self.leader()
        stopped = next(n for n in c.nodes if n != lead)
        last = self.p0(stopped)["last_index"]
        c.kill(stopped)
        self.write(1500)
        st = self.p0(self.leader())
        print(f"    {stopped} stopped at index {last}; the leader's compaction floor is now "
              f"{st['compaction_floor']} (snapshot at {st['snapshot_index']})")  # fmt: skip
        c.start(stopped)
        c.wait_ready()
        self.converge(stopped)
        lead = self.leader()
        st, theirs = self.p0(lead), self.p0(stopped)
        required = st["counters"]["events"].get("snapshot_required", 0)
        by_follower = st["counters"]["snapshots_from_followers"]
        print(f"    the leader reported SnapshotRequired for it {required} time(s); it installed "
              f"a snapshot at {theirs['snapshot_index']} streamed by "
              f"{'another follower (RATIS-2428)' if by_follower else 'the leader'}, "
              f"then caught up to {theirs['high_water_mark']}")  # fmt: skip

        self.chapter("4. A learner joins; promotion is refused while it lags, then accepted")
        lead = self.leader()
        new = c.add_node()
        c.start(new.name)
        time.sleep(0.5)  # it starts listening
        c.pause(new.name)
        code, reply = self.admin(lead, {"op": "add_learner", "node": new.name, "url": new.url})
        print(f"    add_learner {new.name}: {code}, learners {reply.get('learners')}")
        code, reply = self.admin(lead, {"op": "promote", "node": new.name})
        print(f"    promote while it lags: {code} {reply.get('reason')}")
        c.resume(new.name)
        self.converge(new.name)
        code, reply = self.admin(lead, {"op": "promote", "node": new.name})
        print(f"    promote once caught up: {code}, voters {reply.get('voters')}")

        self.chapter("5. Summary")
        self.write(100)
        lead = self.leader()
        self.converge(new.name)
        for node, mode in ((lead, "linearizable"), (new.name, "local")):
            right = sum(
                self.c.get(node, f"/v1/partitions/0/keys/{k}?consistency={mode}")[1].get("value")
                == v
                for k, v in self.latest.items()
            )
            print(f"    {node} ({mode} reads): {right} of {len(self.latest)} keys hold the "
                  "latest value written")  # fmt: skip
            if right != len(self.latest):
                raise AssertionError(f"{node} lost writes")
        print(f"    {self.acked} records acknowledged; every node's status:")
        for line in status_table(c.endpoints).splitlines():
            print(f"    {line}")
        print(f"    ({time.monotonic() - self.started:.1f} s; data and logs were in {c.data_dir})")

    def admin(self, node: str, body: dict[str, str]) -> tuple[int, dict[str, Any]]:
        import json

        code, reply = self.c.request(
            node, "POST", "/v1/admin/partitions/0/members", json.dumps(body).encode(),
            {"Content-Type": "application/json"}, timeout=30,
        )  # fmt: skip
        return code, dict(reply or {})


def main() -> int:
    print("raftlog demo: a local cluster of real node processes (3 nodes, 2 partitions, fsync on)")
    with tempfile.TemporaryDirectory(prefix="raftlog-demo-") as d:
        cluster = LocalCluster(Path(d), replicas=3, partitions=2, raft=RAFT, env=ENV)
        try:
            cluster.start()
            Demo(cluster).run()
        except Exception as e:
            print(f"demo failed: {e}; node logs follow", file=sys.stderr)
            for node in cluster.nodes.values():
                if node.log_path.exists():
                    print(f"--- {node.log_path}", file=sys.stderr)
                    print(node.log_path.read_text()[-3000:], file=sys.stderr)
            return 1
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
