"""`raftctl backup` and `raftctl restore`: backup points in a cluster's archive, and the plan of
a restore (the index of each partition, the same for every member of the new cluster)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from raftlog.cli.cluster_cmds import _client, _run, add_common
from raftlog.node.server.archive import S3ObjectStore, split_archive_url
from raftlog.node.server.restore import (
    RestoreError,
    read_backup,
    resolve,
    take_backup,
)
from raftlog.node.server.restore_target import parse_target
from raftlog.node.settings import read_credentials


def _store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--archive", required=True, help="the archive: s3://bucket/prefix")
    p.add_argument("--s3-endpoint", help="http(s) URL of the S3 API (unset: AWS)")
    p.add_argument("--s3-region")
    p.add_argument(
        "--s3-credentials-file",
        default=os.environ.get("RAFTLOG_ARCHIVE_CREDENTIALS_FILE"),
        help="access key id and secret (two lines, or JSON); unset: AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY",
    )


def _store(args: argparse.Namespace) -> S3ObjectStore:
    split_archive_url(args.archive)
    creds = None
    if args.s3_credentials_file:
        creds = read_credentials(Path(args.s3_credentials_file), "--s3-credentials-file")
    elif os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        creds = (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    return S3ObjectStore(args.archive, args.s3_endpoint, args.s3_region, creds)


def _fail(e: Exception) -> int:
    print(f"raftctl: {e}", file=sys.stderr)
    return 1


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
    p.set_defaults(run=lambda a: _run(_backup_create(a)))
    p = bsub.add_parser("show", help="the index of each partition in backup NAME")
    _store_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("name")
    p.set_defaults(run=lambda a: _run(_backup_show(a)))

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
    p.set_defaults(run=lambda a: _run(_restore_plan(a)))
