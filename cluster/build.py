"""The cluster's binaries: Debian packages installed, Go commands built once per version.

Each Go tool is built from a small module of this folder that requires the upstream module at one
release (its go.mod and go.sum checked in), into `CACHE/<name>-<version>/`, so a second
`make cluster` (or a fresh clone on the same machine) builds nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster import layout

# Debian's container runtime, CNI plugins, netfilter tools and what the images are made with.
PACKAGES = (
    "containerd", "runc", "containernetworking-plugins", "iptables", "conntrack",
    "mmdebstrap", "umoci", "catatonit", "busybox-static", "util-linux",
)  # fmt: skip


@dataclass(frozen=True)
class GoTool:
    name: str
    version: str
    module: str  # folder under cluster/
    packages: tuple[str, ...]  # main packages, built into `binaries` (same order)
    binaries: tuple[str, ...]
    ldflags: str = "-s -w"


def _k8s_ldflags(v: str) -> str:
    major, minor = v.lstrip("v").split(".")[:2]
    return " ".join(
        ["-s", "-w"]
        + [f"-X k8s.io/component-base/version.{k}" for k in (
            f"gitVersion={v}", f"gitMajor={major}", f"gitMinor={minor}", "gitTreeState=clean",
        )]
        + [f"-X k8s.io/client-go/pkg/version.gitVersion={v}"]
    )  # fmt: skip


K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
                "kube-proxy")  # fmt: skip
TOOLS = (
    GoTool(
        "kubernetes", layout.KUBERNETES, "kube",
        tuple(f"k8s.io/kubernetes/cmd/{c}" for c in K8S_COMMANDS), K8S_COMMANDS,
        _k8s_ldflags(layout.KUBERNETES),
    ),
    GoTool("etcd", layout.ETCD, "kube", ("go.etcd.io/etcd/server/v3",), ("etcd",)),
    GoTool("helm", layout.HELM, "helm", ("helm.sh/helm/v3/cmd/helm",), ("helm",),
           f"-s -w -X helm.sh/helm/v3/internal/version.version={layout.HELM}"),
    GoTool("coredns", layout.COREDNS, "coredns", ("github.com/coredns/coredns",), ("coredns",)),
    GoTool(
        "local-path", layout.LOCAL_PATH, "local-path",
        ("github.com/rancher/local-path-provisioner",), ("local-path-provisioner",),
    ),
)  # fmt: skip

# Not the cluster's: the S3-compatible server (`weed`) of the tests and the local mode, built on
# demand (`python -m cluster weed`, `make s3server`, or the harness's first use), never by `up`.
SEAWEEDFS = GoTool(
    "seaweedfs", layout.SEAWEEDFS, "seaweedfs", ("github.com/seaweedfs/seaweedfs/weed",), ("weed",),
    "-s -w -X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT="
    + layout.SEAWEEDFS.rsplit("-", 1)[-1][:8],
)  # fmt: skip


def say(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


def ensure_packages() -> None:
    missing = [
        p
        for p in PACKAGES
        if subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True
        ).stdout
        != "install ok installed"
    ]
    if not missing:
        return
    say(f"apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    subprocess.run([*sudo, "apt-get", "-qq", "update"], check=True, env=env, timeout=600)
    subprocess.run(
        [*sudo, "apt-get", "-y", "-qq", "install", *missing], check=True, env=env, timeout=1200
    )


def tool_dir(tool: GoTool) -> Path:
    return layout.CACHE / f"{tool.name}-{tool.version}"


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """One build of a tool at a time on this machine (two test workers may both want it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(tool: GoTool, log: Path | None = None) -> Path:
    """The folder holding `tool`'s binaries, built unless the cache has them.

    `go build`'s output goes to `log` when given (else to this process's), the build's own log.
    """
    out = tool_dir(tool)
    if all((out / b).exists() for b in tool.binaries):
        return out
    with _locked(out):
        if all((out / b).exists() for b in tool.binaries):
            return out  # another process built it while this one waited
        return _build(tool, out, log)


def _build(tool: GoTool, out: Path, log: Path | None) -> Path:
    if shutil.which("go") is None:
        raise RuntimeError("cluster: `go` is not on the PATH (Go 1.24 or newer builds the cluster)")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    say(f"go build {tool.name} {tool.version} ({len(tool.binaries)} commands; a first build takes "
        "minutes on 2 cores, Kubernetes' and SeaweedFS's over 10)")  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    # One package is built to its binary's name: go names it after the import path, and
    # `go.etcd.io/etcd/server/v3` would be `server`. Several go to a folder, named by go.
    target = str(tmp / tool.binaries[0]) if len(tool.packages) == 1 else f"{tmp}/"
    cmd = ["go", "build", "-trimpath", "-ldflags", tool.ldflags, "-o", target, *tool.packages]
    with contextlib.ExitStack() as stack:
        sink = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            sink = stack.enter_context(open(log, "w"))
            sink.write(f"$ cd {layout.SRC / tool.module} && CGO_ENABLED=0 {shlex.join(cmd)}\n")
            sink.flush()
            say(f"go build's log: {log}")
        done = subprocess.run(
            cmd, cwd=layout.SRC / tool.module, env=env, timeout=5400,
            stdout=sink, stderr=subprocess.STDOUT if sink else None,
        )  # fmt: skip
        if sink is not None:
            sink.write(f"exit {done.returncode} after {time.monotonic() - started:.0f} s\n")
    if done.returncode != 0:
        where = f"; its log: {log}" if log else ""
        raise RuntimeError(f"cluster: go build {tool.name} exited {done.returncode}{where}")
    missing = [b for b in tool.binaries if not (tmp / b).exists()]
    if missing:
        built = sorted(p.name for p in tmp.iterdir())
        raise RuntimeError(f"cluster: go build {tool.name} made {built}, not {missing}")
    if tmp.exists() and out.exists():
        for b in tmp.iterdir():
            b.rename(out / b.name)
        tmp.rmdir()
    else:
        tmp.rename(out)
    say(f"built {tool.name} in {time.monotonic() - started:.0f} s -> {out}")
    return out


def ensure_weed() -> Path:
    """SeaweedFS's `weed`, built (with its log beside its folder) unless the cache has it."""
    tool = SEAWEEDFS
    return build(tool, log=layout.CACHE / f"{tool.name}-{tool.version}.build.log") / "weed"


def ensure_binaries() -> dict[str, Path]:
    """Every command by name, linked into `.cluster/bin` (so `.cluster/bin/helm` works)."""
    layout.BIN.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for tool in TOOLS:
        d = build(tool)
        for b in tool.binaries:
            link = layout.BIN / b
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(d / b)
            paths[b] = link
    return paths
