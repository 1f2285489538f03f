"""`raftlog-node`: run one node of a raftlog cluster.

    raftlog-node --node-id n1 --peers n1=http://127.0.0.1:7001,n2=...,n3=... \\
                 --port 7001 --data-dir /var/lib/raftlog --partitions 2 \\
                 --auth-token-file /etc/raftlog/token

Every flag can also come from the environment (`RAFTLOG_NODE_ID`, `RAFTLOG_PEERS` as JSON, ...,
`RAFTLOG_RAFT__BACKFILL_THRESHOLD`) or a JSON file (`--config`); flags win, then the environment,
then the file. A bad value stops the node at start with the field and the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import functools
import json
import logging
import signal
import sys
import textwrap
from collections.abc import Coroutine
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import uvloop
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from raftlog.node import native

native.install()  # compiled, if built for these sources, before anything imports the core

from raftlog.node.core.config import RaftConfig, describe_validation_error  # noqa: E402
from raftlog.node.server.app import ALL_PLANES, Plane, build_app  # noqa: E402
from raftlog.node.server.connlimit import ConnectionLimit, ensure_descriptors  # noqa: E402
from raftlog.node.server.http_errors import (  # noqa: E402
    MAX_FIELD_BYTES,
    MAX_HEADER_FIELDS,
    MAX_LINE_BYTES,
    JsonErrors,
)
from raftlog.node.server.listener import IDLE_S, Connections, ListenerProtocol  # noqa: E402
from raftlog.node.server.node import Node  # noqa: E402
from raftlog.node.server.restore import restore_missing  # noqa: E402
from raftlog.node.settings import NodeSettings, load_settings  # noqa: E402
from raftlog.node.storage.datadir_lock import hold_data_dir  # noqa: E402
from raftlog.node.storage.errors import CorruptFile, StorageFailed, WalCorruption  # noqa: E402

log = logging.getLogger("raftlog.node")


def parse_peers(text: str) -> dict[str, str]:
    peers = {}
    for part in text.split(","):
        name, sep, url = part.strip().partition("=")
        if not sep or not name or not url:
            raise argparse.ArgumentTypeError(f"{part!r} is not NAME=URL")
        peers[name] = url
    return peers


def parse_json(text: str) -> Any:
    """A flag whose setting is a mapping or a list, given as JSON (as its environment variable)."""
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON") from None


def _flag_type(annotation: Any) -> tuple[Any, list[str] | None]:
    """(argparse type, choices) of a settings field's annotation (None left out of unions)."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return str, [str(a) for a in args]
    if args and get_origin(annotation) in (Union, UnionType):
        return _flag_type(args[0])
    if annotation in (int, float):
        return annotation, None
    if get_origin(annotation) in (dict, list):
        return parse_json, None
    return str, None


def _shown(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return json.dumps(field.get_default(call_default_factory=True), default=str)
    if field.default is PydanticUndefined:
        return "required"
    return "unset" if field.default is None else json.dumps(field.default, default=str)


def build_parser() -> argparse.ArgumentParser:
    """Every setting of `NodeSettings` as a flag, its help generated from the model (meaning,
    environment variable, default); the Raft settings, nested, are listed after them."""
    ap = argparse.ArgumentParser(
        prog="raftlog-node",
        description=__doc__.split("\n\n")[0],
        epilog=_raft_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", help="JSON settings file (env RAFTLOG_CONFIG)")
    for name, field in NodeSettings.model_fields.items():
        if name == "raft":
            continue
        env = f"RAFTLOG_{name.upper()}"
        helptext = f"{field.description} [env {env}; default {_shown(field)}]"
        helptext = helptext.replace("%", "%%")  # argparse formats help with %
        flag = "--" + name.replace("_", "-")
        if name == "peers":
            ap.add_argument(flag, type=parse_peers, help=f"NAME=URL,... : {helptext}")
        elif field.annotation is bool:
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, help=helptext)
        else:
            kind, choices = _flag_type(field.annotation)
            ap.add_argument(flag, type=kind, choices=choices, help=helptext)
    ap.add_argument(
        "--no-fsync", dest="durable", action="store_false", help="the same as --no-durable"
    )
    ap.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="what the node logs, to stderr [default INFO]",
    )
    ap.set_defaults(**dict.fromkeys(NodeSettings.model_fields))
    return ap


def _raft_settings_help() -> str:
    lines = ['Raft settings, from the environment or the --config file\'s "raft" object:']
    for name, field in RaftConfig.model_fields.items():
        head = f"  RAFTLOG_RAFT__{name.upper()} (default {_shown(field)})"
        lines.append(head)
        lines += textwrap.wrap(
            field.description or "", 96, initial_indent="      ", subsequent_indent="      "
        )
    return "\n".join(lines)


