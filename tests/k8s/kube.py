"""The real cluster of `make cluster`, driven the way a user drives one: `kubectl` and `helm`.

What the tests only read to check or wait on (`get`, `items`: every poll of `until`) comes from
the API server over one kept-alive connection instead: a kubectl process per read cost about
0.11 s of CPU, a fifth of `test_quickstart`'s CPU (78 of its 114 kubectl calls were such reads),
on 2 cores that the other suite shares.

Every call has a timeout; every wait polls with a bound and fails naming what it waited for and
the last thing it saw.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from kubernetes import config as kube_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = ROOT / ".cluster" / "kubeconfig"
HELM = ROOT / ".cluster" / "bin" / "helm"
CHART = ROOT / "charts" / "raftlog-operator"
T = TypeVar("T")


def env() -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(KUBECONFIG), "HELM_CACHE_HOME": "/tmp/helm-cache",
            "HELM_CONFIG_HOME": "/tmp/helm-config", "HELM_DATA_HOME": "/tmp/helm-data"}  # fmt: skip


def run(
    argv: list[str], stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT
    )


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
    done = run(["kubectl", *args], stdin, timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} -> {done.returncode}: {done.stderr}")
    return done.stdout


def kubectl_fails(*args: str, stdin: str | None = None) -> str:
    """The error of a kubectl call that must fail (its stderr)."""
    done = run(["kubectl", *args], stdin)
    assert done.returncode != 0, f"kubectl {' '.join(args)} succeeded: {done.stdout}"
    return done.stderr


# The kinds the tests read, by the names they use: (API path, plural, namespaced).
_CORE, _RBAC = "api/v1", "apis/rbac.authorization.k8s.io/v1"
_KINDS: dict[str, tuple[str, str, bool]] = {
    "pod": (_CORE, "pods", True),
    "pvc": (_CORE, "persistentvolumeclaims", True),
    "service": (_CORE, "services", True),
    "secret": (_CORE, "secrets", True),
    "event": (_CORE, "events", True),
    "pv": (_CORE, "persistentvolumes", False),
    "node": (_CORE, "nodes", False),
    "deployment": ("apis/apps/v1", "deployments", True),
    "pdb": ("apis/policy/v1", "poddisruptionbudgets", True),
    "role": (_RBAC, "roles", True),
    "rolebinding": (_RBAC, "rolebindings", True),
    "clusterrole": (_RBAC, "clusterroles", False),
    "clusterrolebinding": (_RBAC, "clusterrolebindings", False),
    "crd": ("apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "raftcluster": ("apis/raftlog.dev/v1alpha1", "raftclusters", True),
    "kopfpeering": ("apis/kopf.dev/v1", "kopfpeerings", True),
}


@functools.cache
def _api() -> ApiClient:
    return cast(ApiClient, kube_config.new_client_from_config(config_file=str(KUBECONFIG)))  # type: ignore[no-untyped-call]


def _read(kind: str, ns: str | None, name: str = "", selector: str | None = None) -> Any:
    """GET of `kind` (singular or plural, as kubectl takes them) from the API server: one
    object by name, or the list (`ns` None: every namespace). Fails with AssertionError, as
    a failed kubectl does, so that `until` goes on polling."""
    known = kind if kind in _KINDS else kind.removesuffix("s")
    if known not in _KINDS:  # not a KeyError: `until` would poll on it to its timeout
        raise LookupError(f"kube._KINDS has no {kind!r}: add its API path")
    prefix, plural, namespaced = _KINDS[known]
    where = f"namespaces/{ns}/" if namespaced and ns else ""
    path = f"/{prefix}/{where}{plural}" + (f"/{name}" if name else "")
    query = [("labelSelector", selector)] if selector else []
    api = _api()
    request = api.param_serialize(
        "GET", path, query_params=query, header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )  # fmt: skip
    try:
        response = api.call_api(*request, _request_timeout=60)
        data: bytes = response.read()  # type: ignore[no-untyped-call]
    except ApiException as e:
        raise AssertionError(f"GET {path} -> {e.status}: {e.reason}") from None
    if response.status != 200:
        raise AssertionError(f"GET {path} -> {response.status}: {data[:500]!r}")
    return json.loads(data)


def get(kind: str, name: str, ns: str | None = None) -> dict[str, Any]:
    return dict(_read(kind, ns, name))


def items(kind: str, ns: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
    return list(_read(kind, ns, selector=selector)["items"])


def helm(*args: str, timeout: float = 300) -> str:
    done = run([str(HELM), *args], timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} -> {done.returncode}: {done.stderr}")
    return done.stdout


def until(what: str, fn: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """`fn()`'s first truthy value; fails after `timeout` with the last value or error seen."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except (AssertionError, subprocess.TimeoutExpired, KeyError, ValueError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s; last: {last!r}")
        time.sleep(every)


