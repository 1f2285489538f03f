"""`raftlog-node`: run one node of a raftlog cluster.

    raftlog-node --node-id n1 --peers n1=http://127.0.0.1:7001,n2=...,n3=... \\
                 --port 7001 --data-dir /var/lib/raftlog --partitions 2

Every flag can also come from the environment (`RAFTLOG_NODE_ID`, `RAFTLOG_PEERS` as JSON, ...,
`RAFTLOG_RAFT__BACKFILL_THRESHOLD`) or a JSON file (`--config`); flags win, then the environment,
then the file. A bad value stops the node at start with the field and the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import Any

import uvloop
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import ValidationError

from raftlog.node.config import describe_validation_error
from raftlog.node.server.app import ALL_PLANES, Plane, build_app
from raftlog.node.server.fastpath import IDLE_S, Connections, FastPathProtocol
from raftlog.node.server.node import Node
from raftlog.node.settings import NodeSettings, load_settings
from raftlog.node.storage.errors import CorruptFile, WalCorruption

log = logging.getLogger("raftlog.node")


def parse_peers(text: str) -> dict[str, str]:
    peers = {}
    for part in text.split(","):
        name, sep, url = part.strip().partition("=")
        if not sep or not name or not url:
            raise argparse.ArgumentTypeError(f"{part!r} is not NAME=URL")
        peers[name] = url
    return peers


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="raftlog-node", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="JSON settings file")
    ap.add_argument("--node-id")
    ap.add_argument("--peers", type=parse_peers, help="NAME=URL,... for every member")
    ap.add_argument("--host")
    ap.add_argument("--port", type=int, help="client API port (and everything, alone)")
    ap.add_argument("--peer-port", type=int, help="peer and admin port (split from clients)")
    ap.add_argument("--partitions", type=int)
    ap.add_argument("--data-dir")
    ap.add_argument("--join", action="store_true", default=None, help="start empty, as a learner")
    ap.add_argument("--tick-ms", type=int)
    ap.add_argument("--auth-token-file")
    ap.add_argument("--tls-cert-file", help="serve HTTPS with this certificate (PEM)")
    ap.add_argument("--tls-key-file", help="its private key (PEM)")
    ap.add_argument("--tls-ca-file", help="CA bundle to verify https peers against")
    ap.add_argument(
        "--no-fsync",
        dest="durable",
        action="store_false",
        default=None,
        help="skip fsync (tests and benchmarks only; logged)",
    )
    ap.add_argument("--event-loop", choices=["uvloop", "asyncio"], help="default: uvloop")
    ap.add_argument("--log-level", default="INFO")
    return ap


async def serve(settings: NodeSettings) -> None:
    node = Node(settings)
    await node.start()
    listeners: list[tuple[int, frozenset[Plane]]] = (
        [(settings.port, ALL_PLANES)]
        if settings.peer_port is None
        else [(settings.port, frozenset({"client"})), (settings.peer_port, frozenset({"peer"}))]
    )
    runners = []
    fast_servers: list[asyncio.Server] = []
    fast_conns = Connections()
    loop = asyncio.get_running_loop()
    for port, planes in listeners:
        # aiohttp closes silent connections after IDLE_S, as the fast path does.
        runner = web.AppRunner(build_app(node, planes), access_log=None, keepalive_timeout=IDLE_S)
        await runner.setup()
        aiohttp_server = runner.server  # the protocol factory the fast path hands over to
        assert aiohttp_server is not None
        appends = "client" in planes and settings.client_fast_path
        frames = "peer" in planes and settings.peer_frames
        if appends or frames:
            fast_servers.append(
                await loop.create_server(
                    lambda fallback=aiohttp_server, a=appends, f=frames: FastPathProtocol(
                        node, fallback, fast_conns, appends=a, frames=f
                    ),
                    settings.host,
                    port,
                    ssl=settings.server_ssl(),
                    backlog=128,
                )
            )
        else:
            site = web.TCPSite(runner, settings.host, port, ssl_context=settings.server_ssl())
            await site.start()
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
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.server").addFilter(OneLineBadRequests())
    flags: dict[str, Any] = {
        k: getattr(args, k)
        for k in (
            "node_id",
            "peers",
            "host",
            "port",
            "peer_port",
            "partitions",
            "data_dir",
            "join",
            "tick_ms",
            "auth_token_file",
            "durable",
            "tls_cert_file",
            "tls_key_file",
            "tls_ca_file",
            "event_loop",
        )
    }
    try:
        settings = load_settings(flags, args.config)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
