"""Column pages in process (`columnar.read_records`) on a follower's driver: only committed
entries, the persisted ones from the WAL's bytes and the ones not yet persisted from the core,
no-op entries skipped; the page is built off the event loop."""

from __future__ import annotations

import asyncio
import os
import threading
from array import array
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftlog.node.core.messages import AppendRequest
from raftlog.node.core.types import Entry, EntryKind, Membership, SnapshotMeta
from raftlog.node.record import Record, encode_record
from raftlog.node.server import columnar
from raftlog.node.server.api_common import ApiError
from raftlog.node.server.app import _record_json, build_app
from raftlog.node.server.node import Node
from raftlog.node.server.partition import PartitionDriver
from raftlog.node.settings import NodeSettings
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage.segment import Rows

PEERS = {f"n{i}": f"http://127.0.0.1:{9 + i}" for i in (1, 2, 3)}  # nobody listens there


def entry(i: int) -> Entry:
    if i == 1:
        return Entry(1, 2, EntryKind.NOOP, b"")  # a new leader's first entry
    return Entry(i, 2, EntryKind.NORMAL, encode_record(Record(f"k{i}".encode(), b"v%d" % i)))


async def follower_of(tmp_path: Path, entries: int, commit: int) -> Node:
    """Node n2, a follower of n1 (nobody listens there) in term 2, fed entries 1..`entries`
    (1 a no-op) with `commit` committed, once its driver has persisted them and shows readers
    the commit (its high-water mark, written after the core's commit moved)."""
    node = Node(
        NodeSettings(
            insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False
        )
    )
    await node.start()
    d = node.drivers[0]
    d.step(
        AppendRequest("n1", "n2", 2, 0, 0, tuple(entry(i) for i in range(1, entries + 1)), commit)
    )
    for _ in range(300):
        if d.storage.last_index() >= entries and d.high_water_mark >= commit:
            return node
        await asyncio.sleep(0.01)
    await node.close()
    raise AssertionError(f"n2 did not take entries 1..{entries} within 3 s")


def rows_of(raw: bytes) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    page = msgspec.msgpack.decode(raw)
    index, term = array("q"), array("q")
    index.frombytes(page["index"])
    term.frombytes(page["term"])
    return page, list(zip(index, term, strict=True))


def test_a_page_holds_the_committed_entries_persisted_or_not(tmp_path, monkeypatch):
    built_on: list[str] = []
    real = columnar.record_page

    def spy(partition: int, rows: Rows, **kw: int) -> bytes:
        built_on.append(threading.current_thread().name)
        return real(partition, rows, **kw)

    monkeypatch.setattr(columnar, "record_page", spy)

    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            first = tuple(entry(i) for i in range(1, 31))
            d.step(AppendRequest("n1", "n2", 2, 0, 0, first, 20))  # 21..30 not committed
            for _ in range(200):
                await asyncio.sleep(0.01)
                if d.storage.last_index() >= 30 and d.high_water_mark >= 20:
                    break
            assert (d.storage.last_index(), d.raft.commit, d.high_water_mark) == (30, 20, 20)
            page, rows = rows_of(await columnar.read_records(d, 1, 10**9, 50_000, 8 << 20))
            assert rows == [(i, 2) for i in range(2, 21)], "no no-op, nothing above the mark"
            assert (page["next"], page["high_water_mark"], page["count"]) == (21, 20, 19)
            assert built_on and built_on[-1] != threading.main_thread().name
            # Entries 31..40 accepted and 35 committed by the core, not yet persisted by the
            # driver (its loop has not run since): 21..30 come from the WAL, 31..35 from the core.
            more = tuple(entry(i) for i in range(31, 41))
            d.raft.step(AppendRequest("n1", "n2", 2, 30, 2, more, 35))
            assert (d.storage.last_index(), d.raft.commit) == (30, 35)
            # Readers are shown a commit once the driver wrote it (a kill cannot take it back):
            # until then the page ends at the mark written, 20.
            page, rows = rows_of(await columnar.read_records(d, 21, 10**9, 50_000, 8 << 20))
            assert rows == [] and (page["next"], page["high_water_mark"]) == (21, 20)
            # Were a mark shown above entries not yet persisted, they come from the core.
            d.high_water_mark = d.raft.commit
            page, rows = rows_of(await columnar.read_records(d, 21, 10**9, 50_000, 8 << 20))
            assert rows == [(i, 2) for i in range(21, 36)]
            assert page["next"] == 36
            # The byte budget holds for the core's entries too (at least one entry).
            page, rows = rows_of(await columnar.read_records(d, 31, 10**9, 50_000, 1))
            assert rows == [(31, 2)] and page["next"] == 32
            # Bounds: `to`, `limit`, and about `max_bytes` (at least one entry).
            page, rows = rows_of(await columnar.read_records(d, 5, 9, 50_000, 8 << 20))
            assert [i for i, _ in rows] == [5, 6, 7, 8] and page["next"] == 9
            page, rows = rows_of(await columnar.read_records(d, 5, 10**9, 3, 8 << 20))
            assert [i for i, _ in rows] == [5, 6, 7] and page["next"] == 8
            page, rows = rows_of(await columnar.read_records(d, 5, 10**9, 50_000, 1))
            assert [i for i, _ in rows] == [5] and page["next"] == 6
        finally:
            await node.close()

    asyncio.run(run())


