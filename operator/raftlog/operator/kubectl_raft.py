"""`kubectl raft`: day-2 controls of RaftClusters, as a kubectl plugin (`kubectl-raft` on PATH).

Everything goes through the `RaftCluster` resource, never around the operator: status is read
from `.status`; requests are the annotations of `controls.py` (pause, restart, switchover,
backup) and the spec fields `fencedMembers`, `hibernate`, `removeMembers`. The operator carries
them out. `restore` writes a new `RaftCluster` (its `spec.restore` reads the source's archive),
printed or created with the user's own credentials (`create` on raftclusters).

Layers: the request builders (annotation values, patch bodies, manifests, refusals) and
`raftview` are pure; `Clusters` is the one place that calls the API server (five methods of the
client's `CustomObjectsApi`); `main` parses the command line and prints.

Exit codes: 0 done; 1 refused, failed or not found (the message says which and why); 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from raftlog.node.server.restore_target import check_backup_name, parse_target
from raftlog.operator import controls, raftview
from raftlog.operator.flag_types import positive_seconds
from raftlog.operator.models import GROUP, KIND, PLURAL, VERSION, RaftClusterSpec

PROG = "kubectl raft"
CONFLICT_RETRIES = 5
POLL_S = 1.0
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class Failure(Exception):
    """What went wrong, in words for the person at the terminal (exit code 1); `status`: the
    API server's HTTP status when it answered with an error."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------- requests


