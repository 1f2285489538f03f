"""A real S3-compatible server on 127.0.0.1: SeaweedFS's `weed`, for `raftctl local up
--object-store` (and, through `raftlog.harness.s3.S3Server`, for the tests).

`WeedS3` runs `weed mini` (master, volume server, filer, S3 gateway and an idle admin server in
one process: SeaweedFS's mode for development and tests) on free ports of 127.0.0.1, with its data
in a folder of its own and one static identity (access and secret key) in its S3 config. `weed
server -s3` was tried first: it took 15 s to exit on SIGTERM (its volume server stops before its
filer, whose last metadata flush then waits for a volume); `weed mini` exits in about 1.5 s.

Which `weed` (`find_weed`): the one given, else `$RAFTLOG_WEED`, else the one the checkout's
`make s3server` built and cached under ~/.cache/raftlog-cluster/seaweedfs-<version>/ (the newest
there), else `weed` on the PATH.

`LocalObjectStore` is what `raftctl local up --object-store` runs: a `WeedS3` in the local state
directory whose credentials and ports are kept there across runs (so are its objects), the
archive's bucket made before the members that upload to it start.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from raftlog.operator.ports import free_ports

WEED_ENV = "RAFTLOG_WEED"
# Where the checkout's `make s3server` (cluster/build.py) caches its builds.
CACHE_ENV = "RAFTLOG_CLUSTER_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "raftlog-cluster"

# Every port `weed mini` listens on here: HTTP and gRPC of each part. All named, none derived
# (weed's default gRPC port is the HTTP port + 10000: past 65535 for a high free port) and none
# left at its default (two servers at once would clash).
PORTS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
    "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
)  # fmt: skip


class LocalS3Error(RuntimeError):
    pass


def _dropped(name: str) -> bool:
    """Environment weed would take settings (WEED_*) or buckets to make (S3_*BUCKET) from."""
    return name.startswith("WEED_") or name in ("S3_BUCKET", "S3_TABLE_BUCKET")


def cached_weed() -> Path | None:
    """The newest `weed` the checkout's `make s3server` cached, if any."""
    cache = Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    found = [p for p in cache.glob("seaweedfs-*/weed") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def find_weed(given: Path | None = None) -> Path:
    """`given`, else `$RAFTLOG_WEED`, else the cached build, else `weed` on the PATH."""
    if given is not None:
        if not given.is_file():
            raise LocalS3Error(f"weed: {given} is not a file")
        return given
    env = os.environ.get(WEED_ENV)
    if env:
        return Path(env)
    found = cached_weed() or (Path(w) if (w := shutil.which("weed")) else None)
    if found is None:
        raise LocalS3Error(
            f"no SeaweedFS `weed`: give its path (--weed PATH or {WEED_ENV}), or run "
            "`make s3server` in the raftlog checkout to build it"
        )
    return found


@dataclass
class WeedS3:
    """One SeaweedFS S3 endpoint; a context manager (start on enter, stop on exit).

    `data_dir` keeps the objects across a stop and start (or a new server on the same folder);
    without one, a temporary folder is made and removed on `stop`. The process's output goes to
    `log_path` (appended to across restarts).
    """

    data_dir: Path | None = None
    buckets: tuple[str, ...] = ()
    access_key: str = "raftlog-access"
    secret_key: str = "raftlog-secret-key-for-tests"
    region: str = "us-east-1"
    start_timeout: float = 60.0
    stop_timeout: float = 15.0
    volume_size_limit_mb: int = 64  # the least `weed mini` takes: little disk, quick vacuum
    log_path: Path | None = None
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    startup_seconds: float | None = None  # how long the last start took until it answered
    _owns_dir: bool = field(default=False, repr=False)
    weed: Path | None = None  # the binary; None: `find_weed`

    def __post_init__(self) -> None:
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="raftlog-s3-"))
            self._owns_dir = True
        self.data_dir = Path(self.data_dir)
        if self.log_path is None:
            self.log_path = self.data_dir / "weed.log"
        if not self.ports:
            self.ports = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))

    def weed_binary(self) -> Path:
        return find_weed(self.weed)

    # -- where it is ------------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def master(self) -> str:
        """The master's address as weed names it: host:port.grpcPort."""
        return f"127.0.0.1:{self.ports['master.port']}.{self.ports['master.port.grpc']}"

    @property
    def filer(self) -> str:
        return f"127.0.0.1:{self.ports['filer.port']}.{self.ports['filer.port.grpc']}"

    def _url(self, part: str) -> str:
        return f"http://127.0.0.1:{self.ports[part + '.port']}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def obstore_config(self) -> dict[str, Any]:
        """Keyword arguments of `obstore.store.S3Store(bucket, **...)` for this endpoint."""
        return {
            "endpoint": self.endpoint,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "region": self.region,
            "virtual_hosted_style_request": False,
            "client_options": {"allow_http": True},
        }

    def pyarrow_options(self) -> dict[str, Any]:
        """Keyword arguments of `pyarrow.fs.S3FileSystem(**...)` for this endpoint."""
        return {
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
            "endpoint_override": self.endpoint,
            "scheme": "http",
        }

    # -- life -------------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def command(self, weed: Path) -> list[str]:
        return [
            str(weed), "-logtostderr=true", "mini",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.dir / 'data'}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            "-admin.port.legacy=0", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # no Iceberg or Lance catalogs
            f"-s3.config={self.dir / 's3.json'}",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
            "-master.telemetry=false",
        ]  # fmt: skip

    def _write_config(self) -> None:
        identity = {
            "name": "raftlog",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        fd = os.open(self.dir / "s3.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w") as f:  # the secret: readable by this user only, from the first byte
            json.dump({"identities": [identity]}, f, indent=2)

    def start(self) -> None:
        if self.running:
            return
        assert self.log_path is not None
        started = time.monotonic()
        try:
            weed = self.weed_binary()
            (self.dir / "data").mkdir(parents=True, exist_ok=True)
            self._write_config()
            env = {k: v for k, v in os.environ.items() if not _dropped(k)}
            with open(self.log_path, "ab") as log:
                log.write(f"---- {shlex.join(self.command(weed))}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    self.command(weed), cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            self._wait_ready(started + self.start_timeout)
            self.startup_seconds = time.monotonic() - started
            for bucket in self.buckets:
                self.create_bucket(bucket)
        except BaseException:
            self.stop()
            raise

    def stop(self, remove: bool | None = None) -> None:
        """SIGTERM, then SIGKILL after `stop_timeout`; the temporary folder is removed with it."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc is not None:
            self._remove_stale_sockets()
        if remove if remove is not None else self._owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed or said goodbye to."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            self._remove_stale_sockets()
        self.proc = None

    def _remove_stale_sockets(self) -> None:
        """weed also serves on Unix sockets /tmp/seaweedfs-<part>-<port>.sock and leaves some
        behind (the admin's always; every one on a crash): those of its ports nothing answers on.
        """
        for port in self.ports.values():
            for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                with socket.socket(socket.AF_UNIX) as probe:
                    try:
                        probe.connect(str(path))
                    except ConnectionRefusedError:
                        path.unlink(missing_ok=True)
                    except OSError:
                        pass

    # -- readiness and buckets ---------------------------------------------------------------------

    def log_tail(self, lines: int = 30) -> str:
        assert self.log_path is not None
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _http(self, url: str) -> tuple[int, bytes] | None:
        """(status, body) of a GET, None when nothing answers yet."""
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())
        except (OSError, ValueError):
            return None

    def _ready(self) -> bool:
        # The master has a volume server to place writes on, the filer answers, and so does the
        # S3 gateway (an unsigned request is refused: that is its answer).
        status = self._http(self._url("master") + "/dir/status")
        if status is None or status[0] != 200:
            return False
        if json.loads(status[1]).get("Topology", {}).get("Max", 0) <= 0:
            return False
        filer = self._http(self._url("filer") + "/")
        if filer is None or filer[0] >= 500:
            return False
        s3 = self._http(self.endpoint + "/")
        return s3 is not None and s3[0] in (200, 403)

    def _wait_ready(self, deadline: float) -> None:
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise LocalS3Error(f"weed exited ({code}) on start:\n{self.log_tail()}")
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise LocalS3Error(
                    f"weed did not answer in {self.start_timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def shell(self, *commands: str, timeout: float = 30.0, check: bool = True) -> str:
        """`weed shell` against this server: its admin commands, one a line; what they printed.

        weed exits 1 when a command failed (and runs the rest): `check` makes that an error.
        """
        done = subprocess.run(
            [str(self.weed_binary()), "shell", f"-master={self.master}", f"-filer={self.filer}"],
            input="\n".join([*commands, "exit"]) + "\n", capture_output=True, text=True,
            timeout=timeout, cwd=self.dir,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise LocalS3Error(
                f"weed shell {commands}: exit {done.returncode}\n{done.stdout}{done.stderr}"
            )
        return done.stdout + done.stderr

    @staticmethod
    def _buckets(listing: str) -> list[str]:
        # `s3.bucket.list` prints "  <name>\tsize:..." a bucket.
        return sorted(line.split()[0] for line in listing.splitlines() if line.startswith("  "))

    def list_buckets(self) -> list[str]:
        return self._buckets(self.shell("s3.bucket.list"))

    def create_bucket(self, name: str) -> None:
        """Create `name` (nothing if it exists), through the server's own admin shell."""
        # One shell for both: an existing bucket fails the create ("already exists"), not the list.
        out = self.shell(f"s3.bucket.create -name {name}", "s3.bucket.list", check=False)
        if name not in self._buckets(out):
            raise LocalS3Error(f"bucket {name!r} not created:\n{out}")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalObjectStore:
    """The S3 server of `raftctl local up --object-store`, in `folder` (the local state
    directory's `object-store/`): its objects, its log (`weed.log`), its credentials
    (`credentials`: the access key id and the secret, two lines, made once and readable by this
    user alone; the members read the same file) and its ports (`ports.json`, kept from one run to
    the next while they are free)."""

    def __init__(self, folder: Path, weed: Path | None = None) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        self.credentials_file = folder / "credentials"
        key, secret = self._credentials()
        self.server = WeedS3(
            folder, access_key=key, secret_key=secret, ports=self._ports(), weed=weed
        )
        self._buckets: set[str] = set()

    def _credentials(self) -> tuple[str, str]:
        if not self.credentials_file.is_file():
            text = f"raftlog-{secrets.token_hex(6)}\n{secrets.token_urlsafe(30)}\n"
            fd = os.open(self.credentials_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "w") as f:
                f.write(text)
        lines = self.credentials_file.read_text().split()
        if len(lines) != 2:
            raise LocalS3Error(f"{self.credentials_file}: not an access key id and a secret")
        return lines[0], lines[1]

    def _ports(self) -> dict[str, int]:
        path = self.folder / "ports.json"
        try:
            kept = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            kept = {}
        if set(kept) != set(PORTS) or not all(_free(p) for p in kept.values()):
            kept = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))
            path.write_text(json.dumps(kept))
        return kept

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def pid(self) -> int | None:
        return self.server.proc.pid if self.server.running and self.server.proc else None

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop(remove=False)
        self._buckets.clear()

    async def ensure_bucket(self, name: str) -> None:
        """The bucket exists (made once per run; nothing when it is there already)."""
        if name not in self._buckets:
            await asyncio.to_thread(self.server.create_bucket, name)
            self._buckets.add(name)
