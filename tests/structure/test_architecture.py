"""The arrows of docs/architecture.md, checked on every module's imports.

Each module of the distribution's source roots is parsed with `ast`; every `import` and
`from ... import` anywhere in it counts (inside functions and under `TYPE_CHECKING` too), and so
does `importlib.import_module("...")` / `__import__("...")` with a literal name. An import of
another part that the table below does not allow fails, naming the module, its line and the rule.
`violations(root)` takes the repository root, so an older checkout can be checked the same way.
"""

from __future__ import annotations

import ast
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("node", "operator", "spark", "demo", "harness")

# Module prefix -> part. The longest matching prefix wins; every module must match one.
PARTS: dict[str, str] = {
    "raftlog.node.core": "core",
    "raftlog.node.storage": "storage",
    "raftlog.node.transport": "transport",
    "raftlog.node.statemachine": "state machine",
    # Formats readers outside the node read too: the record, and the archive's objects.
    "raftlog.node.record": "record",
    "raftlog.node.storage.archive_manifest": "archive format",
    "raftlog.node.storage.archive_objects": "archive format",
    "raftlog.node.routing": "routing",
    "raftlog.node.server": "server",
    "raftlog.node.settings": "server",
    "raftlog.node.sim": "sim",
    "raftlog.node.native": "native",
    "raftlog.node.native_build": "native",
    "raftlog.harness": "harness",
    "raftlog.client": "client",
    "raftlog.cli": "cli",
    "raftlog.operator": "operator",
    "raftlog.spark": "spark",
    "raftlog.demo": "demo",
}

# The parts of the node process.
NODE = frozenset(
    {
        "core",
        "storage",
        "transport",
        "state machine",
        "routing",
        "server",
        "sim",
        "record",
        "archive format",
        "native",
    },
)
# The node's formats that readers may read themselves (Spark's executors read the archive).
FORMATS = frozenset({"routing", "record", "archive format"})

# Part -> the other parts it may import. Anything else is forbidden.
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "state machine": frozenset({"core", "record"}),
    "routing": frozenset(),
    "record": frozenset(),
    "storage": frozenset({"core"}),
    # The archive's layout and objects: WAL segments (storage's format) of entries (core's).
    "archive format": frozenset({"core", "storage"}),
    "transport": frozenset({"core", "storage"}),
    "server": frozenset(
        {
            "core",
            "storage",
            "transport",
            "state machine",
            "routing",
            "record",
            "archive format",
            "native",
        }
    ),
    "sim": frozenset({"core", "storage", "state machine", "server", "record", "native"}),
    # The loader of the compiled modules knows them by name only: it imports none of them.
    "native": frozenset(),
    "client": frozenset({"routing"}),
    # The server for `raftctl backup` and `raftctl restore plan`: the node's object-store client
    # and its restore planning, one implementation with the node's own restore.
    "cli": frozenset({"client", "operator", "storage", "server"}),
    "operator": frozenset({"client", "core", "server"}),
    # The archive format and the record: executors read archived ranges from object storage.
    "spark": frozenset({"client", "routing", "record", "archive format"}),
    "demo": frozenset({"cli", "client", "operator", "spark", "harness"}),
    # The node it starts and the client it waits with; the operator for `free_ports` alone.
    "harness": NODE | frozenset({"client", "operator"}),
}

# Packages above the parts; their __init__ must import nothing (test_namespaces_import_nothing).
NAMESPACES = frozenset({"raftlog", "raftlog.node"})

# A module under raftlog.node that PARTS does not place: reported, and held to the node's rules.
UNPLACED = "node (unplaced)"
ALLOWED[UNPLACED] = NODE

