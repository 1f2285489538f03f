"""Tiered reads: what the nodes compacted away, read by the executors straight from the archive.

With `archiveUrl` (and `archiveEndpoint`, `archiveRegion`, the credentials), indexes below a
partition's compaction floor are read from the cluster's continuous archive with pyarrow's S3
filesystem, not through the nodes. The archive's layout is the nodes' own
(`raftlog.node.storage.archive_manifest`): `p<N>/manifest.json` names the segment objects
`p<N>/segments/<first>-<last>-<digest>.wal`, each a WAL segment of committed entries.

- Planning (the driver) reads the manifest of a partition (`attach`) and plans the range below
  the floor as one `ArchiveSplit` per segment object (`plan`). What is below the archive's first
  index, or in a gap of it, is in neither place: DataLoss naming both places, or with
  failOnDataLoss=false skipped and logged.
- A task reads its object whole, checks its size and sha256 against the manifest
  (`check_object`), decodes the entries of its range with every record's CRC32C and index
  checked (`object_entries`), and builds from them the column page a node serves for the same
  range (`GET /columns`, `raftlog.node.server.columnar.record_page`), which becomes Arrow through
  the same `arrow.page_to_batch`: the rows are a node read's, column for column.
- A node task whose range was compacted after planning (410 on every replica) reads the
  compacted part from the archive the same way (`read_range`), then goes on from the nodes.

Objects are read through one `pyarrow.fs.S3FileSystem` per executor process and archive, with
the options' timeout on every request and pyarrow's bounded retries.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import is_not
from typing import Any, cast
from urllib.parse import urlsplit

import msgspec
import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql.datasource import InputPartition

from raftlog.node.record import Record, decode_record
from raftlog.node.storage.archive_manifest import (
    ArchivedSegment,
    Manifest,
    ManifestError,
    manifest_key,
)
from raftlog.node.storage.archive_objects import Rows, WalCorruption, check_object, object_entries
from raftlog.spark import arrow
from raftlog.spark.nodes import DataLoss, PartitionView
from raftlog.spark.options import ArchiveOptions, Options

log = logging.getLogger("raftlog.spark.archived")
MANIFEST_READS = 3  # a manifest that does not parse is read this many times before it is damage

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


# ====================================================================== what the archive holds
@dataclass(frozen=True)
class Tier:
    """A partition's archive as its manifest named it when read."""

    url: str  # the archive's s3://bucket/prefix
    key: str  # of the manifest
    found: bool  # whether there was a manifest
    segments: tuple[ArchivedSegment, ...]  # by first index

    @property
    def first(self) -> int | None:
        """The first archived index (None: nothing archived)."""
        return self.segments[0].first_index if self.segments else None

    def describe(self) -> str:
        if not self.found:
            return f"the archive {self.url} has no manifest ({self.key})"
        if not self.segments:
            return f"the archive {self.url} holds no segment ({self.key})"
        merged: list[str] = []
        lo, hi = self.segments[0].first_index, self.segments[0].last_index
        for s in self.segments[1:]:
            if s.first_index == hi + 1:
                hi = s.last_index
            else:
                merged.append(f"[{lo}, {hi}]")
                lo, hi = s.first_index, s.last_index
        merged.append(f"[{lo}, {hi}]")
        return f"the archive {self.url} holds {', '.join(merged)} only"

    def cover(self, start: int, stop: int) -> list[tuple[ArchivedSegment | None, int, int]]:
        """[start, stop) in index order as (segment, lo, hi) pieces; a piece with no segment is
        a part the archive does not hold."""
        out: list[tuple[ArchivedSegment | None, int, int]] = []
        at = start
        for s in self.segments:
            if at >= stop:
                break
            if s.last_index < at:
                continue
            if s.first_index > at:
                hi = min(stop, s.first_index)
                out.append((None, at, hi))
                at = hi
                if at >= stop:
                    break
            hi = min(stop, s.last_index + 1)
            out.append((s, at, hi))
            at = hi
        if at < stop:
            out.append((None, at, stop))
        return out


_filesystems: dict[tuple[ArchiveOptions, float], pafs.S3FileSystem] = {}


def filesystem(a: ArchiveOptions, timeout_s: float) -> pafs.S3FileSystem:
    """The S3 filesystem of archive `a`, one per process (the driver's, each Python worker's)."""
    fs = _filesystems.get((a, timeout_s))
    if fs is None:
        kw: dict[str, Any] = {
            "connect_timeout": min(timeout_s, 10.0),
            "request_timeout": timeout_s,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=4),
        }
        if a.endpoint is not None:
            e = urlsplit(a.endpoint)
            kw["endpoint_override"] = e.netloc
            kw["scheme"] = e.scheme
        if a.region is not None:
            kw["region"] = a.region
        if a.access_key_id is not None:
            kw["access_key"] = a.access_key_id
            kw["secret_key"] = a.secret_access_key
        fs = _filesystems[(a, timeout_s)] = pafs.S3FileSystem(**kw)
    return fs


