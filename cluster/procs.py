"""The cluster's processes: started in its network namespace, recorded by pid, stopped by pid.

Each process runs through `nsenter --net` (which execs it, so the pid is the command's): only
the network namespace changes, so the kubelet and containerd still share the host's mount
namespace and see each other's volume mounts (`ip netns exec` would give each a private one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from cluster import layout

PIDS = layout.STATE / "pids"
LOGS = layout.STATE / "logs"
NETNS_PATH = Path("/run/netns") / layout.NETNS


def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Starts `argv` in the cluster's namespace, logging to `.cluster/logs/<name>.log`."""
    PIDS.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    recorded = PIDS / f"{name}.args"
    wanted = "\0".join(argv)
    if alive(name):
        if recorded.exists() and recorded.read_text() == wanted:
            return pid_of(name) or 0
        stop(name)  # started with other flags (an older checkout of this file): again
    with (LOGS / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            ["nsenter", f"--net={NETNS_PATH}", "--", *argv],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, **(env or {})}, cwd=layout.STATE,
        )  # fmt: skip
    (PIDS / f"{name}.pid").write_text(str(proc.pid))
    recorded.write_text(wanted)
    return proc.pid


def pid_of(name: str) -> int | None:
    try:
        return int((PIDS / f"{name}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def alive(name: str) -> bool:
    pid = pid_of(name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A pid reused by an unrelated process is not ours: ours live in the cluster's namespace.
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(NETNS_PATH).st_ino
    except FileNotFoundError:
        return False


def running(name: str) -> bool:
    """Its process exists (whatever its namespace: nsenter joins it only just before exec)."""
    pid = pid_of(name)
    return pid is not None and Path(f"/proc/{pid}").exists() and not _zombie(pid)


def stop(name: str, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; the pid file goes either way."""
    pid = pid_of(name)
    if pid is not None and alive(name):
        kill_and_wait([pid], timeout)
    (PIDS / f"{name}.pid").unlink(missing_ok=True)


def kill_and_wait(pids: list[int], timeout: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]:
                return
            time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def wait_for(what: str, check: Callable[[], bool], timeout: float, log: str | None = None) -> None:
    """Polls `check` until true; on timeout, fails with the tail of the component's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # not up yet: connection refused, 503, ...
            pass
        if log is not None and not running(log):
            break
        time.sleep(0.5)
    tail = ""
    if log is not None and (LOGS / f"{log}.log").exists():
        lines = (LOGS / f"{log}.log").read_text(errors="replace").splitlines()[-25:]
        tail = "\n  " + "\n  ".join(lines)
    state = "exited" if log is not None and not running(log) else f"not within {timeout:.0f} s"
    raise RuntimeError(f"cluster: {what}: {state}; {LOGS / f'{log}.log'}:{tail}")
