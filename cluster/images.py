"""The cluster's container images, built without Docker or a registry, and imported into containerd.

Each image starts as a root filesystem tarball (Debian's own static binaries, or an `mmdebstrap`
of bookworm with raftlog's wheels installed), which `umoci` turns into an OCI image layout whose
only tag is the image's full reference: `ctr images import` names the image after that
`org.opencontainers.image.ref.name` annotation. Every image is cached in CACHE/images under a key
that hashes everything that goes into it, so a second build is instant.

    python -m cluster.images build             # every image, into CACHE/images
    python -m cluster.images import ADDRESS    # ... and into the containerd at ADDRESS
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from cluster import build as cluster_build
from cluster import layout
from raftlog.node import native_build

IMAGES = layout.CACHE / "images"
RAFTLOG_REF = "ghcr.io/raftlog/raftlog:0.1.0"
SPARK_REF = "ghcr.io/raftlog/raftlog-spark:0.1.0"
PAUSE_REF = "localhost/raftlog/pause:catatonit"
COREDNS_REF = f"localhost/raftlog/coredns:{layout.COREDNS}"
LOCAL_PATH_REF = f"localhost/raftlog/local-path-provisioner:{layout.LOCAL_PATH}"
# SeaweedFS's `weed` (statically linked: CGO_ENABLED=0, see cluster/build.py), the S3 server the
# `k8s` tests run inside the cluster; tagged with its module version's commit.
SEAWEEDFS_REF = f"localhost/raftlog/seaweedfs:{layout.SEAWEEDFS.rsplit('-', 1)[-1][:12]}"

# The host's apt sources (/etc/apt/sources.list.d/debian.sources): the only mirror reachable.
MIRRORS = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]
PACKAGES = ["python3", "python3-venv", "ca-certificates"]
# Documentation is dead weight in an image; the licences stay.
DPKG_OPTS = [
    *(f"path-exclude=/usr/share/{d}/*" for d in ("man", "doc", "info", "locale")),
    "path-include=/usr/share/doc/*/copyright",
]
# What the wheels, the Dockerfile and the cache key are made from.
SOURCES = ["node", "operator", "spark", "demo", "pyproject.toml", "README.md", "image"]

# The image's one recipe, shared with the Dockerfile; run in the bookworm chroot.
INSTALL = layout.ROOT / "image" / "install-raftlog.sh"
RAFTLOG_ENV = {
    "PATH": "/opt/raftlog/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "HOME": "/tmp",
}
# Where the node image holds the core compiled by mypyc (raftlog/node/native.py), built here
# from the very sources of its wheel: the members' python (Debian's 3.11) loads what the dev
# venv's 3.11 compiled, as the extension ABI is the same within 3.11.
NATIVE_DIR = "/opt/raftlog/native"
NODE_ENV = {**RAFTLOG_ENV, "RAFTLOG_NATIVE_DIR": NATIVE_DIR}
SPARK_INSTALL = layout.ROOT / "image" / "install-spark.sh"
SPARK_ENTRYPOINT = layout.ROOT / "image" / "spark-entrypoint.sh"
SPARK_ENV = {
    **RAFTLOG_ENV,
    "HOME": "/opt/spark/work-dir",
    "SPARK_HOME": "/opt/spark-home",
    "JAVA_HOME": "/usr/lib/jvm/java-17-openjdk-amd64",
    "PYSPARK_PYTHON": "/opt/raftlog/bin/python",
    "PYSPARK_DRIVER_PYTHON": "/opt/raftlog/bin/python",
}
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = b"root:x:0:\nnobody:x:65534:\n"


class Image(NamedTuple):
    tar: Path  # an OCI image layout tarball, for `ctr images import`
    ref: str


def _log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


def _run(
    *args: str | Path, timeout: float = 600, capture: bool = False, cwd: Path | None = None
) -> str:
    """Run a command (check=True); on a timeout or an interrupt, kill its whole process group, so
    that no apt or dpkg outlives a killed mmdebstrap."""
    argv = [str(a) for a in args]
    stdout = subprocess.PIPE if capture else None
    with subprocess.Popen(argv, stdout=stdout, text=True, cwd=cwd, start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv, out)
    return out or ""


def _key(*parts: str | bytes) -> str:
    """A short hash of everything that goes into an image, this recipe included."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:12]


def _deb_version(package: str) -> str:
    return _run("dpkg-query", "-W", "-f=${Version}", package, capture=True, timeout=30)


