"""The tests run the node's modules as its processes do: compiled by mypyc when a build of these
very sources exists (`make install`), interpreted otherwise (raftlog/node/native.py)."""

import pytest

from raftlog.node import native

native.install()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files holding a test marked `slow` first, each file's tests together and in their
    usual order: xdist hands out tests in this order, so its two workers share the long files
    and end on short ones together, rather than one ending alone on the crash tests (which sort
    last). A file kept whole sets its module fixtures (clusters, servers) up once per worker."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)
