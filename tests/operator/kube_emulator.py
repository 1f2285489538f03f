"""A small Kubernetes API server emulator and a test kubelet, for running the real operator.

kmock's `KubernetesEmulator` was the starting point, but it merges patches as plain dicts, keeps
no resourceVersion, ignores label selectors and runs no controllers; kopf's deletion handling
and the operator's ownership both need those. This emulator, over HTTP with aiohttp, does:

- discovery (`/api`, `/api/v1`, `/apis`, `/apis/<group>/<version>`) of the resources used;
- create / get / list (equality label selectors) / watch (resourceVersion, from history) /
  JSON merge patch (RFC 7386) / delete, for namespaced resources and namespaces;
- uid, resourceVersion, creationTimestamp, generation (bumped on spec changes only);
- the status subresource of RaftClusters (a patch there changes status only, and a patch of
  the main resource leaves status alone), Secrets' `stringData` folded into base64 `data`;
- finalizers (a delete sets deletionTimestamp; the object goes when they are removed);
- garbage collection of objects whose owner (by uid) is gone, cascading;
- events accepted and kept for assertions.

It does not emulate: authentication and RBAC, admission (the CRD's schema is not enforced here;
`test_crd.py` checks it), strategic merge patch, server-side apply, field selectors, graceful
deletion periods, scheduling, or the scale subresource (a test patches spec.replicas, which is
what the scale subresource writes).

The kubelet turns Pods into real `raftlog-node` processes: each pod on its own loopback address
(the host of its own URL in --peers), its PVC a directory that outlives the pod, its secret
volume a file. It restarts a container that exits (restartPolicy Always), reports phase and
podIP, and removes a PVC's directory when the claim is deleted (a Delete reclaim policy).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from aiohttp import web

from raftlog.operator.models import GROUP, KIND, PLURAL, VERSION

Key = tuple[str, str, str]  # (plural, namespace, name); namespace "" for cluster-scoped

CORE = {
    # plural: (kind, namespaced, subresources)
    "namespaces": ("Namespace", False),
    "pods": ("Pod", True),
    "persistentvolumeclaims": ("PersistentVolumeClaim", True),
    "services": ("Service", True),
    "secrets": ("Secret", True),
    "events": ("Event", True),
}
GROUPS = {
    ("policy", "v1"): {"poddisruptionbudgets": ("PodDisruptionBudget", True)},
    ("apiextensions.k8s.io", "v1"): {
        "customresourcedefinitions": ("CustomResourceDefinition", False)
    },
    (GROUP, VERSION): {PLURAL: (KIND, True)},
}
WITH_STATUS = {PLURAL, "pods"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 (add, remove, replace, test), as kopf sends for lists such as finalizers."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            i = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(i, op["value"])
            elif kind == "remove":
                parent.pop(i)
            elif kind == "replace":
                parent[i] = op["value"]
            elif kind == "test" and parent[i] != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        else:
            if kind in ("add", "replace"):
                parent[last] = op["value"]
            elif kind == "remove":
                del parent[last]
            elif kind == "test" and parent.get(last) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
    return doc


def _matches(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj["metadata"].get("labels") or {}
    for term in selector.split(","):
        k, _, v = term.partition("=")
        if labels.get(k.strip()) != v.strip():
            return False
    return True


class Emulator:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.rv = 1
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (rv, plural+event, object)
        self.watchers: dict[str, list[asyncio.Queue[tuple[int, str, dict[str, Any]]]]] = (
            defaultdict(list)
        )
        self.listeners: list[Callable[[str, str, dict[str, Any]], None]] = []
        self.requests: list[tuple[str, str]] = []  # (method, path) of every call
        self.calls: list[tuple[str, str, str]] = []  # (method, path, query string) of every call
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    # ----------------------------------------------------------------- storage
    def _kind(self, plural: str, group: str, version: str) -> tuple[str, bool] | None:
        if group == "":
            return CORE.get(plural)
        return GROUPS.get((group, version), {}).get(plural)

    def _emit(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        snap = copy.deepcopy(obj)
        self.history.append((int(obj["metadata"]["resourceVersion"]), kind, snap))
        self.history = self.history[-5000:]
        for q in self.watchers[plural]:
            q.put_nowait((int(obj["metadata"]["resourceVersion"]), kind, snap))
        for fn in self.listeners:
            fn(plural, kind, snap)

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def create(self, plural: str, ns: str, body: dict[str, Any], api: str = "v1") -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = (plural, ns, meta["name"])
        if key in self.objects:
            raise web.HTTPConflict(
                text=json.dumps(self._status(409, "AlreadyExists", f"{meta['name']} exists")),
                content_type="application/json",
            )
        obj = copy.deepcopy(body)
        m = obj["metadata"]
        m.update(uid=str(uuid.uuid4()), generation=1,
                 creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip
        if ns:
            m["namespace"] = ns
        if plural == "secrets" and "stringData" in obj:
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(v.encode()).decode()
        if plural == "pods":
            obj["status"] = {"phase": "Pending"}
        self._bump(obj)
        self.objects[key] = obj
        self._emit(plural, "ADDED", obj)
        return obj

    def patch(
        self,
        plural: str,
        ns: str,
        name: str,
        patch: dict[str, Any] | list[dict[str, Any]],
        status: bool = False,
    ) -> dict[str, Any]:
        key = (plural, ns, name)
        if key not in self.objects:
            raise web.HTTPNotFound(
                text=json.dumps(self._status(404, "NotFound", f"{name} not found")),
                content_type="application/json",
            )
        old = self.objects[key]
        if isinstance(patch, list):  # RFC 6902
            new: dict[str, Any] = json_patch(old, patch)
        else:  # RFC 7386
            new = merge_patch(old, patch)
        if status:  # the status subresource changes status only
            new = {**old, "status": new.get("status")}
        elif plural in WITH_STATUS:  # and the main resource everything but status
            new = {**new, "status": old.get("status")}
        new = {k: v for k, v in new.items() if v is not None}
        new["metadata"]["uid"] = old["metadata"]["uid"]
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        self._bump(new)
        self.objects[key] = new
        self._emit(plural, "MODIFIED", new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._remove(key)
        return new

    def delete(self, plural: str, ns: str, name: str) -> dict[str, Any]:
        key = (plural, ns, name)
        obj = self.objects.get(key)
        if obj is None:
            raise web.HTTPNotFound(
                text=json.dumps(self._status(404, "NotFound", f"{name} not found")),
                content_type="application/json",
            )
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj = copy.deepcopy(obj)
                obj["metadata"]["deletionTimestamp"] = time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
                )
                self._bump(obj)
                self.objects[key] = obj
                self._emit(plural, "MODIFIED", obj)
            return obj
        self._remove(key)
        return obj

    def _remove(self, key: Key) -> None:
        obj = self.objects.pop(key, None)
        if obj is None:
            return
        self._bump(obj)
        self._emit(key[0], "DELETED", obj)
        self.collect_garbage()

    def collect_garbage(self) -> None:
        """Delete (cascading) whatever names an owner uid that no longer exists."""
        alive = {o["metadata"]["uid"] for o in self.objects.values()}
        for key, obj in list(self.objects.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if owners and not any(o["uid"] in alive for o in owners) and key in self.objects:
                self.delete(*key)

    def list(
        self, plural: str, ns: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (p, n, _), o in sorted(self.objects.items())
            if p == plural and (ns is None or n == ns) and _matches(o, selector)
        ]

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((plural, ns, name))
        return copy.deepcopy(obj) if obj is not None else None

    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                "reason": reason, "message": message}  # fmt: skip

    # ----------------------------------------------------------------- HTTP
    def _discovery(self, group: str, version: str) -> dict[str, Any]:
        table = {k: v for k, v in CORE.items()} if group == "" else GROUPS[(group, version)]
        resources = []
        for plural, (kind, namespaced) in table.items():
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            resources.append({"name": plural, "singularName": kind.lower(), "kind": kind,
                              "namespaced": namespaced, "verbs": verbs})  # fmt: skip
            if plural in WITH_STATUS:
                verbs = ["get", "patch", "update"]
                status = {"name": f"{plural}/status", "singularName": "", "kind": kind,
                          "namespaced": namespaced, "verbs": verbs}  # fmt: skip
                resources.append(status)
        gv = version if group == "" else f"{group}/{version}"
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                "resources": resources}  # fmt: skip

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        self.requests.append((request.method, path))
        self.calls.append((request.method, path, request.query_string))
        parts = [p for p in path.split("/") if p]
        if parts == ["api"]:
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if parts == ["apis"]:
            groups = [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                       "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}}
                      for g, v in GROUPS]  # fmt: skip
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if parts == ["api", "v1"]:
            return web.json_response(self._discovery("", "v1"))
        if len(parts) == 3 and parts[0] == "apis":
            return web.json_response(self._discovery(parts[1], parts[2]))
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        ns: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":  # namespaces/<ns>/<plural>[/<name>[/sub]]
            ns, rest = rest[1], rest[2:]
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        info = self._kind(plural, group, version)
        if info is None:
            return web.json_response(self._status(404, "NotFound", path), status=404)
        kind, namespaced = info
        api_version = version if group == "" else f"{group}/{version}"
        scope = ns if namespaced else ""
        try:
            if request.method == "GET" and name is None:
                if request.query.get("watch") in ("true", "1"):
                    return await self._watch(request, plural, ns)
                items = self.list(plural, ns, request.query.get("labelSelector"))
                return web.json_response({"kind": f"{kind}List", "apiVersion": api_version,
                                          "metadata": {"resourceVersion": str(self.rv)},
                                          "items": items})  # fmt: skip
            if request.method == "GET":
                obj = self.get(plural, scope or "", name or "")
                if obj is None:
                    return web.json_response(self._status(404, "NotFound", f"{name}"), status=404)
                return web.json_response(obj)
            if request.method == "POST":
                body = await request.json()
                body.setdefault("apiVersion", api_version)
                body.setdefault("kind", kind)
                return web.json_response(self.create(plural, scope or "", body), status=201)
            if request.method == "PATCH":
                ctype = request.headers.get("Content-Type", "")
                if "merge-patch" not in ctype and "json-patch" not in ctype:
                    msg = f"only JSON merge and JSON patches are emulated, not {ctype}"
                    return web.json_response(self._status(415, "UnsupportedMediaType", msg),
                                             status=415)  # fmt: skip
                body = await request.json()
                obj = self.patch(plural, scope or "", name or "", body, status=sub == "status")
                return web.json_response(obj)
            if request.method == "DELETE":
                return web.json_response(self.delete(plural, scope or "", name or ""))
        except web.HTTPException as e:
            return web.Response(status=e.status, text=e.text, content_type="application/json")
        return web.json_response(self._status(405, "MethodNotAllowed", request.method), status=405)

    async def _watch(self, request: web.Request, plural: str, ns: str | None) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or 0)
        timeout = float(request.query.get("timeoutSeconds") or 60)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        q: asyncio.Queue[tuple[int, str, dict[str, Any]]] = asyncio.Queue()
        self.watchers[plural].append(q)
        try:
            for rv, kind, obj in list(self.history):
                if rv > since and self._plural_of(obj) == plural:
                    q.put_nowait((rv, kind, obj))
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                try:
                    rv, kind, obj = await asyncio.wait_for(q.get(), left)
                except TimeoutError:
                    break
                if rv <= since or (ns is not None and obj["metadata"].get("namespace") != ns):
                    continue
                since = rv
                line = json.dumps({"type": kind, "object": obj}) + "\n"
                await resp.write(line.encode())
        except (ConnectionResetError, asyncio.CancelledError):
            return resp  # the watcher hung up, or the server is stopping
        finally:
            self.watchers[plural].remove(q)
        return resp

    @staticmethod
    def _plural_of(obj: dict[str, Any]) -> str:
        kind = obj.get("kind", "")
        for plural, (k, _) in CORE.items():
            if k == kind:
                return plural
        for table in GROUPS.values():
            for plural, (k, _) in table.items():
                if k == kind:
                    return plural
        return ""


class Kubelet:
    """Pods as `raftlog-node` processes; PVCs as directories under `root`."""

    def __init__(self, emu: Emulator, root: Path) -> None:
        self.emu = emu
        self.root = root
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.uids: dict[tuple[str, str], str] = {}
        self.restarts: dict[tuple[str, str], int] = defaultdict(int)

    async def step(self) -> None:
        """Bring processes in line with the pods; runs on the emulator's loop."""
        pods = {(o["metadata"]["namespace"], o["metadata"]["name"]): o
                for o in self.emu.list("pods", None)}  # fmt: skip
        for key in list(self.procs):
            pod = pods.get(key)
            if pod is None or pod["metadata"]["uid"] != self.uids.get(key):
                # Waited for off the loop: the API server keeps answering meanwhile, and a
                # new pod of the same member never shares its volume with the old process.
                await asyncio.to_thread(self._kill, key)
        for key, pod in pods.items():
            proc = self.procs.get(key)
            if proc is None:
                self._start(key, pod)
            elif proc.poll() is not None:  # restartPolicy: Always
                self.restarts[key] += 1
                self._start(key, pod)
        claims = {(o["metadata"]["namespace"], o["metadata"]["name"])
                  for o in self.emu.list("persistentvolumeclaims", None)}  # fmt: skip
        for ns_dir in (self.root / "pv").glob("*"):
            for claim in ns_dir.glob("*"):
                if (ns_dir.name, claim.name) not in claims:
                    shutil.rmtree(claim, ignore_errors=True)

    def _start(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        ns, name = key
        c = pod["spec"]["containers"][0]
        args = list(c["args"])
        peers = dict(p.split("=", 1) for p in args[args.index("--peers") + 1].split(","))
        host = urlparse(peers[args[args.index("--node-id") + 1]]).hostname or "127.0.0.1"
        args[args.index("--host") + 1] = host
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        local_of: dict[str, Path] = {}  # mount path -> the directory standing for it
        for vol in pod["spec"]["volumes"]:
            where = mounts.get(vol["name"])
            if where is None:
                continue
            if "persistentVolumeClaim" in vol:
                local = self.root / "pv" / ns / vol["persistentVolumeClaim"]["claimName"]
                local.mkdir(parents=True, exist_ok=True)
            elif "secret" in vol:
                local = self.root / "secrets" / ns / name / vol["name"]
                local.mkdir(parents=True, exist_ok=True)
                secret = self.emu.get("secrets", ns, vol["secret"]["secretName"]) or {}
                for k, v in (secret.get("data") or {}).items():
                    (local / k).write_bytes(base64.b64decode(v))
            else:
                local = self.root / "empty" / ns / name / vol["name"]
                local.mkdir(parents=True, exist_ok=True)
            local_of[where] = local

        def rewrite(arg: str) -> str:
            best = max((m for m in local_of if arg.startswith(m)), key=len, default=None)
            return arg if best is None else str(local_of[best]) + arg[len(best) :]

        args = [rewrite(a) for a in args]
        env = {**os.environ, **{e["name"]: e["value"] for e in c.get("env", [])}}
        log = self.root / "logs" / ns
        log.mkdir(parents=True, exist_ok=True)
        with (log / f"{name}.log").open("ab") as out:
            self.procs[key] = subprocess.Popen(
                [sys.executable, "-m", "raftlog.node.server.main", *args],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        self.uids[key] = pod["metadata"]["uid"]
        if self.emu.get("pods", ns, name) is None:
            return  # deleted meanwhile: the next step stops the process
        self.emu.patch("pods", ns, name, {"status": {
            "phase": "Running", "podIP": host, "hostIP": "127.0.0.1",
            "containerStatuses": [{"name": "node", "ready": True, "started": True,
                                   "restartCount": self.restarts[key]}],
        }}, status=True)  # fmt: skip

    def _kill(self, key: tuple[str, str]) -> None:
        proc = self.procs.pop(key, None)
        self.uids.pop(key, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def signal(self, ns: str, name: str, sig: int) -> None:
        self.procs[(ns, name)].send_signal(sig)

    def stop_all(self) -> None:
        for key in list(self.procs):
            self._kill(key)


class Cluster:
    """The emulator and its kubelet on their own thread and event loop, served over HTTP."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.emu = Emulator()
        self.kubelet = Kubelet(self.emu, root)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._kubelet_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.thread.start()
        self.call(self._serve)
        self.call(self._namespace)

    async def _serve(self) -> None:
        # Open watch streams must not hold the shutdown for their whole timeout.
        self._runner = web.AppRunner(self.emu.app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._kubelet_task = asyncio.get_running_loop().create_task(self._kubelet_loop())

    async def _namespace(self) -> None:
        self.emu.create("namespaces", "", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": "default"}})  # fmt: skip

    async def _kubelet_loop(self) -> None:
        while True:
            try:
                await self.kubelet.step()
            except Exception as e:  # keep the kubelet alive; a test sees the pods' state
                print(f"kubelet: {type(e).__name__}: {e}", file=sys.stderr)
            await asyncio.sleep(0.1)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (a coroutine function or a plain function) on the emulator's loop."""

        async def run() -> Any:
            out = fn()
            if asyncio.iscoroutine(out):
                out = await out
            return out

        fut: Future[Any] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return fut.result(30)

    def kubeconfig(self) -> Path:
        path = self.root / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "emu",
            "clusters": [{"name": "emu", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "emu", "user": {"token": "emulated"}}],
            "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu",
                                                     "namespace": "default"}}],
        }))  # fmt: skip
        return path

    def stop(self) -> None:
        if self._kubelet_task is not None:  # first, so that it restarts nothing
            self.loop.call_soon_threadsafe(self._kubelet_task.cancel)
            time.sleep(0.3)
        self.kubelet.stop_all()
        if self._runner is not None:
            self.call(self._runner.cleanup)
        self.call(self._cancel_tasks)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _cancel_tasks(self) -> None:
        """Every task of the loop (the kubelet, watch streams) ends before the loop stops."""
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
