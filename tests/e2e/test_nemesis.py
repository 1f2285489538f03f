"""Network faults, kills and pauses at random on five real nodes under appends and reads, then
a history check (as Jepsen's): nothing acknowledged lost, nothing twice, nothing invented, the
members agree, every record read was committed there, and every linearizable key read is.

Each ordered pair of nodes talks through its own proxy (`tests/e2e/links.py`), so a fault can
be one-way, a bridge or a clean split, and a cut either stalls a link (packets dropped) or
resets it. Clients talk to the nodes directly and see every answer; an append that got no
answer, or 503 (`leader_lost`, `timeout`), has an unknown outcome and may be in the log once.

The check of a linearizable read of key k that answered value v (or not found), with the final
committed log as the order of writes:
- v was written to k at index i, and that write was sent before the read was answered;
- the table the read saw is the log's up to its `applied_index`: the last write to k at or
  below it is v (none when not found);
- no write to k acknowledged before the read was sent sits above i (it would be a stale read),
  nor does a value an earlier read of k already returned.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import random
import signal
import time
from dataclasses import dataclass

import aiohttp
import pytest
from tests.e2e.links import Links, proxied

from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = 5
KEYS = [f"k{i}" for i in range(4)]
FAULT_SECONDS = float(os.environ.get("NEMESIS_SECONDS", "20"))
SEED = int(os.environ.get("NEMESIS_SEED", "0")) or random.randrange(1, 1 << 30)
# No compaction during the test: the final log is read back whole from every member.
RAFT = {"compact_every_operations": 1_000_000, "compact_every_bytes": 0}


@dataclass
class Write:
    key: str
    value: str
    sent: float
    answered: float = 0.0
    outcome: str = "unknown"  # ok, failed (refused before it was proposed), unknown
    index: int = 0


@dataclass
class KeyRead:
    key: str
    sent: float
    answered: float
    value: str | None  # None: not found
    applied_index: int


@dataclass
class History:
    writes: list[Write]
    reads: list[KeyRead]
    records_seen: list[tuple[str, int, str, int]]  # (node, index, value, its mark then)
    faults: list[str]


class Nemesis:
    """Faults from a seeded random schedule; everything it does is logged in `faults`."""

    def __init__(self, cluster: LocalCluster, links: Links, rng: random.Random) -> None:
        self.cluster, self.links, self.rng = cluster, links, rng
        self.names = list(cluster.nodes)
        self.faults: list[str] = []
        self.killed: list[str] = []
        self.paused: list[str] = []

    def say(self, what: str) -> None:
        self.faults.append(f"{time.monotonic():.1f} {what}")

    def cut_between(self, a: list[str], b: list[str], mode: str, both: bool = True) -> None:
        for x in a:
            for y in b:
                self.links.cut(x, y, mode)
                if both:
                    self.links.cut(y, x, mode)

    def leader(self) -> str | None:
        for name in self.names:
            if name in self.killed or name in self.paused:
                continue
            try:
                part = self.cluster.status(name)["partitions"][0]
            except (OSError, RuntimeError):
                continue
            if part["role"] == "leader":
                return str(part["leader"])
        return None

    def fault(self) -> None:
        rng, names = self.rng, self.names
        mode = rng.choice(["stall", "reset"])
        # The leader cut off or stopped (a long GC pause, a VM migrated) is where a stale read
        # or a lost write would show: it comes back still believing it leads.
        kinds = ["split", "bridge", "one-way", "isolate-leader", "kill", "pause", "pause-leader"]
        kind = rng.choice(kinds)
        shuffled = rng.sample(names, len(names))
        if kind == "split":
            side = rng.choice([1, 2])
            self.cut_between(shuffled[:side], shuffled[side:], mode)
            self.say(f"split {shuffled[:side]} | {shuffled[side:]} ({mode})")
        elif kind == "bridge":  # the middle node sees both sides, which do not see each other
            self.cut_between(shuffled[:2], shuffled[3:], mode)
            self.say(f"bridge {shuffled[:2]} - {shuffled[2]} - {shuffled[3:]} ({mode})")
        elif kind == "one-way":
            pairs = [(a, b) for a in names for b in names if a != b]
            cut = rng.sample(pairs, rng.randint(1, 4))
            for a, b in cut:
                self.links.cut(a, b, mode)
            self.say(f"one-way cuts {cut} ({mode})")
        elif kind == "isolate-leader":
            leader = self.leader()
            if leader is not None:
                self.cut_between([leader], [n for n in names if n != leader], mode)
                self.say(f"leader {leader} isolated ({mode})")
        elif kind == "kill" and not self.killed:
            victim = rng.choice(names)
            self.cluster.kill(victim)
            self.killed.append(victim)
            self.say(f"kill -9 {victim}")
        elif kind.startswith("pause") and not self.paused:
            victim = (self.leader() if kind == "pause-leader" else None) or rng.choice(names)
            self.cluster.signal(victim, signal.SIGSTOP)
            self.paused.append(victim)
            self.say(f"SIGSTOP {victim}")

    def heal(self) -> None:
        self.links.heal_all()
        for name in self.paused:
            self.cluster.signal(name, signal.SIGCONT)
        for name in self.killed:
            self.cluster.start(name)
        if self.paused or self.killed:
            self.say(f"healed; resumed {self.paused}, restarted {self.killed}")
        else:
            self.say("healed")
        self.paused, self.killed = [], []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.fault)
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            await asyncio.to_thread(self.heal)
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))


async def writer(
    http: aiohttp.ClientSession, urls: list[str], wid: int, out: list[Write], stop: asyncio.Event
) -> None:
    rng = random.Random(wid)
    target = rng.choice(urls)
    seq = 0
    while not stop.is_set():
        seq += 1
        w = Write(rng.choice(KEYS), f"w{wid}-{seq}", time.monotonic())
        out.append(w)
        try:
            async with http.post(
                f"{target}/v1/partitions/0/records",
                data=json.dumps({"key": w.key, "value": w.value}),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                body = await resp.json(content_type=None)
                w.answered = time.monotonic()
                if resp.status == 200:
                    w.outcome, w.index = "ok", int(body["last_index"])
                    assert body["first_index"] == w.index, body
                elif resp.status == 421:  # a follower refuses before proposing
                    w.outcome = "failed"
                    target = rng.choice(urls)  # its hint names the leader's proxy, not its URL
                else:
                    target = rng.choice(urls)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            target = rng.choice(urls)
            await asyncio.sleep(0.05)


async def key_reader(
    http: aiohttp.ClientSession, urls: list[str], rid: int, out: list[KeyRead], stop: asyncio.Event
) -> None:
    rng = random.Random(1000 + rid)
    target = rng.choice(urls)
    while not stop.is_set():
        key = rng.choice(KEYS)
        sent = time.monotonic()
        try:
            async with http.get(
                f"{target}/v1/partitions/0/keys/{key}?consistency=linearizable",
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                body = await resp.json(content_type=None)
                if resp.status in (200, 404) and isinstance(body, dict) and "found" in body:
                    value = body.get("value") if body["found"] else None
                    out.append(
                        KeyRead(key, sent, time.monotonic(), value, int(body["applied_index"]))
                    )
                else:  # as a client does, it stays with the node that answered until it fails
                    target = rng.choice(urls)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            target = rng.choice(urls)
            await asyncio.sleep(0.05)


async def record_reader(
    http: aiohttp.ClientSession,
    nodes: dict[str, str],
    out: list[tuple[str, int, str, int]],
    stop: asyncio.Event,
) -> None:
    rng = random.Random(7)
    top = 1  # the highest mark seen: reads start anywhere below it
    while not stop.is_set():
        name = rng.choice(list(nodes))
        start = rng.randint(1, top)
        try:
            async with http.get(
                f"{nodes[name]}/v1/partitions/0/records?from={start}&limit=1000",
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                if resp.status == 200:
                    page = await resp.json()
                    top = max(top, page["high_water_mark"])
                    for r in page["records"]:
                        out.append((name, r["index"], r["value"], page["high_water_mark"]))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass
        await asyncio.sleep(0.1)


async def run_history(cluster: LocalCluster, nemesis: Nemesis) -> History:
    urls = [n.url for n in cluster.nodes.values()]
    writes: list[Write] = []
    reads: list[KeyRead] = []
    seen: list[tuple[str, int, str, int]] = []
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        tasks = [asyncio.create_task(writer(http, urls, i, writes, stop)) for i in range(8)]
        tasks += [asyncio.create_task(key_reader(http, urls, i, reads, stop)) for i in range(4)]
        nodes = {n.name: n.url for n in cluster.nodes.values()}
        tasks.append(asyncio.create_task(record_reader(http, nodes, seen, stop)))
        faults = asyncio.create_task(nemesis.run(stop))
        await asyncio.sleep(FAULT_SECONDS)
        stop.set()
        await asyncio.gather(*tasks)
        await faults
    await asyncio.to_thread(nemesis.heal)
    return History(writes, reads, seen, nemesis.faults)


def final_log(cluster: LocalCluster, name: str) -> tuple[int, dict[int, tuple[str, str]]]:
    """A member's committed records (index -> (key, value)), read whole, and its mark."""
    records: dict[int, tuple[str, str]] = {}
    start, mark = 1, 0
    while True:
        code, page = cluster.get(name, f"/v1/partitions/0/records?from={start}&limit=10000", 10)
        assert code == 200, (name, code, page)
        mark = page["high_water_mark"]
        for r in page["records"]:
            records[r["index"]] = (r["key"], r["value"])
        if page["next"] > mark:
            return mark, records
        start = page["next"]