# The rules of DESIGN.md ("Structure rules") as (importer parts, imported parts, why). ALLOWED
# must never grant one of these; they name the reason when an import breaks them.
FORBIDDEN: list[tuple[frozenset[str], frozenset[str], str]] = [
    (
        frozenset({"core"}),
        (frozenset(PARTS.values()) | {UNPLACED}) - {"core"},
        "the core is sans-I/O and owns its interfaces: it depends on nothing outward",
    ),
    (
        frozenset({"storage", "transport", "state machine", "core", "record", "archive format"}),
        frozenset({"server", "sim"}),
        "storage, transport and the state machine are used by the driver, never the reverse",
    ),
    (
        NODE | {UNPLACED},
        frozenset({"operator", "spark", "cli", "client", "demo", "harness"}),
        "a node never imports its operator, its readers, the CLI, demos or harnesses",
    ),
    (
        frozenset({"spark"}),
        NODE - FORMATS,
        "Spark reads through the client, or the archive's objects, never the node's core, "
        "storage or server",
    ),
    (
        frozenset(PARTS.values()) - {"demo"},
        frozenset({"demo"}),
        "demos are leaves",
    ),
    (
        frozenset(PARTS.values()) - {"demo", "harness"},
        frozenset({"harness"}),
        "process harnesses are for tests, benchmarks and demos only",
    ),
]

# What the core may import from outside raftlog: pure modules only. No asyncio, threading,
# socket, selectors, os, io, pathlib, time, subprocess, logging, aiohttp, ...
CORE_EXTERNAL = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "dataclasses",
        "enum",
        "functools",
        "heapq",
        "itertools",
        "json",
        "math",
        "random",
        "typing",
        "pydantic",
        "msgspec",
        # `mypyc_attr`, read by mypyc when it compiles the core (raftlog/node/native.py); a
        # decorator that returns its class unchanged when interpreted.
        "mypy_extensions",
    },
)

# (importer, imported module) pairs that break a rule today, each with what removes it. The test
# fails when one is no longer found, so that the exception goes with it.
KNOWN: dict[tuple[str, str], str] = {}

