"""The Grafana dashboard the chart ships reads only metrics that exist: every series of every
panel's and variable's query is in the `/metrics` of real nodes (a local cluster under appends)
or of the operator (its own `metrics.serve`, in a process of its own), with the labels the
queries filter, group and name in legends.

The operator is not run against Kubernetes here: its process serves its registry, so its
families are checked by name and declared labels; its labelled counters have no samples until
a reconcile pass, so their label values are not checked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase
from tests.chart.helm import CHART
from tests.chart.promql import Exposition, Matcher, Query, Selector, parse, tokenize

from raftlog.client import Client
from raftlog.harness.local import LocalCluster
from raftlog.operator import metrics as operator_metrics
from raftlog.operator.ports import free_ports

pytestmark = pytest.mark.chart

DASHBOARD = CHART / "dashboards" / "raftlog.json"
# Labels Prometheus gives every series of a target (the chart's PodMonitor and ServiceMonitor),
# `raftcluster` being the PodMonitor's relabelling of the member pod's raftlog.dev/cluster.
TARGET_LABELS = frozenset(
    {"namespace", "pod", "container", "endpoint", "job", "instance", "service", "raftcluster"}
)
# Matchers on values a healthy run does not produce, each with why it is right anyway.
UNOBSERVED = {
    ("status", "5.."): "HTTP status codes of raftlog_request_seconds: no 5xx in a healthy run",
}
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[A-Za-z_]\w*)\)$")
_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, PromQL, legend) of every panel target and every query variable (a variable's
    `label_values(selector, label)` gives its selector, the label checked as a legend is)."""
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} {target['refId']}"
            yield where, target["expr"], target.get("legendFormat", "")
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = _LABEL_VALUES.match(var["query"])
            assert m, f"variable {var['name']}: expected label_values(selector, label)"
            yield f"variable {var['name']!r}", m["selector"], "{{" + m["label"] + "}}"


# ------------------------------------------------------------------- the extractor, by itself


@pytest.mark.parametrize(
    ("expr", "metrics", "grouping"),
    [
        ("up", {"up"}, set()),
        (
            'histogram_quantile(0.99, sum by (le, pod) (rate(x_seconds_bucket{a="b", c=~"d|e"}'
            "[$__rate_interval])))",
            {"x_seconds_bucket"},
            {"le", "pod"},
        ),
        # Aggregation with its clause after; keywords, numbers, durations, offset, bool.
        ("sum(rate(a_total[5m] offset 1h)) by (job) > bool 0.5e3", {"a_total"}, {"job"}),
        (
            "a * on (pod, partition) group_left (follower) b or vector(0) unless c",
            {"a", "b", "c"},
            {"pod", "partition", "follower"},
        ),
        ("count without (instance) (x) and y", {"x", "y"}, {"instance"}),
        # Label names, strings and variables are never metric names, nor is inf / NaN.
        ('max(m{rate="sum", by=~"$by"}) + Inf - NaN', {"m"}, set()),
        ('label_replace(m{x="1"}, "dst", "$1", "src", "(.*)")', {"m"}, set()),
        # A subquery; a recording rule's name with colons; a name given by __name__.
        ("max_over_time(deriv(g[1m])[10m:30s])", {"g"}, set()),
        ("job:requests:rate5m", {"job:requests:rate5m"}, set()),
        ('{__name__="n", p="0"} / ignoring(le) n2', {"n", "n2"}, {"le"}),
        ("topk(3, sum without (pod) (k))", {"k"}, {"pod"}),
    ],
)
def test_the_extractor_finds_metric_names_only(expr, metrics, grouping):
    q = parse(expr)
    assert q.metrics == metrics
    assert q.grouping == grouping


def test_the_extractor_keeps_matchers_with_their_selector():
    q = parse('rate(r_count{method="POST", route=~"/v1/.+", status!="200"}[1m]) / r2{a!~"x"}')
    assert q.selectors == [
        Selector(
            "r_count",
            (
                Matcher("method", "=", "POST"),
                Matcher("route", "=~", "/v1/.+"),
                Matcher("status", "!=", "200"),
            ),
        ),
        Selector("r2", (Matcher("a", "!~", "x"),)),
    ]


