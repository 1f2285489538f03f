"""The `raftlog` Python data source (Spark 4): batch and streaming reads of committed records.

Planning (on the driver) asks every endpoint for its status and fixes, per raftlog partition, an
index range at or below the high-water mark; the range is cut into splits of at most
`maxRecordsPerSplit` indexes, each read by one Spark task from a follower first (the leader last,
unless `preferFollowers=false`). A task reads its range in column pages (`/columns`) and yields
them as Arrow batches. A stream's offsets are the next index to read per partition (as Kafka's
source), checkpointed by Spark: a restarted query replans the same ranges of the same committed
log, so every record lands exactly once. With `archiveUrl`, what lies below a partition's
compaction floor is read by the tasks straight from the cluster's archive (`archived`).
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from raftlog.client import NO_ANSWER, Client, ClientError
from raftlog.spark import archived, arrow, sink
from raftlog.spark.nodes import (
    ClusterView,
    DataLoss,
    PartitionView,
    client,
    index_for_time,
    rounds,
    survey,
)
from raftlog.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    Options,
    TimeSpec,
    parse,
)

log = logging.getLogger("raftlog.spark")


class LogSplit(InputPartition):
    """Committed records [start, stop) of one raftlog partition, from `replicas` in order."""

    def __init__(self, partition: int, start: int, stop: int, replicas: list[str]) -> None:
        self.partition = partition
        self.start = start
        self.stop = stop
        self.replicas = replicas

    def __repr__(self) -> str:
        return f"LogSplit(p{self.partition} [{self.start}, {self.stop}) from {self.replicas})"


class TableSplit(InputPartition):
    """The keyed table of one raftlog partition as of `stop` - 1 (or a newer snapshot)."""

    def __init__(self, partition: int, stop: int, replicas: list[str]) -> None:
        self.partition = partition
        self.stop = stop
        self.replicas = replicas

    def __repr__(self) -> str:
        return f"TableSplit(p{self.partition} up to {self.stop - 1} from {self.replicas})"


# ====================================================================== planning
def _resolve(spec: OffsetSpec, p: int, view: PartitionView, default: int) -> int:
    """The next index to read for `p` given `earliest`, `latest` or JSON (missing: default)."""
    if spec == "earliest":
        return view.earliest
    if spec == "latest":
        return view.high_water_mark + 1
    assert isinstance(spec, dict)
    v = spec.get(p, default)
    if v == EARLIEST:
        return view.earliest
    if v == LATEST:
        return view.high_water_mark + 1
    return v


def _starting_name(opts: Options) -> str:
    return "startingTimestamp" if isinstance(opts.starting_times, int) else (
        "startingOffsetsByTimestamp")  # fmt: skip


def _check_json_partitions(name: str, spec: OffsetSpec, view: ClusterView) -> None:
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - set(view.partitions))
        if unknown:
            raise OptionError(
                name,
                f"partition {unknown[0]} is not read (the partitions read are "
                f"{sorted(view.partitions)})",
            )


def _at_times(
    nodes: Client,
    view: ClusterView,
    times: TimeSpec,
    option: str,
    *,
    ending: bool,
    latest: bool,
    streaming: bool = False,
) -> dict[int, int]:
    """The offsets of `times`: per partition, the first index stamped at or after its time (as
    Kafka's offsetsForTimes). A time no record reaches ends at the latest offset; it starts
    there only with `latest` (startingOffsetsByTimestampStrategy=latest), else it is an error.
    A batch's offsets stay at or below the planned high-water mark; a stream's start does not
    (records committed since the survey are after it)."""
    per = times if isinstance(times, dict) else dict.fromkeys(view.partitions, times)
    _check_json_partitions(option, per, view)
    out: dict[int, int] = {}
    for p, t in sorted(per.items()):
        pv = view.partitions[p]
        try:
            index, compacted = index_for_time(nodes, pv, t)
        except ClientError as e:
            raise OptionError(option, f"partition {p}: no replica answered ({e})") from None
        if index is None and not (ending or latest):
            raise OptionError(
                option,
                f"partition {p} has no record stamped at or after {t} (up to its high-water "
                f"mark {pv.high_water_mark}); set startingOffsetsByTimestampStrategy=latest to "
                "start such partitions at the latest offset",
            )
        if compacted:
            log.warning(
                "raftlog partition %d: records stamped at or after %d may have been compacted; "
                "%s is the first one still held",
                p,
                t,
                "none" if index is None else index,
            )
        latest_offset = pv.high_water_mark + 1  # what the survey saw
        if index is None:
            out[p] = latest_offset
        else:
            out[p] = index if streaming and not ending else min(index, latest_offset)
    return out


def _data_loss(p: int, start: int, floor: int, where: str) -> DataLoss:
    return DataLoss(
        f"raftlog partition {p}: {where} {start} is below the compaction floor {floor} on every "
        f"replica, so records [{start}, {floor}) are gone; start at earliest, or set "
        "failOnDataLoss=false to skip them (what is skipped is logged)"
    )


def _start_or_skip(opts: Options, view: PartitionView, start: int, where: str) -> int:
    """`start`, or the earliest index the nodes still serve when `start` was compacted (and
    is not in their archive) and `failOnDataLoss=false` (DataLoss otherwise)."""
    served = view.readable_from
    if start >= served:
        return start
    if opts.fail_on_data_loss:
        raise _data_loss(view.partition, start, served, where)
    log.warning(
        "raftlog partition %d: skipped records [%d, %d): compacted before they were read "
        "(failOnDataLoss=false)",
        view.partition,
        start,
        served,
    )
    return served


def plan_range(
    opts: Options, view: PartitionView, start: int, stop: int, first: int, where: str
) -> tuple[list[archived.ArchiveSplit], list[LogSplit]]:
    """The splits of [start, stop): below the compaction floor from the archive (with
    archiveUrl), the rest from the nodes."""
    from_archive, start = archived.plan(opts, view, start, stop, where)
    if opts.archive is not None and start >= stop:  # all of it below the floor
        return from_archive, []
    start = _start_or_skip(opts, view, start, where)
    return from_archive, log_splits(opts, view, start, stop, first) if start < stop else []


def _order(view: PartitionView, opts: Options, stop: int, rotate: int) -> list[str]:
    """Replicas for a range ending at `stop`: those that already have it first."""
    order = view.read_order(opts.prefer_followers, rotate)
    have = {r.url for r in view.replicas if r.high_water_mark >= stop - 1}
    return [u for u in order if u in have] + [u for u in order if u not in have]


def log_splits(
    opts: Options, view: PartitionView, start: int, stop: int, first: int = 0
) -> list[LogSplit]:
    out: list[LogSplit] = []
    for lo in range(start, stop, opts.max_records_per_split):
        hi = min(stop, lo + opts.max_records_per_split)
        out.append(LogSplit(view.partition, lo, hi, _order(view, opts, hi, first + len(out))))
    return out


def spread(splits: list[LogSplit], min_partitions: int | None, others: int = 0) -> list[LogSplit]:
    """`splits` with the largest halved until there are `min_partitions` of them with `others`
    (Kafka's minPartitions), or every split holds one index; in partition and index order.
    Of equal sizes, the lowest partition and index is halved first, as in the JVM reader's
    `Planner.spread`, so both readers cut the same ranges."""
    if not min_partitions or len(splits) + others >= min_partitions:
        return splits
    heap = [(s.start - s.stop, s.partition, s.start, s) for s in splits]  # the largest first
    heapq.heapify(heap)
    while heap and len(heap) + others < min_partitions and heap[0][0] <= -2:
        s = heapq.heappop(heap)[3]
        mid = s.start + (s.stop - s.start) // 2
        for half in (LogSplit(s.partition, s.start, mid, s.replicas),
                     LogSplit(s.partition, mid, s.stop, s.replicas)):  # fmt: skip
            heapq.heappush(heap, (half.start - half.stop, half.partition, half.start, half))
    return sorted((e[3] for e in heap), key=lambda s: (s.partition, s.start))


# ====================================================================== reading
def _fetch(
    nodes: Client, split: LogSplit, at: int, opts: Options, unanswered: set[str] | None = None
) -> tuple[pa.RecordBatch, int] | int | archived.Compacted:
    """The next column page of `split` from `at` (its rows and the next index), the index to
    skip to after data loss, or (with archiveUrl) the floor of replicas that all compacted
    `at`. `unanswered`: replicas that gave no answer earlier in the task (down, or frozen until
    the call's timeout), asked after the others from then on: each page of a split cost a
    frozen replica's whole `timeoutSeconds` before the next was asked. A damaged page (not
    msgpack, or not a page), or 404 `unknown_partition`, is asked of the next replica, as the
    JVM reader does."""
    tries = rounds(opts).start()
    floors: dict[str, int] = {}
    errors: dict[str, str] = {}
    unanswered = set() if unanswered is None else unanswered
    while True:
        order = sorted(split.replicas, key=lambda u: u in unanswered)  # stable: the plan's order
        for url in order:
            if url in floors:
                continue
            try:
                page = nodes.columns(url, split.partition, at, split.stop, opts.page_records)
                batch, nxt = arrow.page_to_batch(page, opts.include_headers), int(page["next"])
            except ClientError as e:
                if e.error == "bad_response":
                    errors[url] = f"{url}: a damaged page: {e.reason}"
                    continue
                if e.status == NO_ANSWER:
                    unanswered.add(url)
                if e.status == 410:
                    floor = int(e.body.get("compaction_floor", at + 1))
                    if floor > at:
                        floors[url] = floor
                    else:  # a floor not yet moved past `at` (an install under way): retry
                        errors[url] = f"{url}: 410 with a floor of {floor} at {at}"
                    continue
                if not e.retryable and e.error != "unknown_partition":
                    # A replica without the partition (recreated with an empty disk, not yet
                    # given its partitions) is one replica's state: another may serve the page.
                    raise RuntimeError(
                        f"raftlog partition {split.partition}: reading [{at}, {split.stop}) "
                        f"failed: {e}"
                    ) from None
                errors[url] = str(e)
                continue
            except (KeyError, TypeError, ValueError, pa.ArrowException) as e:
                errors[url] = f"{url}: a damaged page: {type(e).__name__}: {e}"
                continue
            if nxt > at:
                return batch, nxt
            errors[url] = f"{url}: no progress at {at}"
        if len(floors) == len(split.replicas):
            floor = min(floors.values())
            if opts.archive is not None:
                return archived.Compacted(floor)
            if opts.fail_on_data_loss:
                raise _data_loss(split.partition, at, floor, "the planned index")
            skip_to = min(floor, split.stop)
            log.warning(
                "raftlog partition %d: skipped records [%d, %d): compacted before they were "
                "read (failOnDataLoss=false)",
                split.partition,
                at,
                skip_to,
            )
            return skip_to
        pause = tries.again()
        if pause is None:
            raise TimeoutError(
                f"raftlog partition {split.partition}: no replica served [{at}, {split.stop}) "
                f"within timeoutSeconds={opts.timeout_s}: " + "; ".join(errors.values())
            )
        time.sleep(pause)


def read_log(opts: Options, split: LogSplit) -> Iterator[pa.RecordBatch]:
    nodes = client(opts)
    unanswered: set[str] = set()
    try:
        at = split.start
        while at < split.stop:
            got = _fetch(nodes, split, at, opts, unanswered)
            if isinstance(got, archived.Compacted):  # compacted since planning: the archive's
                below = min(got.floor, split.stop)
                yield from archived.read_range(opts, split.partition, at, below, got.floor)
                at = below
                continue
            if isinstance(got, int):
                at = got
                continue
            batch, at = got
            if batch.num_rows:
                yield batch
    finally:
        nodes.close()


def read_table(opts: Options, split: TableSplit) -> Iterator[pa.RecordBatch]:
    """Snapshot plus tail: a replica's latest snapshot, then the log after it up to the planned
    end, merged to the latest value per key. When a new snapshot compacts the tail meanwhile,
    the read starts over from it (the table is then as of that newer snapshot). Replicas are
    retried with back-off for up to `timeoutSeconds` without an answer (as pages are)."""
    nodes = client(opts)
    strict = Options(**{**opts.__dict__, "fail_on_data_loss": True})
    try:
        last: Exception | None = None
        tries = rounds(opts).start()
        restarts = 0
        while True:
            for i, url in enumerate(split.replicas):
                try:
                    snap = nodes.snapshot_table(url, split.partition)
                except ClientError as e:
                    if not e.retryable:
                        raise RuntimeError(f"raftlog partition {split.partition}: {e}") from None
                    last = e
                    continue
                start = int(snap["snapshot_index"]) + 1
                replicas = split.replicas[i:] + split.replicas[:i]
                tail_split = LogSplit(split.partition, start, split.stop, replicas)
                try:
                    tail = list(read_log(strict, tail_split)) if start < split.stop else []
                except DataLoss as e:  # a newer snapshot replaced the one read: start over
                    restarts += 1
                    if restarts > 5:
                        raise RuntimeError(
                            f"raftlog partition {split.partition}: the table could not be read: "
                            f"compaction passed the snapshot read {restarts} times ({e})"
                        ) from None
                    last = e
                    tries = rounds(opts).start()  # a replica did answer
                    break
                table = arrow.latest_per_key(
                    arrow.snapshot_to_table(snap), pa.Table.from_batches(tail, arrow.ARROW_SCHEMA)
                )
                yield from table.to_batches(max_chunksize=opts.page_records)
                return
            pause = tries.again()
            if pause is None:
                raise TimeoutError(
                    f"raftlog partition {split.partition}: the table could not be read within "
                    f"timeoutSeconds={opts.timeout_s}: {last}"
                )
            time.sleep(pause)
    finally:
        nodes.close()


# ====================================================================== batch
class RaftlogBatchReader(DataSourceReader):
    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        nodes = client(opts)
        try:
            view = survey(nodes, opts)
            starting, ending = opts.starting, opts.ending
            if opts.starting_times is not None:
                starting = _at_times(nodes, view, opts.starting_times, _starting_name(opts),
                                     ending=False, latest=opts.no_match_latest)  # fmt: skip
            if opts.ending_times is not None:
                name = "endingTimestamp" if isinstance(opts.ending_times, int) else (
                    "endingOffsetsByTimestamp")  # fmt: skip
                ending = _at_times(nodes, view, opts.ending_times, name, ending=True, latest=True)
        finally:
            nodes.close()
        _check_json_partitions("startingOffsets", starting, view)
        _check_json_partitions("endingOffsets", ending, view)
        if opts.archive is not None:
            for pv in view.partitions.values():
                archived.attach(opts, pv)  # the archive's first index is the earliest
        out: list[InputPartition] = []
        from_archive: list[archived.ArchiveSplit] = []
        for p, pv in sorted(view.partitions.items()):
            hwm = pv.high_water_mark
            if opts.mode == "table":
                out.append(TableSplit(p, hwm + 1, _order(pv, opts, hwm + 1, p)))
                continue
            start = _resolve(starting, p, pv, pv.earliest)
            stop = _resolve(ending, p, pv, hwm + 1)
            if stop > hwm + 1:
                raise OptionError(
                    "endingOffsets",
                    f"partition {p}: {stop} is past the high-water mark {hwm} (+1); "
                    "only committed records can be read",
                )
            if start > stop:
                raise OptionError(
                    "startingOffsets", f"partition {p}: {start} is after the ending offset {stop}"
                )
            arch, logs = plan_range(opts, pv, start, stop, len(out), "the starting offset")
            from_archive.extend(arch)
            out.extend(logs)
        if any(isinstance(s, TableSplit) for s in out):
            return out
        nodes_part = [s for s in out if isinstance(s, LogSplit)]
        return [*from_archive, *spread(nodes_part, opts.min_partitions, len(from_archive))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, TableSplit):
            return read_table(self.opts, partition)
        if isinstance(partition, LogSplit):
            return read_log(self.opts, partition)
        if isinstance(partition, archived.ArchiveSplit):
            return archived.read_split(self.opts, partition)
        return iter(())  # Spark's placeholder when there is nothing to read


# ====================================================================== streaming
def _offsets(d: dict[int, int]) -> dict[str, int]:
    return {str(p): v for p, v in sorted(d.items())}


def _parse_offsets(d: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(v) for p, v in d.items()}


def allot(start: dict[int, int], end: dict[int, int], budget: int) -> dict[int, int]:
    """`end` cut back so that at most `budget` records are read, shared in proportion to what
    each partition has available (every partition with records moves when the budget allows)."""
    avail = {p: max(0, end[p] - start.get(p, end[p])) for p in end}
    total = sum(avail.values())
    if total <= budget:
        return dict(end)
    take = {p: a * budget // total for p, a in avail.items()}
    left = budget - sum(take.values())
    for p in sorted(avail):
        if left <= 0:
            break
        if take[p] < avail[p]:
            take[p] += 1
            left -= 1
    return {p: start.get(p, end[p]) + take[p] for p in end}


@dataclass
class _Holds:
    placed_at: float = 0.0
    offsets: dict[int, int] | None = None


class RaftlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._view: ClusterView | None = None
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow's end
        self._holds = _Holds()
        self._last_batch_at = -math.inf  # the first batch never waits for minOffsetsPerTrigger
        self._latest: dict[int, int] | None = None
        # The hold is renewed between triggers too: a micro-batch longer than its TTL (a first
        # batch from the earliest record, an AvailableNow backfill, an hourly trigger) would
        # otherwise let compaction pass what it has not read yet.
        self._hold_lock = threading.Lock()
        self._stopped = threading.Event()
        self._renewer: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Only the options travel to the executors' `read`.
        return {"opts": self.opts, "_view": None, "_target": None, "_holds": _Holds(),
                "_last_batch_at": -math.inf, "_latest": None, "_hold_lock": None,
                "_stopped": None, "_renewer": None}  # fmt: skip

    def stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    def _renew(self) -> None:
        """The driver's renewal of the hold every quarter of its TTL, until `stop`."""
        while not self._stopped.wait(self.opts.retention_hold_ttl_s / 4):
            try:
                self._hold({})  # placed again once a quarter of the TTL has passed
            except Exception as e:  # a refusal: the next trigger's `_hold` raises it too
                log.error("retention hold %s not renewed: %s", self.opts.retention_hold, e)

    def _survey(self) -> ClusterView:
        nodes = client(self.opts)
        try:
            self._view = survey(nodes, self.opts)
        finally:
            nodes.close()
        return self._view

    def initialOffset(self) -> dict[str, int]:
        view = self._survey()
        if self.opts.archive is not None:
            for pv in view.partitions.values():
                archived.attach(self.opts, pv)  # the archive's first index is the earliest
        starting = self.opts.starting
        if self.opts.starting_times is not None:
            nodes = client(self.opts)
            try:
                starting = _at_times(nodes, view, self.opts.starting_times,
                                     _starting_name(self.opts), ending=False,
                                     latest=self.opts.no_match_latest, streaming=True)  # fmt: skip
            finally:
                nodes.close()
        _check_json_partitions("startingOffsets", starting, view)
        start = {
            p: _resolve(starting, p, pv, pv.high_water_mark + 1)
            for p, pv in view.partitions.items()
        }
        self._hold(start)
        return _offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        # minOffsetsPerTrigger is applied here from the options: Spark's Python sources take
        # one limit, not Kafka's composite of both.
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, int] | None:
        return _offsets(self._latest) if self._latest is not None else None

    def _too_few(self, begin: dict[int, int], end: dict[int, int]) -> bool:
        """Whether to wait for minOffsetsPerTrigger (never past maxTriggerDelay, nor when
        Trigger.AvailableNow reads to a fixed end)."""
        least = self.opts.min_offsets_per_trigger
        if least is None or self._target is not None:
            return False
        if time.monotonic() - self._last_batch_at >= self.opts.max_trigger_delay_s:
            return False
        return sum(end[p] - begin[p] for p in end) < least

    def prepareForTriggerAvailableNow(self) -> None:
        view = self._survey()
        self._target = {p: pv.high_water_mark + 1 for p, pv in view.partitions.items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        view = self._survey()
        begin = _parse_offsets(start)
        end = {p: pv.high_water_mark + 1 for p, pv in view.partitions.items()}
        self._latest = dict(end)
        if self._target is not None:
            end = {p: min(v, self._target.get(p, v)) for p, v in end.items()}
        # A partition new to the query starts at its earliest record (as Kafka's source does).
        for p, pv in view.partitions.items():
            begin.setdefault(p, pv.earliest)
        end = {p: max(v, begin[p]) for p, v in end.items()}
        # A partition this survey missed (its only members silent) stays where it is: left out
        # of the offset, the next trigger took it for new and read it again from its earliest.
        for p, at in begin.items():
            end.setdefault(p, at)
        # `start` is where the previous micro-batch ended, and Spark asks for the next one only
        # once that batch is committed: the hold moves up to it (commit() would only be told
        # with the batch after), is placed from the checkpoint on for a restarted query, and is
        # renewed while the stream idles.
        self._hold(begin)
        if self._too_few(begin, end):
            return dict(start)  # the same offset as `start`: no batch this trigger
        if isinstance(limit, ReadMaxRows):
            end = allot(begin, end, limit.max_rows)
        if end != {p: begin[p] for p in end}:
            self._last_batch_at = time.monotonic()
        return _offsets(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        view = self._view or self._survey()
        begin, stop = _parse_offsets(start), _parse_offsets(end)
        out: list[LogSplit] = []
        from_archive: list[archived.ArchiveSplit] = []
        for p, hi in sorted(stop.items()):
            pv = view.partitions.get(p)
            lo = begin.get(p, pv.earliest if pv else hi)
            if pv is None or hi <= lo:
                continue
            arch, logs = plan_range(self.opts, pv, lo, hi, len(out), "the checkpointed offset")
            from_archive.extend(arch)
            out.extend(logs)
        return [*from_archive, *spread(out, self.opts.min_partitions, len(from_archive))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, archived.ArchiveSplit):
            return archived.read_split(self.opts, partition)
        assert isinstance(partition, LogSplit)
        return read_log(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._hold(_parse_offsets(end))

    def _hold(self, offsets: dict[int, int]) -> None:
        """Move the retention hold up to `offsets` on every replica (never down: a stream
        does not go back), or renew it when a quarter of its TTL has passed. A replica that
        refuses it (token, request) stops the stream; one that cannot be reached now is
        logged, and asked again when the hold moves or is
        renewed."""
        holder = self.opts.retention_hold
        if holder is None:
            return
        if self._renewer is None:
            self._renewer = threading.Thread(
                target=self._renew, name=f"raftlog-hold-{holder}", daemon=True
            )
            self._renewer.start()
        with self._hold_lock:
            self._place(holder, offsets)

    def _place(self, holder: str, offsets: dict[int, int]) -> None:
        held = self._holds.offsets or {}
        merged = {**held, **{p: max(i, held.get(p, i)) for p, i in offsets.items()}}
        fresh = time.monotonic() - self._holds.placed_at < self.opts.retention_hold_ttl_s / 4
        if merged == held and fresh:
            return
        placed_at = time.monotonic()
        offsets = merged
        view = self._view or self._survey()
        nodes = client(self.opts)
        try:
            for p, index in sorted(offsets.items()):
                pv = view.partitions.get(p)
                for r in pv.replicas if pv else []:
                    try:
                        nodes.set_hold(r.url, p, holder, index, self.opts.retention_hold_ttl_s)
                    except ClientError as e:
                        if not e.retryable and e.status != 410:
                            # A refusal (no or a wrong token, a bad request) is not passing:
                            # without the hold, compaction could pass what is not read yet.
                            # (410: already compacted; the read reports that as data loss.)
                            raise RuntimeError(
                                f"raftlog option 'retentionHold': the hold {holder!r} on "
                                f"partition {p} was refused: {e}"
                            ) from None
                        log.warning("retention hold %s on partition %d: %s", holder, p, e)
        finally:
            nodes.close()
        # Only once no replica refused it: a refusal taken for placed (by the renewal thread,
        # which can only log it) was never raised, and the stream ran on without its hold.
        self._holds = _Holds(placed_at, merged)


# ====================================================================== the source
class RaftlogDataSource(DataSource):
    """`spark.read.format("raftlog")` / `spark.readStream.format("raftlog")`, and
    `df.write.format("raftlog")` / `writeStream.format("raftlog")` (`raftlog.spark.sink`)."""

    @classmethod
    def name(cls) -> str:
        return "raftlog"

    def schema(self) -> StructType:
        # A bad value is refused when the options are parsed, naming it.
        include = {str(k).lower(): v for k, v in self.options.items()}.get("includeheaders", "")
        return arrow.schema(str(include).strip().lower() in ("true", "1", "yes"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftlogBatchReader(parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RaftlogStreamReader(parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _appends_only(overwrite)
        return sink.writer(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _appends_only(overwrite)
        return sink.stream_writer(self.options, schema)


def _appends_only(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("mode", "a raftlog log is appended to, never overwritten: use append")
