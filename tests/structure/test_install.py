"""What `make install` leaves in the venv that the tests' processes rely on."""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest


@pytest.mark.parametrize("module", ["aiohttp.connector", "pydantic.fields", "msgspec", "kopf"])
def test_the_dependencies_are_installed_with_their_bytecode(module: str) -> None:
    """uv installs without bytecode unless told: with PYTHONDONTWRITEBYTECODE set (as on CI's
    machines) every node, raftctl and operator process the tests start would compile these
    from source again (about half of a node's start-up CPU)."""
    source = importlib.import_module(module).__file__
    assert source is not None and source.endswith(".py"), source
    cached = importlib.util.cache_from_source(source)
    assert os.path.isfile(cached), f"{module}: no bytecode at {cached}"