@pytest.mark.parametrize(
    ("expr", "error"),
    [
        ("rtae(x[5m])", "unknown function 'rtae'"),  # a misspelt function is not skipped
        ("x{a=1}", "bad label matcher"),
        ('x{a="1"', "unclosed"),
        ("x[5m", "unclosed ["),
        ("x ? y", "cannot read"),
        ('{a="b"}', "without one __name__"),
    ],
)
def test_the_extractor_refuses_what_it_does_not_understand(expr, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        parse(expr)


def test_the_tokenizer_reads_durations_and_grafana_variables_whole():
    texts = [t.text for t in tokenize("rate(x[1h30m]) * ${v} + [[w]] - $__interval")]
    assert texts == [
        *("rate", "(", "x", "[", "1h30m", "]", ")"),
        *("*", "${v}", "+", "[[w]]", "-", "$__interval"),
    ]


EXPOSITION = """\
# HELP h_seconds x
# TYPE h_seconds histogram
h_seconds_bucket{le="1.0",route="/a"} 1.0
h_seconds_bucket{le="+Inf",route="/a"} 1.0
h_seconds_count{route="/a"} 1.0
h_seconds_sum{route="/a"} 0.5
# HELP h_seconds_created x
# TYPE h_seconds_created gauge
h_seconds_created{route="/a"} 1.7e9
# HELP c_total x
# TYPE c_total counter
c_total{p="0"} 3.0
# HELP g_count a gauge whose name ends like a histogram's series
# TYPE g_count gauge
g_count 2.0
# HELP e_total a labelled counter without samples yet
# TYPE e_total counter
"""


@pytest.mark.parametrize(
    ("series", "family", "kind"),
    [
        ("h_seconds_bucket", "h_seconds", "histogram"),
        ("h_seconds_sum", "h_seconds", "histogram"),
        ("h_seconds_count", "h_seconds", "histogram"),
        ("h_seconds", None, None),  # a classic histogram has no series of its bare name
        ("c_total", "c", "counter"),
        ("c", None, None),  # nor a counter
        ("g_count", "g_count", "gauge"),  # a gauge's suffix is its name, not a histogram's
        ("g", None, None),
        ("e_total", "e", "counter"),  # known by its TYPE line before any sample
        ("c_bucket", None, None),
    ],
)
def test_series_names_resolve_to_their_family_by_type(series, family, kind):
    fam = Exposition([EXPOSITION]).family_of(series)
    assert (fam and fam.name, fam and fam.type) == (family, kind)


def test_labels_are_read_per_series_name():
    expo = Exposition([EXPOSITION])
    assert expo.labels_of("h_seconds_bucket") == {"le": {"1.0", "+Inf"}, "route": {"/a"}}
    assert expo.labels_of("h_seconds_count") == {"route": {"/a"}}
    assert expo.labels_of("e_total") == {}


# ------------------------------------------------------------------- the dashboard, checked


def operator_declared_labels() -> dict[str, set[str]]:
    """Family name -> label names, as the operator's metrics module declares them."""
    return {
        m._name: set(m._labelnames)
        for m in vars(operator_metrics).values()
        if isinstance(m, MetricWrapperBase)
    }


def matches(m: Matcher, value: str) -> bool:
    """A label value against an = or =~ matcher (PromQL's regexes are anchored)."""
    return value == m.value if m.op == "=" else re.fullmatch(m.value, value) is not None


def problems(
    dash: dict[str, Any],
    nodes: Exposition,
    operator: Exposition,
    declared: dict[str, set[str]],
) -> list[str]:
    """What the dashboard's queries read that the expositions do not have: metric names, label
    names (in matchers, groupings and legends) and matched label values."""
    found: list[str] = []
    for where, expr, legend in queries(dash):
        q: Query = parse(expr)
        series_labels: set[str] = set()
        for sel in q.selectors:
            expo = nodes if nodes.family_of(sel.metric) else operator
            fam = expo.family_of(sel.metric)
            if fam is None:
                found.append(f"{where}: {sel.metric} is in neither the nodes' nor the operator's")
                continue
            seen = expo.labels_of(sel.metric)
            labels = set(seen) | declared.get(fam.name, set())
            if fam.type == "histogram" and sel.metric.endswith("_bucket"):
                labels.add("le")
            series_labels |= labels
            for m in sel.matchers:
                if m.label in TARGET_LABELS:
                    continue
                if m.label not in labels:
                    found.append(f"{where}: {sel.metric} has no label {m.label!r}")
                    continue
                if m.op not in ("=", "=~") or "$" in m.value or (m.label, m.value) in UNOBSERVED:
                    continue
                if m.label not in seen:  # declared, without a sample yet (the operator's)
                    continue
                if not any(matches(m, v) for v in seen[m.label]):
                    found.append(
                        f"{where}: no {sel.metric} sample has {m.label}{m.op}{m.value!r} "
                        f"(seen: {sorted(seen[m.label])})"
                    )
        for label in sorted(q.grouping - TARGET_LABELS - series_labels):
            found.append(f"{where}: groups by {label!r}, a label of none of its series")
        for label in _LEGEND_LABEL.findall(legend):
            if label not in TARGET_LABELS | series_labels:
                found.append(f"{where}: legend names {label!r}, a label of none of its series")
    return found


@pytest.fixture(scope="module")
def node_metrics(tmp_path_factory) -> Exposition:
    """The /metrics of every member of a real 3-node, 2-partition cluster that took appends
    (by partition and by key, through the client) and reads."""
    with LocalCluster(tmp_path_factory.mktemp("dashboard"), replicas=3, partitions=2) as c:
        c.wait_ready()
        with Client(c.endpoints) as client:
            for i in range(20):
                client.append(i % 2, [{"key": f"k{i}", "value": f"v{i}"}])
            client.append_keyed([{"key": "by-key", "value": "v"}])
            client.read(0, 1, 10)
        texts = []
        for node in c.nodes.values():
            with urllib.request.urlopen(node.url + "/metrics", timeout=10) as r:
                texts.append(r.read().decode())
    return Exposition(texts)


# The operator's process, as far as its metrics go: every module that defines some imported (the
# kopf handlers import the metrics module), then the operator's own `metrics.serve`.
_OPERATOR = """
import sys, time
import raftlog.operator.handlers
from raftlog.operator import metrics
metrics.serve(int(sys.argv[1]))
time.sleep(120)
"""


@pytest.fixture(scope="module")
def operator_exposition() -> Exposition:
    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-c", _OPERATOR, str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return Exposition([r.read().decode()])
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.e2e
def test_every_series_the_dashboard_reads_is_served(node_metrics, operator_exposition):
    dash = load_dashboard()
    assert problems(dash, node_metrics, operator_exposition, operator_declared_labels()) == []
    # And the check saw them all: node and operator metrics are both in use.
    used = {s.metric for _, expr, _ in queries(dash) for s in parse(expr).selectors}
    assert {"raftlog_follower_lag", "raftlog_follower_snapshot_required"} <= used
    assert {"raftlog_fsync_seconds_bucket", "raftlog_elections_total"} <= used
    assert {"raftlog_operator_reconciles_total", "raftlog_operator_promotions_total"} <= used


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ("raftlog_follower_lag{", "raftlog_follower_lagg{", "raftlog_follower_lagg is in neither"),
        ("raftlog_fsync_seconds_bucket{", "raftlog_fsync_seconds{", "raftlog_fsync_seconds is in"),
        ("raftlog_elections_total{", "raftlog_elections{", "raftlog_elections is in neither"),
        (
            "raftlog_operator_promotions_total[",
            "raftlog_operator_promotion_total[",
            "raftlog_operator_promotion_total is in neither",
        ),
        ('status=\\"200\\"', 'status=\\"201\\"', "no raftlog_request_seconds_bucket sample"),
        ("by (namespace, raftcluster, partition, follower)", "by (flower)", "groups by 'flower'"),
        ('"{{pod}}"', '"{{pdo}}"', "legend names 'pdo'"),
        (
            "raftlog_term{namespace",  # in a variable's label_values(...)
            'raftlog_term{partiton=~\\"0\\", namespace',
            "no label 'partiton'",
        ),
    ],
)
def test_a_wrong_name_in_the_dashboard_is_found(
    node_metrics, operator_exposition, old, new, error, tmp_path
):
    text = DASHBOARD.read_text()
    assert old in text, old
    planted = tmp_path / "raftlog.json"
    planted.write_text(text.replace(old, new, 1))
    found = problems(
        load_dashboard(planted), node_metrics, operator_exposition, operator_declared_labels()
    )
    assert any(error in p for p in found), found
