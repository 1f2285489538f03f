"""The tests run the node's modules as its processes do: compiled by mypyc when a build of these
very sources exists (`make install`), interpreted otherwise (raftlog/node/native.py)."""

import pytest

from raftlog.node import native

native.install()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` first, each group in its usual order: xdist hands out tests in this
    order, so the two workers share the long ones and end on short ones together, rather than
    one worker ending alone on the crash tests that sort last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
