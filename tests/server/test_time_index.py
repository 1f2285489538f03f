"""The time index (`server.timeindex`) in process on a one-node leader: for every time asked,
the first committed record stamped at or after it that the replica holds, checked against a
plain scan of what was appended, with timestamps that go back and forth, records with no
timestamp, no-op entries between records, the index extended after later appends, and
compaction moving the log's start under it (the answer then is the first retained record)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from tests.server.helpers import compacting_node, until

from raftlog.node.core.raft import Role
from raftlog.node.record import Record, encode_record
from raftlog.node.server import timeindex
from raftlog.node.server.node import Node
from raftlog.node.server.partition import PartitionDriver


async def _leader(node: Node) -> PartitionDriver:
    await node.start()
    d = node.drivers[0]
    await until(lambda: d.raft.role == Role.LEADER, "election")
    return d


async def _append(d: PartitionDriver, stamps: list[int]) -> list[tuple[int, int]]:
    """(index, timestamp) of each record appended, in batches of 7."""
    out: list[tuple[int, int]] = []
    for i in range(0, len(stamps), 7):
        batch = stamps[i : i + 7]
        done = await d.propose([encode_record(Record(b"k", b"v", {}, ts)) for ts in batch])
        out += list(zip(range(done.first_index, done.last_index + 1), batch, strict=True))
    return out


def _expected(appended: list[tuple[int, int]], floor: int, t: int) -> int | None:
    return next((i for i, ts in appended if i >= floor and ts >= t), None)


def _stamps(rng: random.Random, n: int, base: int) -> list[int]:
    """Mostly rising times with some going back, some far ahead, some with no timestamp."""
    out = []
    for k in range(n):
        roll = rng.random()
        if roll < 0.1:
            out.append(0)
        elif roll < 0.2:
            out.append(base + k * 10 - rng.randrange(500))
        elif roll < 0.22:
            out.append(base + k * 10 + 5_000)
        else:
            out.append(base + k * 10)
    return out


async def _check(d: PartitionDriver, appended: list[tuple[int, int]], times: list[int]) -> None:
    for t in times:
        for _ in range(10):  # a snapshot finishing meanwhile moves the floor: ask again
            floor = d.raft.log.first_index()
            got = (await timeindex.of(d).lookup(d, t)).first
            if d.raft.log.first_index() == floor:
                break
        assert got == _expected(appended, floor, t), f"time {t} (floor {floor})"


@pytest.mark.parametrize("sample_every", [4, 1024])
def test_the_first_record_at_or_after_a_time_as_a_scan_finds_it(
    tmp_path, monkeypatch, sample_every
):
    monkeypatch.setattr(timeindex, "SAMPLE_EVERY", sample_every)
    rng = random.Random(7)

    async def run() -> None:
        node = compacting_node(tmp_path, every=10**9)  # no compaction here
        try:
            d = await _leader(node)
            appended = await _append(d, _stamps(rng, 400, 1_000_000))
            top = max(ts for _, ts in appended)
            times = [0, 1, 999_999, 1_000_000, top, top + 1, *rng.sample(range(1_000_000, top), 60)]
            await _check(d, appended, times)
            # Later appends: the index extends from where it ended.
            appended += await _append(d, _stamps(rng, 150, 1_004_000))
            top = max(ts for _, ts in appended)
            await _check(d, appended, [top, top + 1, *rng.sample(range(1_000_000, top), 60)])
            assert timeindex.of(d).end == d.raft.commit
        finally:
            await node.close()

    asyncio.run(run())


def test_answers_follow_compaction_to_the_first_retained_record(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(timeindex, "SAMPLE_EVERY", 16)
    rng = random.Random(11)

    async def run() -> None:
        node = compacting_node(tmp_path, every=50)
        try:
            d = await _leader(node)
            appended = await _append(d, _stamps(rng, 300, 2_000_000))
            top = max(ts for _, ts in appended)
            await _check(d, appended, rng.sample(range(2_000_000, top), 40))  # built here
            appended += await _append(d, _stamps(rng, 600, 2_003_000))
            await until(lambda: d.raft.log.first_index() > 300, "compaction past the first build")
            await d.compact_now()  # the floor still until the checks are done
            top = max(ts for _, ts in appended)
            await _check(d, appended, [0, 2_000_000, *rng.sample(range(2_000_000, top), 80)])
            # Everything indexed is compacted, then records with times as old as the compacted
            # ones come: answers must skip the compacted matches the samples still count.
            await d.compact_now()
            start = timeindex.of(d).start
            appended += await _append(d, _stamps(rng, 40, 2_000_000))
            await _check(d, appended, [0, 2_000_000, *rng.sample(range(2_000_000, top), 80)])
            assert timeindex.of(d).start == start, "the index went on (no new pass from the floor)"
        finally:
            await node.close()

    asyncio.run(run())


def test_a_log_with_no_record_at_or_after_the_time_answers_none(tmp_path):
    async def run() -> None:
        node = compacting_node(tmp_path, every=10**9)
        try:
            d = await _leader(node)
            index = timeindex.of(d)
            assert await index.lookup(d, 1) == (None, False)  # only the leader's no-op
            appended = await _append(d, [0, 0, 5, 3])
            assert await index.lookup(d, 6) == (None, False)
            assert await index.lookup(d, 4) == (appended[2][0], False)
            assert await index.lookup(d, 0) == (appended[0][0], False)
        finally:
            await node.close()

    asyncio.run(run())


def test_a_compacted_record_far_ahead_costs_no_scan_and_is_reported(tmp_path, monkeypatch):
    """A record stamped far in the future (a skewed clock), then compacted away: lookups for
    earlier times read about one gap, not the whole log, and say a record at or after the time
    may have been compacted; times after every retained record answer none."""
    monkeypatch.setattr(timeindex, "SAMPLE_EVERY", 16)
    read: list[int] = []
    real = timeindex._stamped

    def counting(*args: object) -> object:
        indexes, stamps = real(*args)  # type: ignore[arg-type]
        read.append(len(indexes))
        return indexes, stamps

    monkeypatch.setattr(timeindex, "_stamped", counting)

    async def run() -> None:
        node = compacting_node(tmp_path, every=10**9)
        try:
            d = await _leader(node)
            index = timeindex.of(d)
            await _append(d, [10**12, *range(1_000, 1_200)])
            assert (await index.lookup(d, 1_100)).compacted is False
            await d.compact_now()  # the record far ahead and all the others: gone
            appended = await _append(d, list(range(2_000, 2_400)))
            await index.lookup(d, 0)  # the new records indexed
            read.clear()
            answer = await index.lookup(d, 2_300)
            assert answer.first == next(i for i, ts in appended if ts >= 2_300)
            assert answer.compacted, "the record far ahead was at or after 2,300"
            assert sum(read) <= 2 * 16, f"read {sum(read)} records for one lookup"
            assert await index.lookup(d, 10**11) == (None, True)
        finally:
            await node.close()

    asyncio.run(run())


async def _check_flag(
    d: PartitionDriver, index: timeindex.TimeIndex, appended: list[tuple[int, int]], t: int
) -> None:
    """The answer's first record is the scan's, and `compacted` is set whenever a record the
    floor passed is stamped at or after `t` (it may be set otherwise too: "may have been")."""
    floor = d.raft.log.first_index()
    answer = await index.lookup(d, t)
    assert answer.first == _expected(appended, floor, t), f"time {t} (floor {floor})"
    lost = [(i, ts) for i, ts in appended if i < floor and ts and ts >= t]
    assert answer.compacted or not lost, f"time {t}: {lost[:3]} compacted, flag not set"


def test_the_compacted_flag_is_set_whenever_a_compacted_record_reaches_the_time(
    tmp_path, monkeypatch
):
    """Times taken from the compacted records' own stamps (the edge: exactly at the time),
    over two compactions, the second removing records stamped lower than the first's; and an
    index built for the first time after compaction (what it lost before is unknown)."""
    monkeypatch.setattr(timeindex, "SAMPLE_EVERY", 16)
    rng = random.Random(5)

    async def run() -> None:
        node = compacting_node(tmp_path, every=10**9)
        try:
            d = await _leader(node)
            index = timeindex.of(d)
            appended = await _append(d, _stamps(rng, 200, 9_000_000))  # high stamps first
            await index.lookup(d, 0)  # built before any compaction
            await d.compact_now()
            appended += await _append(d, _stamps(rng, 200, 1_000_000))  # then lower ones
            floor = d.raft.log.first_index()
            assert floor > 1, "the test needs records compacted"
            times = sorted({ts for i, ts in appended if i < floor and ts})
            for t in [*rng.sample(times, 30), times[-1]]:
                await _check_flag(d, index, appended, t)
            await d.compact_now()
            appended += await _append(d, _stamps(rng, 100, 5_000_000))
            floor = d.raft.log.first_index()
            times = sorted({ts for i, ts in appended if i < floor and ts})
            for t in [*rng.sample(times, 30), times[-1], times[-1] + 1]:
                await _check_flag(d, index, appended, t)
            # A new index over a log that starts past 1 cannot know what was compacted.
            fresh = timeindex.TimeIndex()
            for t in [1, times[0], times[-1]]:
                await _check_flag(d, fresh, appended, t)
            # The last record alone reaches the highest time: found at the index's very end.
            top = max(ts for _, ts in appended) + 1
            appended += await _append(d, [top])
            await _check_flag(d, index, appended, top)
            await _check_flag(d, fresh, appended, top)
        finally:
            await node.close()

    asyncio.run(run())
