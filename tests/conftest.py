"""The tests run the node's modules as its processes do: compiled by mypyc when a build of these
very sources exists (`make install`), interpreted otherwise (raftlog/node/native.py)."""

from raftlog.node import native

native.install()
