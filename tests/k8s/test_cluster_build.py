"""The cluster's Go tools build into a cache that holds nothing yet, under the names `up` runs.

A warm cache once hid that `go build` names the etcd binary `server` (after
`go.etcd.io/etcd/server/v3`): only a fresh machine saw `.cluster/bin/etcd` dangle. etcd is the
quick one to build (seconds, once its packages are in Go's own build cache).
"""

from __future__ import annotations

import subprocess

from cluster import build, layout


def test_a_tool_builds_into_an_empty_cache_under_its_binary_names(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "CACHE", tmp_path)
    etcd = next(t for t in build.TOOLS if t.name == "etcd")
    out = build.build(etcd)
    assert out == tmp_path / f"etcd-{layout.ETCD}"
    assert sorted(p.name for p in out.iterdir()) == ["etcd"]
    version = subprocess.run(
        [str(out / "etcd"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"etcd Version: {layout.ETCD.lstrip('v')}" in version, version
    assert build.build(etcd) == out  # and a second call builds nothing
