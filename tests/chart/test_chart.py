"""The Helm chart, rendered by Helm's own engine for each mode, linted, and every rendered object
validated against the schemas of the oldest and newest Kubernetes versions the chart claims."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from tests.chart.helm import (
    CHART,
    KUBE_VERSIONS,
    MODES,
    NAMESPACE,
    RELEASE,
    ROOT,
    objects,
    of_kind,
    one,
    render,
)

from raftlog.operator import manifests
from raftlog.operator.models import RaftClusterSpec

pytestmark = pytest.mark.chart

# Kinds whose schema is not in Kubernetes itself: each is checked by its own CRD below.
PEERING_KINDS = {
    "KopfPeering": "kopfpeerings.kopf.dev",
    "ClusterKopfPeering": "clusterkopfpeerings.kopf.dev",
}


def test_the_chart_yaml_claims_the_versions_the_tests_validate_against():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["kubeVersion"] == f">={KUBE_VERSIONS[0]}.0-0"
    assert meta["apiVersion"] == "v2" and meta["appVersion"] == "0.1.0"


def test_the_charts_crds_are_the_top_level_crds_byte_for_byte():
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert sorted(chart) == sorted(top), "charts/raftlog-operator/crds differs from crds/"
    for name, data in top.items():
        assert chart[name] == data, (
            f"charts/raftlog-operator/crds/{name} is stale: copy crds/{name}"
        )
    assert "raftclusters.raftlog.dev.yaml" in chart and "kopfpeerings.kopf.dev.yaml" in chart


def test_helm_loads_the_crds_and_they_are_valid_for_every_claimed_version():
    with helm.Chart.load(CHART) as chart:
        crds = [yaml.safe_load(c["data"]) for c in chart.crds]
    names = sorted(c["metadata"]["name"] for c in crds)
    assert names == sorted(["raftclusters.raftlog.dev", *PEERING_KINDS.values()])
    for crd in crds:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(crd, version, strict=True)


def _crd_schema(name: str) -> tuple[str, dict[str, Any]]:
    crd = yaml.safe_load((CHART / "crds" / f"{name}.yaml").read_text())
    return crd["spec"]["scope"], crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validate(obj: dict[str, Any], version: str) -> None:
    """A rendered object against its schema: Kubernetes' own, or the CRD that defines it."""
    kind = obj["kind"]
    if kind in PEERING_KINDS:
        scope, schema = _crd_schema(PEERING_KINDS[kind])
        assert obj["apiVersion"] == "kopf.dev/v1"
        assert ("namespace" in obj["metadata"]) == (scope == "Namespaced"), obj
        jsonschema.Draft4Validator(schema).validate(obj)
    elif kind in ("ServiceMonitor", "PodMonitor"):
        # The Prometheus operator's CRDs are not available here: their shape is checked by
        # test_the_metrics_service_and_service_monitor_scrape_the_operator and
        # test_the_pod_monitor_scrapes_every_member instead.
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    else:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_rendered_object_is_valid(mode, version):
    objs = objects(MODES[mode])
    assert one(objs, "Deployment") and one(objs, "ServiceAccount")
    for obj in objs:
        validate(obj, version)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_helm_lint_finds_nothing(mode, version):
    report = helm.lint(
        CHART, MODES[mode], strict=True, namespace=NAMESPACE, kube_version=f"v{version}.0"
    )
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); 2 and 3 are warnings and errors.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_operator_pod_meets_pod_security_restricted(mode):
    objs = objects(MODES[mode])
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(objs)["securityContext"]
    assert sc == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # A read-only root: the only writable place is an emptyDir on /tmp.
    assert container(objs)["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]


def test_probes_go_to_kopfs_liveness_endpoint_with_resources_set():
    c = container(objects())
    assert c["command"] == ["raftlog-operator"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 8000}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["RAFTLOG_OPERATOR_METRICS_PORT"] == "8000"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_default_image_is_the_one_the_dockerfile_builds_and_the_nodes_run():
    from raftlog.operator.models import DEFAULT_IMAGE

    assert container(objects())["image"] == DEFAULT_IMAGE == "ghcr.io/raftlog/raftlog:0.1.0"
    digest = "sha256:" + "a" * 64
    pinned = container(objects({"image": {"digest": digest}}))["image"]
    assert pinned == f"ghcr.io/raftlog/raftlog@{digest}"


@pytest.mark.parametrize(
    "image",
    [
        {},
        {"repository": "registry.example.com/raftlog", "tag": "9.9"},
        {"digest": "sha256:" + "b" * 64},
    ],
)
def test_members_without_spec_image_run_the_operators_own_image(image, monkeypatch):
    from raftlog.operator.manifests import pod
    from raftlog.operator.models import RaftClusterSpec
    from raftlog.operator.settings import OperatorSettings

    c = container(objects({"image": image}))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["RAFTLOG_OPERATOR_DEFAULT_IMAGE"] == c["image"]
    # What the operator makes of it: the default for a spec without an image, never over one.
    monkeypatch.setenv("RAFTLOG_OPERATOR_DEFAULT_IMAGE", env["RAFTLOG_OPERATOR_DEFAULT_IMAGE"])
    default = OperatorSettings().default_image
    spec = RaftClusterSpec().with_image(default)
    member = pod(spec, "c", "ns", "c-0", {}, join=False, config_hash="h")
    assert member["spec"]["containers"][0]["image"] == c["image"]
    own = RaftClusterSpec(image="mine/raftlog:1").with_image(default)
    assert own.image == "mine/raftlog:1"


def test_default_is_namespaced_to_the_release_namespace_and_standalone():
    objs = objects()
    args = container(objs)["args"]
    assert f"--namespace={NAMESPACE}" in args and "--standalone" in args
    assert "--all-namespaces" not in args
    assert one(objs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert one(objs, "Role")["metadata"]["namespace"] == NAMESPACE
    assert not of_kind(objs, "ClusterRole") and not of_kind(objs, "ClusterRoleBinding")
    assert not of_kind(objs, "KopfPeering") and not of_kind(objs, "PodDisruptionBudget")


def test_namespaced_mode_gives_a_role_and_binding_per_watched_namespace():
    objs = objects(MODES["namespaced"])
    args = container(objs)["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    for kind in ("Role", "RoleBinding"):
        assert sorted(o["metadata"]["namespace"] for o in of_kind(objs, kind)) == [
            "team-a",
            "team-b",
        ]
    for binding in of_kind(objs, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "raftlog-operator", "namespace": NAMESPACE}
        ]
    # Nothing cluster-scoped: the operator runs kopf with scanning off in this mode.
    assert not of_kind(objs, "ClusterRole") and not of_kind(objs, "ClusterRoleBinding")


def test_cluster_mode_gives_one_cluster_role_and_no_role():
    objs = objects(MODES["cluster"])
    assert "--all-namespaces" in container(objs)["args"]
    assert not of_kind(objs, "Role") and not of_kind(objs, "RoleBinding")
    role, binding = one(objs, "ClusterRole"), one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == NAMESPACE
    # Nothing in the cluster is written but what the operator owns, and no wildcard anywhere.
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(
            rule["verbs"]
        ) or rule["resources"] == ["raftclusters/finalizers"]


@pytest.mark.parametrize(
    "mode, kind", [("ha", "KopfPeering"), ("ha-cluster", "ClusterKopfPeering")]
)
def test_ha_runs_replicas_in_kopf_peering(mode, kind):
    objs = objects(MODES[mode])
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == MODES[mode]["replicaCount"]
    args = container(objs)["args"]
    assert "--peering=raftlog-operator" in args and "--standalone" not in args
    # Recreate in every mode: a rolling update could run two acting operators (a rollback to
    # a standalone revision, peering through another object); test_ha_and_tls shows it.
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    peering = one(objs, kind)
    assert peering["metadata"]["name"] == "raftlog-operator"
    assert one(objs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100
    # The peering resource is granted, in the scope of the mode.
    roles = of_kind(objs, "Role" if kind == "KopfPeering" else "ClusterRole")
    granted = {(r["resources"][0], v) for role in roles for r in role["rules"] for v in r["verbs"]}
    plural = "kopfpeerings" if kind == "KopfPeering" else "clusterkopfpeerings"
    assert {(plural, "list"), (plural, "watch"), (plural, "patch")} <= granted


def test_the_metrics_service_and_service_monitor_scrape_the_operator():
    objs = objects(MODES["metrics"])
    svc = one(objs, "Service")
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8000, "targetPort": "metrics", "protocol": "TCP"}
    ]
    mon = one(objs, "ServiceMonitor")
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert mon["spec"]["endpoints"][0]["port"] == "metrics"
    assert mon["metadata"]["labels"]["release"] == "prom"
    assert not of_kind(objects(), "ServiceMonitor")  # optional: off by default


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [
        ({}, {"matchNames": [NAMESPACE]}),
        ({"watch": {"mode": "namespaced", "namespaces": ["a", "b"]}}, {"matchNames": ["a", "b"]}),
        ({"watch": {"mode": "cluster"}}, {"any": True}),
    ],
)
def test_the_pod_monitor_scrapes_every_member(values, namespaces):
    on = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    mon = one(objects({**values, **on}), "PodMonitor")
    pod = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")
    # The members' pods, by the labels the operator gives them, at their client port.
    assert mon["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    [endpoint] = mon["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert mon["spec"]["namespaceSelector"] == namespaces
    assert mon["metadata"]["labels"]["release"] == "prom"
    assert not of_kind(objects(values), "PodMonitor")  # optional: off by default
    # Members only: the operator's other objects carry the cluster's labels without a member.
    [member] = mon["spec"]["selector"]["matchExpressions"]
    assert member == {"key": manifests.LABEL_MEMBER, "operator": "Exists"}
    assert manifests.LABEL_MEMBER in pod["metadata"]["labels"]
    assert manifests.LABEL_MEMBER not in manifests.labels("c")
    # The member's RaftCluster as the `raftcluster` label, which the dashboard filters on
    # (Prometheus names a pod label __meta_kubernetes_pod_label_<name, non-alphanumerics as _>).
    [relabel] = endpoint["relabelings"]
    source = "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", manifests.LABEL_CLUSTER)
    assert relabel == {"sourceLabels": [source], "targetLabel": "raftcluster"}
    variables = {
        v["name"]: v
        for v in dashboard_json(objects({"metrics": DASHBOARD_ON}))["templating"]["list"]
    }
    assert variables["raftcluster"]["query"].endswith(", raftcluster)")


