"""The chart as Helm renders it: Helm's own engine through helm-python-sdk (Helm's Go SDK)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "raftlog-operator"
RELEASE = "raftlog-operator"
NAMESPACE = "raftlog-system"
# The oldest and the newest Kubernetes versions the chart claims (Chart.yaml kubeVersion).
KUBE_VERSIONS = ("1.28", "1.37")

# Each mode the chart supports, as the values a user would give.
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watch": {"mode": "namespaced", "namespaces": ["team-a", "team-b"]}},
    "cluster": {"watch": {"mode": "cluster"}},
    "ha": {"replicaCount": 3},
    "ha-cluster": {"replicaCount": 2, "watch": {"mode": "cluster"}},
    "metrics": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "no-metrics": {"metrics": {"enabled": False}},
    "network-policy": {
        "watch": {"mode": "cluster"},
        "networkPolicy": {
            "enabled": True,
            "namespaces": ["orders", "billing"],
            "clients": [
                {"namespaceSelector": {"matchLabels": {"team": "payments"}}},
                {"ipBlock": {"cidr": "10.0.0.0/8"}},
            ],
            "monitoring": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
    },
}


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` prints them."""
    return dict(_render(json.dumps(values, sort_keys=True)))


@functools.lru_cache(maxsize=32)
def _render(values: str) -> tuple[tuple[str, str], ...]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(json.loads(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return tuple(sorted(out.items()))


def objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object the templates render (NOTES.txt aside), in template order."""
    out: list[dict[str, Any]] = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objs, kind)
    assert len(found) == 1, (kind, [o["metadata"]["name"] for o in found])
    return found[0]


def crd_files(where: Path) -> Iterator[Path]:
    return iter(sorted(where.glob("*.yaml")))
