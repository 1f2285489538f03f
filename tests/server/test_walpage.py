"""WAL pages (`walpage.read_wal_records`, `/columns?format=wal`): the committed range's
records exactly as the WAL frames them (commit records between, every entry kind), the core's
committed-but-unpersisted tail framed the same way, the column page's bounds, Compacted below
the floor, and damaged bytes served as they are (the reader checks them)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from crc32c import crc32c
from tests.server.helpers import compacting_node, until

from raftlog.node.core.errors import Compacted
from raftlog.node.core.messages import AppendRequest
from raftlog.node.core.raft import Role
from raftlog.node.core.types import Entry, EntryKind
from raftlog.node.record import Record, encode_record
from raftlog.node.server import columnar, walpage
from raftlog.node.server.app import build_app
from raftlog.node.server.node import Node
from raftlog.node.server.partition import PartitionDriver
from raftlog.node.settings import NodeSettings
from raftlog.node.storage.segment import (
    COMMIT_BODY,
    ENTRY_HEAD,
    REC_HEAD,
    T_COMMIT,
    T_ENTRY,
    decode_entry_body,
)

PEERS = {f"n{i}": f"http://127.0.0.1:{9 + i}" for i in (1, 2, 3)}  # nobody listens there


def entry(i: int, term: int = 2) -> Entry:
    if i == 1:
        return Entry(1, term, EntryKind.NOOP, b"")  # a new leader's first entry
    if i == 4:
        return Entry(4, term, EntryKind.NORMAL, b"not a record")
    data = encode_record(Record(f"k{i}".encode(), b"v%d" % i, {"h": str(i)}, 1000 + i))
    return Entry(i, term, EntryKind.NORMAL, data)


def records_of(raw: bytes) -> tuple[dict[str, Any], list[Entry], int]:
    """The page, its entries (every record's checksum checked), and its COMMIT records' count."""
    page = msgspec.msgpack.decode(raw)
    buf, pos, entries, commits = page["records"], 0, [], 0
    while pos < len(buf):
        length, crc = REC_HEAD.unpack_from(buf, pos)
        body = memoryview(buf)[pos + 8 : pos + 8 + length]
        assert crc32c(body) == crc, f"record at {pos}"
        if body[0] == T_ENTRY:
            entries.append(decode_entry_body(body))
        else:
            assert body[0] == T_COMMIT and length == COMMIT_BODY.size
            commits += 1
        pos += 8 + length
    assert pos == len(buf), "the records end where the page does"
    return page, entries, commits


def read(
    d: PartitionDriver, start: int, stop: int = 10**9, limit: int = 50_000, max_bytes: int = 8 << 20
) -> tuple[dict[str, Any], list[Entry], int]:
    return records_of(walpage.read_wal_records(d, start, stop, limit, max_bytes))


def test_a_wal_page_holds_the_committed_records_as_framed_persisted_or_not(tmp_path):
    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            first = tuple(entry(i) for i in range(1, 21))
            d.step(AppendRequest("n1", "n2", 2, 0, 0, first, 5))
            await until(
                lambda: d.storage.last_index() >= 20 and d.raft.commit >= 5, "append", timeout=5.0
            )
            more = tuple(entry(i) for i in range(21, 31))  # commit 20 then 25: COMMIT records
            d.step(AppendRequest("n1", "n2", 2, 20, 2, (), 20))
            await until(lambda: d.storage.commit_index() >= 20, "commit 20", timeout=5.0)
            d.step(AppendRequest("n1", "n2", 2, 20, 2, more, 25))
            await until(
                lambda: d.storage.last_index() >= 30 and d.high_water_mark >= 25,
                "append 21..30",
                timeout=5.0,
            )
            page, got, commits = read(d, 1)
            assert got == [entry(i) for i in range(1, 26)], "every kind, nothing above the mark"
            assert commits >= 1, "the WAL's commit records are served as they are"
            assert (page["first"], page["next"], page["high_water_mark"]) == (1, 26, 25)
            assert page["partition"] == 0 and page["compaction_floor"] == 1
            # 31..40 accepted and 35 committed by the core only: 31..35 come from the core,
            # framed as the WAL frames them.
            d.raft.step(AppendRequest("n1", "n2", 2, 30, 2, tuple(map(entry, range(31, 41))), 35))
            assert (d.storage.last_index(), d.raft.commit) == (30, 35)
            assert read(d, 21)[0]["next"] == 26, "a commit is shown once written, not before"
            d.high_water_mark = d.raft.commit  # shown as if written
            page, got, _ = read(d, 21)
            assert got == [entry(i) for i in range(21, 36)] and page["next"] == 36
            # The column page's bounds: `to`, `limit`, about `max_bytes` (at least one entry).
            for args, want in [
                ((5, 9), [5, 6, 7, 8]),
                ((5, 10**9, 3), [5, 6, 7]),
                ((5, 10**9, 50_000, 1), [5]),
                ((31, 10**9, 50_000, 1), [31]),
            ]:
                page, got, _ = read(d, *args)
                assert [e.index for e in got] == want and page["next"] == want[-1] + 1, args
            # The same range's column page holds the NORMAL entries of the WAL page.
            cols = msgspec.msgpack.decode(await columnar.read_records(d, 1, 36, 50_000, 8 << 20))
            assert cols["next"] == 36 and cols["count"] == 34
        finally:
            await node.close()

    asyncio.run(run())


def test_damaged_bytes_are_served_as_they_are(tmp_path):
    """The node checks no record: a flipped byte in the WAL reaches the reader, which checks."""

    async def run() -> None:
        node = Node(
            NodeSettings(
                insecure_no_auth=True, node_id="n2", peers=PEERS, data_dir=tmp_path, durable=False
            )
        )
        await node.start()
        try:
            d = node.drivers[0]
            d.step(AppendRequest("n1", "n2", 2, 0, 0, tuple(map(entry, range(1, 11))), 10))
            # Persisted and marked stable in the core: pages read entries below the core's
            # `offset` from the WAL, those above from the core (written, not yet advanced).
            await until(
                lambda: d.raft.log.offset > 10 and d.raft.commit >= 10, "append", timeout=5.0
            )
            (raw,) = d.storage.read_raw(6, 7, 1 << 20)
            fd = os.open(raw.path, os.O_RDWR)
            try:
                at = raw.offsets[0] + REC_HEAD.size + ENTRY_HEAD.size + 3  # in 6's data
                os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
            finally:
                os.close(fd)
            page = msgspec.msgpack.decode(walpage.read_wal_records(d, 1, 11, 50_000, 1 << 20))
            assert page["next"] == 11
            with pytest.raises(AssertionError, match="record at"):
                records_of(walpage.read_wal_records(d, 1, 11, 50_000, 1 << 20))
        finally:
            await node.close()

    asyncio.run(run())


def test_a_range_below_the_floor_is_compacted_over_http_as_in_process(tmp_path):
    """`/columns?format=wal`: 410 with the floor below it, the page from it; an unknown
    format is a 400."""

    async def run() -> None:
        node = compacting_node(tmp_path)
        await node.start()
        srv = TestServer(build_app(node))
        await srv.start_server()
        try:
            d = node.drivers[0]
            await until(lambda: d.raft.role == Role.LEADER, "election", timeout=5.0)
            for i in range(0, 200, 10):
                await d.propose([b'{"key": "k%d", "value": "v"}' % j for j in range(i, i + 10)])
            await until(lambda: d.storage.first_index() > 1, "a compaction", timeout=5.0)
            # A pass of its own, after any snapshot in flight: a floor that settled while one
            # was due behind a slow snapshot moved again under the reads below.
            await d.compact_now()
            floor = d.storage.first_index()
            # Everything applied was compacted (no entries kept): a few more to read from it,
            # fewer than a snapshot waits for.
            await d.propose([b'{"key": "t%d", "value": "v"}' % j for j in range(10)])
            with pytest.raises(Compacted):
                walpage.read_wal_records(d, floor - 1, 10**9, 50_000, 1 << 20)
            async with ClientSession(str(srv.make_url(""))) as s:
                url = "/v1/partitions/0/columns?format=wal&from="
                async with s.get(f"{url}{floor - 1}") as r:
                    assert r.status == 410
                    assert (await r.json())["compaction_floor"] == floor
                async with s.get(f"{url}{floor}") as r:
                    assert r.status == 200 and r.content_type == walpage.CONTENT_TYPE
                    page, got, _ = records_of(await r.read())
                assert got[0].index == floor and page["compaction_floor"] == floor
                assert [e.index for e in got] == list(range(floor, d.raft.commit + 1))
                async with s.get("/v1/partitions/0/columns?format=json") as r:
                    bad = await r.json()
                    assert r.status == 400 and "columns or wal" in bad["reason"], bad
                    assert bad["field"] == "format", bad
                async with s.get(f"/v1/partitions/0/columns?from={floor}") as r:
                    body = await r.read()
                    assert r.status == 200, (r.status, body[:300])
                    assert r.content_type == columnar.CONTENT_TYPE, "the default stays"
        finally:
            await srv.close()
            await node.close()

    asyncio.run(run())
