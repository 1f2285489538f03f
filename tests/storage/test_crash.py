"""SIGKILL at random moments while a real process appends, then recovery and a full audit.

Each seed runs many kill/restart iterations on one directory (CRASH_ITERATIONS), with one
partition whose WAL syncs itself, or with three partitions sharing the node's journal. With the
journal, half the kills are also a power loss: what each WAL wrote after the journal's last
checkpoint is cut from its active segment (never synced there; the journal must replay it).
After every kill the directory is reopened and checked, each partition:
- every acknowledged entry is present at its index with its term and byte-identical payload, or
  (below the compaction floor) covered by the snapshot;
- the recovered commit index covers every acknowledged entry and never passes the durable log;
- every entry an earlier audit found committed is still there with its term (or under the
  snapshot); the commit index never goes back after a plain SIGKILL, and after a power loss only
  as far as what was synced (see `audit`);
- the log is consistent: contiguous, terms never decrease, every record is whole;
- the keyed table (snapshot plus the log up to the commit index) equals the table computed
  independently from the acknowledged history.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
from tests.storage import crash_child
from tests.storage.crash_child import expected_record, open_partitions

from raftlog.node.core.types import EntryKind
from raftlog.node.record import decode_record
from raftlog.node.statemachine import KeyedTable
from raftlog.node.storage import segment as fmt
from raftlog.node.storage.durable import DurableStorage
from raftlog.node.storage.journal import read_journal
from raftlog.node.storage.recovery import analyze_wal

pytestmark = [pytest.mark.crash, pytest.mark.slow]

ITERATIONS = int(os.environ.get("CRASH_ITERATIONS", "50"))

# Children are forked from a server that imported crash_child once: a fresh interpreter spent
# about 0.3 s of CPU per iteration on imports (pydantic's models), 200 iterations a run, and the
# kills meant for recovery landed in them instead.
FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["tests.storage.crash_child"])


def child_main(path: str, seed: int, mode: str, out: str, err: str) -> None:
    """In the forked child: stdout and stderr to the test's files (by descriptor, so what the
    child wrote is in them whatever Python buffered when it was killed), then the run."""
    for fd, name in ((1, out), (2, err)):
        f = os.open(name, os.O_WRONLY | os.O_APPEND)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the process's own stdout)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    asyncio.run(crash_child.run(path, seed, mode))


def start_child(path: Path, seed: int, out: Path, mode: str) -> BaseProcess:
    err = out.with_suffix(".err")
    out.write_bytes(b"")  # there, even when the child is killed before it opens them
    err.write_bytes(b"")
    child = FORKS.Process(
        target=child_main, args=(str(path), seed, mode, str(out), str(err)), daemon=True
    )
    child.start()
    return child


def errors_of(out: Path) -> str:
    return out.with_suffix(".err").read_text()[-3000:]


def lose_unsynced_wal_tails(path: Path) -> int:
    """A power loss as the partitions' WALs see it: each active segment loses the entries after
    the journal's last complete checkpoint (written to the page cache only; sealed segments
    were synced when sealed). Returns how many entries were cut."""
    trusted = read_journal(str(path / "journal")).trusted
    cut = 0
    for p, last in trusted.items():
        wal = analyze_wal(str(path / f"p{p}" / "wal"))
        seg = wal.segments[-1]
        drop = [r for r in seg.scan.records if r.kind == fmt.T_ENTRY and r.index > last]
        if drop:
            with open(seg.path, "r+b") as f:
                f.truncate(drop[0].offset)
            cut += len(drop)
    return cut


def complete_lines(out: Path) -> list[str]:
    text = out.read_text()
    return text.split("\n")[:-1]  # a line cut by the kill has no newline yet


class History:
    """What the audits of one partition found, which later audits must still find."""

    def __init__(self) -> None:
        self.committed: dict[int, tuple[int, int]] = {}  # (term, kind) of entries found committed
        self.commit = 0  # the commit index the last audit recovered
        self.synced = 0  # a commit index known synced, which a power loss keeps
        # The keyed table computed from the history, extended as the commit grows.
        self.rows: dict[bytes, bytes] = {}
        self.upto = 0

    def table_at(self, commit: int, kind_of: dict[int, int]) -> dict[bytes, bytes]:
        if commit < self.upto:  # the commit index stepped back (see `audit`): count again
            self.rows, self.upto = {}, 0
        for index in range(self.upto + 1, commit + 1):
            assert index in kind_of, f"{index} is committed, but neither held nor acknowledged"
            if kind_of[index] == EntryKind.NORMAL:
                rec = decode_record(expected_record(index))
                assert rec.key is not None
                if rec.value is None:
                    self.rows.pop(rec.key, None)
                else:
                    self.rows[rec.key] = rec.value
        self.upto = commit
        return self.rows


def audit_all(
    path: Path,
    mode: str,
    acked: dict[int, dict[int, tuple[int, int]]],
    history: dict[int, History],
    repairs: Counter[str],
    power_loss: bool,
) -> dict[int, dict[str, int]]:
    storages, journal = open_partitions(str(path), mode)
    try:
        return {
            p: audit(s, acked.setdefault(p, {}), history.setdefault(p, History()), power_loss)
            for p, s in storages.items()
        }
    finally:
        for s in storages.values():
            # What recovery had to do, by kind ("truncated a torn tail of ...", "replayed").
            pattern = r"[0-9a-f]{16}-[0-9a-f]{16}\.wal|\d+"
            repairs.update(re.sub(pattern, "N", r) for r in s.recovery)
            s.close()
        if journal is not None:
            journal.close()


def audit(
    s: DurableStorage, acked: dict[int, tuple[int, int]], seen: History, power_loss: bool
) -> dict[str, int]:
    if True:
        hs, snap = s.initial_state()
        first, last, commit = s.first_index(), s.last_index(), hs.commit
        log = s.entries(first, last + 1) if last >= first else []
        for prev, e in itertools.pairwise(log):
            assert e.index == prev.index + 1 and e.term >= prev.term, f"log order at {e.index}"
        assert snap.index <= commit <= last, (snap.index, commit, last)
        by_index = {e.index: e for e in log}
        top = max(acked, default=0)
        assert commit >= top, f"acknowledged {top} but recovered commit index is {commit}"
        for index, (term, kind) in acked.items():
            if index >= first:
                e = by_index[index]
                assert (e.term, int(e.kind)) == (term, kind), f"entry {index} changed"
                if e.kind == EntryKind.NORMAL:
                    assert e.data == expected_record(index), f"entry {index} bytes differ"
            else:
                assert index <= snap.index, f"acked {index} is below the floor {first} and snapshot"
        for e in log:
            if e.kind == EntryKind.NORMAL:
                assert e.data == expected_record(e.index), f"entry {e.index} is not whole"
        # What is promised of committed entries and the commit index. Each partition here is
        # a leader, which commits only entries already synced: the entries under any commit
        # record it wrote are durable and never change, so an entry once found committed
        # stays. The commit record is durable only once a later sync completes; a kill before
        # that leaves it in the WAL's page cache alone, where the next open (this audit) reads
        # it but a power loss may drop it. Raft allows that (the leader commits the entries
        # again), so after a power loss the commit index may go back, though never below what
        # was synced; after a plain SIGKILL the page cache keeps everything: it never goes back.
        for index, (term, kind) in seen.committed.items():
            if index >= first:
                now = by_index.get(index)
                assert now is not None and (now.term, int(now.kind)) == (term, kind), (
                    f"entry {index} was committed, and is now {now}"
                )
            else:
                assert index <= snap.index, f"committed {index} is below the floor {first}"
        if power_loss:
            assert commit >= seen.synced, f"the commit index went back past {seen.synced}, synced"
        else:
            assert commit >= seen.commit, f"a SIGKILL took the commit index back from {seen.commit}"
        seen.commit = commit
        seen.committed.update((e.index, (e.term, int(e.kind))) for e in log if e.index <= commit)
        # The keyed table, from the snapshot and the log, against the acknowledged history.
        table = KeyedTable.restore(s.snapshot_data())
        assert table.applied_index == snap.index
        for e in log:
            if snap.index < e.index <= commit:
                table.apply(e)
        kinds = {i: kind for i, (_, kind) in acked.items()}
        kinds.update((i, kind) for i, (_, kind) in seen.committed.items())
        kinds.update((e.index, int(e.kind)) for e in log)
        assert table.rows == seen.table_at(commit, kinds)
        return {
            "commit": commit,
            "first": first,
            "snapshot": snap.index,
        }


@pytest.mark.parametrize(("mode", "seed"), [("wal", 1), ("wal", 2), ("journal", 1), ("journal", 2)])
def test_sigkill_while_appending_loses_nothing_acknowledged(tmp_path, mode, seed):
    rng = random.Random(seed)
    data = tmp_path / "node"
    acked: dict[int, dict[int, tuple[int, int]]] = {}
    history: dict[int, History] = {}
    kills = during_startup = power_losses = cut = 0
    repairs: Counter[str] = Counter()
    last: dict[int, dict[str, int]] = {}
    for it in range(ITERATIONS):
        out = tmp_path / f"out{it}.txt"
        child = start_child(data, seed * 1000 + it, out, mode)
        if rng.random() < 0.15:  # sometimes kill it during recovery and election
            time.sleep(rng.uniform(0.0, 0.4))
            during_startup += 1
        else:
            deadline = time.monotonic() + 60
            # "ready" is not always the first line: acks of entries committed on election
            # (the new leader's no-op, earlier runs' tail) may be printed before it.
            while "ready " not in out.read_text():
                assert child.is_alive(), f"exit code {child.exitcode}: {errors_of(out)}"
                if time.monotonic() > deadline:
                    child.kill()
                    child.join()
                    raise AssertionError(
                        f"iteration {it}: the child never became leader; it printed "
                        f"{out.read_text()[:500]!r}; stderr: {errors_of(out)}"
                    )
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.5))
        child.kill()  # SIGKILL
        child.join()
        kills += 1
        assert child.exitcode == -signal.SIGKILL, f"exit code {child.exitcode}: {errors_of(out)}"
        child.close()
        for line in complete_lines(out):
            if line.startswith("ack "):
                _, p, index, term, kind = line.split()
                mine = acked.setdefault(int(p), {})
                prior = mine.get(int(index))
                assert prior is None or prior == (int(term), int(kind)), f"p{p} {index} re-acked"
                mine[int(index)] = (int(term), int(kind))
        if mode == "journal" and "ready " in out.read_text():
            # Past `Journal.start`, which synced every WAL: what the last audit found is durable.
            for h in history.values():
                h.synced = max(h.synced, h.commit)
        power_loss = mode == "journal" and rng.random() < 0.5 and (data / "journal").exists()
        if power_loss:
            power_losses += 1
            cut += lose_unsynced_wal_tails(data)
        last = audit_all(data, mode, acked, history, repairs, power_loss)
    total = sum(len(a) for a in acked.values())
    print(
        f"{mode} seed {seed}: {kills} SIGKILLs ({during_startup} during startup, "
        f"{power_losses} also power losses cutting {cut} WAL entries), {total} acknowledged "
        f"entries audited, final {last}, recovery repairs: {dict(repairs) or 'none'}"
    )
    assert total > ITERATIONS * 20, "the child appended too little to test anything"
    for part, figures in last.items():
        assert figures["first"] > 1 and figures["snapshot"] > 0, f"p{part}: snapshots, compaction"
    if mode == "journal":
        assert len(last) == 3 and all(len(acked.get(part, {})) > 0 for part in last)
        assert power_losses > 0 and cut > 0, "the power losses cut something to replay"
        assert any("replayed" in r for r in repairs), "recovery replayed the journal"
