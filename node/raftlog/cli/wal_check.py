"""`raftctl wal check PATH [--repair]`: a WAL's health, read-only unless repair is asked for.

PATH is a partition directory (with `wal/`, `snap/`, `hardstate`), a `wal/` directory itself, or
any directory above them (a node's data directory): every WAL found below it is checked, and
the node's journal (`journal/`, shared by its partitions) too; a WAL's damage after the
journal's last checkpoint is a tail the journal replays, as the node treats it.
Exit status: 0 healthy (a torn tail, which the node cuts by itself on start, counts as healthy),
1 corrupted (the node refuses to start), 2 nothing to check.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from raftlog.node.storage.errors import WalCorruption
from raftlog.node.storage.journal import Found, list_journal, lost_partitions, read_journal
from raftlog.node.storage.recovery import WalAnalysis, analyze_wal, list_segments
from raftlog.node.storage.wal import Wal
from raftlog.node.storage.wal_report import check_partition


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help="report a WAL's health; --repair cuts it at the damage")
    p.add_argument("path", help="partition, wal or data directory")
    p.add_argument(
        "--repair",
        action="store_true",
        help="cut a corrupted WAL at the damage (after printing what that drops)",
    )
    p.add_argument("--yes", action="store_true", help="do not ask before repairing")
    p.set_defaults(run=run)


def find_wal_dirs(path: str) -> list[str]:
    found = []
    for root, dirs, _files in os.walk(path):
        dirs.sort()
        if list_segments(root):
            found.append(root)
    return found


def _files_for_directories(path: str) -> list[tuple[str, str]]:
    """Files where a node keeps its journal's directory (beside its `p<N>` partitions) or a
    partition its WAL's, which `find_wal_dirs` and `find_journals` pass over: (path, what)."""
    found = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        partition = re.fullmatch(r"p\d+", os.path.basename(root)) is not None
        if "wal" in files and partition:
            found.append((os.path.join(root, "wal"), "a WAL's"))
        if "journal" in files and any(re.fullmatch(r"p\d+", d) for d in dirs):
            found.append((os.path.join(root, "journal"), "the journal's"))
    return found


def find_journals(path: str) -> list[str]:
    """The journals below `path`, and that of the node `path` is a partition or WAL of."""
    found = []
    for root, dirs, _files in os.walk(path):
        dirs.sort()
        if os.path.basename(root) == "journal" and list_journal(root):
            found.append(root)
    up = os.path.normpath(path)
    for _ in range(2):
        up = os.path.dirname(up)
        if list_journal(os.path.join(up, "journal")):
            found.append(os.path.join(up, "journal"))
    return found


def check_journals(path: str) -> tuple[dict[str, Found], int]:
    """Each journal `find_journals` finds, printed, by its node's data directory; and the exit
    status (1: one is corrupted)."""
    found: dict[str, Found] = {}
    status = 0
    for root in find_journals(path):
        try:
            j = read_journal(root)
        except WalCorruption as e:
            print(f"journal {root}\n  status      CORRUPTED: {e.reason} in {e.path} at {e.offset}")
            status = 1
            continue
        except OSError as e:
            print(f"journal {root}\n  status      CORRUPTED: unreadable ({e})")
            status = 1
            continue
        found[os.path.dirname(root)] = j
        records = sum(len(ops) for ops in j.ops.values())
        print(f"journal {root}")
        print(f"  segments    {len(j.segments)}, replay from checkpoint {j.start}")
        print(f"  to replay   {records} records of {len(j.ops)} partitions")
        for msg in j.repairs:
            print(f"  repair      {msg}")
        lost = lost_partitions(os.path.dirname(root), j)
        for p, last in lost.items():
            held = f"up to {last} at the checkpoint" if last else "written since the checkpoint"
            print(f"  LOST        partition {p}: p{p}/ is missing; it held entries ({held})")
        if lost:
            print("  status      CORRUPTED: the node refuses to start")
            status = 1
        else:
            print("  status      healthy")
    return found, status


