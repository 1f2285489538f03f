"""`raftctl` commands that talk to a running cluster, and `raftctl local` to run one here.

Every command takes `--endpoints` (or `RAFTLOG_ENDPOINTS`), `--token-file` (or
`RAFTLOG_TOKEN_FILE`), for https endpoints `--ca-file` (and, where members ask callers of their
peer port for a certificate, `--cert-file` and `--key-file`), and `--json`; without `--json` the
output is meant for people.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from raftlog.client import NO_ANSWER, AsyncClient, ClientError
from raftlog.operator.flag_types import positive_seconds
from raftlog.operator.local_cli import add_commands as add_local_commands
from raftlog.operator.local_cli import recorded_alive, stop_recorded


def endpoint_list(text: str) -> str:
    """`--endpoints` checked when the command line is read: an empty list was a traceback, and
    a URL without a scheme was retried until it said the cluster could not be reached."""
    urls = [e.strip() for e in text.split(",") if e.strip()]
    if not urls:
        raise argparse.ArgumentTypeError("give at least one node URL (http://host:port)")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise argparse.ArgumentTypeError(
                f"{url!r} is not a node URL: give http://host:port or https://host:port"
            )
        try:
            parts.port  # noqa: B018  (parsed here: an out-of-range port raises)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{url!r}: {e}") from None
    return ",".join(urls)


def at_least(low: int) -> Callable[[str], int]:
    """An integer flag of `low` or more: a negative count printed nothing and exited 0."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoints",
        type=endpoint_list,
        default=os.environ.get("RAFTLOG_ENDPOINTS", "http://127.0.0.1:7001"),
        help="comma-separated node URLs (default: $RAFTLOG_ENDPOINTS or http://127.0.0.1:7001)",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("RAFTLOG_TOKEN_FILE"),
        help="file holding the admin token",
    )
    p.add_argument(
        "--ca-file",
        default=os.environ.get("RAFTLOG_CA_FILE"),
        help="CA bundle that signed the nodes' certificates, for https endpoints "
        "(default: $RAFTLOG_CA_FILE, else the system's)",
    )
    p.add_argument(
        "--cert-file",
        default=os.environ.get("RAFTLOG_CERT_FILE"),
        help="client certificate (PEM) shown to members that ask for one on their peer port "
        "(--peer-client-cert-auth); default: $RAFTLOG_CERT_FILE",
    )
    p.add_argument(
        "--key-file",
        default=os.environ.get("RAFTLOG_KEY_FILE"),
        help="the client certificate's private key (default: $RAFTLOG_KEY_FILE)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _endpoints(args: argparse.Namespace) -> list[str]:
    return [e.strip() for e in args.endpoints.split(",") if e.strip()]


@dataclass(frozen=True)
class Access:
    """How a command reaches the nodes: the admin token and the TLS files."""

    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def client(self, endpoints: list[str], retries: int) -> AsyncClient:
        return AsyncClient(
            endpoints,
            token=self.token,
            retries=retries,
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
        )


def _access(args: argparse.Namespace) -> Access:
    """The token read and the TLS files checked up front: a missing file is said by name, not
    as an SSL error at the first call."""
    for flag in ("ca_file", "cert_file", "key_file"):
        path = getattr(args, flag)
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"--{flag.replace('_', '-')} {path}: no such file")
    if (args.cert_file is None) != (args.key_file is None):
        raise ValueError("--cert-file and --key-file go together: give both, or neither")
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    return Access(token, args.ca_file, args.cert_file, args.key_file)


# Pauses of about 0.05 s doubling to 3.2 s: 3 to 10 s in all, past an election after a
# leader's crash (followers name the dead leader for up to 2 election timeouts, 1 s by default).
RETRIES = 7


def _client(args: argparse.Namespace) -> AsyncClient:
    return _access(args).client(_endpoints(args), RETRIES)


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)