def get_object(opts: Options, key: str) -> bytes | None:
    """The bytes of object `key` of the archive, or None when there is none."""
    a = opts.archive
    assert a is not None
    try:
        with filesystem(a, opts.timeout_s).open_input_stream(f"{a.bucket}/{key}") as f:
            return cast(bytes, f.read())
    except FileNotFoundError:
        return None
    except OSError as e:
        raise RuntimeError(f"raftlog archive {a.url}: {key} could not be read: {e}") from None


def load(opts: Options, partition: int) -> Tier:
    """What the archive holds of `partition`, from its manifest."""
    a = opts.archive
    assert a is not None
    key = manifest_key(a.prefix, partition)
    for attempt in range(1, MANIFEST_READS + 1):
        raw = get_object(opts, key)
        if raw is None:
            return Tier(a.url, key, False, ())
        try:
            m = Manifest.from_json(key, raw)
            break
        except ManifestError as e:
            # pyarrow reads an object's size, then that many bytes: a manifest the leader
            # replaced in between comes cut at the old size (a CI run read one). Read again.
            if attempt == MANIFEST_READS:
                raise RuntimeError(f"raftlog archive {a.url}: {e}") from None
            log.info("%s did not read whole (%s); reading it again", key, e)
    if m.partition != partition:
        raise RuntimeError(
            f"raftlog archive {a.url}: {key} is the manifest of partition {m.partition}"
        )
    return Tier(a.url, key, True, tuple(m.segments))


def attach(opts: Options, view: PartitionView) -> Tier:
    """Read the archive's manifest of `view`'s partition into `view.tier`."""
    view.tier = load(opts, view.partition)
    return view.tier


# ====================================================================== planning
class ArchiveSplit(InputPartition):
    """Committed records [start, stop) of one raftlog partition, from one archived segment
    object (`segment`), read by the task straight from the archive."""

    def __init__(self, partition: int, start: int, stop: int, segment: ArchivedSegment) -> None:
        self.partition = partition
        self.start = start
        self.stop = stop
        self.segment = segment

    def __repr__(self) -> str:
        return (
            f"ArchiveSplit(p{self.partition} [{self.start}, {self.stop}) from {self.segment.key})"
        )


def _neither(opts: Options, p: int, lo: int, hi: int, floor: int, tier: Tier, where: str) -> None:
    """Records [lo, hi) are neither on a node nor in the archive: DataLoss, or (with
    failOnDataLoss=false) logged as skipped."""
    if opts.fail_on_data_loss:
        raise DataLoss(
            f"raftlog partition {p}: records [{lo}, {hi}) are in neither place: {where} is below "
            f"the compaction floor {floor} on every replica, and {tier.describe()}; start at "
            "earliest, or set failOnDataLoss=false to skip them (what is skipped is logged)"
        )
    log.warning(
        "raftlog partition %d: skipped records [%d, %d): compacted before they were read and "
        "not in the archive %s (failOnDataLoss=false)",
        p,
        lo,
        hi,
        tier.url,
    )


def plan(
    opts: Options, view: PartitionView, start: int, stop: int, where: str
) -> tuple[list[ArchiveSplit], int]:
    """The archive's splits of [start, stop) below the partition's compaction floor, one per
    segment object, and where the nodes' part begins. Without archiveUrl, or from the floor on,
    nothing: the nodes' part begins at `start` (and the source's checks apply to it)."""
    floor = view.floor
    if opts.archive is None or start >= min(floor, stop):
        return [], start
    tier = view.tier if view.tier is not None else attach(opts, view)
    end = min(stop, floor)
    splits: list[ArchiveSplit] = []
    for seg, lo, hi in tier.cover(start, end):
        if seg is None:
            _neither(opts, view.partition, lo, hi, floor, tier, f"{where} {start}")
        else:
            splits.append(ArchiveSplit(view.partition, lo, hi, seg))
    return splits, end


# ====================================================================== reading
def _binary(values: list[bytes | None]) -> tuple[bytes, bytes, bytes]:
    """(offsets int32, data, validity uint8) of nullable byte strings, as a column page has."""
    n = len(values)
    nulls = values.count(None)
    if nulls == n:
        return bytes(4 * (n + 1)), b"", bytes(n)
    if nulls:
        present: list[bytes] = [b"" if v is None else v for v in values]
        valid = bytes(map(is_not, values, repeat(None)))
    else:
        present, valid = cast(list[bytes], values), b"\x01" * n
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, present)))
    return offsets.tobytes(), b"".join(present), valid


