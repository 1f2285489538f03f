"""The local runtime: the operator's reconciler driving node processes and directories.

`raftctl local up -f examples/raftcluster.yaml --data-dir DIR` runs it. The desired state is the
manifest kept in `DIR/raftcluster.yaml` (`raftctl local scale` edits it, as `kubectl scale` edits
the resource); the status is `DIR/status.json`; each member's data is `DIR/members/<name>/`.
Members are processes on 127.0.0.1, each on its own port, with the same flags a pod gets.

Secrets are files here, the way Kubernetes mounts them: the generated auth token is `DIR/token`,
and the Secret `spec.archive.credentialsSecret` names is the folder `DIR/secrets/<name>/` with a
file per key (`accessKeyId`, `secretAccessKey`), from which the members' archive credentials
file `DIR/archive-credentials` is written. With `raftctl local up --object-store` the archive goes
to the local S3 server that command runs (`local_s3.LocalObjectStore`): its endpoint and its
credentials instead of the spec's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raftlog.node.server.archive import S3ObjectStore
from raftlog.node.settings import read_credentials
from raftlog.operator.actions import Event, describe
from raftlog.operator.cluster_views import PodState
from raftlog.operator.controls import Controls
from raftlog.operator.controls import parse as parse_controls
from raftlog.operator.local_s3 import LocalObjectStore
from raftlog.operator.models import (
    ACCESS_KEY_ID_KEY,
    GROUP,
    KIND,
    SECRET_ACCESS_KEY_KEY,
    RaftClusterSpec,
    RaftClusterStatus,
    name_problem,
)
from raftlog.operator.node_launch import node_args, node_env, restore_env
from raftlog.operator.nodeapi import NodeApi
from raftlog.operator.ports import free_ports
from raftlog.operator.runtime import PassResult, PodInfo, reconcile_pass
from raftlog.operator.safety import lowering_refused

log = logging.getLogger("raftlog.operator.local")

MANIFEST = "raftcluster.yaml"
STATUS = "status.json"
SECRETS = "secrets"  # DIR/secrets/<name>/<key>: the local runtime's Secrets
ARCHIVE_CREDENTIALS = "archive-credentials"
OBJECT_STORE = "object-store"  # the folder of `raftctl local up --object-store`'s S3 server


class ManifestError(ValueError):
    pass


def load_manifest(text: str, source: str = "manifest") -> tuple[str, RaftClusterSpec]:
    """The cluster's name and validated spec from a `RaftCluster` manifest (YAML)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ManifestError(f"{source}: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{source}: expected a RaftCluster object")
    api = f"{GROUP}/v1alpha1"
    if doc.get("apiVersion") != api or doc.get("kind") != KIND:
        raise ManifestError(f"{source}: apiVersion/kind must be {api}/{KIND}")
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{source}: metadata.name is required")
    if (problem := name_problem(name)) is not None:
        raise ManifestError(f"{source}: {problem}, got {name!r}")
    try:
        spec = RaftClusterSpec.model_validate(doc.get("spec") or {})
    except ValidationError as e:
        where = "; ".join(
            f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise ManifestError(f"{source}: {where}") from None
    return name, spec


def manifest_of(name: str, spec: RaftClusterSpec, annotations: dict[str, str] | None = None) -> str:
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    doc = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": KIND,
        "metadata": metadata,
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_unset=True),
    }
    return yaml.safe_dump(doc, sort_keys=False)


class LocalRuntime:
    """Members as processes on 127.0.0.1; their addresses and launch hashes in `runtime.json`."""

    def __init__(
        self,
        base: Path,
        token_file: Path,
        env: dict[str, str] | None = None,
        object_store: LocalObjectStore | None = None,
    ) -> None:
        self.base = base
        self.token_file = token_file
        self.env = dict(env or {})
        self.object_store = object_store
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._state_path = base / "runtime.json"
        state = json.loads(self._state_path.read_text()) if self._state_path.is_file() else {}
        self.ports: dict[str, int] = state.get("ports", {})
        self.hashes: dict[str, str] = state.get("hashes", {})

    def _save(self) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ports": self.ports, "hashes": self.hashes}))
        os.replace(tmp, self._state_path)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def data_dir(self, name: str) -> Path:
        return self.base / "members" / name

    async def archive_store(self, spec: RaftClusterSpec, url: str) -> S3ObjectStore:
        """The object store at `url` as the members reach it (spec.archive's endpoint, region
        and credentials, or the local object store's), for restore plans and backups."""
        env = self.archive_env(spec)
        creds_file = env.get("RAFTLOG_ARCHIVE_CREDENTIALS_FILE")
        creds = (
            read_credentials(Path(creds_file), "spec.archive.credentialsSecret")
            if creds_file
            else None
        )
        return S3ObjectStore(
            url, env.get("RAFTLOG_ARCHIVE_ENDPOINT"), env.get("RAFTLOG_ARCHIVE_REGION"), creds
        )

    def archive_env(self, spec: RaftClusterSpec) -> dict[str, str]:
        """A member's archive settings: the spec's, with credentials from the Secret's folder
        (written to one file for the node), or the local object store's endpoint and
        credentials when there is one. Raises, naming the field, when the Secret is missing."""
        if spec.archive is None:
            return {}
        env = spec.archive.node_env()
        if self.object_store is not None:
            env["RAFTLOG_ARCHIVE_ENDPOINT"] = self.object_store.endpoint
            env["RAFTLOG_ARCHIVE_CREDENTIALS_FILE"] = str(self.object_store.credentials_file)
            return env
        name = spec.archive.credentials_secret
        if name is None:
            return env
        folder = self.base / SECRETS / name
        if not folder.is_dir():
            raise RuntimeError(
                f"spec.archive.credentialsSecret: no secret {name} in {self.base / SECRETS} "
                f"(a folder {name}/ with the files {ACCESS_KEY_ID_KEY} and {SECRET_ACCESS_KEY_KEY})"
            )
        values = []
        for key in (ACCESS_KEY_ID_KEY, SECRET_ACCESS_KEY_KEY):
            try:
                value = (folder / key).read_text().strip()
            except OSError:
                value = ""
            if not value:
                raise RuntimeError(
                    f"spec.archive.credentialsSecret: secret {name} has no key {key} "
                    f"({folder / key} missing or empty)"
                )
            values.append(value)
        path = self.base / ARCHIVE_CREDENTIALS
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:  # readable by this user alone, from the first byte
            f.write("\n".join(values) + "\n")
        os.replace(tmp, path)
        env["RAFTLOG_ARCHIVE_CREDENTIALS_FILE"] = str(path)
        return env

    async def pods(self, spec: RaftClusterSpec, status: RaftClusterStatus) -> dict[str, PodInfo]:
        out = {}
        for name in self.ports:
            proc = self.procs.get(name)
            state: PodState = (
                "missing" if proc is None else "running" if proc.poll() is None else "failed"
            )
            out[name] = PodInfo(
                state, self.data_dir(name).is_dir(), self.url(name), self.hashes.get(name)
            )
        return out

    async def create_members(
        self,
        spec: RaftClusterSpec,
        status: RaftClusterStatus,
        names: tuple[str, ...],
        join: bool,
        launch_hash: str,
    ) -> None:
        archive = self.archive_env(spec)  # a missing Secret fails the step before any change
        if spec.archive is not None and self.object_store is not None:
            await self.object_store.ensure_bucket(spec.archive.bucket)
        new = [n for n in names if n not in self.ports]
        for n, port in zip(new, free_ports(len(new)), strict=True):
            self.ports[n] = port
        self._save()
        peers = {n: self.url(n) for n in self.ports}
        for name in names:
            await self._stop(name)
            self.data_dir(name).mkdir(parents=True, exist_ok=True)
            args = node_args(
                spec, name, peers, join=join, data_dir=str(self.data_dir(name)),
                port=self.ports[name], peer_port=None, host="127.0.0.1",
                token_file=str(self.token_file),
            )  # fmt: skip
            cmd = [sys.executable, "-m", "raftlog.node.server.main", *args]
            restore = restore_env(status) if not join else {}
            env = {**os.environ, **node_env(spec), **archive, **restore, **self.env}
            with (self.base / f"{name}.log").open("ab") as out:
                self.procs[name] = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            self.hashes[name] = launch_hash
        self._save()

    async def delete_member(self, name: str, delete_volume: bool) -> None:
        await self._stop(name)
        self.ports.pop(name, None)
        self.hashes.pop(name, None)
        self._save()
        if delete_volume:
            shutil.rmtree(self.data_dir(name), ignore_errors=True)

    async def stop_member(self, name: str) -> None:
        await self._stop(name)

    async def expand_volume(self, name: str, size: str) -> None:
        """A member's directory has no size of its own (`pods` reports none, so this is never
        asked)."""
        raise RuntimeError(f"{name}: the local runtime's volumes are directories, with no size")

    async def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused node must run to hear SIGTERM
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._stop(n) for n in list(self.procs)))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]


def _refuse_lowering(base: Path, spec: RaftClusterSpec, source: str) -> None:
    """spec.partitions below what a member's data holds (its `p<N>` directories) is refused,
    as the CRD's rule has the API server refuse it."""
    held = max(
        (
            int(d.name[1:]) + 1
            for d in (base / "members").glob("*/p*")
            if d.is_dir() and d.name[1:].isdigit()
        ),
        default=0,
    )
    refused = lowering_refused(held, spec.partitions)
    if refused is not None:
        raise ManifestError(f"{source}: {refused}")


class LocalOperator:
    """The reconciler on a loop over the local runtime, for one cluster in `base`."""

    def __init__(
        self,
        base: Path,
        env: dict[str, str] | None = None,
        interval_s: float = 0.5,
        on_event: Callable[[Event], None] | None = None,
        object_store: LocalObjectStore | None = None,
    ) -> None:
        self.base = base
        self.interval_s = interval_s
        self.on_event = on_event or (lambda e: log.info("%s %s: %s", e.type, e.reason, e.message))
        self.token_file = base / "token"
        if not self.token_file.is_file():  # the generated auth secret
            self.token_file.write_text(secrets.token_urlsafe(32))
            self.token_file.chmod(0o600)
        self.runtime = LocalRuntime(base, self.token_file, env, object_store)
        self.api = NodeApi(token=self.token_file.read_text().strip())
        self.status = RaftClusterStatus()
        status_path = base / STATUS
        if status_path.is_file():
            self.status = RaftClusterStatus.model_validate_json(status_path.read_text())
        self.last: PassResult | None = None

    @classmethod
    def create(cls, base: Path, manifest: str, **kw: Any) -> LocalOperator:
        """Set up `base` for the cluster `manifest` describes (or check it is the same one)."""
        name, spec = load_manifest(manifest)
        _refuse_lowering(base, spec, "the manifest")
        base.mkdir(parents=True, exist_ok=True)
        path = base / MANIFEST
        if path.is_file():
            old, _ = load_manifest(path.read_text(), str(path))
            if old != name:
                raise ManifestError(f"{base} holds cluster {old!r}, not {name!r}")
        annotations = ((yaml.safe_load(manifest) or {}).get("metadata") or {}).get("annotations")
        path.write_text(manifest_of(name, spec, annotations))
        return cls(base, **kw)

    def desired(self) -> tuple[str, RaftClusterSpec]:
        """The manifest's cluster, refused as the API server refuses an update that lowers
        spec.partitions (the CRD's rule): here nothing else would stop a member that restarts
        from being launched with the lower count, and dropping the partitions above it."""
        path = self.base / MANIFEST
        name, spec = load_manifest(path.read_text(), str(path))
        _refuse_lowering(self.base, spec, str(path))
        return name, spec

    def controls(self) -> Controls:
        """The manifest's annotations, read as the Kubernetes operator reads the resource's."""
        doc = yaml.safe_load((self.base / MANIFEST).read_text()) or {}
        annotations = (doc.get("metadata") or {}).get("annotations") or {}
        return parse_controls({str(k): str(v) for k, v in annotations.items()})

    async def _save(self, status: RaftClusterStatus) -> None:
        path = self.base / STATUS
        tmp = path.with_suffix(".tmp")
        tmp.write_text(status.model_dump_json(by_alias=True, indent=1))
        os.replace(tmp, path)
        self.status = status

    async def step(self) -> PassResult:
        name, spec = self.desired()
        result = await reconcile_pass(
            name, spec, self.status, self.runtime, self.api, self._save,
            controls=self.controls(),
        )  # fmt: skip
        for e in result.events:
            self.on_event(e)
        if result.outcome is not None and not result.outcome.ok:
            log.warning("%s: %s", describe(result.action), result.outcome.detail)
        self.last = result
        return result

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
            except ManifestError as e:
                log.error("%s", e)  # a bad edit of the manifest: keep the cluster as it is
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    async def wait_for(
        self, predicate: Callable[[RaftClusterStatus], bool], timeout: float
    ) -> RaftClusterStatus:
        """Step until `predicate(status)` holds (for tools and tests driving the loop)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await self.step()
            if predicate(self.status):
                return self.status
            await asyncio.sleep(self.interval_s)
        raise TimeoutError(f"not reached within {timeout} s; last: {self.status.last_action}")

    def endpoints(self) -> list[str]:
        return [self.runtime.url(n) for n in self.runtime.ports]

    async def close(self) -> None:
        await self.runtime.stop_all()
        await self.api.close()
