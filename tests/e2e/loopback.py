"""Loopback addresses for tests whose nodes must each have an address of their own."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path


def free_loopback_net(members: int = 8, ports: tuple[int, ...] = (7001, 7002)) -> int:
    """A second octet N such that 127.N.i.1 has every one of `ports` free for i < `members`: the
    pods of one test, each on its own address (members' client and peer ports). Drawn from the
    OS's randomness (a seeded `random` could give two xdist workers the same net) and checked by
    binding each address."""
    rng = random.SystemRandom()
    for _ in range(200):
        net = rng.randint(2, 254)
        socks = []
        try:
            for i in range(members):
                for port in ports:
                    s = socket.socket()
                    socks.append(s)
                    s.bind((f"127.{net}.{i}.1", port))
            return net
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no free 127.N.i.1 with ports {ports} for {members} members")


def start_split_nodes(
    folder: Path,
    hosts: list[str],
    ports: tuple[int, int],
    token: str,
    *,
    scheme: str = "http",
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Real nodes n0, n1, ... one per address of `hosts`, clients on ports[0] and peers and the
    admin API on ports[1] (as operator pods run), with `token` and without fsync; each logs to
    folder/nI.log. Stop them with `kill_nodes`."""
    client, peer = ports
    (folder / "token").write_text(token)
    peers = ",".join(f"n{i}={scheme}://{h}:{peer}" for i, h in enumerate(hosts))
    procs = []
    for i, host in enumerate(hosts):
        cmd = [
            sys.executable, "-m", "raftlog.node.server.main", "--node-id", f"n{i}",
            "--peers", peers, "--host", host, "--port", str(client), "--peer-port", str(peer),
            "--data-dir", str(folder / f"n{i}"), "--auth-token-file", str(folder / "token"),
            "--no-fsync", *args,
        ]  # fmt: skip
        with (folder / f"n{i}.log").open("ab") as log:
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, **(env or {})},
                )
            )
    return procs


def kill_nodes(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
