"""Every value of the chart reaches what it configures, compared with literal expectations (not
with what the chart's own helpers render): a value Helm silently ignores, say a misspelt
`.Values.podAnnotation`, renders nothing and passes `helm lint --strict`. Written from the
seventeenth planted-bug round (the chart: 106 mutants, 70 survived the chart tests before)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.chart.helm import NAMESPACE, RELEASE, objects, of_kind, one, render

pytestmark = pytest.mark.chart

SELECTOR = {
    "app.kubernetes.io/name": "raftlog-operator",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "operator",
}
TEAMS = {"watch": {"mode": "namespaced", "namespaces": ["team-a", "team-b"]}}


def deployment(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return one(objects(values), "Deployment")


def pod_spec(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return dict(deployment(values)["spec"]["template"]["spec"])


def operator_container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    [c] = pod_spec(values)["containers"]
    return dict(c)


def env(values: dict[str, Any] | None = None) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in operator_container(values)["env"]}


def notes(values: dict[str, Any] | None = None) -> str:
    [text] = [t for path, t in render(values).items() if path.endswith("NOTES.txt")]
    return text


# ------------------------------------------------------------------------- names and labels
def test_a_63_character_fullname_override_is_kept_whole():
    name = "r" * 63
    objs = objects({"fullnameOverride": name})
    assert one(objs, "Deployment")["metadata"]["name"] == name
    assert one(objs, "ServiceAccount")["metadata"]["name"] == name
    assert one(objs, "Service")["metadata"]["name"] == "r" * 55 + "-metrics"


def test_the_selector_is_name_instance_and_component_everywhere_it_selects_the_operator():
    objs = objects({"replicaCount": 2, "networkPolicy": {"enabled": True}})
    dep = one(objs, "Deployment")
    assert dep["spec"]["selector"]["matchLabels"] == SELECTOR
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels == SELECTOR  # no chart version on pods: an upgrade keeps matching them
    assert one(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == SELECTOR
    assert one(objs, "Service")["spec"]["selector"] == SELECTOR
    [policy] = of_kind(objs, "NetworkPolicy")
    operator_peer = policy["spec"]["ingress"][0]["from"][1]
    assert operator_peer["podSelector"]["matchLabels"] == SELECTOR
    assert operator_peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": NAMESPACE
    }
    anti = pod_spec({"replicaCount": 2})["affinity"]["podAntiAffinity"]
    [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": SELECTOR},
    }


def test_pod_labels_and_annotations_reach_the_pods():
    tpl = deployment({"podLabels": {"team": "payments"}, "podAnnotations": {"a.io/b": "c"}})
    meta = tpl["spec"]["template"]["metadata"]
    assert meta["labels"] == {**SELECTOR, "team": "payments"}
    assert meta["annotations"] == {"a.io/b": "c"}


# ------------------------------------------------------------------------- the service account
def test_a_named_service_account_is_the_one_made_bound_and_run_as():
    values = {"serviceAccount": {"name": "ops", "annotations": {"iam.example/role": "r"}}}
    objs = objects(values)
    sa = one(objs, "ServiceAccount")
    assert sa["metadata"]["name"] == "ops"
    assert sa["metadata"]["annotations"] == {"iam.example/role": "r"}
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    [binding] = of_kind(objs, "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ops", "namespace": NAMESPACE}
    ]


# ------------------------------------------------------------------------- image and pod
def test_the_image_tag_and_digest_reach_the_operator_and_its_members():
    for image, ref in (
        ({"tag": "9.9"}, "ghcr.io/raftlog/raftlog:9.9"),
        ({"digest": "sha256:" + "a" * 64}, "ghcr.io/raftlog/raftlog@sha256:" + "a" * 64),
        ({}, "ghcr.io/raftlog/raftlog:0.1.0"),
    ):
        assert operator_container({"image": image})["image"] == ref
        assert env({"image": image})["RAFTLOG_OPERATOR_DEFAULT_IMAGE"] == ref
    assert operator_container()["imagePullPolicy"] == "IfNotPresent"


def test_scheduling_values_reach_the_pod():
    values = {
        "priorityClassName": "critical",
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "replicaCount": 2,
    }  # fmt: skip
    spec = pod_spec(values)
    assert spec["priorityClassName"] == "critical"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["tolerations"] == values["tolerations"]
    assert spec["affinity"] == values["affinity"]  # the user's, not the HA default
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["automountServiceAccountToken"] is True  # the operator's API access
    # Ready as soon as it answers: `helm install --wait` and a rolling update wait on it.
    assert spec["containers"][0]["readinessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 5,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    for key in ("priorityClassName", "imagePullSecrets", "nodeSelector", "tolerations"):
        assert key not in pod_spec()
    assert "affinity" not in pod_spec()


def test_operator_settings_reach_its_arguments_and_environment():
    values: dict[str, Any] = {
        "operator": {"logLevel": "DEBUG", "intervalSeconds": 7,
                     "memberUrl": "http://{pod}.{cluster}.{namespace}.svc.example:{port}"},
        "health": {"port": 9090},
    }  # fmt: skip
    c = operator_container(values)
    assert "--log-level=DEBUG" in c["args"]
    assert "--liveness=http://0.0.0.0:9090/healthz" in c["args"]
    assert {"name": "health", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    got = env(values)
    assert got["RAFTLOG_OPERATOR_INTERVAL_S"] == "7"
    assert got["RAFTLOG_OPERATOR_MEMBER_URL"] == values["operator"]["memberUrl"]
    default = operator_container()
    assert "--log-level=INFO" in default["args"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in default["args"]
    assert env()["RAFTLOG_OPERATOR_INTERVAL_S"] == "1"
    assert "RAFTLOG_OPERATOR_MEMBER_URL" not in env()


# ------------------------------------------------------------------------- peering and updates
def test_peering_asked_for_with_one_replica_runs_in_peering_with_its_object():
    objs = objects({"peering": {"enabled": True}})
    dep = one(objs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=raftlog-operator" in args and "--standalone" not in args
    assert [p["metadata"]["namespace"] for p in of_kind(objs, "KopfPeering")] == [NAMESPACE]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert not of_kind(objs, "PodDisruptionBudget")  # one replica: nothing to keep running


def test_ha_over_watched_namespaces_has_a_peering_object_in_each():
    objs = objects({**TEAMS, "replicaCount": 2})
    peerings = of_kind(objs, "KopfPeering")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("team-a", "raftlog-operator"),
        ("team-b", "raftlog-operator"),
    ]


def test_the_disruption_budget_can_be_turned_off():
    assert of_kind(objects({"replicaCount": 2}), "PodDisruptionBudget")
    off = {"replicaCount": 2, "podDisruptionBudget": {"enabled": False}}
    assert not of_kind(objects(off), "PodDisruptionBudget")


# ------------------------------------------------------------------------- RBAC
# (apiGroup, resource, verbs) of the Role in each watched namespace, HA: the whole grant, so a
# rule dropped or added anywhere fails here first (tests/k8s/test_rbac.py then checks each
# against the operator's real calls).
ROLE_RULES = [
    ("kopf.dev", "kopfpeerings", ["list", "watch", "patch"]),
    ("raftlog.dev", "raftclusters", ["get", "list", "watch", "patch"]),
    ("raftlog.dev", "raftclusters/status", ["patch"]),
    ("raftlog.dev", "raftclusters/finalizers", ["update"]),
    ("", "pods", ["list", "create", "delete"]),
    ("", "persistentvolumeclaims", ["list", "create", "delete"]),
    ("", "persistentvolumeclaims", ["patch"]),
    ("", "services", ["create", "patch"]),
    ("", "secrets", ["get", "create"]),
    ("policy", "poddisruptionbudgets", ["create", "patch"]),
    ("", "events", ["create"]),
]


def _rules(role: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    return [
        (g, r, rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    ]


def test_each_watched_namespace_gets_exactly_the_operators_grants():
    objs = objects({**TEAMS, "replicaCount": 2})
    roles = of_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _rules(role) == ROLE_RULES, role["metadata"]["namespace"]
    cluster = one(objects({"watch": {"mode": "cluster"}, "replicaCount": 2}), "ClusterRole")
    assert _rules(cluster) == [
        ("apiextensions.k8s.io", "customresourcedefinitions", ["list", "watch"]),
        ("kopf.dev", "clusterkopfpeerings", ["list", "watch", "patch"]),
        *ROLE_RULES[1:],
    ]


# ------------------------------------------------------------------------- network policy
def test_in_namespaced_mode_the_network_policies_go_to_the_watched_namespaces():
    objs = objects({**TEAMS, "networkPolicy": {"enabled": True, "namespaces": ["elsewhere"]}})
    policies = of_kind(objs, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]


def test_the_default_clients_are_the_pods_the_notes_tell_users_to_label():
    values = {"networkPolicy": {"enabled": True}}
    [policy] = of_kind(objects(values), "NetworkPolicy")
    client_rule = policy["spec"]["ingress"][1]
    assert client_rule["ports"] == [{"port": "client", "protocol": "TCP"}]
    assert client_rule["from"] == [{"podSelector": {"matchLabels": {"raftlog.dev/client": "true"}}}]
    assert "Label client pods raftlog.dev/client=true" in notes(values)
    assert "Network policy" not in notes()


# ------------------------------------------------------------------------- metrics
def test_the_metrics_service_takes_its_type_port_and_annotations():
    service = {"type": "NodePort", "port": 9100, "annotations": {"prometheus.io/scrape": "true"}}
    values = {"metrics": {"service": service}}
    svc = one(objects(values), "Service")
    assert svc["spec"]["type"] == "NodePort"
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert "port 9100, path /metrics" in notes(values)


def test_the_service_monitor_scrapes_metrics_at_the_asked_pace_and_only_if_served():
    values = {"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s",
                                             "scrapeTimeout": "5s"}}}  # fmt: skip
    objs = objects(values)
    [endpoint] = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s",
                        "scrapeTimeout": "5s"}  # fmt: skip
    [member] = one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert (member["path"], member["interval"], member["scrapeTimeout"]) == (
        "/metrics",
        "15s",
        "5s",
    )
    off = {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}}
    assert not of_kind(objects(off), "ServiceMonitor")  # no Service to scrape
    assert not of_kind(objects(off), "Service")


def test_the_default_scrape_timeout_is_within_its_interval():
    objs = objects({"metrics": {"serviceMonitor": {"enabled": True}}})
    [endpoint] = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "10s")


def test_the_dashboards_annotations_are_kept_without_a_folder():
    values = {"metrics": {"grafanaDashboard": {"enabled": True, "annotations": {"x.io/y": "z"}}}}
    [cm] = [o for o in objects(values) if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["annotations"] == {"x.io/y": "z"}


# ------------------------------------------------------------------------- NOTES.txt
def test_the_notes_create_the_cluster_in_a_watched_namespace():
    text = notes(TEAMS)
    assert "kubectl apply -n team-a -f examples/raftcluster.yaml" in text
    assert "kubectl get raft -n team-a -w" in text
    assert f"kubectl apply -n {NAMESPACE} -f" in notes()