@pytest.mark.parametrize("limit", [1, 7])
def test_a_page_starting_at_a_no_op_moves_on(tmp_path, limit):
    async def run() -> None:
        node = await follower_of(tmp_path, entries=10, commit=10)
        try:
            d = node.drivers[0]
            page, rows = rows_of(await columnar.read_records(d, 1, 10**9, limit, 8 << 20))
            assert [i for i, _ in rows] == list(range(2, limit + 1))
            assert page["next"] == limit + 1, "a page of only a no-op still makes progress"
        finally:
            await node.close()

    asyncio.run(run())


class HeldBuilds:
    """Page builds that wait in their threads until `release` is set; `building` counts the
    threads that started. Turns are waited for 0.2 s at most."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.building = threading.Semaphore(0)
        real = columnar._build_record_page

        def held(*args: Any) -> bytes:
            self.building.release()
            assert self.release.wait(30)
            return real(*args)

        monkeypatch.setattr(columnar, "_build_record_page", held)
        monkeypatch.setattr(columnar, "GATE_WAIT_S", 0.2)

    @staticmethod
    def take_every_turn(d: PartitionDriver) -> list[asyncio.Task[bytes]]:
        """As many page requests as there are turns, each for the whole log of 10 entries."""
        return [
            asyncio.create_task(columnar.read_records(d, 1, 11, 50_000, 8 << 20))
            for _ in range(columnar.BUILDERS)
        ]


def test_pages_in_the_making_are_bounded_and_a_request_waits_for_its_turn_at_most_so_long(
    tmp_path, monkeypatch
):
    release = HeldBuilds(monkeypatch).release

    async def run() -> None:
        node = await follower_of(tmp_path, entries=10, commit=10)
        try:
            d = node.drivers[0]
            busy = HeldBuilds.take_every_turn(d)
            await asyncio.sleep(0.05)
            with pytest.raises(ApiError) as e:
                await columnar.read_records(d, 1, 11, 50_000, 8 << 20)
            assert e.value.status == 503 and e.value.body["error"] == "busy"
            release.set()
            for t in busy:
                _, rows = rows_of(await t)
                assert [i for i, _ in rows] == list(range(2, 11))
            _, rows = rows_of(await columnar.read_records(d, 1, 11, 50_000, 8 << 20))
            assert len(rows) == 9, "the turns were given back"
        finally:
            release.set()
            await node.close()

    asyncio.run(run())


def test_a_cancelled_request_keeps_its_turn_until_its_thread_has_built_the_page(
    tmp_path, monkeypatch
):
    held = HeldBuilds(monkeypatch)
    release, building = held.release, held.building

    async def run() -> None:
        node = await follower_of(tmp_path, entries=10, commit=10)
        try:
            d = node.drivers[0]
            gone = HeldBuilds.take_every_turn(d)
            for _ in gone:  # every thread is building
                assert await asyncio.to_thread(building.acquire, True, 10)
            for t in gone:  # their clients hung up
                t.cancel()
            await asyncio.gather(*gone, return_exceptions=True)
            with pytest.raises(ApiError) as e:  # the threads still hold the turns
                await columnar.read_records(d, 1, 11, 50_000, 8 << 20)
            assert e.value.body["error"] == "busy"
            release.set()
            _, rows = rows_of(await columnar.read_records(d, 1, 11, 50_000, 8 << 20))
            assert len(rows) == 9, "the turns came back when the threads ended"
        finally:
            release.set()
            await node.close()

    asyncio.run(run())


def test_an_entry_that_is_not_a_record_never_shifts_its_neighbours():
    r1 = encode_record(Record(b"k1", b"v1"))
    r2 = encode_record(Record(b"k2", b"v2"))
    # A record and 3 more bytes: together with the next entry it would decode as one record if
    # the entries were decoded as one stream.
    x = encode_record(Record(b"evil", b"zzz")) + b"\x91\xc4" + bytes([len(r1)])
    got = columnar._decode([x, r1, r2])
    assert got[0] == Record(None, x, {"raftlog.raw": "true"})
    assert got[1:] == [Record(b"k1", b"v1"), Record(b"k2", b"v2")]


def test_a_record_with_a_string_that_is_not_utf8_is_a_raw_row():
    """msgspec raises UnicodeDecodeError (not a DecodeError) for it: once a 500 per page."""
    bad = b"\x93\xc4\x01k\xc4\x01v\x81\xa2\xff\xfe\xa1x"  # a header key of bytes ff fe
    got = columnar._decode([bad, encode_record(Record(b"k1", b"v1"))])
    assert got == [Record(None, bad, {"raftlog.raw": "true"}), Record(b"k1", b"v1")]


def test_a_damaged_or_vanished_snapshot_is_a_503_naming_the_problem(tmp_path):
    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            table = KeyedTable()
            table.rows[b"k"] = b"v"
            d.storage.snapshots.save(
                SnapshotMeta(5, 2, Membership(frozenset(PEERS))), table.snapshot()
            )
            page = msgspec.msgpack.decode(await columnar.read_table(d))
            assert (page["snapshot_index"], page["count"]) == (5, 1)
            file = d.storage.snapshots.file
            assert file is not None
            raw = bytearray(Path(file).read_bytes())
            raw[-3] ^= 0xFF  # bit rot after the node loaded it
            Path(file).write_bytes(bytes(raw))
            with pytest.raises(ApiError) as e:
                await columnar.read_table(d)
            assert (e.value.status, e.value.body["error"]) == (503, "storage_corrupt")
            os.unlink(file)
            with pytest.raises(ApiError) as e:
                await columnar.read_table(d)
            assert (e.value.status, e.value.body["error"]) == (503, "storage_corrupt")
        finally:
            await node.close()

    asyncio.run(run())


def test_a_suffix_overwritten_by_a_new_leader_is_never_served_from_the_stale_wal(tmp_path):
    """The WAL still holds an uncommitted term-2 suffix that a term-3 leader has overwritten in
    the core and committed past, before the driver truncated the WAL: pages show term 3 only."""

    def record(i: int, term: int) -> Entry:
        data = encode_record(Record(f"k{i}".encode(), f"t{term}-{i}".encode()))
        return Entry(i, term, EntryKind.NORMAL, data)

    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            old = (Entry(1, 2, EntryKind.NOOP, b""), *(record(i, 2) for i in range(2, 21)))
            d.step(AppendRequest("n1", "n2", 2, 0, 0, old, 10))  # 11..20 not committed
            for _ in range(300):
                await asyncio.sleep(0.01)
                if d.storage.last_index() >= 20 and d.high_water_mark >= 10:
                    break
            new = tuple(record(i, 3) for i in range(11, 26))
            d.raft.step(AppendRequest("n3", "n2", 3, 10, 2, new, 25))  # the core only
            assert d.storage.term(15) == 2, "the stale suffix is still in the WAL"
            page, rows = rows_of(await columnar.read_records(d, 2, 10**9, 50_000, 8 << 20))
            assert page["next"] == 11, "the commit 25 is not written yet: not shown"
            d.high_water_mark = d.raft.commit  # as if it were: the stale WAL is never read
            want = [(i, 2) for i in range(2, 11)] + [(i, 3) for i in range(11, 26)]
            page, rows = rows_of(await columnar.read_records(d, 2, 10**9, 50_000, 8 << 20))
            assert rows == want and page["next"] == 26
            values = msgspec.msgpack.decode(await columnar.read_records(d, 11, 12, 1, 1 << 20))
            assert values["value_data"] == b"t3-11"
            at, paged = 2, []
            while at < 26:  # page by page, the smallest pages there are
                page, got = rows_of(await columnar.read_records(d, at, 10**9, 50_000, 1))
                paged += got
                at = page["next"]
            assert paged == want
        finally:
            await node.close()

    asyncio.run(run())


def test_the_keyed_table_skips_a_record_with_a_string_that_is_not_utf8():
    # It must count it as undecodable, as any non-record, not raise in the driver's apply.
    table = KeyedTable()
    bad = b"\x93\xc4\x01k\xc4\x01v\x81\xa2\xff\xfe\xa1x"
    table.apply(Entry(1, 1, EntryKind.NORMAL, bad))
    table.apply(Entry(2, 1, EntryKind.NORMAL, encode_record(Record(b"k1", b"v1"))))
    assert (table.applied_index, table.undecodable, table.rows) == (2, 1, {b"k1": b"v1"})


def test_a_record_whose_timestamp_is_past_int64_is_a_raw_row_and_the_page_is_built():
    # msgpack's uint64 holds it and msgspec decodes it; the int64 column cannot: once a 500.
    big = msgspec.msgpack.encode([b"k", b"v", {}, 1 << 63])
    got = columnar._decode([big, encode_record(Record(b"k1", b"v1", {}, (1 << 63) - 1))])
    assert got == [
        Record(None, big, {"raftlog.raw": "true"}),
        Record(b"k1", b"v1", {}, (1 << 63) - 1),
    ]
    rows = Rows()
    rows.add_entries([Entry(1, 1, EntryKind.NORMAL, big)])
    page = msgspec.msgpack.decode(
        columnar.record_page(0, rows, high_water_mark=1, next_index=2, floor=1)
    )
    assert page["count"] == 1 and page["timestamp_ms"] == bytes(8)


def test_the_json_read_of_a_record_with_a_string_that_is_not_utf8_is_its_raw_bytes():
    bad = b"\x93\xc4\x01k\xc4\x01v\x81\xa2\xff\xfe\xa1x"
    assert _record_json(7, 2, bad) == {"index": 7, "term": 2, "raw_b64": "k8QBa8QBdoGi//6heA=="}


def test_a_json_page_names_the_commit_as_its_mark_never_the_last_entry_held(tmp_path):
    """A replica holding entries past its commit (20 held, 10 committed) serves records up to
    10 only, and names 10 as the page's high-water mark."""

    async def run() -> None:
        node = await follower_of(tmp_path, 20, 10)
        try:
            async with TestClient(TestServer(build_app(node))) as client:
                r = await client.get("/v1/partitions/0/records?from=1&limit=100")
                page = await r.json()
            assert r.status == 200, page
            assert page["high_water_mark"] == 10, page
            assert [rec["index"] for rec in page["records"]] == list(range(2, 11))
            assert page["next"] == 11
        finally:
            await node.close()

    asyncio.run(run())