def _mb(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def oci_from_rootfs(
    rootfs_tar: Path,
    out: Path,
    ref: str,
    *,
    entrypoint: list[str] | None,
    cmd: list[str] | None,
    user: str | None,
    workdir: str | None,
    env: dict[str, str],
) -> Path:
    """Make `out`, an OCI image layout tarball of one layer (rootfs_tar) tagged `ref`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as tmp:
        oci, bundle, tar = Path(tmp) / "oci", Path(tmp) / "bundle", Path(tmp) / "image.tar"
        # The tag is the full reference: umoci writes it as the manifest's ref.name annotation,
        # which ctr keeps as the image name (a bare tag would become "import-<date>:<tag>").
        image = f"{oci}:{ref}"
        _run("umoci", "init", "--layout", oci)
        _run("umoci", "new", "--image", image)
        _run("umoci", "unpack", "--image", image, bundle)
        # The runtime mounts its own /dev; mmdebstrap's device nodes stay out of the layer.
        skip_dev = "--exclude=./dev/*"
        _run("tar", "--numeric-owner", skip_dev, "-xpf", rootfs_tar, "-C", bundle / "rootfs")
        _run("umoci", "repack", "--image", image, bundle, timeout=1200)
        config: list[str] = []
        for flag, values in (("entrypoint", entrypoint), ("cmd", cmd)):
            for value in values or []:
                config += [f"--config.{flag}", value]
        config += [f"--config.env={k}={v}" for k, v in env.items()]
        config += [f"--config.user={user}"] if user else []
        config += [f"--config.workingdir={workdir}"] if workdir else []
        if config:
            _run("umoci", "config", "--image", image, *config)
        _run("umoci", "gc", "--layout", oci)
        _run("tar", "--numeric-owner", "-C", oci, "-cf", tar, "oci-layout", "index.json", "blobs")
        tar.replace(out)  # atomically: the cache never holds half an image
    return out


class _Rootfs:
    """A root filesystem tarball written entry by entry, everything owned by root."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar

    def _add(self, name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "") -> None:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.size, info.linkname = kind, mode, len(data), link
        self.tar.addfile(info, io.BytesIO(data) if data else None)

    def dir(self, name: str, mode: int = 0o755) -> None:
        self._add(name, tarfile.DIRTYPE, mode)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._add(name, tarfile.REGTYPE, mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._add(name, tarfile.SYMTYPE, 0o777, link=target)

    def etc(self) -> None:
        """/etc/passwd and /etc/group (root and nobody), and a world-writable /tmp."""
        self.dir("etc")
        self.file("etc/passwd", PASSWD)
        self.file("etc/group", GROUP)
        self.dir("tmp", 0o1777)


@contextmanager
def _rootfs(path: Path) -> Iterator[_Rootfs]:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        yield _Rootfs(tar)


def _prune(name: str, keep: Path) -> None:
    """Drop this image's builds under older keys: each source edit would otherwise leave one."""
    for old in IMAGES.glob(f"{name}-{'?' * 12}.tar"):
        if old != keep:
            old.unlink()


def _cached(name: str, key: str) -> tuple[Path, bool]:
    IMAGES.mkdir(parents=True, exist_ok=True)
    out = IMAGES / f"{name}-{key}.tar"
    if out.exists():
        _log(f"{name}: cached {out} ({_mb(out)})")
    return out, out.exists()


def _small_image(
    name: str,
    ref: str,
    key: str,
    fill: Callable[[_Rootfs], None],
    entrypoint: list[str],
    env: dict[str, str],
) -> Image:
    """An image of a few host files (static binaries), written by `fill`."""
    out, done = _cached(name, key)
    if not done:
        _log(f"{name}: building {ref}")
        with tempfile.TemporaryDirectory(dir=IMAGES, prefix=f".{name}-") as tmp:
            rootfs = Path(tmp) / "rootfs.tar"
            with _rootfs(rootfs) as fs:
                fill(fs)
            oci_from_rootfs(
                rootfs, out, ref, entrypoint=entrypoint, cmd=None, user=None, workdir=None, env=env
            )
        _log(f"{name}: built {out} ({_mb(out)})")
        _prune(name, out)
    return Image(out, ref)


def pause_image() -> Image:
    """The pod sandbox: Debian's static catatonit in pause mode (it only reaps and waits)."""
    catatonit = Path("/usr/bin/catatonit")
    data = catatonit.read_bytes()
    key = _key(PAUSE_REF, _deb_version("catatonit"), data)

    def fill(fs: _Rootfs) -> None:
        fs.file("catatonit", data, 0o755)

    return _small_image("pause", PAUSE_REF, key, fill, ["/catatonit", "-P"], {})


def busybox_ref() -> str:
    """Named after Debian's busybox-static version: 1:1.35.0-4+deb12u1+b1 -> 1.35.0."""
    version = _deb_version("busybox-static")
    return f"localhost/raftlog/busybox:{version.split(':')[-1].split('-')[0]}"


def busybox_image() -> Image:
    """Debian's static busybox with a /bin symlink per applet: the local-path provisioner's
    helper pod runs `sh -c` scripts of mkdir, chmod and rm in it."""
    busybox = Path("/bin/busybox")
    data = busybox.read_bytes()
    ref = busybox_ref()
    applets = sorted(set(_run(busybox, "--list", capture=True, timeout=30).split()) - {"busybox"})

    def fill(fs: _Rootfs) -> None:
        fs.dir("bin")
        fs.file("bin/busybox", data, 0o755)
        for applet in applets:
            fs.symlink(f"bin/{applet}", "busybox")
        fs.etc()

    key = _key(ref, data)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    return _small_image("busybox", ref, key, fill, ["/bin/sh"], env)


def binary_image(binary: Path, ref: str, entrypoint: list[str]) -> Image:
    """One static binary at /<name>, with /etc/passwd, /etc/group and /tmp (CoreDNS, the
    local-path provisioner)."""
    data = binary.read_bytes()
    key = _key(ref, *entrypoint, data)

    def fill(fs: _Rootfs) -> None:
        fs.file(binary.name, data, 0o755)
        fs.etc()

    return _small_image(binary.name, ref, key, fill, entrypoint, {})


def _source_hash() -> str:
    """Every file the wheels are built from (tracked or not, committed or not), by content."""
    ls_files = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--"]
    listed = _run(*ls_files, *SOURCES, cwd=layout.ROOT, capture=True, timeout=60)
    h = hashlib.sha256()
    for name in sorted(set(filter(None, listed.split("\0")))):
        path = layout.ROOT / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
    return h.hexdigest()


class _VenvImage(NamedTuple):
    """An image of bookworm with a venv of raftlog's wheels, installed by a recipe of image/."""

    name: str
    ref: str
    packages: list[str]
    recipe: Path  # run in the chroot as `sh RECIPE /tmp/wheels FILES...`
    files: list[Path]  # copied into the chroot's /tmp for the recipe
    target: str  # what `pip wheel` builds: "." or ".[spark]"
    cmd: list[str] | None
    entrypoint: list[str] | None
    user: str
    workdir: str
    env: dict[str, str]
    native: bool = False  # the node's compiled core in NATIVE_DIR


def _venv_image(spec: _VenvImage) -> Image:
    """The image in two layers: a base (bookworm, the packages, the venv with every dependency;
    cached by everything but raftlog's sources and `spec.files`) and raftlog's own wheel and
    files over it (`--update` of the recipe): a source change rebuilds only the second."""
    python = layout.ROOT / ".venv" / "bin" / "python"
    # The versions the dev venv was tested with pin the image's dependencies (and key it).
    pip: list[str | Path] = [python, "-m", "pip", "--disable-pip-version-check"]
    listed = _run(*pip, "list", "--format=freeze", "--exclude-editable", capture=True)
    # uv installs the dev venv (Makefile) and is no dependency: its version must not key images.
    pins = "".join(line for line in listed.splitlines(True) if not line.startswith("uv=="))
    # Not the paths: the same image from any checkout is the same cache entry.
    shape = [
        spec.packages,
        spec.target,
        spec.cmd,
        spec.entrypoint,
        spec.user,
        spec.workdir,
        spec.env,
    ]
    # The dependencies raftlog declares: the base's wheels are them, and one newly declared
    # but already in the dev venv (as a dependency of a dev tool) leaves the pins unchanged.
    project = tomllib.loads((layout.ROOT / "pyproject.toml").read_text())["project"]
    declared = repr([project["dependencies"], project.get("optional-dependencies", {})])
    base_key = _key(
        spec.name, spec.ref, repr(shape), *MIRRORS, *DPKG_OPTS, spec.recipe.read_bytes(), pins,
        declared,
    )  # fmt: skip
    files = [f.read_bytes() for f in spec.files]
    out, done = _cached(spec.name, _key(base_key, *files, _source_hash()))
    if done:
        return Image(out, spec.ref)
    started = time.monotonic()
    base, based = _cached(f"{spec.name}-base", base_key)
    if not based:
        _base_image(spec, base, pip, pins)
        _prune(f"{spec.name}-base", base)
    _log(f"{spec.name}: raftlog's wheel and files over {base.name}")
    with tempfile.TemporaryDirectory(dir=IMAGES, prefix=f".{spec.name}-") as tmp_name:
        tmp = Path(tmp_name)
        oci, bundle, tar = tmp / "oci", tmp / "bundle", tmp / "image.tar"
        _run(*pip, "wheel", "-q", "--no-deps", "-w", tmp / "wheels", layout.ROOT, timeout=600)
        oci.mkdir()
        _run("tar", "-xf", base, "-C", oci)
        image = f"{oci}:{spec.ref}"
        _run("umoci", "unpack", "--image", image, bundle, timeout=600)
        root = bundle / "rootfs"
        staged = root / "tmp" / "raftlog-update"
        staged.mkdir()
        for f in (tmp / "wheels", spec.recipe, *spec.files):
            _run("cp", "-r", f, staged)
        inside = " ".join(f"/tmp/raftlog-update/{f.name}" for f in spec.files)
        # A private mount namespace: /dev and /proc for the recipe, gone when it ends.
        script = (
            f"mount --rbind /dev {root}/dev && mount -t proc proc {root}/proc && "
            f"chroot {root} env -i sh /tmp/raftlog-update/{spec.recipe.name} --update "
            f"/tmp/raftlog-update/wheels {inside}"
        )
        _run("unshare", "--mount", "--fork", "sh", "-c", script, timeout=600)
        _run("rm", "-rf", staged)
        if spec.native:
            build = native_build.build(quiet=True)  # compiles only if these sources are new
            native = root / NATIVE_DIR.lstrip("/")
            native.mkdir(parents=True)
            _run("cp", "-r", build, native / build.name)
            _run("chmod", "-R", "a+rX", native)  # read by the pods' user, 10001
        _run("umoci", "repack", "--image", image, bundle, timeout=1200)
        _run("umoci", "gc", "--layout", oci)
        _run("tar", "--numeric-owner", "-C", oci, "-cf", tar, "oci-layout", "index.json", "blobs")
        tar.replace(out)  # atomically: the cache never holds half an image
    elapsed = time.monotonic() - started
    _log(f"{spec.name}: built {out} ({_mb(out)}) in {elapsed:.0f} s")
    _prune(spec.name, out)
    return Image(out, spec.ref)


def _base_image(spec: _VenvImage, out: Path, pip: list[str | Path], pins: str) -> None:
    """bookworm minbase with the packages, the recipe run in it over the wheels of raftlog and
    every dependency, as one layer."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=IMAGES, prefix=f".{spec.name}-") as tmp_name:
        tmp = Path(tmp_name)
        wheels, rootfs, constraints = tmp / "wheels", tmp / "rootfs.tar", tmp / "constraints.txt"
        constraints.write_text(pins)
        _log(f"{spec.name}: pip wheel ({spec.target} and its runtime dependencies)")
        target = f"{layout.ROOT}{spec.target[1:]}"
        _run(*pip, "wheel", "-q", "-w", wheels, "-c", constraints, target, timeout=1800)
        _log(f"{spec.name}: mmdebstrap bookworm minbase + {' '.join(spec.packages)}, venv, wheels")
        chroot_files = " ".join(f"/tmp/{f.name}" for f in spec.files)
        # unshare mode as root: a private mount namespace, so a killed build leaves no mounts.
        # (TMPDIR: mmdebstrap's scratch space, next to the rest, removed with it.)
        mmdebstrap = ["env", f"TMPDIR={tmp}", "mmdebstrap", "--quiet", "--mode=unshare"]
        copied = " ".join(str(f) for f in (wheels, spec.recipe, *spec.files))
        options = [f"--dpkgopt={o}" for o in DPKG_OPTS] + [
            "--variant=minbase",
            f"--include={','.join(spec.packages)}",
            # Java's packages register man pages with update-alternatives, which fails when
            # their folder is missing (the man pages themselves are excluded above).
            '--essential-hook=mkdir -p "$1/usr/share/man/man1"',
            f"--customize-hook=copy-in {copied} /tmp",
            # A clean environment: the host's PIP_* and PYTHON* settings stay out.
            f'--customize-hook=chroot "$1" env -i sh /tmp/{spec.recipe.name} /tmp/wheels '
            + chroot_files,
            '--customize-hook=rm -rf "$1"/tmp/*',
        ]
        _run(*mmdebstrap, *options, "bookworm", rootfs, *MIRRORS, timeout=1800)
        size = _mb(rootfs)
        _log(f"{spec.name}: umoci, rootfs {size}")
        oci_from_rootfs(
            rootfs, out, spec.ref, entrypoint=spec.entrypoint, cmd=spec.cmd, user=spec.user,
            workdir=spec.workdir, env=spec.env,
        )  # fmt: skip
    elapsed = time.monotonic() - started
    _log(f"{spec.name}: built the base {out} ({_mb(out)}, rootfs {size}) in {elapsed:.0f} s")


def raftlog_image(ref: str = RAFTLOG_REF) -> Image:
    """The project's image: bookworm's python3 with raftlog in a venv at /opt/raftlog, as the
    Dockerfile builds it, run as 10001:10001 in /var/lib/raftlog."""
    spec = _VenvImage(
        name="raftlog",
        ref=ref,
        packages=PACKAGES,
        recipe=INSTALL,
        files=[],
        target=".",
        cmd=["raftlog-node", "--help"],
        entrypoint=None,
        user="10001:10001",
        workdir="/var/lib/raftlog",
        env=NODE_ENV,
        native=True,
    )
    return _venv_image(spec)


def spark_image(ref: str = SPARK_REF) -> Image:
    """Spark's image for raftlog (examples/spark/Dockerfile's, without Docker): bookworm's
    python3 and Java 17, raftlog[spark] in /opt/raftlog (pyspark's Spark), raftlog-jvm's jar
    among Spark's jars, and the entrypoint Spark's Kubernetes pods call; run as 185:185."""
    jar = layout.ROOT / "spark" / "raftlog" / "spark" / "jars" / "raftlog-spark.jar"
    if not jar.is_file():
        raise RuntimeError(f"{jar} is missing: `make jvm` builds it")
    spec = _VenvImage(
        name="raftlog-spark",
        ref=ref,
        packages=[*PACKAGES, "openjdk-17-jre-headless"],
        recipe=SPARK_INSTALL,
        files=[jar, SPARK_ENTRYPOINT, layout.ROOT / "examples" / "spark" / "archive_main.py"],
        target=".[spark]",
        cmd=None,
        entrypoint=["/opt/entrypoint.sh"],
        user="185:185",
        workdir="/opt/spark/work-dir",
        env=SPARK_ENV,
    )
    return _venv_image(spec)


def digest(tar: Path) -> str:
    """The manifest digest of an image tarball (what `ctr images ls` shows once imported)."""
    with tarfile.open(tar) as t:
        member = t.extractfile("index.json")
        assert member is not None
        return str(json.load(member)["manifests"][0]["digest"])


def import_image(tar: Path, ref: str, address: str) -> None:
    """Import into containerd's k8s.io namespace (the kubelet's), where the name is `ref`."""
    ctr = ["ctr", "--address", address, "-n", "k8s.io"]
    _log(f"import {ref} into {address}")
    _run(*ctr, "images", "import", tar, timeout=600)
    if ref not in _run(*ctr, "images", "ls", "-q", capture=True, timeout=60).split():
        raise RuntimeError(f"{tar} imported into {address}, but {ref} is not listed")


def build() -> list[Image]:
    return [raftlog_image(), pause_image(), busybox_image()]


def seaweedfs_image() -> Image:
    """SeaweedFS's static `weed` at /weed (built from the Go module proxy unless cached), for an
    S3 server in the cluster: `weed mini -dir=/tmp/...` or with a volume for its data."""
    return binary_image(cluster_build.ensure_weed(), SEAWEEDFS_REF, ["/weed"])


def ensure_all(bins: dict[str, Path]) -> list[Image]:
    """Every image the cluster runs: raftlog's, the sandbox's, the add-ons' (from `bins`) and the
    tests' S3 server."""
    return [
        *build(),
        binary_image(bins["coredns"].resolve(), COREDNS_REF, ["/coredns"]),
        binary_image(
            bins["local-path-provisioner"].resolve(), LOCAL_PATH_REF, ["/local-path-provisioner"]
        ),
        seaweedfs_image(),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.images", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build every image into the cache")
    load = commands.add_parser("import", help="build, then import into a containerd")
    load.add_argument("address", help="containerd's socket")
    args = parser.parse_args()
    for image in build():
        if args.command == "import":
            import_image(image.tar, image.ref, args.address)
        print(image.ref, image.tar)


if __name__ == "__main__":
    main()
