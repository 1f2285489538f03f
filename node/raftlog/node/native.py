"""The node's hot modules compiled with mypyc, used only while they match their sources.

Each partition's round (its appends stepped, written, answered and applied) is Python on
every replica, and at 16 partitions it binds the leader's process (bench/RESULTS.md, "the
leader's process is what binds"). mypyc compiles these typed modules to C extensions; the
speed it gives is in bench/RESULTS.md ("Hot modules compiled with mypyc"), measured with
`python -m bench.partitions 16 1`.

`python -m raftlog.node.native_build` (run by `make install`) compiles MODULES into
`$RAFTLOG_NATIVE_DIR` (default `~/.cache/raftlog-native`), in a directory named by the key of
their sources: the bytes of every module of their packages and of the build's recipe, and the
interpreter's extension suffix. `raftlog-node`, `raftlog-sim` and the tests call `install()`
before anything imports the core: it computes the key of the sources as they are now and, if
a build of that key exists, has the modules imported from it. An edit to any of them (or no
build) runs them all interpreted: a build never runs stale code, and compiled and interpreted
modules never mix (a compiled module reaches into the compiled classes of the others).
`RAFTLOG_NATIVE=0` runs them interpreted whatever is built (for a debugger or a line profiler).

Left interpreted: the message and entry types and `validate.py`, since compiled classes check
their fields' types on construction and the core's validation must be what refuses a
malformed message, naming the field; the driver and storage, whose objects tests replace
methods of to inject faults (a compiled object has fixed attributes) and which the time index
keys weakly (a compiled object has no weak references); the HTTP listener and peer links
(asyncio protocols). The core alone, 16 groups of 3 stepped in one process: about 57 -> 31 us
per group round.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

MODULES = (
    "raftlog.node.core.raft",
    "raftlog.node.core.log",
    "raftlog.node.core.progress",
    "raftlog.node.core.liveness",
    "raftlog.node.transport.codec",
)
ROOT = Path(__file__).resolve().parents[2]  # the directory holding the `raftlog` package
MANIFEST = "manifest.json"
SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX"))  # of this interpreter's extension modules


def cache_dir() -> Path:
    configured = os.environ.get("RAFTLOG_NATIVE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "raftlog-native"


def source_of(module: str, root: Path) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def _keyed(root: Path) -> list[Path]:
    """MODULES' sources and every other module of their packages (mypyc compiles against
    the types, and inlines the constants, of what they import, all of it from these), and the
    recipe that builds them: a changed recipe builds anew at the next `make install`."""
    packages = sorted({source_of(m, root).parent for m in MODULES})
    recipe = source_of("raftlog.node.native_build", root)
    return sorted([recipe, *(f for package in packages for f in package.glob("*.py"))])


def key(root: Path = ROOT) -> str:
    """What a build must have been made from to be used: the sources and the extension ABI."""
    h = hashlib.sha256(SUFFIX.encode())
    h.update("\0".join(MODULES).encode())
    for source in _keyed(root):
        h.update(b"\0" + str(source.relative_to(root)).encode() + b"\0")
        h.update(source.read_bytes())
    return h.hexdigest()[:24]


class _Finder(importlib.abc.MetaPathFinder):
    """Imports the built modules (and mypyc's shared library of them) from the build."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        where = self.paths.get(fullname)
        if where is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(where))
        return importlib.util.spec_from_file_location(fullname, where, loader=loader)


def install() -> bool:
    """Import MODULES compiled if a build of the current sources exists; True if so."""
    if os.environ.get("RAFTLOG_NATIVE", "1") == "0":
        return False
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    try:
        build = cache_dir() / key()
        listed = json.loads((build / MANIFEST).read_text())
    except (OSError, ValueError):
        return False  # no build of these sources (or none readable): interpreted
    if any(m in sys.modules for m in MODULES):
        return False  # already imported interpreted: the two must not mix
    paths = {name: build / rel for name, rel in listed.items()}
    if set(MODULES) - set(paths) or not all(p.is_file() for p in paths.values()):
        return False  # a build missing a file (cut short, or pruned under us): interpreted
    sys.meta_path.insert(0, _Finder(paths))
    return True


def active() -> bool:
    """Whether this process runs the core compiled (False while nothing has imported it)."""
    core = sys.modules.get(MODULES[0])
    return str(getattr(core, "__file__", "")).endswith(SUFFIX)
