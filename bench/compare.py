"""Issue 4's comparison benchmark: appends through HTTP against raftlog, PySyncObj, etcd and a null
server, in one run, with `wrk` (a C generator) as the load.

Targets, all on 127.0.0.1, each a 3-node cluster with its disk sync on unless said otherwise:
- raftlog (`LocalCluster`, one partition, fsync on), load on the leader;
- PySyncObj 0.3.17 (PyPI) behind a minimal aiohttp front end (`bench.pysyncobj_front`), with its
  append-entries batching on and off (the best of the two is reported); its journal file is
  written but never fsynced (PySyncObj has no option for it);
- etcd from Debian's `etcd-server` package, through its HTTP/JSON gateway (`/v3/kv/put`);
- a null aiohttp server that answers at once: the generator's own ceiling.

`wrk -t1 -cN` (one thread, N connections, each a closed-loop client) posts one 100-byte record per
request at 1 and 64 clients; then batched producers (100 records per request, 8 clients) against
raftlog and the null server. Every target runs in turn within each round (interleaved), so drift of
the shared machine hits them alike. Missing tools are installed: `wrk` and `etcd-server` with
`apt-get install -y`, PySyncObj with pip into this interpreter (it is not a raftlog dependency).

Results: a Markdown table on stdout and `bench/results/append.json`. `python -m bench.compare`
runs it alone; `BENCH_SECONDS` sets the length of each run (default 10). Then `bench.recovery`
(backfill catch-up and snapshot install against a loopback socket copy) runs in the same process.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import recovery
from raftlog.harness.local import LocalCluster, free_ports

HERE = Path(__file__).resolve().parent
LUA = HERE / "post.lua"
RESULTS = HERE / "results" / "append.json"
PYSYNCOBJ_VERSION = "0.3.17"
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
WARMUP_SECONDS = 2.0
VALUE = "x" * 90  # a raftlog record of 100 bytes encoded
ETCD_KEY, ETCD_VALUE = b"bench-key", b"v" * 91  # 100 bytes of key and value

NULL_SERVER = """
import sys
from aiohttp import web
async def ok(request):
    await request.read()
    return web.json_response({"partition": 0, "first_index": 1, "last_index": 1, "term": 1})
