"""`python -m raftlog.node.native_build`: compile the node's hot modules with mypyc (`make
install` runs it), unless a build of their current sources exists. What is compiled, where
it goes and when a node uses it: `native.py`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from raftlog.node.native import MANIFEST, MODULES, ROOT, SUFFIX, cache_dir, key, source_of

KEEP_BUILDS = 8  # other checkouts' builds kept beside this one's


def build(into: Path | None = None, quiet: bool = False) -> Path:
    """Compile MODULES of the sources under ROOT (unless a build of their key exists)."""
    base = into or cache_dir()
    target = base / key()
    if (target / MANIFEST).exists():
        if not quiet:
            print(f"native modules up to date: {target}")
        return target
    with tempfile.TemporaryDirectory(prefix="raftlog-native-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(
            ROOT / "raftlog", src / "raftlog", ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
        files = [str(source_of(m, Path("."))) for m in MODULES]
        print(f"mypyc: compiling {len(files)} modules of the node (under a minute) ...", flush=True)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypyc",
                "--explicit-package-bases",
                "--ignore-missing-imports",
                *files,
            ],
            cwd=src,
            env={**os.environ, "MYPYPATH": str(src)},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"mypyc failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        base.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=base))
        staged.chmod(0o755)  # mkdtemp's 0700 would hide it from an image's unprivileged user
        listed: dict[str, str] = {}
        for module in MODULES:
            rel = Path(*module.split(".")).with_suffix(SUFFIX)
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, staged / rel)
            listed[module] = str(rel)
        for lib in src.glob(f"*__mypyc{SUFFIX}"):  # the modules' shared library
            shutil.copy2(lib, staged / lib.name)
            listed[lib.name[: -len(SUFFIX)]] = lib.name
        (staged / MANIFEST).write_text(json.dumps(listed, indent=1, sort_keys=True))
        try:
            staged.rename(target)
        except OSError:  # another build of the same key landed first: the same bytes
            shutil.rmtree(staged, ignore_errors=True)
    _prune(base, keep=target)
    if not quiet:
        print(f"native modules built: {target}")
    return target


def _prune(base: Path, keep: Path) -> None:
    builds = sorted(
        (d for d in base.iterdir() if d.is_dir() and (d / MANIFEST).exists() and d != keep),
        key=lambda d: d.stat().st_mtime,
        reverse=True,
    )
    for old in builds[KEEP_BUILDS - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m raftlog.node.native_build", file=sys.stderr)
        return 2
    build()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
