"""Durable storage of one partition: WAL + hard state + snapshots + retention holds.

It implements the same `WritableStorage` protocol as the simulator's in-memory storage. Layout of
a partition directory:

    wal/         segments (see `wal.py`)
    snap/        the latest snapshot (see `snapshots.py`)
    hardstate    term and vote
    holds.json   retention holds

Opening it recovers from a crash at any instant: a torn WAL tail is cut, an interrupted snapshot
install is finished, and any other damage refuses to open with an error naming file and offset.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable

from raftlog.node.core.errors import Compacted, SafetyViolation
from raftlog.node.core.types import Entry, HardState, Membership, SnapshotMeta
from raftlog.node.storage.errors import LostFile, StorageFailed, WalCorruption
from raftlog.node.storage.fileio import FileOps
from raftlog.node.storage.hardstate import HardStateFile
from raftlog.node.storage.holds import Hold, RetentionHolds, check_hold
from raftlog.node.storage.journal import PartitionJournal, commit_past_log, replay_into
from raftlog.node.storage.segment import RawRange
from raftlog.node.storage.snapshots import SnapshotReceiver, SnapshotStore
from raftlog.node.storage.wal import DEFAULT_SEGMENT_BYTES, Wal

log = logging.getLogger("raftlog.storage")
_NO_SNAPSHOT = SnapshotMeta(0, 0, Membership())  # a member not yet part of any configuration
# Bytes a partition's WAL holds before writing them, with the journal (`Wal.write_behind`).
WRITE_BEHIND_BYTES = 32 * 1024


class DurableStorage:
    def __init__(
        self,
        path: str,
        *,
        bootstrap: Membership | None = None,
        durable: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        ops: FileOps | None = None,
        clock: Callable[[], float] = time.time,
        journal: PartitionJournal | None = None,
    ) -> None:
        """Open (or create) the partition in `path`.

        `bootstrap` is the initial membership of a brand-new partition (recorded as the
        snapshot at index 0); it is ignored when the partition already exists.
        `durable=False` skips every fsync: for tests and benchmarks only, and logged.
        `journal`: the node's shared log (`journal.py`) makes this partition's writes durable,
        and its records since the last checkpoint are replayed here first; without one, the
        WAL syncs itself.
        """
        self.path = path
        self.durable = durable
        self.journal = journal
        self.ops = ops or FileOps()
        if not durable:
            log.warning(
                "%s: durability is OFF (fsync skipped): a machine crash can lose acknowledged "
                "entries; use only for tests and benchmarks",
                path,
            )
        if bootstrap is not None and not os.path.isdir(path):
            self._create(path, bootstrap)
        os.makedirs(path, exist_ok=True)
        self.snapshots = SnapshotStore(os.path.join(path, "snap"), durable=durable, ops=self.ops)
        if self.snapshots.meta is None and bootstrap is not None:
            # A new partition's initial members, recorded as the snapshot at index 0. Without a
            # bootstrap (a member waiting to join, or a tool inspecting the directory) nothing
            # is written: opening must never decide a partition's membership by accident.
            self.snapshots.save(SnapshotMeta(0, 0, bootstrap), b"")
        snap = self.snapshot_meta()
        self.hard = HardStateFile(os.path.join(path, "hardstate"), durable=durable, ops=self.ops)
        self.holds = RetentionHolds(
            os.path.join(path, "holds.json"), durable=durable, ops=self.ops, clock=clock
        )
        self.wal = Wal.open(
            os.path.join(path, "wal"),
            base_index=snap.index,
            base_term=snap.term,
            segment_bytes=segment_bytes,
            durable=durable,
            ops=self.ops,
            trusted_last=journal.trusted_last if journal is not None else None,
            preallocate=journal is None,
        )
        self.recovery = list(self.wal.recovery)
        # The compaction floor may sit inside the oldest segment: the WAL deletes whole segments
        # only, and a pass moves the floor at most `max_entries_per_compaction`, so a floor kept
        # at segment starts would never pass a segment holding more entries than that (500,000
        # records of 100 bytes fill a 64 MiB segment). Entries below it read as compacted; a
        # segment goes once wholly below it. Not persisted: a restart starts at the WAL's first
        # entry, which is still committed and covered by the snapshot.
        self._floor = 0
        try:
            if journal is not None:
                self._replay(journal)
            self._reconcile_with_snapshot(snap)
            self._reconcile_term()
        except BaseException:
            self.wal.close()
            raise
        if journal is not None:
            self.wal.on_write = journal.add_frames
            self.wal.write_behind = WRITE_BEHIND_BYTES

    def _create(self, path: str, bootstrap: Membership) -> None:
        """A new partition's directory, made whole (its members as the snapshot at index 0)
        under another name and then renamed: a crash leaves it whole or absent, and an absent
        one is bootstrapped again by the next open. A directory made in place and cut before
        its snapshot was written was opened by the next start as a member's that waits to be
        added (no bootstrap for a directory that exists), so this member never took part in
        the partition again."""
        staging = path + ".new"
        shutil.rmtree(staging, ignore_errors=True)  # an earlier attempt cut short
        store = SnapshotStore(os.path.join(staging, "snap"), durable=self.durable, ops=self.ops)
        store.save(SnapshotMeta(0, 0, bootstrap), b"")
        if self.durable:
            self.ops.fsync_dir(staging)
        self.ops.replace(staging, path)
        if self.durable:
            self.ops.fsync_dir(os.path.dirname(path) or ".")

    def _replay(self, journal: PartitionJournal) -> None:
        ops = journal.pending
        lost = commit_past_log(self.wal.last_index(), ops, journal.checkpoint_commit)
        if lost is not None:  # nothing `wal check --repair` could mend: the entries are gone
            raise LostFile(
                self.wal.path,
                f"is short: {lost.reason}. Restore the segments, or remove this member and add "
                "it back with an empty data directory and --join",
            )
        if not ops:
            return
        before = self.wal.last_index(), self.wal.commit
        notes = replay_into(self.wal, ops)
        after = self.wal.last_index(), self.wal.commit
        msg = (
            f"replayed {len(ops)} journal records: last index {before[0]} -> {after[0]}, "
            f"commit {before[1]} -> {after[1]}"
        )
        for m in [msg, *notes]:
            self.recovery.append(m)
            log.info("%s: %s", self.path, m)

    def _reconcile_with_snapshot(self, snap: SnapshotMeta) -> None:
        wal = self.wal
        if wal.first_index() - 1 > snap.index:
            raise WalCorruption(
                wal.path,
                0,
                wal.first_index(),
                f"the WAL starts at {wal.first_index()} but the snapshot covers only up to "
                f"{snap.index}: entries {snap.index + 1}..{wal.first_index() - 1} are missing",
            )
        if snap.index > wal.last_index() or wal.term(snap.index) != snap.term:
            # The snapshot was installed (it is durable) but the crash came before the log was
            # reset: finish the install.
            wal.reset(snap.index, snap.term)
            msg = f"finished an interrupted snapshot install at index {snap.index}"
            self.recovery.append(msg)
            log.warning("%s: %s", self.path, msg)

    def _reconcile_term(self) -> None:
        """Never start with a term below the last logged entry's.

        The hard state is saved before the entries of the same Ready, so this node never leaves
        entries of term T durable with its term below T; a data directory written by an older
        version (entries first) or edited by hand can. No vote in those terms was ever sent (a
        vote is durable before its answer goes out), so the term is raised to T with no vote:
        a state the node did pass through.

        A hard state file that is missing altogether beside entries is another matter: it is
        written before the first entry and only ever replaced, so it was lost, and with it
        votes this member may have cast in terms above its log's. Taken as term 0 (or the
        last entry's), the member could vote a second time in such a term and help elect a
        second leader, so it refuses to start, as for a lost partition directory.
        """
        last = self.last_index()
        last_term = self.term(last)
        if self.hard.lost_beside(last, self.snapshot_meta().index):
            raise LostFile(
                self.hard.path,
                f"is missing, while the WAL beside it holds entries up to {last} (term "
                f"{last_term}): this member's term and vote are lost, and it could vote twice "
                "in one term. Restore the file, or remove this member and add it back with an "
                "empty data directory and --join (the operator replaces a member whose volume "
                "is lost so)",
            )
        if last_term > self.hard.term:
            msg = f"raised the term from {self.hard.term} to {last_term}, the last entry's term"
            self.hard.save(last_term, None)
            self.recovery.append(msg)
            log.warning("%s: %s", self.path, msg)

    def close(self) -> None:
        self.wal.close()

    @property
    def failed(self) -> StorageFailed | None:
        if self.journal is not None and self.journal.journal.failed is not None:
            return self.journal.journal.failed
        return self.wal.failed

    # ================================================================== LogStorage
    def initial_state(self) -> tuple[HardState, SnapshotMeta]:
        snap = self.snapshot_meta()
        return HardState(self.hard.term, self.hard.vote, self.commit_index()), snap

    def commit_index(self) -> int:
        return max(self.wal.commit, self.snapshot_meta().index)

    def first_index(self) -> int:
        return max(self.wal.first_index(), self._floor)

    def last_index(self) -> int:
        return self.wal.last_index()

    def term(self, index: int) -> int:
        snap = self.snapshot_meta()
        if index == snap.index:
            return snap.term
        if index < self._floor - 1:
            raise Compacted(f"index {index} is below the compaction floor {self._floor}")
        return self.wal.term(index)

    def _check_floor(self, lo: int) -> None:
        if lo < self._floor:
            raise Compacted(f"index {lo} is below the compaction floor {self._floor}")

    def entries(self, lo: int, hi: int) -> list[Entry]:
        self._check_floor(lo)
        return self.wal.entries(lo, hi)

    def read_raw(self, lo: int, hi: int, max_bytes: int) -> list[RawRange]:
        """Entries [lo, hi) as their records' bytes, for bulk readers (see `Wal.read_raw`)."""
        self._check_floor(lo)
        return self.wal.read_raw(lo, hi, max_bytes)

    def config_entries(self, lo: int) -> list[Entry]:
        lo = max(lo, self.first_index())
        return [e for i in self.wal.config_indexes if i >= lo for e in self.wal.entries(i, i + 1)]

    def snapshot_meta(self) -> SnapshotMeta:
        return self.snapshots.meta or _NO_SNAPSHOT

    # ================================================================== writes
    def save(self, hard_state: HardState | None, entries: list[Entry]) -> None:
        """Write and make durable (one fsync for the whole batch)."""
        self.write(hard_state, entries)
        self.sync()

    def write(self, hard_state: HardState | None, entries: list[Entry]) -> None:
        """Write without waiting for the disk; `sync` (or group commit) makes it durable."""
        if hard_state is not None and (hard_state.term, hard_state.vote) != (
            self.hard.term,
            self.hard.vote,
        ):
            self._guard("hardstate", lambda: self.hard.save(hard_state.term, hard_state.vote))
        # The commit index rides in the entries' write (after them), or alone.
        self.wal.append(entries, hard_state.commit if hard_state is not None else 0)

    def sync(self) -> None:
        if self.journal is not None:
            self.journal.journal.sync()
        else:
            self.wal.sync()

    def _guard(self, what: str, fn: Callable[[], None]) -> None:
        if self.wal.failed is not None:
            raise self.wal.failed
        try:
            fn()
        except OSError as e:
            self.wal.failed = StorageFailed(os.path.join(self.path, what), "write", e)
            log.error("%s", self.wal.failed)
            raise self.wal.failed from e

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Install a received snapshot: written atomically, then the log is reset behind it."""
        self._guard("snap", lambda: self.snapshots.save(meta, data))
        self._reset(meta)

    def _reset(self, meta: SnapshotMeta) -> None:
        if self.journal is not None:
            # Durable before the WAL is reset: a replay of records from before the install
            # must meet it, or it would put back entries the install discarded.
            self.journal.reset(meta.index, meta.term)
        self.wal.reset(meta.index, meta.term)

    def install_received(self, receiver: SnapshotReceiver, meta: SnapshotMeta) -> None:
        """Install a snapshot received in chunks (already verified by `receiver.verify()`)."""
        self._guard("snap", lambda: receiver.commit(meta))
        self._reset(meta)

    def create_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        if meta.index <= self.snapshot_meta().index:
            return
        if meta.index > self.commit_index():
            raise SafetyViolation(
                f"snapshot at {meta.index} is above the commit index {self.commit_index()}"
            )
        self._guard("snap", lambda: self.snapshots.save(meta, data))

    def write_snapshot_file(self, meta: SnapshotMeta, data: bytes) -> str:
        """The durable file of a local snapshot, not yet the latest (see `adopt_snapshot`);
        safe in a worker thread."""
        return self.snapshots.write_file(meta, data)

    def adopt_snapshot(self, meta: SnapshotMeta, path: str) -> bool:
        """Make a durable file from `write_snapshot_file` the latest snapshot, which lets
        `compact` remove the entries it covers; False when a newer one is already in place."""
        if meta.index > self.commit_index():
            raise SafetyViolation(
                f"snapshot at {meta.index} is above the commit index {self.commit_index()}"
            )
        return self.snapshots.adopt(meta, path)

    def snapshot_write_failed(self, error: OSError) -> StorageFailed:
        """A snapshot write in a worker thread failed: the partition stops writing, as when
        any other write of it fails."""
        if self.wal.failed is None:
            self.wal.failed = StorageFailed(os.path.join(self.path, "snap"), "write", error)
            log.error("%s", self.wal.failed)
        return self.wal.failed

    def snapshot_data(self) -> bytes:
        return self.snapshots.data()

    def compact(self, new_first_index: int) -> int:
        """Move the floor up to `new_first_index`, never past the snapshot or a hold, and
        delete the segments wholly below it. Returns how many entries the floor passed."""
        snap = self.snapshot_meta().index
        if new_first_index - 1 > snap:
            raise SafetyViolation(
                f"compaction to {new_first_index} would pass the snapshot at {snap}"
            )
        hold = self.holds.floor()
        if hold is not None:
            new_first_index = min(new_first_index, hold)
        before = self.first_index()
        new_first_index = min(new_first_index, self.last_index() + 1)
        if new_first_index <= before:
            return 0
        self.wal.compact(new_first_index)
        self._floor = new_first_index
        return new_first_index - before

    def compaction_floor(self) -> int:
        return self.first_index()

    def set_hold(self, holder: str, min_index: int, ttl_seconds: float) -> Hold:
        """Keep entries from `min_index` on until the hold expires (renew to extend it)."""
        check_hold(holder, min_index, ttl_seconds)  # a bad one is a 400 before a 410
        floor = self.compaction_floor()
        if min_index < floor:
            raise Compacted(
                f"min_index: {min_index} is already compacted (the floor is {floor}); "
                f"read from the snapshot at {self.snapshot_meta().index} instead"
            )
        return self.holds.set(holder, min_index, ttl_seconds)
