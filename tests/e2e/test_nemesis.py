"""Network faults, kills and pauses at random on five real nodes under appends and reads, then
a history check (as Jepsen's): nothing acknowledged lost, nothing twice, nothing invented, the
members agree, every record read was committed there, and every linearizable key read is.

Each ordered pair of nodes talks through its own proxy (`tests/e2e/links.py`), so a fault can
be one-way, a bridge or a clean split, and a cut either stalls a link (packets dropped) or
resets it. Clients talk to the nodes directly and see every answer; an append that got no
answer, or 503 (`leader_lost`, `timeout`), has an unknown outcome and may be in the log once.
Of three partitions, two take the load; the third stays idle (quiesced) through the faults,
and an append to each must commit once they heal.

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
from typing import Any

import aiohttp
import pytest
from tests.e2e.links import Links, proxied

from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = 5
BUSY = [0, 1]  # partitions under appends and reads; the last one stays idle (quiesced) until
PARTITIONS = 3  # the end, when an append must commit on it too
KEYS = [f"k{i}" for i in range(4)]
FAULT_SECONDS = float(os.environ.get("NEMESIS_SECONDS", "20"))
SEED = int(os.environ.get("NEMESIS_SEED", "0")) or random.randrange(1, 1 << 30)
# No compaction during the test: the final log is read back whole from every member.
RAFT = {"compact_every_operations": 1_000_000, "compact_every_bytes": 0}


@dataclass
class Write:
    partition: int
    key: str
    value: str
    sent: float
    answered: float = 0.0
    outcome: str = "unknown"  # ok, failed (refused before it was proposed), unknown
    index: int = 0


@dataclass
class KeyRead:
    partition: int
    key: str
    sent: float
    answered: float
    value: str | None  # None: not found
    applied_index: int


@dataclass
class History:
    writes: list[Write]
    reads: list[KeyRead]
    records_seen: list[tuple[int, str, int, str, int]]  # (partition, node, index, value, mark)
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

    def leader(self, p: int) -> str | None:
        for name in self.names:
            if name in self.killed or name in self.paused:
                continue
            try:
                part = self.cluster.status(name)["partitions"][p]
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
        kinds = ["split", "bridge", "one-way", "kill", "pause", "pause-leader"]
        kinds += ["isolate-leader"] * 3
        p = rng.choice(BUSY)
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
            leader = self.leader(p)
            if leader is not None:
                # Stalled rather than reset, mostly: it then learns of the new leader only
                # when the link heals, and until its check-quorum it still believes it leads.
                mode = "stall" if rng.random() < 0.75 else "reset"
                self.cut_between([leader], [n for n in names if n != leader], mode)
                self.say(f"p{p}'s leader {leader} isolated ({mode})")
        elif kind == "kill" and not self.killed:
            victim = rng.choice(names)
            self.cluster.kill(victim)
            self.killed.append(victim)
            self.say(f"kill -9 {victim}")
        elif kind.startswith("pause") and not self.paused:
            victim = (self.leader(p) if kind == "pause-leader" else None) or rng.choice(names)
            self.cluster.signal(victim, signal.SIGSTOP)
            self.paused.append(victim)
            self.say(f"SIGSTOP {victim}")

    def transfer(self, rng: random.Random) -> None:
        """A new leader at once, through the admin API: it must not serve a read before it
        applied what its predecessor committed, nor may its predecessor after it."""
        p = rng.choice(BUSY)
        leader = self.leader(p)
        if leader is not None:
            target = rng.choice([n for n in self.names if n != leader])
            body = json.dumps({"target": target}).encode()
            path = f"/v1/admin/partitions/{p}/transfer"
            try:
                code, _ = self.cluster.request(leader, "POST", path, body, timeout=3)
            except OSError:
                code = None
            self.say(f"p{p}'s leadership {leader} -> {target}: {code}")

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
        churn = asyncio.create_task(self.churn(stop))
        while not stop.is_set():
            await asyncio.to_thread(self.fault)
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))
            await asyncio.to_thread(self.heal)
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        await churn

    async def churn(self, stop: asyncio.Event) -> None:
        """Leadership moved by hand every second or so, beside the faults (its own random
        sequence, so that the faults' schedule stays the seed's)."""
        rng = random.Random(self.rng.random())
        while not stop.is_set():
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            await asyncio.to_thread(self.transfer, rng)


def next_target(rng: random.Random, nodes: dict[str, str], answer: object) -> str:
    """Where a client goes after a refusal: the leader a 421 names (by name: its `leader_url`
    is the address the node reaches it at, here a proxy), else any node."""
    leader = answer.get("leader") if isinstance(answer, dict) else None
    return nodes[leader] if leader in nodes else rng.choice(list(nodes.values()))


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: dict[str, str] | None = None
) -> tuple[int, Any] | None:
    """One request with the clients' 2 s time-out: its status and JSON answer, or None when no
    answer came (refused, reset, timed out, cut off mid-answer: a fault of the schedule)."""
    try:
        async with http.request(
            method,
            url,
            data=None if body is None else json.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=2),
        ) as resp:
            return resp.status, await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def writer(
    http: aiohttp.ClientSession,
    nodes: dict[str, str],
    wid: int,
    out: list[Write],
    stop: asyncio.Event,
) -> None:
    rng = random.Random(wid)
    urls = list(nodes.values())
    target = rng.choice(urls)
    partition = BUSY[wid % len(BUSY)]
    seq = 0
    while not stop.is_set():
        seq += 1
        w = Write(partition, rng.choice(KEYS), f"w{wid}-{seq}", time.monotonic())
        out.append(w)
        got = await call(
            http, "POST", f"{target}/v1/partitions/{partition}/records",
            {"key": w.key, "value": w.value},
        )  # fmt: skip
        if got is None:  # no answer: the outcome stays unknown
            target = rng.choice(urls)
            await asyncio.sleep(0.05)
            continue
        status, answer = got
        w.answered = time.monotonic()
        if status == 200:
            w.outcome, w.index = "ok", int(answer["last_index"])
            assert answer["first_index"] == w.index, answer
        elif status == 421:  # a follower refuses before proposing
            w.outcome = "failed"
            target = next_target(rng, nodes, answer)
        else:
            target = rng.choice(urls)


async def key_reader(
    http: aiohttp.ClientSession,
    nodes: dict[str, str],
    rid: int,
    out: list[KeyRead],
    stop: asyncio.Event,
) -> None:
    rng = random.Random(1000 + rid)
    urls = list(nodes.values())
    target = rng.choice(urls)
    partition = BUSY[rid % len(BUSY)]
    while not stop.is_set():
        key = rng.choice(KEYS)
        sent = time.monotonic()
        path = f"/v1/partitions/{partition}/keys/{key}?consistency=linearizable"
        got = await call(http, "GET", target + path)
        if got is None:
            target = rng.choice(urls)
            await asyncio.sleep(0.05)
            continue
        status, answer = got
        if status in (200, 404) and isinstance(answer, dict) and "found" in answer:
            value = answer.get("value") if answer["found"] else None
            answered, applied = time.monotonic(), int(answer["applied_index"])
            out.append(KeyRead(partition, key, sent, answered, value, applied))
        else:  # as a client does, it stays with the node that answered until it fails
            target = next_target(rng, nodes, answer)


async def record_reader(
    http: aiohttp.ClientSession,
    nodes: dict[str, str],
    out: list[tuple[int, str, int, str, int]],
    stop: asyncio.Event,
) -> None:
    rng = random.Random(7)
    top = dict.fromkeys(BUSY, 1)  # the highest mark seen: reads start anywhere below it
    while not stop.is_set():
        name, p = rng.choice(list(nodes)), rng.choice(BUSY)
        start = rng.randint(1, top[p])
        path = f"/v1/partitions/{p}/records?from={start}&limit=1000"
        got = await call(http, "GET", nodes[name] + path)
        if got is not None and got[0] == 200:  # a node cut off or down is asked again later
            page = got[1]
            mark = page["high_water_mark"]
            top[p] = max(top[p], mark)
            for r in page["records"]:
                out.append((p, name, r["index"], r["value"], mark))
        await asyncio.sleep(0.1)


async def run_history(cluster: LocalCluster, nemesis: Nemesis) -> History:
    nodes = {n.name: n.url for n in cluster.nodes.values()}
    writes: list[Write] = []
    reads: list[KeyRead] = []
    seen: list[tuple[int, str, int, str, int]] = []
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        tasks = [asyncio.create_task(writer(http, nodes, i, writes, stop)) for i in range(8)]
        tasks += [asyncio.create_task(key_reader(http, nodes, i, reads, stop)) for i in range(8)]
        tasks.append(asyncio.create_task(record_reader(http, nodes, seen, stop)))
        faults = asyncio.create_task(nemesis.run(stop))
        await asyncio.sleep(FAULT_SECONDS)
        stop.set()
        await asyncio.gather(*tasks)
        await faults
    await asyncio.to_thread(nemesis.heal)
    return History(writes, reads, seen, nemesis.faults)


Log = dict[int, tuple[str, str]]  # index -> (key, value)


def final_log(cluster: LocalCluster, name: str, p: int) -> tuple[int, Log]:
    """A member's committed records of partition `p`, read whole, and its mark."""
    records: Log = {}
    start, mark = 1, 0
    while True:
        path = f"/v1/partitions/{p}/records?from={start}&limit=10000"
        code, page = cluster.get(name, path, 10)
        assert code == 200, (name, code, page)
        mark = page["high_water_mark"]
        for r in page["records"]:
            records[r["index"]] = (r["key"], r["value"])
        if page["next"] > mark:
            return mark, records
        start = page["next"]


