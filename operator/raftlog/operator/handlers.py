"""The kopf handlers: thin. A daemon per RaftCluster runs reconcile passes; deletion cleans up.

All decisions are the reconciler's; all state is the resource's status and the cluster itself,
so a restarted operator resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from raftlog.operator import metrics
from raftlog.operator.actions import ChangeMembership, InstallSnapshot
from raftlog.operator.controls import parse as parse_controls
from raftlog.operator.kube import KubeRuntime
from raftlog.operator.models import GROUP, PLURAL, VERSION, RaftClusterSpec, RaftClusterStatus
from raftlog.operator.nodeapi import MemberTls, NodeApi
from raftlog.operator.runtime import reconcile_pass
from raftlog.operator.settings import OperatorSettings, api_client

log = logging.getLogger("raftlog.operator")
FINALIZER = f"{GROUP}/finalizer"

_settings: OperatorSettings | None = None
_api: k8s.ApiClient | None = None


def operator_settings() -> OperatorSettings:
    global _settings
    if _settings is None:
        _settings = OperatorSettings()
    return _settings


def api() -> k8s.ApiClient:
    global _api
    if _api is None:
        _api = api_client()
    return _api


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 120
    port = operator_settings().metrics_port
    if port:
        metrics.serve(port)


def _runtime(name: str, namespace: str, body: kopf.Body) -> KubeRuntime:
    return KubeRuntime(
        api(), namespace, name,
        adopt=lambda obj: kopf.adopt(obj, owner=body),
        member_url=operator_settings().member_url,
    )  # fmt: skip


class StaleStatus(Exception):
    """The resource changed since the status this operator holds was read (HTTP 409)."""


def merge_patch(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` as a JSON merge patch (RFC 7386) over `old`: a map's key that `new` lacks is sent
    as null, which deletes it (sent as `new` alone, a partition no longer led stayed in
    `status.leaders` for good); lists and other values are replaced whole."""
    out = dict(new)
    for key, was in old.items():
        if key not in new:
            out[key] = None
        elif isinstance(was, Mapping) and isinstance(new[key], dict):
            out[key] = merge_patch(was, new[key])
    return out


async def _save_status(
    name: str,
    namespace: str,
    status: dict[str, Any],
    on_server: Mapping[str, Any],
    resource_version: str | None,
) -> str:
    """Writes the status if the resource is still at `resource_version` (optimistic
    concurrency: a second operator, or anyone, who wrote since makes it a 409); returns the new
    resourceVersion. `on_server`: the status the API server holds at that version."""
    patch: dict[str, Any] = {"status": merge_patch(on_server, status)}
    if resource_version is not None:
        patch["metadata"] = {"resourceVersion": resource_version}
    custom = k8s.CustomObjectsApi(api())
    try:
        resp: Any = await asyncio.to_thread(
            custom.patch_namespaced_custom_object_status,
            GROUP, VERSION, namespace, PLURAL, name, patch,
            _content_type="application/merge-patch+json", _preload_content=False,
        )  # fmt: skip
    except ApiException as e:
        if e.status == 409:
            raise StaleStatus(f"{namespace}/{name}: {e.reason}") from None
        raise
    return str(json.loads(resp.data)["metadata"]["resourceVersion"])