DASHBOARD_ON = {"grafanaDashboard": {"enabled": True}}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def dashboard_json(objs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(objs, "ConfigMap")
    assert list(cm["data"]) == ["raftlog.json"]
    dash = json.loads(cm["data"]["raftlog.json"])
    assert isinstance(dash, dict)
    return dash


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_the_dashboard_configmap_is_for_grafanas_sidecar(version):
    assert not of_kind(objects(), "ConfigMap")  # optional: off by default
    objs = objects({"metrics": DASHBOARD_ON})
    cm = one(objs, "ConfigMap")
    validate(cm, version)
    assert cm["metadata"]["name"] == "raftlog-operator-dashboard"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in cm["metadata"]  # no folder asked for
    # The chart's dashboards/raftlog.json, as it is.
    assert dashboard_json(objs) == json.loads((CHART / "dashboards" / "raftlog.json").read_text())
    notes = render({"metrics": DASHBOARD_ON})["raftlog-operator/templates/NOTES.txt"]
    assert "configmap/raftlog-operator-dashboard in raftlog-system" in notes
    assert "grafana_dashboard=1" in notes
    report = helm.lint(
        CHART,
        {"metrics": DASHBOARD_ON},
        strict=True,
        namespace=NAMESPACE,
        kube_version=f"v{version}.0",
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_dashboards_label_folder_and_namespace_are_the_users():
    own = {
        "enabled": True,
        "label": "example.com/dashboard",
        "labelValue": "raftlog",
        "folder": "Data stores",
        "folderAnnotation": "grafana_folder",
        "namespace": "monitoring",
        "labels": {"team": "storage"},
        "annotations": {"owner": "platform"},
    }
    meta = one(objects({"metrics": {"grafanaDashboard": own}}), "ConfigMap")["metadata"]
    assert meta["namespace"] == "monitoring"
    assert meta["labels"]["example.com/dashboard"] == "raftlog"
    assert meta["labels"]["team"] == "storage" and "grafana_dashboard" not in meta["labels"]
    assert meta["annotations"] == {"grafana_folder": "Data stores", "owner": "platform"}
    # Without the operator's own metrics the members' panels still have something to show.
    assert of_kind(objects({"metrics": {"enabled": False, **DASHBOARD_ON}}), "ConfigMap")


def test_every_dashboard_panel_queries_the_chosen_prometheus():
    dash = dashboard_json(objects({"metrics": DASHBOARD_ON}))
    [ds] = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert ds["name"] == "datasource" and ds["query"] == "prometheus"
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
    titles = " ".join(p["title"] for p in panels).lower()
    for topic in ("appends", "commit latency", "fsync", "follower lag", "snapshotrequired"):
        assert topic in titles
    for topic in ("snapshot installs", "elections", "reconcile", "promotions"):
        assert topic in titles


def schema_refusal(values: dict[str, Any]) -> str:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as e:
        chart.validate_schema(values)
    return str(e.value)


def test_the_schema_takes_the_dashboards_values_and_refuses_bad_ones():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.merge_values({"metrics": DASHBOARD_ON}))
        good = {"label": "example.com/dashboard", "labelValue": "", "namespace": "monitoring"}
        chart.validate_schema(chart.merge_values({"metrics": {"grafanaDashboard": good}}))
    where = "at '/metrics/grafanaDashboard"
    bad = [
        ({"enable": True}, f"{where}': additional properties 'enable' not allowed"),
        ({"enabled": "yes"}, f"{where}/enabled': got string, want boolean"),
        ({"labelValue": 1}, f"{where}/labelValue': got number, want string"),
        ({"label": "grafana dashboard"}, f"{where}/label'"),
        ({"labelValue": "-1"}, f"{where}/labelValue'"),
        ({"folderAnnotation": "a/b/c"}, f"{where}/folderAnnotation'"),
        ({"namespace": "Monitoring"}, f"{where}/namespace'"),
        ({"labels": {"team": 1}}, f"{where}/labels/team': got number, want string"),
    ]
    for values, reason in bad:
        message = schema_refusal({"metrics": {"grafanaDashboard": values}})
        assert reason in message, (values, message)


def test_without_metrics_there_is_no_service_and_the_operator_serves_none():
    objs = objects(MODES["no-metrics"])
    assert not of_kind(objs, "Service")
    env = {e["name"]: e.get("value") for e in container(objs)["env"]}
    assert env["RAFTLOG_OPERATOR_METRICS_PORT"] == "0"


def test_the_network_policy_keeps_clients_off_the_peer_port_and_strangers_off_both():
    from raftlog.operator.manifests import pod
    from raftlog.operator.models import RaftClusterSpec

    objs = objects(MODES["network-policy"])
    policies = of_kind(objs, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["billing", "orders"]
    member_ports = {
        p["name"]: p["containerPort"]
        for p in pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")["spec"][
            "containers"
        ][0]["ports"]
    }
    assert member_ports == {"client": 7001, "peer": 7002}  # the names the policy refers to
    values = MODES["network-policy"]["networkPolicy"]
    for policy in policies:
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        # The members' pods, as the operator labels them.
        assert spec["podSelector"]["matchLabels"] == {
            "app.kubernetes.io/name": "raftlog",
            "app.kubernetes.io/managed-by": "raftlog-operator",
        }
        peer_rule, client_rule = spec["ingress"]
        assert peer_rule["ports"] == [{"port": "peer", "protocol": "TCP"}]
        members, operator = peer_rule["from"]  # nobody else reaches peers and the admin API
        assert members == {"podSelector": {"matchLabels": spec["podSelector"]["matchLabels"]}}
        pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert operator["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert operator["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": NAMESPACE
        }
        assert client_rule["ports"] == [{"port": "client", "protocol": "TCP"}]
        assert client_rule["from"] == values["clients"] + values["monitoring"]
    assert not of_kind(objects(), "NetworkPolicy")  # optional: off by default
    # No clients and no monitoring: the client port admits nobody (no rule, no open port).
    closed = one(
        objects({"networkPolicy": {"enabled": True, "clients": [], "monitoring": []}}),
        "NetworkPolicy",
    )
    assert [r["ports"][0]["port"] for r in closed["spec"]["ingress"]] == ["peer"]


def test_the_network_policy_selects_the_pods_the_operator_creates():
    from raftlog.operator.manifests import labels

    objs = objects({"networkPolicy": {"enabled": True}})
    policy = one(objs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == NAMESPACE  # the watched namespace
    member = labels("orders", "orders-0")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= member.items()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_notes_tell_the_next_command(mode):
    notes = render(MODES[mode])["raftlog-operator/templates/NOTES.txt"]
    assert "kubectl -n raftlog-system rollout status deployment/raftlog-operator" in notes
    assert "-f examples/raftcluster.yaml" in notes and "kubectl get raft" in notes


def test_the_metrics_service_name_fits_a_service_name_whatever_the_release():
    """Found by a review: `<fullname>-metrics` passed 63 characters for a release name over
    38, which the API server refuses for a Service."""
    long = "a" * 54 + "-operator"  # 63, the most fullnameOverride takes
    objs = objects({"fullnameOverride": long, "metrics": {"enabled": True}})
    service = one(objs, "Service")["metadata"]["name"]
    assert service == "a" * 54 + "-metrics"  # cut to 55, its trailing "-" dropped
    short = one(objects({"metrics": {"enabled": True}}), "Service")["metadata"]["name"]
    assert short == f"{RELEASE}-metrics"
