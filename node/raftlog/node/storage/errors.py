"""Storage errors. Each names the file and what a person can do about it."""

from __future__ import annotations

import errno as errno_mod
import os


class WalCorruption(Exception):
    """A checksum or structure failure that is not a torn tail: the WAL refuses to open.

    Never a silent loss: the node does not start on it. `raftctl wal check PATH` shows the same
    finding, and `raftctl wal check --repair PATH` truncates there after printing what it drops.
    """

    def __init__(self, path: str, offset: int, index: int | None, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.index = index
        self.reason = reason
        where = f"{path} at offset {offset}"
        if index is not None:
            where += f" (log index {index})"
        super().__init__(
            f"WAL corrupted: {reason} in {where}; refusing to start. "
            "inspect it with `raftctl wal check`; `--repair` truncates there after listing "
            "what it drops"
        )


class CorruptFile(Exception):
    """A small state file (hard state, snapshot) fails its checksum or structure."""

    what = "file"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{self.what} {path} is invalid: {reason}")


def make_directory(path: str, what: str) -> None:
    """`path` made a directory if it is none yet; a file in its place is damage (CorruptFile,
    the node refuses to start) rather than `[Errno 17] File exists`."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise CorruptFile(path, f"is a file where {what} directory belongs")
    os.makedirs(path, exist_ok=True)


class LostFile(CorruptFile):
    """A file or directory the node's other state says must exist (its vote, a log) is gone."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        Exception.__init__(self, f"{path} {reason}")


class SnapshotCorruption(CorruptFile):
    what = "snapshot"


class SnapshotNoRoom(Exception):
    """A snapshot upload would leave its volume less free space than the log is kept."""

    def __init__(self, path: str, total: int, free: int, kept: int) -> None:
        self.path = path
        super().__init__(
            f"a snapshot of {total} bytes does not fit in {os.path.dirname(path)}: {free} bytes "
            f"free, {kept} of them kept for the log"
        )


class StorageFailed(Exception):
    """A write or fsync failed (EIO, ENOSPC, ...). The partition accepts no more writes.

    After a failed fsync the page cache cannot be trusted (a retry may report success for data
    that never reached the disk), so the failure is permanent until the process restarts and
    recovers from what is really on disk. Reads of what was durable keep working.
    """

    def __init__(self, path: str, op: str, cause: OSError) -> None:
        self.path = path
        self.op = op
        self.errno = cause.errno
        name = errno_mod.errorcode.get(cause.errno or 0, "error")
        detail = cause.strerror or os.strerror(cause.errno or 0)
        super().__init__(
            f"storage failed: {op} of {path}: {name} ({detail}); "
            "writes to this partition are stopped, committed reads still served"
        )