def _decode(data: list[bytes]) -> list[Record]:
    """Each record on its own; what is not one becomes a raw row (as the nodes' pages do)."""
    out: list[Record] = []
    for raw in data:
        try:
            r: Record | None = decode_record(raw)
        except msgspec.DecodeError:
            r = None
        if r is None or not INT64_MIN <= r.timestamp_ms <= INT64_MAX:
            r = Record(None, raw, {"raftlog.raw": "true"})
        out.append(r)
    return out


def column_page(
    partition: int, index: array[int], term: array[int], data: list[bytes]
) -> dict[str, Any]:
    """The column page of NORMAL entries, laid out as a node's `GET /columns` page (see
    `raftlog.node.server.columnar`), for `arrow.page_to_batch`."""
    records = _decode(data)
    counts = [len(r.headers) for r in records]
    header_offsets = array("i", [0])
    header_offsets.extend(accumulate(counts))
    hk: list[str] = []
    hv: list[bytes | None] = []
    for r in records:
        if isinstance(r.headers, dict):
            hk.extend(r.headers.keys())
            hv.extend(v.encode() for v in r.headers.values())
        else:
            for k, v in r.headers:
                hk.append(k)
                hv.append(v)
    key_offsets, key_data, key_valid = _binary([r.key for r in records])
    value_offsets, value_data, value_valid = _binary([r.value for r in records])
    hk_offsets, hk_data, _ = _binary([k.encode() for k in hk])
    hv_offsets, hv_data, _ = _binary(hv)
    return {
        "partition": partition,
        "count": len(records),
        "index": index.tobytes(),
        "term": term.tobytes(),
        "timestamp_ms": array("q", [r.timestamp_ms for r in records]).tobytes(),
        "key_offsets": key_offsets,
        "key_data": key_data,
        "key_valid": key_valid,
        "value_offsets": value_offsets,
        "value_data": value_data,
        "value_valid": value_valid,
        "header_offsets": header_offsets.tobytes(),
        "header_key_offsets": hk_offsets,
        "header_key_data": hk_data,
        "header_value_offsets": hv_offsets,
        "header_value_data": hv_data,
    }


def read_piece(
    opts: Options, partition: int, seg: ArchivedSegment, start: int, stop: int
) -> Iterator[pa.RecordBatch]:
    """Records [start, stop) of archived segment `seg`, checked, as Arrow batches of at most
    `pageRecords` rows."""
    a = opts.archive
    assert a is not None
    where = f"raftlog partition {partition}: the archived object {a.url}/{seg.key}"
    raw = get_object(opts, seg.key)
    if raw is None:
        raise RuntimeError(f"{where} named by the manifest is missing")
    try:
        check_object(seg, raw)
        entries = object_entries(seg.key, raw, start, stop)
    except WalCorruption as e:
        raise RuntimeError(f"{where} is damaged: {e}") from None
    if len(entries) != stop - start or (entries and entries[0].index != start):
        got = f"[{entries[0].index}, {entries[-1].index}]" if entries else "none"
        raise RuntimeError(f"{where} does not hold [{start}, {stop}) (its entries: {got})")
    rows = Rows()
    rows.add_entries(entries)
    del raw, entries
    step = opts.page_records
    for at in range(0, len(rows.data), step):
        page = column_page(
            partition, rows.index[at : at + step], rows.term[at : at + step],
            rows.data[at : at + step],
        )  # fmt: skip
        yield arrow.page_to_batch(page, opts.include_headers)


def read_split(opts: Options, split: ArchiveSplit) -> Iterator[pa.RecordBatch]:
    return read_piece(opts, split.partition, split.segment, split.start, split.stop)


@dataclass(frozen=True)
class Compacted:
    """Every replica answered 410 for a node task's next index: the nodes hold it no more."""

    floor: int  # the lowest floor the replicas answered


def read_range(
    opts: Options, partition: int, start: int, stop: int, floor: int
) -> Iterator[pa.RecordBatch]:
    """Records [start, stop) below the floor `floor` read from the archive by a task (its
    manifest read now): a node task's range that compaction passed after planning."""
    tier = load(opts, partition)
    for seg, lo, hi in tier.cover(start, stop):
        if seg is None:
            _neither(opts, partition, lo, hi, floor, tier, f"the planned index {start}")
        else:
            yield from read_piece(opts, partition, seg, lo, hi)
