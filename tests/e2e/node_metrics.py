"""A node's request counters, read from its `/metrics`, for tests of what it answered."""

from __future__ import annotations

import re
import urllib.request

from raftlog.harness.local import LocalCluster


def requests_counted(c: LocalCluster, name: str, method: str, route: str, status: int) -> float:
    """How many `method route` requests node `name` answered with `status` so far."""
    with urllib.request.urlopen(c.nodes[name].url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(
        rf'raftlog_request_seconds_count\{{method="{method}",route="{re.escape(route)}",'
        rf'status="{status}"\}} (\S+)',
        text,
    )
    return float(m.group(1)) if m else 0.0
