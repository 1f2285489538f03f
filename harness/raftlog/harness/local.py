"""A local cluster of real node processes on 127.0.0.1, for tests, benchmarks and demos."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftlog.operator.ports import free_ports as free_ports  # re-exported for tests, bench
from raftlog.operator.ports import release_ports


@dataclass
class LocalNode:
    name: str
    port: int
    data_dir: Path
    log_path: Path
    join: bool = False
    proc: subprocess.Popen[bytes] | None = None

    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalCluster:
    data_dir: Path
    replicas: int = 3
    partitions: int = 1
    tick_ms: int = 50
    durable: bool = True
    raft: dict[str, Any] = field(default_factory=dict)  # RaftConfig overrides
    auth_token_file: Path | None = None
    tls: tuple[Path, Path, Path] | None = None  # certificate, key, CA: the nodes serve https
    env: dict[str, str] = field(default_factory=dict)  # more RAFTLOG_ settings
    # Where a node reaches a peer, (node, peer) -> URL: the peer's own URL by default; a test
    # of network faults gives each ordered pair a proxy it can cut (tests/e2e/links.py).
    peer_url: Callable[[str, str], str] | None = None
    # The nodes' `--cluster`; by default one per data directory, so that two clusters on this
    # machine (pytest's workers) refuse each other's calls should their ports ever meet;
    # "": none (nothing checked).
    cluster: str | None = None
    nodes: dict[str, LocalNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas: must be at least 1, got {self.replicas}")
        self.data_dir = Path(self.data_dir)
        if self.cluster is None:
            where = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()
            self.cluster = f"local-{where[:12]}"
        ports = free_ports(self.replicas)
        for i, port in enumerate(ports, start=1):
            name = f"n{i}"
            self.nodes[name] = LocalNode(
                name, port, self.data_dir / name, self.data_dir / f"{name}.log",
                scheme="https" if self.tls else "http",
            )  # fmt: skip

    def add_node(self) -> LocalNode:
        """A new, empty member (started with `--join`: it waits to be added as a learner)."""
        name = f"n{len(self.nodes) + 1}"
        port = free_ports(1)[0]
        node = LocalNode(
            name, port, self.data_dir / name, self.data_dir / f"{name}.log", join=True,
            scheme="https" if self.tls else "http",
        )  # fmt: skip
        self.nodes[name] = node
        return node

    @property
    def peers(self) -> str:
        return ",".join(f"{n.name}={n.url}" for n in self.nodes.values())

    def peers_of(self, name: str) -> str:
        """The `--peers` of node `name`: its own URL, and where it reaches each other node."""
        if self.peer_url is None:
            return self.peers
        return ",".join(
            f"{n.name}={n.url if n.name == name else self.peer_url(name, n.name)}"
            for n in self.nodes.values()
        )

    @property
    def endpoints(self) -> list[str]:
        return [n.url for n in self.nodes.values()]

    def start(self, name: str | None = None) -> None:
        for node in [self.nodes[name]] if name else list(self.nodes.values()):
            if node.running:
                continue
            node.data_dir.mkdir(parents=True, exist_ok=True)
            cmd = [
                sys.executable, "-m", "raftlog.node.server.main",
                "--node-id", node.name, "--peers", self.peers_of(node.name),
                "--port", str(node.port),
                "--data-dir", str(node.data_dir), "--partitions", str(self.partitions),
                "--tick-ms", str(self.tick_ms),
            ]  # fmt: skip
            if not self.durable:
                cmd.append("--no-fsync")
            if node.join:
                cmd.append("--join")
            if self.cluster:
                cmd += ["--cluster", self.cluster]
            if self.auth_token_file is not None:
                cmd += ["--auth-token-file", str(self.auth_token_file)]
            else:  # a harness of processes on 127.0.0.1: said so, as the node requires
                cmd.append("--insecure-no-auth")
            if self.tls is not None:
                cert, key, ca = self.tls
                cmd += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
                cmd += ["--tls-ca-file", str(ca)]
            env = {**os.environ, **self.env}
            for k, v in self.raft.items():
                env[f"RAFTLOG_RAFT__{k.upper()}"] = str(v)
            with node.log_path.open("ab") as log:
                node.proc = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )

    def signal(self, name: str, sig: int) -> None:
        node = self.nodes[name]
        if node.proc is not None:
            node.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                node.proc.wait()
                node.proc = None  # stopped on purpose: not a crash for `wait_ready`

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)

    def pause(self, name: str) -> None:
        self.signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.running:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGCONT)
                node.proc.terminate()
        for node in self.nodes.values():
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()

    def get(self, name: str, path: str, timeout: float = 2.0) -> tuple[int, Any]:
        return self.request(name, "GET", path, timeout=timeout)

    def request(
        self,
        name: str,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 5.0,
    ) -> tuple[int, Any]:
        """One HTTP call to a node: (status, decoded JSON body or None)."""
        req = urllib.request.Request(
            self.nodes[name].url + path, data=body, method=method, headers=headers or {}
        )
        context = ssl.create_default_context(cafile=str(self.tls[2])) if self.tls else None
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw) if raw else None
            except ValueError:
                return e.code, {"raw": raw.decode(errors="replace")}

    def status(self, name: str) -> dict[str, Any]:
        code, body = self.get(name, "/v1/status")
        if code != 200:
            raise RuntimeError(f"{name}: status answered {code}")
        return dict(body)

    def leader(self, partition: int) -> str | None:
        """The leader every running node agrees on for `partition`, or None."""
        return self.leaders().get(partition)

    def leaders(self) -> dict[int, str]:
        """Each partition's leader, where every running node agrees on one (one status call
        per node for all partitions)."""
        seen: dict[int, set[str]] = {}
        for name, node in self.nodes.items():
            if not node.running:
                continue
            try:
                st = self.status(name)
            except (OSError, RuntimeError):
                return {}
            for part in st["partitions"]:
                seen.setdefault(int(part["partition"]), set()).add(part["leader"] or "")
        return {p: s.pop() for p, s in seen.items() if len(s) == 1 and "" not in s}

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running node serves and every partition has an agreed leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n.name for n in self.nodes.values() if n.proc is not None and not n.running]
            if dead:
                raise RuntimeError(f"nodes exited: {dead}; see {self.data_dir}/<node>.log")
            try:
                if len(self.leaders()) == self.partitions:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the cluster was not ready within {timeout} s")

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        release_ports(n.port for n in self.nodes.values())
