"""values.schema.json: Helm refuses wrong types, unknown keys (typos) and bad enums, naming them."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml
from tests.chart.helm import CHART, MODES, render

pytestmark = pytest.mark.chart


def refusal(values: dict[str, Any]) -> str:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as e:
        chart.validate_schema(values)
    return str(e.value)


def test_the_default_values_and_every_mode_pass_the_schema():
    with helm.Chart.load(CHART) as chart:
        defaults = yaml.safe_load((CHART / "values.yaml").read_text())
        assert chart.values == defaults
        chart.validate_schema(defaults)
        for values in MODES.values():
            chart.validate_schema(chart.merge_values(values))


BAD = [
    # unknown keys: a typo anywhere fails instead of being ignored
    ({"replicas": 3}, "at '': additional properties 'replicas' not allowed"),
    ({"image": {"tagg": "1.0"}}, "at '/image': additional properties 'tagg' not allowed"),
    ({"watch": {"namespace": ["a"]}}, "at '/watch': additional properties 'namespace' not allowed"),
    (
        {"metrics": {"serviceMonitor": {"enable": True}}},
        "at '/metrics/serviceMonitor': additional properties 'enable' not allowed",
    ),
    (
        {"networkPolicy": {"clients": [{"podSelectors": {}}]}},
        "at '/networkPolicy/clients/0': additional properties 'podSelectors' not allowed",
    ),
    # wrong types
    ({"replicaCount": "2"}, "at '/replicaCount': got string, want integer"),
    ({"peering": {"enabled": "yes"}}, "at '/peering/enabled': got string, want boolean"),
    ({"metrics": {"port": 80.5}}, "at '/metrics/port': got number, want integer"),
    ({"watch": {"namespaces": "team-a"}}, "at '/watch/namespaces': got string, want array"),
    ({"podLabels": {"tier": 1}}, "at '/podLabels/tier': got number, want string"),
    # bad enums and ranges
    (
        {"watch": {"mode": "clusterwide"}},
        "at '/watch/mode': value must be one of 'namespaced', 'cluster'",
    ),
    ({"image": {"pullPolicy": "always"}}, "at '/image/pullPolicy': value must be one of"),
    ({"operator": {"logLevel": "verbose"}}, "at '/operator/logLevel': value must be one of"),
    (
        {"metrics": {"service": {"type": "Headless"}}},
        "at '/metrics/service/type': value must be one of",
    ),
    ({"replicaCount": 0}, "at '/replicaCount': minimum: got 0, want 1"),
    # Not created and not named, the operator's Role went to the namespace's `default`
    # ServiceAccount, which every pod there runs as (found by a review).
    ({"serviceAccount": {"create": False}}, "at '/serviceAccount/name': minLength: got 0"),
    ({"serviceAccount": {"create": False, "name": ""}}, "at '/serviceAccount/name': minLength"),
    ({"serviceAccount": {"name": "My_Operator"}}, "at '/serviceAccount/name': '"),
    ({"operator": {"intervalSeconds": 0}}, "at '/operator/intervalSeconds': exclusiveMinimum"),
    ({"health": {"port": 70000}}, "at '/health/port': maximum: got 70,000, want 65,535"),
    # bad formats
    ({"watch": {"namespaces": ["Team_A"]}}, "at '/watch/namespaces/0'"),
    ({"image": {"digest": "latest"}}, "at '/image/digest'"),
    ({"resources": {"requests": {"memory": "lots"}}}, "at '/resources/requests/memory'"),
    (
        {"metrics": {"serviceMonitor": {"interval": "often"}}},
        "at '/metrics/serviceMonitor/interval'",
    ),
    # From the seventeenth planted-bug round (the chart): each bound a survivor loosened.
    # An empty peer would admit every source to the members' client port.
    ({"networkPolicy": {"clients": [{}]}}, "at '/networkPolicy/clients/0': minProperties"),
    ({"watch": {"namespaces": ["a", "a"]}}, "at '/watch/namespaces': items at 0 and 1 are equal"),
    ({"replicaCount": 11}, "at '/replicaCount': maximum: got 11, want 10"),
    ({"watch": {"namespaces": ["a" * 64]}}, "at '/watch/namespaces/0': maxLength: got 64"),
    ({"health": {"port": 0}}, "at '/health/port': minimum: got 0, want 1"),
    ({"resources": {"requests": {"memory": "1Gix"}}}, "at '/resources/requests/memory': '1Gix'"),
    ({"image": {"digest": "sha256:" + "a" * 65}}, "at '/image/digest'"),
    ({"image": {"digest": "sha256:" + "a" * 63}}, "at '/image/digest'"),
    ({"peering": {"name": "Not_A_Name"}}, "at '/peering/name': 'Not_A_Name' does not match"),
    ({"imagePullSecrets": [{}]}, "at '/imagePullSecrets/0': missing property 'name'"),
]


@pytest.mark.parametrize("values, reason", BAD, ids=[str(v) for v, _ in BAD])
def test_bad_values_are_refused_naming_the_key_and_the_reason(values, reason):
    message = refusal(values)
    assert reason in message, message


@pytest.mark.parametrize("values, reason", BAD[:2], ids=["typo-at-top", "typo-nested"])
def test_helm_refuses_to_render_with_bad_values(values, reason):
    with pytest.raises(helm.HelmValuesError, match="values don't meet the specifications"):
        render(values)


def test_the_metrics_port_may_not_be_the_liveness_port():
    with pytest.raises(helm.HelmRenderError, match=r"metrics\.port and health\.port are both 8080"):
        render({"metrics": {"port": 8080}})
    # Without metrics the port is unused, so it may be anything.
    render({"metrics": {"enabled": False, "port": 8080}})