def _run(coro: Any) -> int:
    try:
        return int(asyncio.run(coro))
    except ClientError as e:
        unreachable = "cannot reach the cluster: " if e.status == NO_ANSWER else ""
        print(f"raftctl: {unreachable}{e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:  # the token and TLS files
        print(f"raftctl: {e}", file=sys.stderr)
        return 1


# ====================================================================== status
async def fetch_status(endpoints: list[str], access: Access | None = None) -> dict[str, Any]:
    """Each node's `/v1/status` by name (an unreachable one as `{"error": ...}` by URL)."""
    nodes: dict[str, Any] = {}
    async with (access or Access()).client(endpoints, 0) as c:
        for url in endpoints:
            try:
                st = await c.status(url)
                nodes[st["node"]] = st
            except ClientError as e:
                nodes[url] = {"node": url, "error": str(e)}
    return nodes


def format_status(nodes: dict[str, Any]) -> str:
    rows = [("PARTITION", "NODE", "ROLE", "TERM", "LEADER", "HWM", "APPLIED", "FLOOR", "LAG")]
    leaders = {
        q["partition"]: q
        for st in nodes.values()
        for q in st.get("partitions", [])
        if q["role"] == "leader"
    }
    for name, st in sorted(nodes.items()):
        if "error" in st:
            rows.append(("-", name, "unreachable", "", "", "", "", "", ""))
            continue
        for p in st["partitions"]:
            lag = ""
            leader_st = leaders.get(p["partition"])
            if leader_st is not None and name in leader_st["followers"]:
                f = leader_st["followers"][name]
                lag = "snapshot required" if f["snapshot_required"] else str(f["lag"])
            role = p["role"] + ("" if p["member"] == "voter" else f" ({p['member']})")
            rows.append(
                (
                    str(p["partition"]), name, role, str(p["term"]), p["leader"] or "-",
                    str(p["high_water_mark"]), str(p["applied"]), str(p["compaction_floor"]), lag,
                )
            )  # fmt: skip
    rows[1:] = sorted(rows[1:], key=lambda r: (r[0], r[1]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def status_table(endpoints: list[str], access: Access | None = None) -> str:
    return format_status(asyncio.run(fetch_status(endpoints, access)))


async def _status(args: argparse.Namespace) -> int:
    nodes = await fetch_status(_endpoints(args), _access(args))
    _out(args, nodes, format_status(nodes))
    failed = [st["error"] for st in nodes.values() if "error" in st]
    for why in failed:  # the table says "unreachable"; why (refused, a certificate) is here
        print(f"raftctl: {why}", file=sys.stderr)
    return 1 if failed else 0


# ====================================================================== records
def _record(args: argparse.Namespace, value: str) -> dict[str, Any]:
    rec: dict[str, Any] = {"value": value}
    if args.key is not None:
        rec["key"] = args.key
    return rec


async def _append(args: argparse.Namespace) -> int:
    if args.sequence is not None and args.producer_id is None:
        # Dropped, it would append without idempotence while the caller counted on it.
        print("raftctl: --sequence: give --producer-id with it", file=sys.stderr)
        return 2
    async with _client(args) as c:
        records = [_record(args, v) for v in args.values]
        if args.producer_id is not None:  # "" too: the node refuses it, naming the field
            sequence = 0 if args.sequence is None else args.sequence
            r = await c.append(
                args.partition, records, producer_id=args.producer_id, sequence=sequence
            )
        else:
            r = await c.append(args.partition, records)
    _out(
        args,
        r.__dict__,
        f"partition {r.partition}: indexes {r.first_index}..{r.last_index}, term {r.term}"
        + (" (a retry: already appended)" if r.duplicate else ""),
    )
    return 0


def _line(rec: dict[str, Any]) -> str:
    """index, term, key and value, tab-separated. Text is a JSON string, so no key or value
    reads as another (a tombstone is `null`, not the text "None"; a tab stays `\\t`); bytes
    are `base64:...`, and an entry that is not a record `raw:...` (its base64)."""
    if "raw_b64" in rec:
        return f"{rec['index']}\t{rec['term']}\tnull\traw:{rec['raw_b64']}"
    return f"{rec['index']}\t{rec['term']}\t{_shown(rec, 'key')}\t{_shown(rec, 'value')}"


# What JSON leaves raw but a terminal or a line splitter acts on: C1 controls, NEL and the
# line and paragraph separators (C0 controls JSON escapes itself).
_UNSAFE = {c: f"\\u{c:04x}" for c in [*range(0x80, 0xA0), 0x2028, 0x2029]}


def _shown(rec: dict[str, Any], name: str) -> str:
    if rec.get(f"{name}_b64") is not None:
        return f"base64:{rec[f'{name}_b64']}"
    return json.dumps(rec.get(name), ensure_ascii=False).translate(_UNSAFE)


async def _read(args: argparse.Namespace) -> int:
    async with _client(args) as c:
        page = await c.read(args.partition, args.start, args.limit, min_index=args.min_index)
    _out(args, page, "\n".join(_line(r) for r in page["records"]) or "(no records)")
    return 0


async def _tail(args: argparse.Namespace) -> int:
    """The last `--lines` committed records (as `tail`), then with -f every new one."""
    async with _client(args) as c:
        start = args.start
        if start is None:
            try:
                first = await c.read(args.partition, 1, 1, min_index=args.min_index)
            except ClientError as e:
                if e.status != 410:
                    raise
                # Compacted from 1 on: any page has the high-water mark, the floor's too.
                floor = int(e.body["compaction_floor"])
                first = await c.read(args.partition, floor, 1, min_index=args.min_index)
            hwm = first["high_water_mark"]
            # Entries that are not records (a leader's no-op, a member change) are few: read
            # a few times more entries than the records wanted, and keep the last ones.
            last: list[dict[str, Any]] = []
            at = max(1, hwm - 4 * args.lines + 1)
            while at <= hwm:
                try:
                    page = await c.read(args.partition, at, 1000, min_index=args.min_index)
                except ClientError as e:
                    if e.status != 410:
                        raise
                    at = int(e.body["compaction_floor"])  # older ones are compacted away
                    continue
                last = (last + list(page["records"]))[-args.lines :] if args.lines else []
                at = page["next"]
                if not page["records"] and at > page["high_water_mark"]:
                    break
            for r in last:
                print(json.dumps(r) if args.json else _line(r), flush=True)
            if not args.follow:
                return 0
            start = at
        while True:
            # `--min-index` on every page: a later one may come from another replica.
            wait_ms = 10_000 if args.follow else 0
            page = await c.read(
                args.partition, start, 1000, wait_ms=wait_ms, min_index=args.min_index
            )
            for r in page["records"]:
                print(json.dumps(r) if args.json else _line(r), flush=True)
            start = page["next"]
            if not args.follow and start > page["high_water_mark"]:
                return 0


# ====================================================================== admin
async def _lag(args: argparse.Namespace) -> int:
    async with _client(args) as c:
        r = await c.follower_lag(args.partition, args.node)
    state = "snapshot required" if r["snapshot_required"] else r["state"]
    _out(args, r, f"{args.node} on partition {args.partition}: lag {r['lag']} ({state})")
    return 0


async def _members(args: argparse.Namespace) -> int:
    op = args.op.replace("-", "_")
    async with _client(args) as c:
        url = getattr(args, "url", None) or None  # only add-learner has one
        r = await c.change_membership(args.partition, op, args.node, url)
    _out(
        args,
        r,
        f"partition {r['partition']}: voters {', '.join(r['voters'])}; "
        f"learners {', '.join(r['learners']) or '-'} (at index {r['index']})",
    )
    return 0


async def _snapshot_install(args: argparse.Namespace) -> int:
    async with _client(args) as c:
        r = await c.install_snapshot(
            args.partition, args.target, args.source, timeout_s=args.timeout
        )
    if r["status"] == "already_installed":
        text = f"{args.target} needs no snapshot: it is in state {r['state']}, lag {r['lag']}"
    else:
        text = f"snapshot installed on {args.target} from {r['source']}"
        if "fell_back_to_leader" in r:
            text += f" (fell back to the leader: {r['fell_back_to_leader']})"
    _out(args, r, text)
    return 0


async def _transfer(args: argparse.Namespace) -> int:
    async with _client(args) as c:
        r = await c.transfer_leader(args.partition, args.target)
    _out(args, r, f"partition {r['partition']}: leader is now {r['leader']}")
    return 0


# ====================================================================== local
def _local_state(args: argparse.Namespace) -> dict[str, Any] | None:
    """What `raftctl local up` left in --data-dir; None, said on stderr, when there is nothing."""
    path = Path(args.data_dir) / "cluster.json"
    try:
        if not path.is_file():
            raise FileNotFoundError(f"no local cluster in {args.data_dir} (no cluster.json)")
        return dict(json.loads(path.read_text()))
    except FileNotFoundError as e:
        print(f"raftctl local {args.local_command}: {e}", file=sys.stderr)
        return None


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _local_down(args: argparse.Namespace) -> int:
    state = _local_state(args)
    if state is None:
        return 1
    supervised = recorded_alive(state["supervisor"], state)
    running = [p for p in state["pids"] if recorded_alive(p, state)]
    store = int((state.get("objectStore") or {}).get("pid") or 0)
    # Without its supervisor (killed), the object store it ran is stopped here too.
    orphans = [*state["pids"], *([store] if str(store) in state.get("started", {}) else [])]
    store_left = store in orphans and recorded_alive(store, state)
    left = stop_recorded([state["supervisor"]] if supervised else orphans, state)
    if not running and not supervised:
        print(
            f"not running ({_nodes(len(state['pids']))} stopped already)"
            + ("; stopped the object store it left" if store_left else "")
        )
        return 0
    print(f"stopped {_nodes(len(running))}" + (f" ({len(left)} killed)" if left else ""))
    return 0


def _local_status(args: argparse.Namespace) -> int:
    state = _local_state(args)
    if state is None:
        return 1
    running = [p for p in state["pids"] if recorded_alive(p, state)]
    if not running:
        print(f"not running ({_nodes(len(state['pids']))} stopped)")
        return 1
    nodes = asyncio.run(fetch_status(state["endpoints"]))
    _out(args, nodes, f"{len(running)} of {len(state['pids'])} nodes running\n"
         + format_status(nodes))  # fmt: skip
    return 0


# ====================================================================== parser
def _command(
    sub: Any,
    name: str,
    help: str,
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
    *,
    partition: bool = True,
) -> argparse.ArgumentParser:
    """A cluster command's parser: the common options, `-p/--partition` (most commands act on one
    partition), and `run` as what it does; the caller adds the command's own arguments."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help)
    add_common(p)
    if partition:
        p.add_argument("-p", "--partition", type=at_least(0), default=0)
    p.set_defaults(run=lambda a: _run(run(a)))
    return p


def add_parsers(sub: Any) -> None:
    _command(
        sub, "status", "members, roles, leaders, high-water marks and lag", _status, partition=False
    )

    p = _command(sub, "append", "append records (one per VALUE) to a partition", _append)
    p.add_argument("--key")
    p.add_argument("--producer-id", help="make the append idempotent (with --sequence)")
    p.add_argument(
        "--sequence", type=at_least(0), default=None, help="the first record's sequence (default 0)"
    )
    p.add_argument("values", nargs="+")

    p = _command(
        sub, "read", "read committed records: index, term, key, value (JSON strings) a line", _read
    )
    p.add_argument("--from", dest="start", type=at_least(1), default=1)
    p.add_argument("--limit", type=at_least(1), default=100)
    p.add_argument(
        "--min-index",
        type=at_least(0),
        default=0,
        help="read your writes: only from a replica that has committed this index (an append's "
        "last index); a follower may trail the leader by a few milliseconds otherwise",
    )

    p = _command(
        sub,
        "tail",
        "print the last committed records, and with -f each new one as it commits",
        _tail,
    )
    p.add_argument(
        "-n", "--lines", type=at_least(0), default=10, help="how many of the last records"
    )
    p.add_argument(
        "--from",
        dest="start",
        type=at_least(1),
        default=None,
        help="every record from this index on",
    )
    p.add_argument("-f", "--follow", action="store_true", help="then wait for new records")
    p.add_argument(
        "--min-index",
        type=at_least(0),
        default=0,
        help="read your writes: only from a replica that has committed this index",
    )

    p = _command(sub, "lag", "one follower's lag behind the leader", _lag)
    p.add_argument("node")

    members = sub.add_parser("members", help="change a partition's membership")
    msub = members.add_subparsers(dest="op", required=True, metavar="OP")
    for op, helptext in (
        ("add-learner", "add a non-voting member"),
        ("promote", "make a caught-up learner a voter"),
        ("remove", "remove a member"),
    ):
        p = _command(msub, op, helptext, _members)
        p.add_argument("node")
        if op == "add-learner":
            p.add_argument(
                "--url",
                default=None,
                help="the new member's base URL (needed unless the leader knows its address: "
                "it is refused naming the field otherwise)",
            )

    leader = sub.add_parser("leader", help="leadership")
    lsub = leader.add_subparsers(dest="leader_command", required=True, metavar="COMMAND")
    p = _command(lsub, "transfer", "hand a partition's leadership to a voter", _transfer)
    p.add_argument("target")

    snap = sub.add_parser("snapshot", help="snapshots")
    ssub = snap.add_subparsers(dest="snapshot_command", required=True, metavar="COMMAND")
    p = _command(
        ssub, "install", "install a snapshot on a member that needs one", _snapshot_install
    )
    p.add_argument("--target", required=True)
    p.add_argument("--source", default="leader", help='a follower\'s name, or "leader"')
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the answer, which comes once the whole snapshot is "
        "streamed (default 600)",
    )

    local = sub.add_parser("local", help="a local cluster of real node processes")
    lo = local.add_subparsers(dest="local_command", required=True, metavar="COMMAND")
    add_local_commands(lo)  # up and scale: the operator's reconciler, run here
    p = lo.add_parser("down", help="stop the local cluster started in --data-dir")
    p.add_argument("--data-dir", required=True)
    p.set_defaults(run=_local_down)
    p = lo.add_parser("status", help="which of its nodes run, and their status table")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=_local_status)