def settle(cluster: LocalCluster) -> dict[int, tuple[str, str]]:
    """After the faults: a new append commits, every member comes to the same mark and log."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the members did not agree within 60 s of the heal"
        try:
            cluster.wait_ready(timeout=30)
            leader = cluster.leader(0)
            if leader is None:
                continue
            body = json.dumps({"key": "final", "value": "final"}).encode()
            code, ack = cluster.request(
                leader, "POST", "/v1/partitions/0/records", body,
                {"Content-Type": "application/json"}, timeout=5,
            )  # fmt: skip
            if code != 200:
                continue
            logs = {}
            for _ in range(100):
                logs = {n: final_log(cluster, n) for n in cluster.nodes}
                if all(mark >= ack["last_index"] for mark, _ in logs.values()):
                    break
                time.sleep(0.1)
            marks = {n: mark for n, (mark, _) in logs.items()}
            assert min(marks.values()) >= ack["last_index"], marks
            # Members may hold the marks at different heights; up to the lowest they agree.
            low = min(marks.values())
            views = {
                n: {i: r for i, r in recs.items() if i <= low} for n, (_, recs) in logs.items()
            }
            first = next(iter(views.values()))
            for n, view in views.items():
                assert view == first, f"{n}'s committed log differs from the others'"
            return max(((m, r) for m, r in logs.values()), key=lambda mr: mr[0])[1]
        except (OSError, RuntimeError, TimeoutError):
            time.sleep(0.5)


def check(history: History, log: dict[int, tuple[str, str]]) -> None:
    where: dict[str, int] = {}
    for index, (_key, value) in log.items():
        assert value not in where, f"{value} committed twice: at {where[value]} and {index}"
        where[value] = index
    sent = {w.value: w for w in history.writes}
    for value, index in where.items():
        assert value == "final" or value in sent, f"{value} at {index} was never sent"
    for w in history.writes:
        if w.outcome == "ok":
            assert log.get(w.index) == (w.key, w.value), f"acknowledged {w} lost or moved"
        elif w.outcome == "failed":
            assert w.value not in where, f"{w} was refused, yet committed at {where[w.value]}"
    for name, index, value, mark in history.records_seen:
        assert index <= mark, f"{name} served {index} above its mark {mark}"
        assert log.get(index, (None, None))[1] == value, (
            f"{name} served {value} at {index}; the committed log has {log.get(index)}"
        )
    by_key: dict[str, list[tuple[int, str]]] = {}
    for index in sorted(log):
        key, value = log[index]
        by_key.setdefault(key, []).append((index, value))
    acked_at = {w.value: w.answered for w in history.writes if w.outcome == "ok"}
    for r in history.reads:
        writes_of_key = by_key.get(r.key, [])
        seen_table = [v for i, v in writes_of_key if i <= r.applied_index]
        expected = seen_table[-1] if seen_table else None
        assert r.value == expected, f"{r}: the log up to {r.applied_index} holds {expected}"
        at = where[r.value] if r.value is not None else 0
        if r.value is not None:
            assert sent[r.value].sent < r.answered, f"{r} read a write sent after it"
        newer_acked = [
            (i, v) for i, v in writes_of_key if i > at and acked_at.get(v, float("inf")) < r.sent
        ]
        assert not newer_acked, f"{r} is stale: {newer_acked[0]} was acknowledged before it"
    # Reads of a key answered before this one was sent returned no newer write than it did.
    answered: dict[str, list[tuple[float, int, KeyRead]]] = {}
    for q in sorted(history.reads, key=lambda q: q.answered):
        at = where[q.value] if q.value is not None else 0
        runs = answered.setdefault(q.key, [])
        best = runs[-1] if runs and runs[-1][1] >= at else (q.answered, at, q)
        runs.append((q.answered, best[1], best[2]))  # the newest write returned so far
    for r in history.reads:
        at = where[r.value] if r.value is not None else 0
        runs = answered[r.key]
        k = bisect.bisect_left(runs, r.sent, key=lambda run: run[0])
        if k:
            _, newest, q = runs[k - 1]
            assert newest <= at, f"{r} went back behind {q}, answered before it was sent"


def test_faults_at_random_lose_nothing_and_every_read_is_linearizable(tmp_path):
    rng = random.Random(SEED)
    cluster = LocalCluster(tmp_path, replicas=NODES, raft=RAFT)
    ports = {name: node.port for name, node in cluster.nodes.items()}
    with proxied(ports) as links:
        cluster.peer_url = links.url
        with cluster:
            cluster.wait_ready()
            nemesis = Nemesis(cluster, links, rng)
            history = asyncio.run(run_history(cluster, nemesis))
            log = settle(cluster)
    story = f"seed {SEED} (NEMESIS_SEED to replay the schedule):\n" + "\n".join(history.faults)
    ok = [w for w in history.writes if w.outcome == "ok"]
    # Not vacuous: faults came, writes and reads went through between them.
    assert len(history.faults) >= 4, story
    assert len(ok) >= 50, (len(ok), story)
    assert len(history.reads) >= 20, (len(history.reads), story)
    assert len(history.records_seen) >= 50, story
    try:
        check(history, log)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{story}") from None
    print(
        f"{len(ok)} acknowledged, {sum(w.outcome == 'unknown' for w in history.writes)} unknown,"
        f" {len(history.reads)} linearizable reads, {len(history.records_seen)} records read;"
        f" {story}"
    )