def parse_time(stamp: str) -> float:
    """An API server timestamp (RFC 3339, `Z`) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(stamp).timestamp()


FIGURES = ROOT / ".cluster" / "k8s-figures.log"


def say(msg: str) -> None:
    """A measured figure: on stderr (`pytest -s` shows it) and in FIGURES, which `make test`
    prints after the suite (pytest's workers keep a passing test's stderr to themselves)."""
    line = f"[k8s] {datetime.datetime.now():%H:%M:%S} {msg}"
    print(line, file=sys.stderr, flush=True)
    with FIGURES.open("a") as f:
        f.write(line + "\n")


def container_pid(pod: dict[str, Any]) -> int:
    """The host pid of a pod's (first) container: what a node-level fault is sent to."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    task = ROOT / ".cluster/containerd/state/io.containerd.runtime.v2.task/k8s.io" / cid
    return int((task / "init.pid").read_text())


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


RELEASE = "raftlog-operator"
RELEASE_PODS = f"app.kubernetes.io/instance={RELEASE}"


def release_objects(ns: str) -> list[str]:
    """What the chart's release made in `ns`, and cluster-wide (by helm's release annotation)."""
    namespaced = kubectl(
        "get", "deploy,rs,pods,sa,role,rolebinding,svc,pdb,cm,secret,networkpolicy,kopfpeering",
        "-n", ns, "-l", RELEASE_PODS, "-o", "name",
    )  # fmt: skip
    cluster = json.loads(kubectl(
        "get", "clusterrole,clusterrolebinding,clusterkopfpeering", "-l", RELEASE_PODS, "-o", "json"
    ))["items"]  # fmt: skip
    mine = [f"{o['kind']}/{o['metadata']['name']}" for o in cluster
            if (o["metadata"].get("annotations") or {}).get("meta.helm.sh/release-namespace")
            == ns]  # fmt: skip
    return namespaced.split() + mine


def start_pod(
    ns: str,
    name: str,
    image: str,
    command: list[str],
    uid: int,
    *,
    requests: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """A pod that runs `command` once as `uid`, under Pod Security "restricted"."""
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    container: dict[str, Any] = {
        "name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "command": command,
        "securityContext": restricted, "volumeMounts": mounts or [],
    }  # fmt: skip
    if requests:
        container["resources"] = {"requests": requests}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": uid, "runAsGroup": uid},
            "containers": [container], "volumes": volumes or [],
        },
    }  # fmt: skip
    kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(pod))


def pod_output(ns: str, name: str, timeout: float) -> str:
    """Waits for a pod of `start_pod` to finish; it must succeed. Its log."""
    started = time.monotonic()
    phase = until(f"{name} finished", lambda: (
        p if (p := get("pod", name, ns)["status"].get("phase")) in ("Succeeded", "Failed")
        else None), timeout)  # fmt: skip
    out = kubectl("logs", "-n", ns, name)
    assert phase == "Succeeded", f"{name} {phase} after {time.monotonic() - started:.0f} s:\n{out}"
    return out