def settle(cluster: LocalCluster, p: int) -> Log:
    """After the faults: a new append to partition `p` commits, and every member comes to the
    same mark and log."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, f"p{p}: no agreement within 60 s of the heal"
        try:
            cluster.wait_ready(timeout=30)
            leader = cluster.leader(p)
            if leader is None:
                continue
            body = json.dumps({"key": "final", "value": "final"}).encode()
            code, ack = cluster.request(
                leader, "POST", f"/v1/partitions/{p}/records", body,
                {"Content-Type": "application/json"}, timeout=5,
            )  # fmt: skip
            if code != 200:
                continue
            logs = {}
            for _ in range(100):
                logs = {n: final_log(cluster, n, p) for n in cluster.nodes}
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
                assert view == first, f"p{p}: {n}'s committed log differs from the others'"
            return max(((m, r) for m, r in logs.values()), key=lambda mr: mr[0])[1]
        except (OSError, RuntimeError, TimeoutError):
            time.sleep(0.5)


def check(history: History, logs: dict[int, Log]) -> None:
    for p, log in logs.items():
        try:
            check_partition(
                [w for w in history.writes if w.partition == p],
                [r for r in history.reads if r.partition == p],
                [s[1:] for s in history.records_seen if s[0] == p],
                log,
            )
        except AssertionError as e:
            raise AssertionError(f"p{p}: {e}") from None


def check_partition(
    writes: list[Write],
    reads: list[KeyRead],
    records_seen: list[tuple[str, int, str, int]],
    log: Log,
) -> None:
    where: dict[str, int] = {}
    for index, (_key, value) in log.items():
        assert value not in where, f"{value} committed twice: at {where[value]} and {index}"
        where[value] = index
    sent = {w.value: w for w in writes}
    for value, index in where.items():
        assert value == "final" or value in sent, f"{value} at {index} was never sent"
    for w in writes:
        if w.outcome == "ok":
            assert log.get(w.index) == (w.key, w.value), f"acknowledged {w} lost or moved"
        elif w.outcome == "failed":
            assert w.value not in where, f"{w} was refused, yet committed at {where[w.value]}"
    for name, index, value, mark in records_seen:
        assert index <= mark, f"{name} served {index} above its mark {mark}"
        assert log.get(index, (None, None))[1] == value, (
            f"{name} served {value} at {index}; the committed log has {log.get(index)}"
        )
    by_key: dict[str, list[tuple[int, str]]] = {}
    for index in sorted(log):
        key, value = log[index]
        by_key.setdefault(key, []).append((index, value))
    acked_at = {w.value: w.answered for w in writes if w.outcome == "ok"}
    for r in reads:
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
    for q in sorted(reads, key=lambda q: q.answered):
        at = where[q.value] if q.value is not None else 0
        runs = answered.setdefault(q.key, [])
        best = runs[-1] if runs and runs[-1][1] >= at else (q.answered, at, q)
        runs.append((q.answered, best[1], best[2]))  # the newest write returned so far
    for r in reads:
        at = where[r.value] if r.value is not None else 0
        runs = answered[r.key]
        k = bisect.bisect_left(runs, r.sent, key=lambda run: run[0])
        if k:
            _, newest, q = runs[k - 1]
            assert newest <= at, f"{r} went back behind {q}, answered before it was sent"


def test_faults_at_random_lose_nothing_and_every_read_is_linearizable(tmp_path):
    rng = random.Random(SEED)
    cluster = LocalCluster(tmp_path, replicas=NODES, partitions=PARTITIONS, raft=RAFT)
    ports = {name: node.port for name, node in cluster.nodes.items()}
    with proxied(ports) as links:
        cluster.peer_url = links.url
        with cluster:
            cluster.wait_ready()
            nemesis = Nemesis(cluster, links, rng)
            history = asyncio.run(run_history(cluster, nemesis))
            logs = {p: settle(cluster, p) for p in range(PARTITIONS)}
    story = f"seed {SEED} (NEMESIS_SEED to replay the schedule):\n" + "\n".join(history.faults)
    # Not vacuous: faults came, and writes and reads went through between them on each busy
    # partition.
    assert len(history.faults) >= 4, story
    for p in BUSY:
        ok = [w for w in history.writes if w.partition == p and w.outcome == "ok"]
        assert len(ok) >= 20, (p, len(ok), story)
        assert sum(r.partition == p for r in history.reads) >= 20, (p, story)
        assert sum(s[0] == p for s in history.records_seen) >= 50, (p, story)
    try:
        check(history, logs)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{story}") from None
    ok = [w for w in history.writes if w.outcome == "ok"]
    print(
        f"{len(ok)} acknowledged, {sum(w.outcome == 'unknown' for w in history.writes)} unknown,"
        f" {len(history.reads)} linearizable reads, {len(history.records_seen)} records read;"
        f" {story}"
    )