def _journal_of(d: str, journals: dict[str, Found]) -> tuple[Found, int] | None:
    """The journal of the partition whose WAL is `d`, and the partition, if any."""
    partition = os.path.dirname(os.path.normpath(d))
    j = journals.get(os.path.dirname(partition))
    name = os.path.basename(partition)
    if j is None or not name[1:].isdigit():
        return None
    return j, int(name[1:])


def repair_plan(a: WalAnalysis) -> list[str]:
    """What `--repair` drops, one line per file."""
    c = a.corruption
    assert c is not None
    plan = []
    size = os.path.getsize(c.path)
    first_lost = c.index if c.index is not None else "?"
    plan.append(
        f"truncate {c.path} at offset {c.offset}: drops {size - c.offset} bytes, "
        f"the entries from index {first_lost} on in that file"
    )
    for name in a.unreadable_after:
        full = os.path.join(a.path, name)
        plan.append(f"delete {full}: {os.path.getsize(full)} bytes after the damage")
    committed = (
        f"entries up to {a.commit} at least were committed"
        if a.commit
        else ("the commit index recorded after the damage is unreadable")
    )
    plan.append(
        f"WARNING: {committed}; entries this node acknowledged may be among those dropped. "
        "In a cluster, prefer replacing the member (empty data, rejoin as a learner)"
    )
    return plan


def repair(a: WalAnalysis) -> None:
    c = a.corruption
    assert c is not None
    for name in a.unreadable_after:
        os.unlink(os.path.join(a.path, name))
    if c.offset == 0:
        os.unlink(c.path)  # nothing of it is usable (a damaged header or a broken chain)
    else:
        with open(c.path, "r+b") as f:
            f.truncate(c.offset)
            os.fsync(f.fileno())
    Wal.open(a.path).close()  # applies the safe repairs and proves the WAL opens


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.path):
        why = "not a directory" if os.path.exists(args.path) else "no such directory"
        print(f"raftctl wal check: {args.path}: {why}", file=sys.stderr)
        return 2
    dirs = find_wal_dirs(args.path)
    # The journal first: a node's only partition directory lost leaves no WAL, but the journal
    # says what it held (LOST, exit 1), which "nothing found" (exit 2) would hide.
    journals, status = check_journals(args.path)
    for path, what in _files_for_directories(args.path):
        print(f"{path}\n  status      CORRUPTED: a file where {what} directory belongs")
        print("              the node refuses to start on it")
        status = 1
    if not dirs:
        if journals or status:
            return status
        print(f"raftctl wal check: no WAL segments under {args.path}", file=sys.stderr)
        return 2
    for d in dirs:
        try:
            found = _journal_of(d, journals)
            j, p = found if found is not None else (Found(), -1)
            a = analyze_wal(d, j.trusted.get(p))
        except OSError as e:  # a segment replaced by a directory, unreadable, ...
            print(f"WAL {d}\n  status      CORRUPTED: unreadable ({e})")
            status = 1
            continue
        report = check_partition(a, j.ops.get(p, []), j.committed.get(p, 0))
        print("\n".join(report.lines))
        if a.corruption is None:
            if not report.healthy:
                status = 1  # the hard state or snapshot: nothing --repair could cut
            continue
        if not args.repair:
            status = 1
            continue
        plan = repair_plan(a)
        print("  repair plan:")
        for line in plan:
            print(f"    {line}")
        if not args.yes and not _confirm():
            print("  not repaired")
            status = 1
            continue
        repair(a)
        print("  repaired: the WAL opens cleanly")
    return status


def _confirm() -> bool:
    if not sys.stdin.isatty():
        print("  refusing to repair without a terminal to confirm on; pass --yes", file=sys.stderr)
        return False
    return input("  type 'repair' to proceed: ").strip() == "repair"
