"""The operator's Prometheus metrics (`raftlog_operator_` prefix)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

RECONCILES = Counter(
    "raftlog_operator_reconciles", "Reconcile passes, by the step taken", ["outcome"]
)
RECONCILE_SECONDS = Histogram(
    "raftlog_operator_reconcile_seconds", "Duration of a reconcile pass, its step included"
)
STATUS_CONFLICTS = Counter(
    "raftlog_operator_status_conflicts",
    "Status writes refused for a stale resourceVersion (someone else wrote first); the pass "
    "starts again from what the API server holds",
)
PROMOTIONS = Counter("raftlog_operator_promotions", "Learner promotions accepted by a leader")
INSTALLS = Counter(
    "raftlog_operator_snapshot_installs", "Snapshot installs asked of leaders", ["result"]
)


def serve(port: int) -> None:
    start_http_server(port)
