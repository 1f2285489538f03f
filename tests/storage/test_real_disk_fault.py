"""A real disk fault from the kernel, not an injected one: the file size limit (EFBIG).

A child process caps its file size with RLIMIT_FSIZE and appends until the kernel refuses a
write. The partition must stop accepting writes with a clear error and keep serving what it
holds; reopened afterwards, the log is a clean prefix of what was written.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.storage.helpers import ents

from raftlog.node.storage.durable import DurableStorage

CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from raftlog.node.core.types import HardState, Membership
    from raftlog.node.storage.durable import DurableStorage
    from raftlog.node.storage.errors import StorageFailed
    from tests.storage.helpers import ents

    s = DurableStorage(sys.argv[1], bootstrap=Membership.of(["a"]), segment_bytes=1 << 30)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    i = 1
    try:
        while True:
            s.save(HardState(1, "a", i - 1), ents(i, i + 9, 1, size=300))
            i += 10
    except StorageFailed as e:
        print("failed:", e)
    try:
        s.save(None, ents(i, i, 1))
        print("accepted a write after the failure")
    except StorageFailed:
        print("refused later writes")
    assert s.entries(1, i) == ents(1, i - 1, 1, size=300)
    print("reads ok up to", i - 1)
    """
)


def test_efbig_from_the_kernel_stops_writes_and_keeps_reads(tmp_path):
    root = Path(__file__).parents[2]
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "p0")],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "failed: storage failed: write of" in r.stdout and "EFBIG" in r.stdout, r.stdout
    assert "refused later writes" in r.stdout
    written = int(r.stdout.split("reads ok up to")[1])
    s = DurableStorage(str(tmp_path / "p0"))
    last = s.last_index()
    assert written <= last < written + 10, "only a clean prefix of the failed batch may remain"
    assert s.entries(1, last + 1) == ents(1, last, 1, size=300)
