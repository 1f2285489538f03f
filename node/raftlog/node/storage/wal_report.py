"""A readable health report of a WAL: what `raftctl wal check` prints and the demo shows."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from raftlog.node.core.types import EntryKind
from raftlog.node.storage.errors import CorruptFile
from raftlog.node.storage.hardstate import HardStateFile
from raftlog.node.storage.journal import Op, commit_past_log
from raftlog.node.storage.recovery import WalAnalysis
from raftlog.node.storage.segment import T_ENTRY
from raftlog.node.storage.snapshots import SnapshotStore


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


class Report(NamedTuple):
    lines: list[str]
    healthy: bool  # False: the node refuses to start on what it found


def wal_report(a: WalAnalysis) -> list[str]:
    """A readable health report of one WAL (and its partition's hard state and snapshot)."""
    return check_partition(a).lines


def check_partition(a: WalAnalysis, journal: Sequence[Op] = (), committed: int = 0) -> Report:
    """`wal_report`'s lines, and whether the node would start on them: the WAL, and beside it
    the hard state and the snapshot, judged as the node judges them when it opens (with the
    node's `journal` records of this partition since its checkpoint and its commit index at
    that checkpoint, if any)."""
    out: list[str] = []
    out.append(f"WAL {a.path}")
    segs = a.segments
    total = sum(s.scan.size for s in segs)
    used = sum(s.scan.valid_end for s in segs)
    # The last segment is allocated at full size before it fills (see `prealloc.py`).
    filled = f" ({_size(used)} of records)" if used != total else ""
    out.append(f"  segments    {len(segs)} readable, {_size(total)}{filled}")
    if segs:
        first, last = segs[0].first_index, segs[-1].last_index
        entries = sum(s.entries for s in segs)
        configs = sum(
            1
            for s in segs
            for r in s.scan.records
            if r.kind == T_ENTRY and r.entry_kind == EntryKind.CONFIG
        )
        out.append(
            f"  entries     {first}..{last} ({entries} entries, {configs} membership), "
            f"commit record {a.commit}"
        )
    problems: list[str] = []
    partition = os.path.dirname(a.path.rstrip("/"))
    if os.path.basename(a.path.rstrip("/")) == "wal":
        span = (segs[0].first_index, segs[-1].last_index) if segs else None
        problems = _partition_report(partition, out, span)
    lost = commit_past_log(segs[-1].last_index, journal, committed) if segs else None
    if lost is not None:  # as `DurableStorage._replay` refuses it
        problems.append(lost.reason)
    for repair in a.repairs():
        out.append(f"  on start    will {repair}")
    if a.corruption is not None:
        c = a.corruption
        out.append(f"  status      CORRUPTED: {c.reason}")
        where = f"{c.path} at offset {c.offset}"
        if c.index is not None:
            where += f" (log index {c.index})"
        out.append(f"              in {where}")
        out.append("              the node refuses to start on it; see --repair")
    elif problems:
        out.append(f"  status      CORRUPTED: {problems[0]}")
        out.extend(f"              and {p}" for p in problems[1:])
        out.append("              the node refuses to start on it")
    else:
        out.append("  status      OK")
    return Report(out, a.corruption is None and not problems)


def _partition_report(partition: str, out: list[str], span: tuple[int, int] | None) -> list[str]:
    """The hard state and snapshot lines; what in them the node would refuse to start on.
    `span`: the first and last index of the WAL's segments."""
    problems = []
    hs: HardStateFile | None = None
    try:
        hs = HardStateFile(os.path.join(partition, "hardstate"))
        out.append(
            f"  hard state  term {hs.term}, vote {hs.vote}" if hs.on_disk else "  hard state  none"
        )
    except (CorruptFile, OSError) as e:
        reason = e.reason if isinstance(e, CorruptFile) else f"unreadable ({e})"
        out.append(f"  hard state  INVALID: {reason}")
        problems.append(f"the hard state is invalid: {reason}")
    snap_dir = os.path.join(partition, "snap")
    covered = 0
    if os.path.isdir(snap_dir):
        try:
            meta = SnapshotStore.peek(snap_dir)
            if meta is not None:
                covered = meta.index
                out.append(
                    f"  snapshot    index {meta.index}, term {meta.term}, "
                    f"{meta.membership.describe()}"
                )
        except (CorruptFile, OSError) as e:
            reason = e.reason if isinstance(e, CorruptFile) else f"unreadable ({e})"
            out.append(f"  snapshot    INVALID: {reason}")
            problems.append(f"the snapshot is invalid: {reason}")
    if span is not None and span[0] - 1 > covered and not problems:
        problems.append(
            f"the WAL starts at {span[0]} but the snapshot covers only up to {covered}: "
            f"entries {covered + 1}..{span[0] - 1} are missing"
        )
    partition_files = os.path.isdir(snap_dir)  # not a bare WAL copied out of its partition
    if hs is not None and partition_files and span and hs.lost_beside(span[1], covered):
        problems.append(  # as `DurableStorage._reconcile_term` refuses it
            f"the hard state is missing while the WAL holds entries up to {span[1]}: this "
            "member's term and vote are lost"
        )
    return problems
