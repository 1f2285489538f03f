"""One node process per data directory: an exclusive `flock` on its `lock` file, held for the
process's life (the kernel lets it go when the process ends, however it ends).

A second process started on a directory in use (a restarted local operator that did not know
its members outlived it, a volume mounted by two pods on one machine) replayed the journal into
the live WAL and deleted the live node's journal segment before its port was found taken: the
live node then journaled into an unlinked file. It is refused before anything is opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

LOCK_FILE = "lock"


class DataDirInUse(ValueError):
    """Another process holds the data directory."""


@contextlib.contextmanager
def hold_data_dir(data_dir: str) -> Iterator[None]:
    """Hold `data_dir` for the block; DataDirInUse (naming the holder's pid) when another
    process holds it."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise DataDirInUse(
                f"{data_dir} is in use by another node process (pid {holder}, holding {path}); "
                "stop it first, or give this one its own data directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor
