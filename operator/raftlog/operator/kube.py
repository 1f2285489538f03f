"""The Kubernetes runtime: members as Pods with PVCs, through the API server.

It uses the official `kubernetes` client (synchronous, so every call runs in a worker thread and
the operator's event loop never blocks) and reads answers as plain JSON. What it creates it
adopts: owner references to the RaftCluster, so the API server's garbage collector removes them
with it; a PVC is adopted only when the reclaim policy is Delete.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from raftlog.node.server.archive import S3ObjectStore
from raftlog.operator import manifests
from raftlog.operator.cluster_views import PodState
from raftlog.operator.models import (
    ACCESS_KEY_ID_KEY,
    SECRET_ACCESS_KEY_KEY,
    MemberStatus,
    RaftClusterSpec,
    RaftClusterStatus,
)
from raftlog.operator.node_launch import restore_env
from raftlog.operator.nodeapi import MemberTls
from raftlog.operator.runtime import PodInfo

Adopt = Callable[[dict[str, Any]], None]
FIELD_MANAGER = "raftlog-operator"
# Seconds between two applies of an unchanged shared object (drift comes back within this).
RESYNC_S = 30.0


def _json(resp: Any) -> dict[str, Any]:
    return dict(json.loads(resp.data))


class KubeRuntime:
    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str,
        cluster: str,
        adopt: Adopt,
        member_url: str = manifests.DEFAULT_MEMBER_URL,
    ) -> None:
        self.core = k8s.CoreV1Api(api)
        self.policy = k8s.PolicyV1Api(api)
        self.namespace = namespace
        self.cluster = cluster
        self.adopt = adopt
        self.member_url = member_url
        self.tls = False  # set from the spec on each pass (ensure_shared)
        self._applied: dict[tuple[str, str], tuple[str, float]] = {}
        self._known_token: str | None = None  # the generated secret's, once read

    def url(self, member: str) -> str:
        return manifests.member_url(
            self.member_url, self.cluster, self.namespace, member, tls=self.tls
        )

    # ----------------------------------------------------------------- observation
    async def pods(self, spec: RaftClusterSpec, status: RaftClusterStatus) -> dict[str, PodInfo]:
        sel = f"{manifests.LABEL_CLUSTER}={self.cluster}"
        pods, claims = await asyncio.gather(
            asyncio.to_thread(
                self.core.list_namespaced_pod, self.namespace, label_selector=sel,
                _preload_content=False,
            ),
            asyncio.to_thread(
                self.core.list_namespaced_persistent_volume_claim, self.namespace,
                label_selector=sel, _preload_content=False,
            ),
        )  # fmt: skip
        volumes = {
            c["metadata"]["name"]: c
            for c in _json(claims)["items"]
            if _mine(c, self.cluster) and not c["metadata"].get("deletionTimestamp")
        }
        out: dict[str, PodInfo] = {}
        for p in _json(pods)["items"]:
            if not _mine(p, self.cluster):
                continue  # an API server that ignored the selector
            meta = p["metadata"]
            name = meta["labels"][manifests.LABEL_MEMBER]
            claim = volumes.get(manifests.pvc_name(name))
            out[name] = PodInfo(
                _pod_state(p),
                claim is not None,
                self.url(name),
                (meta.get("annotations") or {}).get(manifests.ANNOTATION_HASH),
                (p.get("status") or {}).get("podIP"),
                *_sizes(claim),
                pod_stuck(p),
            )
        for m in status.members:  # members whose pod is gone: is their volume still there?
            if m.name not in out:
                claim = volumes.get(manifests.pvc_name(m.name))
                out[m.name] = PodInfo(
                    "missing", claim is not None, self.url(m.name), None, None, *_sizes(claim)
                )
        return out

    # ----------------------------------------------------------------- shared objects
    async def ensure_shared(
        self, spec: RaftClusterSpec, members: Sequence[MemberStatus] = (), apply: bool = True
    ) -> str:
        """Services and the PodDisruptionBudget as the spec wants them now (made again when
        deleted, put back when edited), and the auth secret; returns the token. The budget
        follows the voters there are (`members`, the status's), not `replicas`: during a scale
        from 5 to 3 the five are voters until each is removed. `apply=False` (a paused cluster)
        only reads the token."""
        self.tls = spec.tls_secret_name is not None
        voters = sum(1 for m in members if m.role == "voter") if members else spec.replicas
        others = len(members) - voters if members else 0
        shared = [
            *manifests.services(self.cluster, self.namespace),
            manifests.pdb(self.cluster, self.namespace, voters, others),
        ]
        for body in shared if apply else []:
            self.adopt(body)
            await self._apply(body)
        return await self._token(spec, [m.name for m in members], create=apply)

    async def _apply(self, body: dict[str, Any]) -> None:
        """Server-side apply as the operator's field manager. An unchanged object is applied
        again only every RESYNC_S (a deleted or edited one comes back then), so a pass every
        second is not four writes a second."""
        kind, name = body["kind"], body["metadata"]["name"]
        text = json.dumps(body, sort_keys=True)
        last = self._applied.get((kind, name))
        now = time.monotonic()
        if last is not None and last[0] == text and now - last[1] < RESYNC_S:
            return
        patch = {
            "Service": self.core.patch_namespaced_service,
            "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
        }[kind]
        await asyncio.to_thread(
            patch, name, self.namespace, body, field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml", _preload_content=False,
        )  # fmt: skip
        self._applied[(kind, name)] = (text, now)

    async def _secret_data(self, name: str, field: str) -> dict[str, str]:
        """The `data` of Secret `name` (base64 values); a missing one is an error naming the
        spec `field` that names it."""
        try:
            resp = await asyncio.to_thread(
                self.core.read_namespaced_secret, name, self.namespace, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                raise RuntimeError(
                    f"{field}: secret {name} not found in {self.namespace}"
                ) from None
            raise
        data: dict[str, str] = _json(resp).get("data") or {}
        return data

    async def member_tls(self, spec: RaftClusterSpec) -> MemberTls | None:
        """The cluster's TLS secret as the operator uses it: `ca.crt` to verify members with,
        and `tls.crt`/`tls.key` to show them when they ask (spec.peerClientCertAuth)."""
        if spec.tls_secret_name is None:
            return None
        data = await self._secret_data(spec.tls_secret_name, "spec.tlsSecretName")
        missing = [k for k in ("ca.crt", "tls.crt", "tls.key") if k not in data]
        if missing:
            keys = ", ".join(f"`{k}`" for k in missing)
            raise RuntimeError(f"spec.tlsSecretName: secret {spec.tls_secret_name} has no {keys}")
        ca, cert, key = (
            base64.b64decode(data[k]).decode() for k in ("ca.crt", "tls.crt", "tls.key")
        )
        return MemberTls(ca, cert, key)

    async def _token(
        self, spec: RaftClusterSpec, members: Sequence[str] = (), create: bool = True
    ) -> str:
        name = manifests.auth_secret(self.cluster, spec)
        try:
            resp = await asyncio.to_thread(
                self.core.read_namespaced_secret, name, self.namespace, _preload_content=False
            )
        except ApiException as e:
            if e.status != 404:
                raise
            if not create and self._known_token is not None:
                return self._known_token
            if spec.auth_secret_name is not None:
                raise RuntimeError(
                    f"spec.authSecretName: secret {name} not found in {self.namespace}"
                ) from None
            # Deleted while the members run: made again with the token they hold (a new one
            # would lock the operator and every restarted member out of the others). Deleted
            # while no operator ran, that token is known only to the running members: asked
            # for. With none running (hibernated, say), nobody holds it: a new one is made.
            running: list[str] = []
            if self._known_token is None and members:
                seen = await self.pods(spec, RaftClusterStatus())
                running = sorted(n for n, info in seen.items() if info.pod == "running")
            if running:
                raise RuntimeError(
                    f"secret {name} is gone, with the token members {', '.join(running)} run "
                    "with (a new one would lock every restarted member out of the others): "
                    f"put it back, e.g. `kubectl -n {self.namespace} create secret generic "
                    f'{name} --from-literal=token="$(kubectl -n {self.namespace} exec '
                    f'{running[0]} -- cat {manifests.TOKEN_DIR}/token)"`'
                ) from None
            token = self._known_token or secrets.token_urlsafe(32)
            body = manifests.secret(self.cluster, self.namespace, spec, token)
            self.adopt(body)
            await self._create(self.core.create_namespaced_secret, body)
            resp = await asyncio.to_thread(
                self.core.read_namespaced_secret, name, self.namespace, _preload_content=False
            )
        data = _json(resp).get("data") or {}
        if "token" not in data:
            raise RuntimeError(f"secret {name} has no key `token`")
        self._known_token = base64.b64decode(data["token"]).decode().strip()
        return self._known_token

    async def archive_store(self, spec: RaftClusterSpec, url: str) -> S3ObjectStore:
        """The object store at `url` as the members reach it (spec.archive's endpoint and
        region, credentials from its Secret), for restore plans and backups."""
        assert spec.archive is not None
        creds = None
        name = spec.archive.credentials_secret
        if name is not None:
            data = await self._secret_data(name, "spec.archive.credentialsSecret")
            keys = (ACCESS_KEY_ID_KEY, SECRET_ACCESS_KEY_KEY)
            if any(k not in data for k in keys):
                raise RuntimeError(
                    f"spec.archive.credentialsSecret: secret {name} needs the keys {keys}"
                )
            key_id, secret = (base64.b64decode(data[k]).decode().strip() for k in keys)
            creds = (key_id, secret)
        return S3ObjectStore(url, spec.archive.endpoint, spec.archive.region, creds)

    # ----------------------------------------------------------------- members
    async def create_members(
        self,
        spec: RaftClusterSpec,
        status: RaftClusterStatus,
        names: tuple[str, ...],
        join: bool,
        launch_hash: str,
    ) -> None:
        peers = {m.name: self.url(m.name) for m in status.members}
        for name in names:
            claim = manifests.pvc(spec, self.cluster, self.namespace, name)
            if spec.storage.reclaim_policy == "Delete":
                self.adopt(claim)
            await self._create(self.core.create_namespaced_persistent_volume_claim, claim)
            body = manifests.pod(
                spec, self.cluster, self.namespace, name, peers, join=join,
                config_hash=launch_hash, restore=restore_env(status) if not join else None,
            )  # fmt: skip
            self.adopt(body)
            await self._create(self.core.create_namespaced_pod, body)

    async def delete_member(self, name: str, delete_volume: bool) -> None:
        await self._delete(self.core.delete_namespaced_pod, name)
        if delete_volume:
            await self._delete(
                self.core.delete_namespaced_persistent_volume_claim, manifests.pvc_name(name)
            )

    async def stop_member(self, name: str) -> None:
        await self._delete(self.core.delete_namespaced_pod, name)

    async def expand_volume(self, name: str, size: str) -> None:
        """A patch of the claim's request; the API server refuses it, with its reason, where the
        claim's StorageClass does not allow volume expansion."""
        body = {"spec": {"resources": {"requests": {"storage": size}}}}
        try:
            await asyncio.to_thread(
                self.core.patch_namespaced_persistent_volume_claim, manifests.pvc_name(name),
                self.namespace, body, _preload_content=False,
            )  # fmt: skip
        except ApiException as e:
            reason = e.reason
            with contextlib.suppress(ValueError):
                reason = json.loads(e.body or "{}").get("message") or reason
            raise RuntimeError(f"the API server refused the larger claim: {reason}") from None

    async def delete_all(self, spec: RaftClusterSpec, members: list[str]) -> None:
        """On deletion of the RaftCluster: pods, then volumes per the reclaim policy."""
        for name in members:
            await self.delete_member(name, spec.storage.reclaim_policy == "Delete")

    # ----------------------------------------------------------------- plumbing
    async def _create(self, fn: Callable[..., Any], body: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(fn, self.namespace, body, _preload_content=False)
        except ApiException as e:
            if e.status != 409:  # already there: creation is idempotent
                raise

    async def _delete(self, fn: Callable[..., Any], name: str) -> None:
        try:
            await asyncio.to_thread(fn, name, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise


def _sizes(claim: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """What a claim asks for, and what its volume has."""
    if claim is None:
        return None, None
    asked = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get(
        "storage"
    )
    has = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
    return asked, has


def _mine(obj: dict[str, Any], cluster: str) -> bool:
    return (obj["metadata"].get("labels") or {}).get(manifests.LABEL_CLUSTER) == cluster


# A container waiting for one of these does not start without a change to its pod.
STUCK_WAITING = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "CrashLoopBackOff",
})  # fmt: skip


def pod_stuck(p: dict[str, Any]) -> str | None:
    """Why a pod cannot start by itself: its scheduler's refusal, or the reason a container
    waits (an image that cannot be pulled, a crash loop). None: running, or on its way."""
    status = p.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            return f"Unschedulable: {c.get('message', '')}".rstrip(": ")
    for c in status.get("containerStatuses") or []:
        reason = ((c.get("state") or {}).get("waiting") or {}).get("reason")
        if reason in STUCK_WAITING:
            return str(reason)
    return None


def _pod_state(p: dict[str, Any]) -> PodState:
    if p["metadata"].get("deletionTimestamp"):
        return "terminating"
    phase = (p.get("status") or {}).get("phase")
    if phase == "Running":
        return "running"
    if phase in ("Failed", "Succeeded"):
        return "failed"
    return "pending"
