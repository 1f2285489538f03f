"""`raftctl backup` and `raftctl restore`: backup points in a cluster's archive, and the plan of
a restore (the index of each partition, the same for every member of the new cluster)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from raftlog.cli.cluster_cmds import _client, _run, add_common
from raftlog.node.server.archive import S3ObjectStore
from raftlog.node.server.restore import (
    RestoreError,
    read_backup,
    resolve,
    take_backup,
)
from raftlog.node.server.restore_target import parse_target
from raftlog.node.settings import archive_url, read_credentials


def _store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--archive", required=True, type=_archive, help="the archive: s3://bucket/prefix"
    )
    p.add_argument("--s3-endpoint", help="http(s) URL of the S3 API (unset: AWS)")
    p.add_argument("--s3-region")
    p.add_argument(
        "--s3-credentials-file",
        default=os.environ.get("RAFTLOG_ARCHIVE_CREDENTIALS_FILE"),
        help="access key id and secret (two lines, or JSON); default: "
        "$RAFTLOG_ARCHIVE_CREDENTIALS_FILE (a node's own setting), else AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY",
    )


def _archive(v: str) -> str:
    try:
        return archive_url(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _store(args: argparse.Namespace) -> S3ObjectStore:
    creds = None
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if args.s3_credentials_file:
        creds = read_credentials(Path(args.s3_credentials_file), "--s3-credentials-file")
    elif key and secret:
        creds = (key, secret)
    elif key or secret:
        given, missing = (
            ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
            if key
            else ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
        )
        raise ValueError(f"{missing}: not set, but {given} is (set both, or --s3-credentials-file)")
    return S3ObjectStore(args.archive, args.s3_endpoint, args.s3_region, creds)


def _fail(e: Exception | str) -> int:
    print(f"raftctl: {e}", file=sys.stderr)
    return 1


def _run_store(coro: Coroutine[Any, Any, int], archive: str) -> int:
    """`_run`, with what the options and the object store refuse said in one line (obstore's
    errors carry a multi-line debug dump after their first line)."""
    from obstore.exceptions import BaseError

    try:
        return _run(coro)
    except ValueError as e:  # an option's value, named (the credentials)
        return _fail(e)
    except (BaseError, TimeoutError) as e:
        said = str(e).strip().splitlines()
        return _fail(f"the object store of {archive}: {said[0] if said else type(e).__name__}")


async def _backup_create(args: argparse.Namespace) -> int:
    store = _store(args)
    async with _client(args) as client:
        status = await client.status(client.endpoints[0])
        partitions = len(status["partitions"])

        async def flush(p: int) -> int:
            reply = await client.archive_flush(p, timeout_s=120)
            print(f"partition {p}: archived to {reply['archived_index']}", file=sys.stderr)
            return int(reply["archived_index"])

        try:
            backup = await take_backup(store, store.prefix, args.name, partitions, flush)
        except (RestoreError, ValueError) as e:
            return _fail(e)
    text = "\n".join(
        [f"backup {backup.name} at {backup.created_at}"]
        + [f"  partition {p}: index {i}" for p, i in sorted(backup.partitions.items())]
    )
    _print(args, _backup_json(backup.name, backup.created_at, backup.partitions), text)
    return 0


async def _backup_show(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        b = await read_backup(store, store.prefix, args.name)
    except RestoreError as e:
        return _fail(e)
    lines = [f"  partition {p}: index {i}" for p, i in sorted(b.partitions.items())]
    _print(args, _backup_json(b.name, b.created_at, b.partitions), "\n".join([b.name, *lines]))
    return 0


def _backup_json(name: str, at: str, parts: dict[int, int]) -> dict[str, Any]:
    return {"name": name, "created_at": at, "partitions": {str(p): i for p, i in parts.items()}}


async def _restore_plan(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        target = parse_target(args.to)
        plan = await resolve(store, store.prefix, args.partitions, target)
    except (RestoreError, ValueError) as e:
        return _fail(e)
    indexes = {str(p): i for p, i in sorted(plan.items())}
    lines = [f"restore {args.archive} to {target.describe()}:"] + [
        f"  partition {p}: index {i}" for p, i in sorted(plan.items())
    ]
    lines.append(f"RAFTLOG_RESTORE_URL={args.archive}")
    lines.append(f"RAFTLOG_RESTORE_INDEXES='{json.dumps(indexes)}'")
    _print(args, {"restore_url": args.archive, "restore_indexes": indexes}, "\n".join(lines))
    return 0


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)


def add_parsers(sub: Any) -> None:
    backup = sub.add_parser("backup", help="backup points in a cluster's archive")
    bsub = backup.add_subparsers(dest="backup_command", required=True, metavar="COMMAND")
    p = bsub.add_parser(
        "create", help="archive what each partition has committed and record it as NAME"
    )
    add_common(p)
    _store_options(p)
    p.add_argument("name")
    p.set_defaults(run=lambda a: _run_store(_backup_create(a), a.archive))
    p = bsub.add_parser("show", help="the index of each partition in backup NAME")
    _store_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("name")
    p.set_defaults(run=lambda a: _run_store(_backup_show(a), a.archive))

    restore = sub.add_parser("restore", help="restore a new cluster from an archive")
    rsub = restore.add_subparsers(dest="restore_command", required=True, metavar="COMMAND")
    p = rsub.add_parser(
        "plan",
        help="the index each partition comes back at: give it to every member of the new "
        "cluster (RAFTLOG_RESTORE_URL, RAFTLOG_RESTORE_INDEXES)",
    )
    _store_options(p)
    p.add_argument("--partitions", type=int, required=True, help="the new cluster's partitions")
    p.add_argument(
        "--to",
        default="latest",
        help="latest, index:N, index:P=N,..., time:<ISO 8601 with zone or epoch ms>, "
        "backup:NAME (default latest)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=lambda a: _run_store(_restore_plan(a), a.archive))
