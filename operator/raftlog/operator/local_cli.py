"""`raftctl local up` and `raftctl local scale`: the operator's reconciler on this machine.

`raftctl local up --object-store` also runs a real S3-compatible server (SeaweedFS,
`local_s3.LocalObjectStore`) in `DIR/object-store/` for as long as the cluster runs, and the
members archive to it: the bucket of `spec.archive.url` is made there, and the members get its
endpoint and credentials in place of the spec's (which are for the store a Kubernetes cluster
would reach). Without a manifest, it adds `spec.archive.url: s3://raftlog-archive/<name>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from raftlog.operator.actions import Event
from raftlog.operator.local import (
    MANIFEST,
    OBJECT_STORE,
    LocalOperator,
    ManifestError,
    load_manifest,
)
from raftlog.operator.local_s3 import LocalObjectStore, LocalS3Error

LOCAL_ARCHIVE_BUCKET = "raftlog-archive"  # of a manifest made from the flags


def _print_event(event: Event) -> None:
    mark = "!" if event.type == "Warning" else " "
    print(f"{time.strftime('%H:%M:%S')} {mark} {event.reason}: {event.message}", flush=True)


def _manifest_from_flags(args: argparse.Namespace) -> str:
    text = (
        "apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nmetadata:\n  name: local\n"
        f"spec:\n  replicas: {3 if args.replicas is None else args.replicas}\n"
        f"  partitions: {1 if args.partitions is None else args.partitions}\n"
    )
    if args.object_store:
        text += f"  archive:\n    url: s3://{LOCAL_ARCHIVE_BUCKET}/local\n"
    return text


def local_up(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    base = Path(args.data_dir)
    try:
        given = {f: v for f in ("replicas", "partitions") if (v := getattr(args, f)) is not None}
        if args.file:
            if given:
                raise ManifestError(f"--{next(iter(given))}: not with -f (the manifest's spec)")
            text = Path(args.file).read_text()
        elif (base / MANIFEST).is_file():
            text = (base / MANIFEST).read_text()  # the cluster already set up there
        else:
            text = _manifest_from_flags(args)
            given = {}  # they made this manifest
        name, spec = load_manifest(text)
        for field, value in given.items():
            # Else the flags were ignored without a word for the cluster already there.
            if getattr(spec, field) != value:
                how = "`raftctl local scale`" if field == "replicas" else "a manifest with -f"
                raise ManifestError(
                    f"--{field} {value}: the cluster in {base} has {field} "
                    f"{getattr(spec, field)} (change it with {how})"
                )
        if args.weed is not None and not args.object_store:
            raise ManifestError("--weed: only with --object-store")
        if args.object_store and spec.archive is None:
            raise ManifestError(
                "--object-store: the manifest has no spec.archive (add `archive: {url: "
                "s3://bucket/prefix}`: the bucket is made on the local server)"
            )
        busy = _take_over(base)
        if busy is not None:
            raise ManifestError(busy)
        object_store = (
            LocalObjectStore(base / OBJECT_STORE, weed=args.weed) if args.object_store else None
        )
        local_operator = LocalOperator.create(
            base, text, on_event=_print_event, object_store=object_store
        )
        name, spec = local_operator.desired()
    except (OSError, ManifestError, LocalS3Error) as e:
        print(f"raftctl local up: {e}", file=sys.stderr)
        return 1
    print(
        f"cluster {name}: {spec.replicas} members, {spec.partitions} partitions, data in {base}",
        flush=True,
    )
    if object_store is not None:
        try:
            object_store.start()
        except (OSError, LocalS3Error) as e:
            print(f"raftctl local up: --object-store: {e}", file=sys.stderr)
            return 1
        print(
            f"object store: {object_store.endpoint} (SeaweedFS, data in {object_store.folder}; "
            f"access key id and secret in {object_store.credentials_file})",
            flush=True,
        )

    async def run() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        announced: list[str] = []
        try:
            while not stop.is_set():
                try:
                    await local_operator.step()
                except ManifestError as e:
                    print(f"raftctl local up: {e} (keeping the cluster as it is)", file=sys.stderr)
                _write_state(base, local_operator)
                endpoints = local_operator.endpoints()
                if local_operator.status.phase == "Running" and endpoints != announced:
                    announced = endpoints
                    print(f"export RAFTLOG_ENDPOINTS={','.join(endpoints)}", flush=True)
                    print(f"export RAFTLOG_TOKEN_FILE={local_operator.token_file}", flush=True)
                    print("Ctrl-C stops the cluster.", flush=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), local_operator.interval_s)
        finally:
            await local_operator.close()
            if object_store is not None:
                object_store.stop()
        print("stopped", flush=True)
        return 0

    return asyncio.run(run())


def started_at(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, the 22nd field of /proc/PID/stat);
    None when there is no such process, or it has exited (a zombie its parent has not reaped).
    A pid and its start name one process: `raftctl local down` must not signal whatever took
    the pid of a node that is gone (after a reboot, say)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def recorded_alive(pid: int, state: dict[str, Any]) -> bool:
    """Whether `pid` is still the process `local up` recorded in `cluster.json` (`state`), not
    one that took its pid since."""
    recorded: int | None = state.get("started", {}).get(str(pid))
    if recorded is not None:
        return started_at(pid) == recorded
    try:  # a cluster.json written before start times were recorded
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: not a process this user's `local up` started
        return False
    return True


def stop_recorded(pids: list[int], state: dict[str, Any], wait_s: float = 30.0) -> list[int]:
    """SIGTERM each of `pids` still the process recorded, wait for the nodes of `state` to end,
    SIGKILL those left after `wait_s`; the pids killed."""
    for pid in pids:
        if recorded_alive(pid, state):
            os.kill(pid, signal.SIGCONT)  # a paused node must run to hear SIGTERM
            os.kill(pid, signal.SIGTERM)
    waited = [*state["pids"], *(p for p in pids if p not in state["pids"])]
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(recorded_alive(p, state) for p in waited):
        time.sleep(0.1)
    left = [p for p in waited if recorded_alive(p, state)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _take_over(base: Path) -> str | None:
    """Members a `local up` left running when it was killed (they run in sessions of their own,
    so they outlive it) are stopped before this one starts its own on their data: it knew no
    process of theirs, took each for missing and started a second node on each directory.
    Refused (the reason returned) while that `local up` itself still runs."""
    path = base / "cluster.json"
    if not path.is_file():
        return None
    state = dict(json.loads(path.read_text()))
    supervisor = int(state.get("supervisor", 0))
    if supervisor and supervisor != os.getpid() and recorded_alive(supervisor, state):
        return (
            f"a cluster is already up in {base} (raftctl local up, pid {supervisor}); stop it "
            f"first: raftctl local down --data-dir {base}"
        )
    store = int((state.get("objectStore") or {}).get("pid") or 0)
    running = [p for p in state.get("pids", []) if recorded_alive(p, state)]
    if store and str(store) in state.get("started", {}) and recorded_alive(store, state):
        running.append(store)  # its object store too (SeaweedFS, in a session of its own)
    if running:
        killed = stop_recorded(running, state)
        print(
            f"stopped {len(running)} processes a previous `raftctl local up` left running "
            f"(pids {', '.join(map(str, running))}"
            + (f"; {len(killed)} killed" if killed else "")
            + "): they are started again on their data",
            flush=True,
        )
    return None


def _write_state(base: Path, local_operator: LocalOperator) -> None:
    """`cluster.json`, read by `raftctl local status|down`."""
    pids = local_operator.runtime.pids()
    supervisor = os.getpid()  # `local down` asks it to stop its nodes
    store = local_operator.runtime.object_store
    stores = [store.pid] if store is not None and store.pid is not None else []
    state = {
        "endpoints": local_operator.endpoints(),
        "pids": pids,
        "supervisor": supervisor,
        "started": {str(pid): started_at(pid) for pid in [*pids, supervisor, *stores]},
        "phase": local_operator.status.phase,
    }
    if store is not None:
        state["objectStore"] = {"endpoint": store.endpoint, "pid": store.pid}
    tmp = base / "cluster.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, base / "cluster.json")


def local_scale(args: argparse.Namespace) -> int:
    path = Path(args.data_dir) / MANIFEST
    try:
        name, _ = load_manifest(path.read_text(), str(path))
        if name != args.name:
            raise ManifestError(f"{args.data_dir} holds cluster {name!r}, not {args.name!r}")
        doc = yaml.safe_load(path.read_text())
        doc.setdefault("spec", {})["replicas"] = args.replicas
        text = yaml.safe_dump(doc, sort_keys=False)
        load_manifest(text, "the scaled manifest")  # refuses e.g. --replicas 0 with the reason
    except (OSError, ManifestError) as e:
        print(f"raftctl local scale: {e}", file=sys.stderr)
        return 1
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    print(f"{name}: replicas set to {args.replicas}; `raftctl local up` reconciles it")
    return 0


def add_commands(local_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = local_commands.add_parser(
        "up", help="run a cluster here with the operator's reconciler, until interrupted"
    )
    up.add_argument("-f", "--file", help="a RaftCluster manifest (e.g. examples/raftcluster.yaml)")
    up.add_argument(
        "--replicas", type=int, default=None, help="without -f, for a new cluster: voters (3)"
    )
    up.add_argument(
        "--partitions", type=int, default=None, help="without -f, for a new cluster: partitions (1)"
    )
    up.add_argument("--data-dir", required=True)
    up.add_argument(
        "--object-store",
        action="store_true",
        help="run a local S3 server (SeaweedFS) in DATA_DIR/object-store for as long as the "
        "cluster runs, and archive to it (spec.archive: its bucket is made there)",
    )
    up.add_argument(
        "--weed",
        type=Path,
        help="with --object-store: the SeaweedFS `weed` binary (default: $RAFTLOG_WEED, else "
        "the one `make s3server` cached, else `weed` on the PATH)",
    )
    up.set_defaults(run=local_up)
    scale = local_commands.add_parser(
        "scale", help="change the replicas of the cluster `local up` runs"
    )
    scale.add_argument("name", help="the cluster's name (metadata.name)")
    scale.add_argument("--replicas", type=int, required=True)
    scale.add_argument("--data-dir", required=True)
    scale.set_defaults(run=local_scale)