def utc_stamp(now: datetime) -> str:
    """RFC 3339, UTC, whole seconds (as `kubectl rollout restart` writes)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def switchover_value(member: str, partitions: Sequence[int], now: datetime) -> str:
    """The raftlog.dev/switchover value: `MEMBER[:P,P]@<id>`. The id (UTC, microseconds) makes a
    repeated command a new request."""
    listed = ":" + ",".join(str(p) for p in sorted(set(partitions))) if partitions else ""
    return f"{member}{listed}@{now.astimezone(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}"


def annotation_patch(key: str, value: str | None) -> dict[str, Any]:
    """A merge patch setting (or, with None, removing) one annotation."""
    return {"metadata": {"annotations": {key: value}}}


def ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"raftcluster {meta.get('namespace')}/{meta.get('name')}"


def _members(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    status = obj.get("status") or {}
    return {m["name"]: m for m in status.get("members") or [] if "name" in m}


def _known(obj: Mapping[str, Any], member: str) -> dict[str, Any]:
    members = _members(obj)
    if member not in members:
        listed = ", ".join(sorted(members)) or "none yet"
        raise Failure(f"{ref(obj)} has no member {member} (its members: {listed})")
    return members[member]


def check_switchover(obj: Mapping[str, Any], member: str, partitions: Sequence[int]) -> None:
    """Refuses a target that cannot lead: unknown, not a voter, fenced; or a partition the
    cluster does not have."""
    m = _known(obj, member)
    if m.get("role") != "voter":
        raise Failure(f"{ref(obj)}: {member} is a {m.get('role')}, and only a voter can lead")
    if m.get("fenced") or member in ((obj.get("spec") or {}).get("fencedMembers") or []):
        raise Failure(f"{ref(obj)}: {member} is fenced (kubectl raft unfence first)")
    count = (obj.get("spec") or {}).get("partitions", 1)
    wrong = sorted(p for p in set(partitions) if not 0 <= p < count)
    if wrong:
        raise Failure(
            f"{ref(obj)} has partitions 0..{count - 1}: no partition "
            + ", ".join(str(p) for p in wrong)
        )


def _guarded(obj: Mapping[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A spec merge patch that applies only to the version read (409 Conflict otherwise): lists
    are replaced whole by a merge patch, so a concurrent edit must not be overwritten."""
    return {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": spec}


def fence_patch(obj: Mapping[str, Any], member: str, fence: bool) -> dict[str, Any] | None:
    """The patch adding (removing) `member` to (from) spec.fencedMembers; None: already so.
    Fencing refuses a member the status does not list."""
    listed = list((obj.get("spec") or {}).get("fencedMembers") or [])
    if fence:
        _known(obj, member)
        if member in listed:
            return None
        return _guarded(obj, {"fencedMembers": [*listed, member]})
    if member not in listed:
        return None
    return _guarded(obj, {"fencedMembers": [n for n in listed if n != member]})


def remove_patch(obj: Mapping[str, Any], members: Sequence[str]) -> dict[str, Any]:
    """One patch: the members added to spec.removeMembers and spec.replicas lowered by as many.
    Refuses an unknown member, one already being removed, and going below one replica. Only
    removals still to come stay listed: those under way, and those asked that the operator has
    not started yet (as many as the active members exceed replicas). Names of members gone, and
    of removals cancelled by a raised `replicas`, leave the list: listed first, they would be
    the next ones removed."""
    spec = obj.get("spec") or {}
    wanted = list(dict.fromkeys(members))
    known = _members(obj)
    active = [n for n, m in known.items() if m.get("role") != "removing"]
    to_start = max(0, len(active) - int(spec.get("replicas", 1)))
    names = [n for n in spec.get("removeMembers") or [] if n in known]
    under_way = [n for n in names if known[n].get("role") == "removing"]
    asked = [n for n in names if known[n].get("role") != "removing"][:to_start]
    listed = [n for n in names if n in under_way or n in asked]
    for member in wanted:
        m = _known(obj, member)
        if member in listed or m.get("role") == "removing":
            raise Failure(f"{ref(obj)}: {member} is already being removed")
    replicas = int(spec.get("replicas", 1))
    if replicas - len(wanted) < 1:
        raise Failure(
            f"{ref(obj)} has spec.replicas {replicas}: removing {len(wanted)} would leave "
            f"{replicas - len(wanted)} (at least 1; delete the RaftCluster to remove them all)"
        )
    return _guarded(obj, {"removeMembers": [*listed, *wanted], "replicas": replicas - len(wanted)})


def backup_patch(obj: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The guarded patch setting raftlog.dev/backup to `name`. Refuses a name the operator
    would not take, a cluster that does not archive, and a name already taken (the operator
    takes each name once)."""
    try:
        check_backup_name(name)
    except ValueError as e:
        raise Failure(str(e)) from None
    if not (obj.get("spec") or {}).get("archive"):
        raise Failure(f"{ref(obj)} has no spec.archive: there is no archive to back up to")
    taken = _backup(obj, name)
    if taken is not None:
        raise Failure(
            f"{ref(obj)}: backup {name} was already asked for ({taken.get('state')}); "
            "a backup name is taken once: give another"
        )
    return {
        "metadata": {
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "annotations": {controls.BACKUP: name},
        }
    }


def _backup(obj: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    # The operator takes a name once: at most one entry has it.
    listed = (obj.get("status") or {}).get("backups") or []
    return next((b for b in listed if b.get("name") == name), None)


def restored_archive_url(source_url: str, new: str) -> str:
    """Where the restored cluster archives by default: beside the source, in its bucket, under
    `<source prefix>-restored-<new>` (`restored-<new>` when the source has no prefix)."""
    parts = urlsplit(source_url)
    prefix = parts.path.strip("/")
    return f"s3://{parts.netloc}/{prefix + '-' if prefix else ''}restored-{new}"


# What a new cluster does not take from its source: requests about the source's own members
# (its spec.restore, if any, is replaced).
NOT_COPIED = ("fencedMembers", "removeMembers", "hibernate")


def restore_manifest(
    source: Mapping[str, Any], new: str, target: str, archive_url: str | None
) -> dict[str, Any]:
    """A new RaftCluster `new` (in the source's namespace) with the source's spec, restored from
    the source's archive to `target` and archiving to `archive_url` (default:
    `restored_archive_url`); no status. Refuses a source without spec.archive, a bad target, the
    source's own archive url, and a spec the models refuse (naming the field)."""
    spec = dict(source.get("spec") or {})
    archive = spec.get("archive")
    if not archive or not archive.get("url"):
        raise Failure(f"{ref(source)} has no spec.archive: there is no archive to restore from")
    try:
        parse_target(target)
    except ValueError as e:
        raise Failure(f"--to: {e}") from None
    url = archive_url or restored_archive_url(archive["url"], new)
    if url.rstrip("/") == archive["url"].rstrip("/"):
        raise Failure(
            f"--archive-url {url} is {ref(source)}'s own archive: the restored cluster must "
            "archive elsewhere"
        )
    for key in NOT_COPIED:
        spec.pop(key, None)
    spec["archive"] = {**archive, "url": url}
    spec["restore"] = {"url": archive["url"], "target": target}
    try:
        RaftClusterSpec.model_validate(spec)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Failure(f"the new spec is not valid: spec.{where}: {first['msg']}") from None
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": new, "namespace": (source.get("metadata") or {}).get("namespace")},
        "spec": spec,
    }


# ----------------------------------------------------------------------------- the API server


class CustomObjects(Protocol):
    """The methods of `kubernetes.client.CustomObjectsApi` that `Clusters` uses."""

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> Any: ...

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str
    ) -> Any: ...

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> Any: ...

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any
    ) -> Any: ...

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Any
    ) -> Any: ...