async def serve(settings: NodeSettings) -> None:
    await restore_missing(settings)  # a new member of a restored cluster: its partitions first
    node = Node(settings)
    await node.start()
    listeners: list[tuple[int, frozenset[Plane]]] = (
        [(settings.port, ALL_PLANES)]
        if settings.peer_port is None
        else [(settings.port, frozenset({"client"})), (settings.peer_port, frozenset({"peer"}))]
    )
    runners = []
    fast_servers: list[asyncio.Server] = []
    fast_conns = Connections(
        settings.request_head_timeout_s,
        settings.request_body_timeout_s,
        settings.peer_frame_timeout_s,
    )
    loop = asyncio.get_running_loop()
    limits = {"client": settings.max_client_connections, "peer": settings.max_peer_connections}
    names = ["client" if "client" in planes else "peer" for _, planes in listeners]
    ensure_descriptors(sum(limits[n] for n in names), settings.partitions)
    for (port, planes), name in zip(listeners, names, strict=True):
        # aiohttp closes silent connections after IDLE_S, as the fast path does.
        # An early answer (413, 408) is read for at most a second more, not aiohttp's ten, by
        # a client still sending: it sees the answer, and trickling holds nothing for long.
        # Bodies are taken as sent: no decompression of a Content-Encoding (the guard answers
        # 415), which a small gzip body of a gigabyte would spend the loop on.
        handler_args: dict[str, Any] = {
            "access_log": None,
            "keepalive_timeout": IDLE_S,
            "lingering_time": 1.0,
            "auto_decompress": False,
            "max_line_size": MAX_LINE_BYTES,
            "max_field_size": MAX_FIELD_BYTES,
            "max_headers": MAX_HEADER_FIELDS,
        }
        runner = web.AppRunner(build_app(node, planes), **handler_args)
        await runner.setup()
        assert runner.server is not None
        # What the fast path hands over to: aiohttp's request handler, as `web.Server` makes
        # it, answering the requests it cannot parse in JSON, its heads held to the same
        # deadline as the fast path's.
        aiohttp_server = functools.partial(
            JsonErrors,
            runner.server,
            loop=loop,
            head_timeout_s=settings.request_head_timeout_s,
            **handler_args,
        )
        appends = "client" in planes and settings.client_fast_path
        frames = "peer" in planes
        # Every connection starts on the fast path's protocol, which admits it (or not) under
        # the listener's cap and hands whatever it does not serve itself to aiohttp.
        setting = "max_client_connections" if name == "client" else "max_peer_connections"
        admission = ConnectionLimit(name, limits[name], setting, node.metrics.connections_refused)
        fast_servers.append(
            await loop.create_server(
                lambda fallback=aiohttp_server, a=appends, f=frames, lim=admission: (
                    ListenerProtocol(node, fallback, fast_conns, lim, appends=a, frames=f)
                ),
                settings.host,
                port,
                ssl=settings.server_ssl(peer=name == "peer"),
                backlog=128,
            )
        )
        runners.append(runner)
        log.info(
            "node %s serving %s on %s://%s:%d",
            node.id,
            " and ".join(sorted(planes)),
            "https" if settings.tls_cert_file else "http",
            settings.host,
            port,
        )
    log.info("node %s: %d partitions, data in %s", node.id, settings.partitions, settings.data_dir)
    if settings.insecure_no_auth:
        log.warning(
            "node %s runs WITHOUT AUTHENTICATION (insecure_no_auth): anyone who reaches it can "
            "send it Raft messages, change its members and rewrite its peer addresses",
            node.id,
        )
    fast_conns.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("node %s stopping", node.id)
    for server in fast_servers:
        server.close()
    await fast_conns.drain(settings.append_timeout_s + 1)  # appends under way get their answer
    fast_conns.close_streams()
    for runner in runners:
        await runner.cleanup()
    await node.close()


def run(main: Coroutine[Any, Any, None], event_loop: str) -> None:
    if event_loop == "uvloop":
        uvloop.run(main)
    else:
        asyncio.run(main)


class OneLineBadRequests(logging.Filter):
    """aiohttp logs each request its parser refuses (answered 400) at ERROR with a whole
    traceback, so any client could flood the log: one WARNING line each is enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            said = record.getMessage()
            reason = " ".join(str(exc.message).split())[:300]
            record.msg, record.args = "%s: refused with %d: %s", (said, exc.code, reason)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.server").addFilter(OneLineBadRequests())
    flags: dict[str, Any] = {k: getattr(args, k) for k in NodeSettings.model_fields}
    try:
        settings = load_settings(flags, args.config)
        with hold_data_dir(str(settings.data_dir)):
            run(serve(settings), settings.event_loop)
    except ValidationError as e:
        print(f"raftlog-node: invalid settings: {describe_validation_error(e)}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"raftlog-node: {e}", file=sys.stderr)
        return 2
    except (WalCorruption, CorruptFile) as e:
        print(f"raftlog-node: {e}", file=sys.stderr)
        return 3
    except StorageFailed as e:  # at start: what it could not write (a full disk, EIO)
        reason = errno.errorcode.get(e.errno or 0, "error")
        print(f"raftlog-node: cannot start: {e.op} of {e.path} failed: {reason}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