app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_post("/v1/partitions/0/records", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


@dataclass
class Run:
    target: str
    clients: int
    records_per_request: int
    requests: int
    seconds: float
    records_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    errors: dict[str, int]


@dataclass
class Target:
    name: str
    url: str
    body: bytes
    batch_body: bytes | None = None  # 100 records per request, when the target takes batches
    notes: list[str] = field(default_factory=list)


# ====================================================================== tools
def apt_install(packages: list[str]) -> str | None:
    """Install Debian packages; None on success, else why not."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if shutil.which("apt-get") is None:
        return "apt-get is not available on this machine"
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return "not root and no sudo: cannot apt-get install"
        cmd = ["sudo", "-n", *cmd]
    for attempt in range(2):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if r.returncode == 0:
            return None
        if attempt == 0:  # a stale package list: refresh once
            subprocess.run(
                [*cmd[: cmd.index("apt-get")], "apt-get", "update"],
                env=env,
                capture_output=True,
                check=False,
            )
    return f"apt-get install {' '.join(packages)} failed: {r.stderr.strip()[-300:]}"


def ensure_tools() -> dict[str, Any]:
    """wrk, etcd and PySyncObj present (installed when missing); what failed and versions."""
    info: dict[str, Any] = {"missing": {}}
    wanted = {"wrk": "wrk", "etcd": "etcd-server"}
    missing = [pkg for tool, pkg in wanted.items() if shutil.which(tool) is None]
    if missing:
        why = apt_install(missing)
        if why:
            for tool, pkg in wanted.items():
                if pkg in missing:
                    info["missing"][tool] = why
    if shutil.which("etcd"):
        out = subprocess.run(["etcd", "--version"], capture_output=True, text=True, check=False)
        m = re.search(r"etcd Version: (\S+)", out.stdout)
        info["etcd_version"] = m.group(1) if m else out.stdout.strip()[:80]
    if shutil.which("wrk"):
        out = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False)
        info["wrk_version"] = (out.stdout or out.stderr).split("\n")[0].strip()
    try:
        version = importlib.import_module("pysyncobj.version").VERSION
    except ImportError:
        version = None
    if version != PYSYNCOBJ_VERSION:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", f"pysyncobj=={PYSYNCOBJ_VERSION}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            info["missing"]["pysyncobj"] = f"pip install failed: {r.stderr.strip()[-300:]}"
        else:
            version = PYSYNCOBJ_VERSION
    info["pysyncobj_version"] = version
    return info


# ====================================================================== load
def wrk(
    url: str,
    body: bytes,
    clients: int,
    seconds: float,
    workdir: Path,
    script: Path = LUA,
    more: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One wrk run: its RESULT line (requests, errors, latency percentiles in µs). `more`:
    arguments after the body file, for `script`."""
    body_file = workdir / f"body-{hashlib.sha1(body).hexdigest()[:12]}.json"
    if not body_file.exists():
        body_file.write_bytes(body)
    cmd = [
        "wrk", "-t1", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "10s",
        "-s", str(script), url, "--", str(body_file), *more,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=seconds + 60)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    raise RuntimeError(f"wrk printed no result: {out.stdout[-500:]} {out.stderr[-500:]}")


def measure(t: Target, clients: int, batch: int, workdir: Path) -> Run:
    body = t.body if batch == 1 else t.batch_body
    assert body is not None
    r = wrk(t.url, body, clients, SECONDS, workdir)
    secs = r["duration_us"] / 1e6
    lat = r["latency_us"]
    return Run(
        target=t.name,
        clients=clients,
        records_per_request=batch,
        requests=r["requests"],
        seconds=round(secs, 3),
        records_per_s=round(r["requests"] * batch / secs, 1),
        p50_ms=lat["p50"] / 1000,
        p99_ms=lat["p99"] / 1000,
        p999_ms=lat["p999"] / 1000,
        errors=r["errors"],
    )


# ====================================================================== targets
def _get_json(url: str, data: bytes | None = None, timeout: float = 2.0) -> Any:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _wait(what: str, ok: Any, timeout: float = 60.0) -> Any:
    """`ok()`'s first answer other than None (a leader's index may be 0)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = ok()
            if v is not None:
                return v
        except Exception as e:
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready within {timeout} s (last error: {last})")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def raftlog_body(batch: int) -> bytes:
    if batch == 1:
        return json.dumps({"value": VALUE}).encode()
    return json.dumps({"records": [{"value": VALUE}] * batch}).encode()


@contextlib.contextmanager
def null_server(workdir: Path) -> Iterator[Target]:
    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-c", NULL_SERVER, str(port)])
    try:
        url = f"http://127.0.0.1:{port}/v1/partitions/0/records"
        _wait("null server", lambda: _get_json(url, b"{}"))
        yield Target("null aiohttp server", url, raftlog_body(1), raftlog_body(100))
    finally:
        _stop([proc])


@contextlib.contextmanager
def raftlog_cluster(workdir: Path) -> Iterator[Target]:
    with LocalCluster(workdir / "raftlog", replicas=3, partitions=1) as cluster:
        cluster.wait_ready()
        leader = cluster.leader(0)
        assert leader is not None
        url = cluster.nodes[leader].url + "/v1/partitions/0/records"
        yield Target("raftlog", url, raftlog_body(1), raftlog_body(100))


@contextlib.contextmanager
def etcd_cluster(workdir: Path) -> Iterator[Target]:
    ports = free_ports(6)
    names = ["e1", "e2", "e3"]
    peer = {n: f"http://127.0.0.1:{ports[i]}" for i, n in enumerate(names)}
    client = {n: f"http://127.0.0.1:{ports[3 + i]}" for i, n in enumerate(names)}
    initial = ",".join(f"{n}={peer[n]}" for n in names)
    procs = []
    try:
        for n in names:
            log = open(workdir / f"etcd-{n}.log", "wb")  # noqa: SIM115 (the process owns it)
            cmd = [
                "etcd", "--name", n, "--data-dir", str(workdir / f"etcd-{n}"),
                "--listen-peer-urls", peer[n], "--initial-advertise-peer-urls", peer[n],
                "--listen-client-urls", client[n], "--advertise-client-urls", client[n],
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", "raftlog-bench", "--log-level", "warn",
                "--logger", "zap",
            ]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))

        def leader() -> str | None:
            for n in names:
                st = _get_json(f"{client[n]}/v3/maintenance/status", b"{}")
                if st.get("leader") and st["leader"] == st["header"]["member_id"]:
                    return n
            return None

        n = _wait("etcd cluster", leader)
        body = json.dumps(
            {
                "key": base64.b64encode(ETCD_KEY).decode(),
                "value": base64.b64encode(ETCD_VALUE).decode(),
            }
        ).encode()
        yield Target("etcd", f"{client[n]}/v3/kv/put", body)
    finally:
        _stop(procs)


@contextlib.contextmanager
def pysyncobj_cluster(workdir: Path, batch: bool) -> Iterator[Target]:
    ports = free_ports(6)  # one call: ports of separate calls may repeat
    raft_ports, http_ports = ports[:3], ports[3:]
    addrs = [f"127.0.0.1:{p}" for p in raft_ports]
    procs = []
    tag = "on" if batch else "off"
    try:
        for i, addr in enumerate(addrs):
            partners = ",".join(a for a in addrs if a != addr)
            log = open(workdir / f"pysyncobj-{tag}-{i}.log", "wb")  # noqa: SIM115
            cmd = [
                sys.executable, "-m", "bench.pysyncobj_front", addr, partners, str(http_ports[i]),
                str(workdir / f"pysyncobj-{tag}-{i}.journal"), "1" if batch else "0",
            ]  # fmt: skip
            procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=HERE.parent)
            )

        def leader() -> int | None:
            for i, port in enumerate(http_ports):
                st = _get_json(f"http://127.0.0.1:{port}/status")
                if st["leader"] and st["has_quorum"]:
                    return i
            return None

        try:
            i = _wait(f"PySyncObj cluster (batching {tag})", leader)
        except TimeoutError as e:
            logs = [(workdir / f"pysyncobj-{tag}-{k}.log").read_text()[-600:] for k in range(3)]
            codes = [p.poll() for p in procs]
            raise TimeoutError(f"{e}; exit codes {codes}; logs: {logs}") from None
        url = f"http://127.0.0.1:{http_ports[i]}/v1/partitions/0/records"
        yield Target(f"PySyncObj, batching {tag}", url, raftlog_body(1))
    finally:
        _stop(procs)


# ====================================================================== run
def _fmt(v: float) -> str:
    return f"{v:,.0f}"


def main() -> dict[str, Any]:
    tools = ensure_tools()
    if "wrk" in tools["missing"]:
        raise SystemExit(f"bench.compare needs wrk: {tools['missing']['wrk']}")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    runs: list[Run] = []
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="raftlog-cmp-")))
        targets = [
            stack.enter_context(null_server(workdir)),
            stack.enter_context(raftlog_cluster(workdir)),
        ]
        if "etcd" not in tools["missing"]:
            targets.append(stack.enter_context(etcd_cluster(workdir)))
        if "pysyncobj" not in tools["missing"]:
            for batch in (True, False):
                targets.append(stack.enter_context(pysyncobj_cluster(workdir, batch)))
        for t in targets:  # warm up: connections, JIT-less caches, the first elections' noise
            wrk(t.url, t.body, 8, WARMUP_SECONDS, workdir)
        for clients in (1, 64):
            for t in targets:
                runs.append(measure(t, clients, 1, workdir))
                print(_line(runs[-1]), file=sys.stderr, flush=True)
        for t in targets:
            if t.batch_body is not None:
                runs.append(measure(t, 8, 100, workdir))
                print(_line(runs[-1]), file=sys.stderr, flush=True)
    print("\nbackfill catch-up and snapshot install (bench.recovery):", file=sys.stderr)
    try:
        recovered: dict[str, Any] = recovery.main()
    except Exception as e:  # the append figures are still written
        recovered = {"error": f"{type(e).__name__}: {e}"}
        print(f"bench.recovery failed: {recovered['error']}", file=sys.stderr)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    result = {
        "command": "python -m bench.compare",
        "started": started,
        "seconds_per_run": SECONDS,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "tools": tools,
        "runs": [asdict(r) for r in runs],
        "summary": summarize(runs),
        "recovery": recovered,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    return result


def _line(r: Run) -> str:
    err = sum(r.errors.values())
    return (
        f"| {r.target} | {r.clients} | {r.records_per_request} | {_fmt(r.records_per_s)} | "
        f"{r.p50_ms:.2f} ms | {r.p99_ms:.2f} ms | {err or ''} |"
    )


def summarize(runs: list[Run]) -> dict[str, Any]:
    def get(name: str, clients: int, batch: int = 1) -> Run | None:
        for r in runs:
            if r.target == name and r.clients == clients and r.records_per_request == batch:
                return r
        return None

    out: dict[str, Any] = {}
    for clients in (1, 64):
        rl, etcd, null = (
            get("raftlog", clients),
            get("etcd", clients),
            get("null aiohttp server", clients),
        )
        pso = [r for r in (get(f"PySyncObj, batching {b}", clients) for b in ("on", "off")) if r]
        best = max(pso, key=lambda r: r.records_per_s) if pso else None
        s: dict[str, Any] = {}
        if rl and etcd:
            s["raftlog_over_etcd_rate"] = round(rl.records_per_s / etcd.records_per_s, 3)
            s["raftlog_over_etcd_p50"] = round(rl.p50_ms / etcd.p50_ms, 3)
            s["raftlog_over_etcd_p99"] = round(rl.p99_ms / etcd.p99_ms, 3)
        if rl and best:
            s["pysyncobj_best"] = best.target
            s["raftlog_over_pysyncobj_best_rate"] = round(rl.records_per_s / best.records_per_s, 3)
        if rl and null:
            s["raftlog_over_null_rate"] = round(rl.records_per_s / null.records_per_s, 3)
        out[f"clients_{clients}"] = s
    batched = get("raftlog", 8, 100)
    if batched:
        out["batched_records_per_s"] = batched.records_per_s
    return out


def print_table(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"wrk -t1, {result['seconds_per_run']:g} s per run, {m['cpus']} CPUs, load average "
        f"{' '.join(m['loadavg_before'])} before, {' '.join(m['loadavg_after'])} after; "
        f"etcd {result['tools'].get('etcd_version')}, "
        f"PySyncObj {result['tools'].get('pysyncobj_version')}\n"
    )
    for tool, why in result["tools"]["missing"].items():
        print(f"NOT RUN: {tool}: {why}\n")
    print("| target | clients | records per request | records/s | p50 | p99 | errors |")
    print("|---|---|---|---|---|---|---|")
    for r in result["runs"]:
        print(_line(Run(**r)))
    print()
    s = result["summary"]
    for clients in (1, 64):
        c = s[f"clients_{clients}"]
        parts = []
        if "raftlog_over_etcd_rate" in c:
            parts.append(
                f"raftlog/etcd: rate {c['raftlog_over_etcd_rate']:.2f}x, "
                f"p50 {c['raftlog_over_etcd_p50']:.2f}x, p99 {c['raftlog_over_etcd_p99']:.2f}x"
            )
        if "raftlog_over_pysyncobj_best_rate" in c:
            parts.append(
                f"raftlog/{c['pysyncobj_best']}: rate {c['raftlog_over_pysyncobj_best_rate']:.2f}x"
            )
        if "raftlog_over_null_rate" in c:
            parts.append(f"raftlog/null: {c['raftlog_over_null_rate']:.2f}x")
        print(f"- {clients} client{'s' if clients > 1 else ''}: " + "; ".join(parts))
    if "batched_records_per_s" in s:
        print(f"- batched (8 clients x 100 records): {_fmt(s['batched_records_per_s'])} records/s")


if __name__ == "__main__":
    main()