async def _read(name: str, namespace: str) -> dict[str, Any]:
    custom = k8s.CustomObjectsApi(api())
    resp: Any = await asyncio.to_thread(
        custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
        _preload_content=False,
    )  # fmt: skip
    return dict(json.loads(resp.data))


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def reconcile(
    *,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    status: kopf.Status,
    stopped: kopf.DaemonStopped,
    **_: Any,
) -> None:
    """One reconcile pass every `interval` seconds for as long as the resource exists."""
    assert namespace is not None  # the resource is namespaced
    runtime = _runtime(name, namespace, body)
    current = RaftClusterStatus.model_validate(dict(status))
    node_api: NodeApi | None = None
    node_api_for: tuple[str, MemberTls | None] | None = None

    saved: list[RaftClusterStatus] = []
    version: list[str | None] = [meta.get("resourceVersion")]
    on_server: list[Mapping[str, Any]] = [dict(status)]

    async def save(new_status: RaftClusterStatus) -> None:
        # An unchanged status is not written: every write is a watch event for every watcher.
        if saved and saved[-1] == new_status:
            return
        dumped = new_status.model_dump(mode="json", by_alias=True)
        version[0] = await _save_status(name, namespace, dumped, on_server[0], version[0])
        saved[:] = [new_status.model_copy(deep=True)]
        on_server[0] = dumped

    try:
        while not stopped:
            started = time.monotonic()
            try:
                desired = RaftClusterSpec.model_validate(dict(spec)).with_image(
                    operator_settings().default_image
                )  # the live spec
            except ValidationError as e:
                kopf.warn(body, reason="InvalidSpec", message=str(e).replace("\n", " "))
                await stopped.wait(operator_settings().interval_s * 10)
                continue
            controls = parse_controls(meta.get("annotations"))
            try:
                # Paused: the shared objects are read, not applied (nothing is changed).
                token = await runtime.ensure_shared(
                    desired, current.members, apply=not controls.paused
                )
                tls = await runtime.member_tls(desired)
                if node_api is None or (token, tls) != node_api_for:
                    if node_api is not None:
                        await node_api.close()
                    node_api, node_api_for = _node_api(token, tls, name, namespace), (token, tls)
                result = await reconcile_pass(
                    name, desired, current, runtime, node_api, save, meta.get("generation"),
                    controls=controls,
                )  # fmt: skip
            except StaleStatus as e:
                # Someone wrote first: start again from what the API server holds now.
                metrics.STATUS_CONFLICTS.inc()
                log.info("%s; reading it again", e)
                fresh = await _read(name, namespace)
                current = RaftClusterStatus.model_validate(fresh.get("status") or {})
                version[0] = fresh["metadata"]["resourceVersion"]
                on_server[0] = fresh.get("status") or {}
                saved.clear()
                continue
            except Exception as e:  # the API server or a runtime call: the next pass retries
                log.exception("%s/%s: reconcile pass failed", namespace, name)
                metrics.RECONCILES.labels(outcome="error").inc()
                kopf.warn(body, reason="ReconcileFailed", message=f"{type(e).__name__}: {e}")
                await stopped.wait(operator_settings().interval_s * 5)
                continue
            current = result.status
            kind = type(result.action).__name__ if result.action is not None else "Steady"
            metrics.RECONCILES.labels(outcome=kind).inc()
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
            _count(result.action, result.outcome is not None and result.outcome.ok)
            for event in result.events:
                kopf.event(body, type=event.type, reason=event.reason, message=event.message)
            # Woken at once when kopf stops the daemon: a rollout or an uninstall does not wait
            # out the pass interval, nor kopf's cancellation timeout.
            await stopped.wait(operator_settings().interval_s)
    finally:
        if node_api is not None:
            await node_api.close()


def _node_api(token: str, tls: MemberTls | None, name: str, namespace: str) -> NodeApi:
    """Calls to the members: with TLS, verifying them against the cluster's CA and showing
    the cluster's certificate to a member that asks for one."""
    if tls is None:
        return NodeApi(token=token)
    ca, cert, key = tls.write(f"{namespace}-{name}")
    return NodeApi(token=token, ca_file=ca, cert_file=cert, key_file=key)


def _count(action: object, ok: bool) -> None:
    if isinstance(action, ChangeMembership) and action.op == "promote" and ok:
        metrics.PROMOTIONS.inc()
    if isinstance(action, InstallSnapshot):
        metrics.INSTALLS.labels(result="ok" if ok else "failed").inc()


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(
    *,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    **_: Any,
) -> None:
    """Members' pods go, and their volumes per `storage.reclaimPolicy`."""
    assert namespace is not None
    desired = RaftClusterSpec.model_validate(dict(spec))
    members = [m.name for m in RaftClusterStatus.model_validate(dict(status)).members]
    await _runtime(name, namespace, body).delete_all(desired, members)
    log.info("%s/%s: deleted %d members", namespace, name, len(members))
