"""The operator's Prometheus metrics (`raftlog_operator_` prefix)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

RECONCILES = Counter(
    "raftlog_operator_reconciles", "Reconcile passes, by the step taken", ["outcome"]
)
RECONCILE_SECONDS = Histogram(
    "raftlog_operator_reconcile_seconds", "Duration of a reconcile pass, its step included"
)
PROMOTIONS = Counter("raftlog_operator_promotions", "Learner promotions accepted by a leader")
INSTALLS = Counter(
    "raftlog_operator_snapshot_installs", "Snapshot installs asked of leaders", ["result"]
)


def serve(port: int) -> None:
    start_http_server(port)
