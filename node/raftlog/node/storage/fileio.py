"""The file operations storage performs, in one place.

Every write and fsync of the WAL, the hard state and the snapshots goes through a `FileOps`, so a
disk fault (EIO, ENOSPC) is handled on one path, and so the fault tests can hand storage a
`FileOps` whose disk fails, the same way a real failing disk would.
"""

from __future__ import annotations

import os


class FileOps:
    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        """Data and the size, not timestamps: what an append needs to be read back."""
        os.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def allocate(self, fd: int, size: int) -> None:
        """Allocate the file's first `size` bytes (reading as zeros where nothing was written)."""
        os.posix_fallocate(fd, 0, size)

    def try_allocate(self, fd: int, size: int, end: int) -> bool:
        """Allocate like `allocate`, as a saving only: on a full disk or a filesystem that cannot
        allocate, give back what was allocated past `end` (a failed fallocate can keep part of
        it) and let the file grow with its records. False when it did not allocate."""
        try:
            self.allocate(fd, size)
        except OSError:
            self.truncate(fd, end)
            return False
        return True

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)


def atomic_write(path: str, data: bytes, ops: FileOps, durable: bool) -> None:
    """Write `path` so that a crash leaves either the old or the new content, never a mix."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        ops.write(fd, data)
        if durable:
            ops.fsync(fd)
    finally:
        os.close(fd)
    ops.replace(tmp, path)
    if durable:
        ops.fsync_dir(os.path.dirname(path) or ".")