# At least this many modules per part: a walk that finds nothing proves nothing.
MINIMUM_MODULES: dict[str, int] = {
    "core": 10,
    "storage": 10,
    "transport": 3,
    "state machine": 1,
    "routing": 1,
    "record": 1,
    "archive format": 2,
    "server": 12,
    "sim": 5,
    "native": 2,
    "client": 5,
    "cli": 3,
    "operator": 15,
    "spark": 8,
    "demo": 1,
    "harness": 1,
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    path: Path
    line: int


def part_of(module: str) -> str | None:
    best = ""
    for prefix in PARTS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    return PARTS[best] if best else None


def modules(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for source_root in SOURCE_ROOTS:
        base = root / source_root
        if not (base / "raftlog").is_dir():
            continue
        for path in sorted((base / "raftlog").rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name of a relative import (`from . import x` in `importer`)."""
    package = importer.split(".")
    if not is_package:
        package = package[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join([*package, module] if module else package)


def imports_of(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                _resolve(module, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            # `from raftlog.node import server` imports raftlog.node.server: count the name too.
            names = [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            names = [node.args[0].value]
        line: int = getattr(node, "lineno", 0)
        found.extend(Import(module, name, path, line) for name in names if name)
    return found


def _reason(importer_part: str, imported_part: str) -> str:
    for importers, imported, why in FORBIDDEN:
        if importer_part in importers and imported_part in imported:
            return why
    return "not an arrow of docs/architecture.md"


def violations(root: Path) -> tuple[list[str], set[tuple[str, str]]]:
    """The broken rules under `root` (one line each), and the KNOWN pairs that were seen."""
    found = modules(root)
    broken: list[str] = []
    seen_known: set[tuple[str, str]] = set()
    for module, path in found.items():
        importer_part = part_of(module)
        if module in NAMESPACES:
            continue  # `raftlog.node`'s __init__: a docstring, checked to import nothing below
        if importer_part is None:
            broken.append(
                f"{path.relative_to(root)}: module {module} belongs to no part of "
                "docs/architecture.md",
            )
            if not module.startswith("raftlog.node."):
                continue
            importer_part = UNPLACED  # still held to the node's rules
        reported: set[tuple[int, str]] = set()
        for imp in imports_of(module, path):
            where = f"{path.relative_to(root)}:{imp.line}"
            top = imp.imported.split(".")[0]
            if top != "raftlog":
                if importer_part == "core" and top not in CORE_EXTERNAL:
                    broken.append(
                        f"{where}: {module} imports {imp.imported}: the core is sans-I/O and "
                        f"imports only pure modules ({', '.join(sorted(CORE_EXTERNAL))})",
                    )
                continue
            if imp.imported in NAMESPACES:
                continue  # `from raftlog.node import x` also counts as raftlog.node.x
            imported_part = part_of(imp.imported) or UNPLACED
            if imported_part == importer_part:
                continue
            if imported_part in ALLOWED[importer_part] or (imp.line, imported_part) in reported:
                continue
            known = [
                (importer, target)
                for importer, target in KNOWN
                if importer == module
                and (imp.imported == target or imp.imported.startswith(target + "."))
            ]
            if known:
                seen_known.update(known)
                continue
            reported.add((imp.line, imported_part))
            broken.append(
                f"{where}: {module} ({importer_part}) imports {imp.imported} ({imported_part}): "
                f"{_reason(importer_part, imported_part)}",
            )
    return broken, seen_known


def test_no_forbidden_import() -> None:
    broken, _ = violations(REPO)
    assert not broken, "forbidden imports:\n" + "\n".join(broken)


def test_known_exceptions_still_exist() -> None:
    _, seen = violations(REPO)
    gone = set(KNOWN) - seen
    assert not gone, f"no longer imported, remove from KNOWN and docs/architecture.md: {gone}"


def test_every_part_is_found() -> None:
    counts = Counter(part_of(module) for module in modules(REPO))
    short = {part: counts[part] for part, least in MINIMUM_MODULES.items() if counts[part] < least}
    assert not short, f"too few modules found (the walk is broken?): {short} of {dict(counts)}"
    assert set(MINIMUM_MODULES) == set(ALLOWED) - {UNPLACED} == set(PARTS.values())


def test_namespaces_import_nothing() -> None:
    found = modules(REPO)
    for module in NAMESPACES & set(found):
        imported = [imp.imported for imp in imports_of(module, found[module])]
        assert imported in ([], ["__future__", "__future__.annotations"]), (module, imported)


def test_every_import_is_seen(tmp_path: Path) -> None:
    """Imports inside functions and under TYPE_CHECKING are counted, and relative ones resolved."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from raftlog.operator import models\n"
        "def f():\n"
        "    import asyncio\n"
        "    from ..server import node\n"
        "    importlib.import_module('raftlog.spark.source')\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    names = {imp.imported for imp in imports_of("raftlog.node.core.probe", path)}
    assert {
        "raftlog.operator.models",
        "asyncio",
        "raftlog.node.server.node",
        "raftlog.spark.source",
    } <= names


def test_allowed_never_grants_a_forbidden_arrow() -> None:
    for importers, imported, why in FORBIDDEN:
        for part in importers:
            granted = ALLOWED[part] & imported
            assert not granted, f"ALLOWED[{part!r}] grants {granted}, but {why}"


def test_the_wheel_holds_what_shipped_code_imports() -> None:
    """The harness stays out of the wheel only while no shipped module (the demo) imports it."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"]
    found = modules(REPO)
    users = sorted(
        f"{module} imports {imp.imported}"
        for module, path in found.items()
        if part_of(module) != "harness"
        for imp in imports_of(module, path)
        if part_of(imp.imported) == "harness"
    )
    assert "harness/raftlog" in wheel or not users, (
        f"shipped code imports the harness, add harness/raftlog to the wheel: {users}"
    )
    assert "raftlog.node.local" not in found  # the harness left the node (issue 19)