def _api_error(e: Exception, what: str) -> Failure:
    """An ApiException in words: the API server's own message (its Status object) when any."""
    status = getattr(e, "status", None)
    message = ""
    body = getattr(e, "body", None)
    if body:
        try:
            message = str(json.loads(body).get("message") or "")
        except (ValueError, AttributeError):
            message = str(body)[:300]
    if status == 404:
        text = f"{what} not found"
    elif status == 403:
        text = f"forbidden: {message or what}"
    elif status == 401:
        text = f"unauthorized: the kubeconfig's credentials were refused ({what})"
    elif status == 422:
        text = f"{what}: refused by the API server: {message}"
    else:
        text = f"{what}: the API server answered {status} {getattr(e, 'reason', '')}: {message}"
    return Failure(text, status if isinstance(status, int) else None)


class Clusters:
    """RaftClusters through the API server: read, list, patch (merge patches only)."""

    def __init__(self, api: CustomObjects) -> None:
        self.api = api

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn()
        except ApiException as e:
            raise _api_error(e, what) from None
        except HTTPError as e:
            raise Failure(f"cannot reach the API server ({what}): {e}") from None

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(
            self._call(
                f"raftcluster {namespace}/{name}",
                lambda: self.api.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name
                ),
            )
        )

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        if namespace is None:
            found = self._call(
                "raftclusters in every namespace",
                lambda: self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL),
            )
        else:
            found = self._call(
                f"raftclusters in namespace {namespace}",
                lambda: self.api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL),
            )
        items = [dict(i) for i in found.get("items") or []]
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    def patch(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(
            self._call(
                f"raftcluster {namespace}/{name}",
                lambda: self.api.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, dict(body)
                ),
            )
        )

    def create(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        try:
            return dict(
                self._call(
                    f"raftcluster {namespace}/{name}",
                    lambda: self.api.create_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, dict(body)
                    ),
                )
            )
        except Failure as e:
            if e.status == 409:
                raise Failure(f"raftcluster {namespace}/{name} already exists", 409) from None
            raise

    def update(
        self,
        namespace: str,
        name: str,
        build: Callable[[dict[str, Any]], dict[str, Any] | None],
        sleep: Callable[[float], None] = time.sleep,
    ) -> tuple[dict[str, Any], bool]:
        """Read, build a guarded patch, apply; again on a conflict (someone wrote in between),
        a bounded number of times. The object, and whether it was changed."""
        for attempt in range(CONFLICT_RETRIES):
            obj = self.get(namespace, name)
            body = build(obj)
            if body is None:
                return obj, False
            try:
                return self.patch(namespace, name, body), True
            except Failure as e:
                if e.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
            sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")


def connect(kubeconfig: str | None, context: str | None) -> tuple[Clusters, str]:
    """The API server of the kubeconfig (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`), else
    the pod's service account; with the namespace of the context (or the pod), else default."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    files = [Path(p).expanduser() for p in path.split(os.pathsep) if p]
    configuration = k8s.Configuration()
    try:
        if any(f.exists() for f in files):
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
            contexts, current = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                config_file=path
            )
            chosen = next((c for c in contexts if c.get("name") == context), None) or current
            namespace = (chosen or {}).get("context", {}).get("namespace") or "default"
        elif kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
            namespace = SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else "default"
        else:
            raise Failure(
                f"no kubeconfig: {path} does not exist and this is not a pod "
                "(set KUBECONFIG or --kubeconfig)"
            )
    except k8s_config.ConfigException as e:
        raise Failure(f"kubeconfig {path}: {e}") from None
    api = k8s.CustomObjectsApi(k8s.ApiClient(configuration))
    return Clusters(api), namespace


# ----------------------------------------------------------------------------- commands


def _print_view(obj: Mapping[str, Any], output: str, out: TextIO) -> None:
    v = _view(obj)
    if output == "json":
        out.write(json.dumps(v, indent=2) + "\n")
    elif output == "yaml":
        out.write(yaml.safe_dump(v, sort_keys=False))
    else:
        out.write(raftview.render(v))


def _view(obj: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return raftview.view(obj)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Failure(f"{ref(obj)}: status.{where} not readable: {first['msg']}") from None


def cmd_status(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    if args.name:
        _print_view(clusters.get(args.namespace, args.name), args.output, out)
        return 0
    items = clusters.list(None if args.all_namespaces else args.namespace)
    views = [_view(o) for o in items]
    if args.output == "json":
        out.write(json.dumps({"items": views}, indent=2) + "\n")
    elif args.output == "yaml":
        out.write(yaml.safe_dump({"items": views}, sort_keys=False))
    else:
        if not views and not args.all_namespaces:
            out.write(f"No RaftClusters found in namespace {args.namespace}.\n")
        else:
            out.write(raftview.render_list(views, args.all_namespaces))
    return 0


class Clock(Protocol):
    def now(self) -> datetime: ...
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class RealClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _paused_note(obj: Mapping[str, Any], out: TextIO) -> None:
    if controls.parse((obj.get("metadata") or {}).get("annotations")).paused:
        out.write(
            f"note: {ref(obj)} is paused: the operator acts once `kubectl raft resume` is run\n"
        )


def wait_until(
    clusters: Clusters,
    namespace: str,
    name: str,
    check: Callable[[dict[str, Any]], tuple[str, bool | None]],
    timeout: float,
    clock: Clock,
    out: TextIO,
) -> bool:
    """Polls the resource until `check` says done: `check(obj)` is (progress line, None while
    under way / True done / False failed). Prints each new progress line. Fails on timeout."""
    deadline = clock.monotonic() + timeout
    last = None
    while True:
        obj = clusters.get(namespace, name)
        line, outcome = check(obj)
        if line != last:
            out.write(line + "\n")
            out.flush()
            last = line
        if outcome is not None:
            return outcome
        if clock.monotonic() >= deadline:
            raise Failure(f"{ref(obj)}: not done within {timeout:.0f} s (last: {line})")
        clock.sleep(POLL_S)


def switchover_progress(value: str) -> Callable[[dict[str, Any]], tuple[str, bool | None]]:
    def check(obj: dict[str, Any]) -> tuple[str, bool | None]:
        sw = (obj.get("status") or {}).get("switchover") or {}
        if sw.get("request") != value:
            return "waiting for the operator to take the request", None
        state, message = sw.get("state", "pending"), sw.get("message") or ""
        line = f"switchover to {sw.get('target')}: {state}" + (f": {message}" if message else "")
        return line, None if state == "pending" else state == "done"

    return check


def restart_progress(value: str) -> Callable[[dict[str, Any]], tuple[str, bool | None]]:
    def check(obj: dict[str, Any]) -> tuple[str, bool | None]:
        status = obj.get("status") or {}
        if status.get("restartedAt") == value:
            return f"every member restarted for {value}", True
        return f"restarting: {status.get('lastAction') or 'waiting for the operator'}", None

    return check


def backup_progress(name: str) -> Callable[[dict[str, Any]], tuple[str, bool | None]]:
    def check(obj: dict[str, Any]) -> tuple[str, bool | None]:
        b = _backup(obj, name)
        if b is None:
            return "waiting for the operator to take the request", None
        state = b.get("state", "pending")
        if state == "done":
            at = ", ".join(f"{p['partition']}@{p['index']}" for p in b.get("partitions") or [])
            return f"backup {name}: done: partition@index {at or 'none'}", True
        if state == "failed":
            return f"backup {name}: failed: {b.get('message') or 'no reason given'}", False
        return f"backup {name}: {state}", None

    return check


def cmd_backup(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    obj, _ = clusters.update(
        args.namespace, args.name, lambda o: backup_patch(o, args.backup), args.clock.sleep
    )
    out.write(f"{ref(obj)}: backup requested ({controls.BACKUP}={args.backup})\n")
    _paused_note(obj, out)
    if not args.wait:
        return 0
    done = wait_until(
        clusters, args.namespace, args.name, backup_progress(args.backup), args.timeout,
        args.clock, out,
    )  # fmt: skip
    return 0 if done else 1


def cmd_restore(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    source = clusters.get(args.namespace, args.source)
    manifest = restore_manifest(source, args.name, args.to, args.archive_url)
    if not args.apply:
        if args.output == "json":
            out.write(json.dumps(manifest, indent=2) + "\n")
        else:
            out.write(yaml.safe_dump(manifest, sort_keys=False))
        return 0
    created = clusters.create(args.namespace, manifest)
    spec = manifest["spec"]
    out.write(
        f"{ref(created)} created: restoring {spec['restore']['url']} "
        f"({spec['restore']['target']}), archiving to {spec['archive']['url']}; "
        f"`kubectl raft status {args.name}` shows where each partition comes back\n"
    )
    return 0


def cmd_switchover(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    obj = clusters.get(args.namespace, args.name)
    check_switchover(obj, args.to, args.partition)
    value = switchover_value(args.to, args.partition, args.clock.now())
    clusters.patch(args.namespace, args.name, annotation_patch(controls.SWITCHOVER, value))
    out.write(f"{ref(obj)}: switchover requested ({controls.SWITCHOVER}={value})\n")
    _paused_note(obj, out)
    if not args.wait:
        return 0
    done = wait_until(
        clusters, args.namespace, args.name, switchover_progress(value), args.timeout,
        args.clock, out,
    )  # fmt: skip
    return 0 if done else 1


def cmd_restart(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    value = utc_stamp(args.clock.now())
    obj = clusters.patch(args.namespace, args.name, annotation_patch(controls.RESTART, value))
    out.write(f"{ref(obj)}: restart requested ({controls.RESTART}={value})\n")
    _paused_note(obj, out)
    if not args.wait:
        return 0
    wait_until(
        clusters, args.namespace, args.name, restart_progress(value), args.timeout, args.clock,
        out,
    )  # fmt: skip
    return 0


def cmd_pause(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    pause = args.command == "pause"
    obj = clusters.patch(
        args.namespace, args.name, annotation_patch(controls.PAUSE, "true" if pause else None)
    )
    if pause:
        out.write(f"{ref(obj)}: paused; the operator leaves it alone until `kubectl raft resume`\n")
    else:
        out.write(f"{ref(obj)}: resumed; the operator reconciles it again\n")
    return 0


def cmd_fence(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    fence = args.command == "fence"
    obj, changed = clusters.update(
        args.namespace, args.name, lambda o: fence_patch(o, args.member, fence), args.clock.sleep
    )
    if fence:
        what = "fenced" if changed else "already fenced"
        out.write(f"{ref(obj)}: {args.member} {what} (spec.fencedMembers)\n")
    else:
        what = "unfenced" if changed else "was not fenced"
        out.write(f"{ref(obj)}: {args.member} {what}\n")
    return 0


def cmd_hibernate(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    on = args.command == "hibernate"
    obj = clusters.patch(args.namespace, args.name, {"spec": {"hibernate": on}})
    what = "hibernating: every member's pod stops, volumes stay" if on else "waking up"
    out.write(f"{ref(obj)}: {what}\n")
    return 0


def cmd_remove(args: argparse.Namespace, clusters: Clusters, out: TextIO) -> int:
    obj, _ = clusters.update(
        args.namespace, args.name, lambda o: remove_patch(o, args.members), args.clock.sleep
    )
    spec = obj.get("spec") or {}
    out.write(
        f"{ref(obj)}: removing {', '.join(dict.fromkeys(args.members))} "
        f"(spec.replicas now {spec.get('replicas')})\n"
    )
    return 0


# ----------------------------------------------------------------------------- command line


def _partition(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a partition number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: partitions are numbered from 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n", "--namespace", help="the RaftCluster's namespace (default: the context's)"
    )
    common.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    common.add_argument("--context", help="kubeconfig context (default: the current one)")

    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Day-2 controls of raftlog's RaftClusters, through the resource: the "
        "operator carries them out.",
        epilog="Run `kubectl raft COMMAND --help` for a command's options.",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[..., int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(run=run)
        return p

    p = command(
        "status",
        cmd_status,
        "a RaftCluster's phase, conditions, members, partitions, snapshot installs and "
        "switchover; without NAME, one line per RaftCluster",
    )
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument(
        "-o", "--output", choices=["table", "json", "yaml"], default="table", help="format"
    )

    p = command(
        "switchover",
        cmd_switchover,
        "move leaderships to a member (annotation raftlog.dev/switchover)",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--to", required=True, metavar="MEMBER", help="the member that should lead")
    p.add_argument(
        "--partition",
        "-p",
        type=_partition,
        action="append",
        default=[],
        metavar="P",
        help="a partition to move (repeatable; default: every partition)",
    )
    p.add_argument("--wait", action="store_true", help="wait until done or failed (exit 1)")
    p.add_argument("--timeout", type=positive_seconds, default=300.0, help="of --wait, in s (300)")

    p = command(
        "restart",
        cmd_restart,
        "restart every member once, quorum-safe, leaders last (annotation raftlog.dev/restartedAt)",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--wait", action="store_true", help="wait until every member restarted")
    p.add_argument("--timeout", type=positive_seconds, default=900.0, help="of --wait, in s (900)")

    for name, run, text in [
        ("pause", cmd_pause, "stop reconciling (annotation raftlog.dev/pause-reconciliation)"),
        ("resume", cmd_pause, "reconcile again (removes raftlog.dev/pause-reconciliation)"),
        ("hibernate", cmd_hibernate, "stop every member's pod, keep the volumes (spec.hibernate)"),
        ("wake", cmd_hibernate, "bring a hibernated cluster back (spec.hibernate false)"),
    ]:
        command(name, run, text).add_argument("name", metavar="NAME")
    for name, text in [
        ("fence", "stop a member from serving, keeping its data and place (spec.fencedMembers)"),
        ("unfence", "let a fenced member serve again"),
    ]:
        p = command(name, cmd_fence, text)
        p.add_argument("name", metavar="NAME")
        p.add_argument("member", metavar="MEMBER")

    p = command(
        "backup",
        cmd_backup,
        "take a backup: every partition archived up to a point recorded under NAME "
        "(annotation raftlog.dev/backup)",
    )
    p.add_argument("name", metavar="CLUSTER")
    p.add_argument("backup", metavar="NAME", help="the backup's name (a-z, 0-9, -, ., _)")
    p.add_argument("--wait", action="store_true", help="wait until done, or failed (exit 1)")
    p.add_argument("--timeout", type=positive_seconds, default=300.0, help="of --wait, in s (300)")

    p = command(
        "restore",
        cmd_restore,
        "a new RaftCluster restored from SOURCE's archive (spec.restore): printed, or created "
        "with --apply",
    )
    p.add_argument("name", metavar="NEW", help="the new RaftCluster's name")
    p.add_argument("--from", dest="source", required=True, metavar="SOURCE",
                   help="the RaftCluster whose archive (spec.archive.url) to restore")  # fmt: skip
    p.add_argument(
        "--to",
        default="latest",
        metavar="TARGET",
        help="latest (default), index:N, index:P=N,..., time:<RFC 3339 with a zone, or epoch "
        "ms>, backup:<name>",
    )
    p.add_argument(
        "--archive-url",
        metavar="URL",
        help="where the new cluster archives (default: s3://<source's bucket>/<source's "
        "prefix>-restored-NEW)",
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], help="format (yaml)")
    p.add_argument("--apply", action="store_true", help="create it instead of printing it")

    p = command(
        "remove",
        cmd_remove,
        "remove these members and lower spec.replicas by as many (spec.removeMembers)",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("members", nargs="+", metavar="MEMBER")
    return ap


def main(
    argv: Sequence[str] | None = None,
    clusters: Clusters | None = None,
    clock: Clock | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The plugin; `clusters`, `clock` and the streams are the tests' to replace."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "all_namespaces", False) and args.name:
        parser.error("status: a NAME and --all-namespaces do not go together")
    if args.command == "restore" and args.apply and args.output:
        parser.error("restore: -o prints the manifest, --apply creates it: give one of them")
    args.clock = clock or RealClock()
    try:
        if clusters is None:
            clusters, default_namespace = connect(args.kubeconfig, args.context)
        else:
            default_namespace = "default"
        args.namespace = args.namespace or default_namespace
        return int(args.run(args, clusters, out))
    except Failure as e:
        err.write(f"error: {e}\n")
        return 1
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
