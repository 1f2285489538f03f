"""The RaftCluster CRD: generated from the models, checked in, valid, and enforcing the spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from raftlog.operator.crd import CRD_PATH, build_crd, render
from raftlog.operator.local import ManifestError, load_manifest
from raftlog.operator.models import RaftClusterSpec

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_crd_is_what_the_models_generate():
    checked_in = (ROOT / CRD_PATH).read_text()
    assert checked_in == render(), (
        f"{CRD_PATH} is stale: run `python -m raftlog.operator.crd --write` and commit it"
    )


@pytest.mark.parametrize("version", ["1.28", "1.37"])
def test_the_crd_is_a_valid_custom_resource_definition(version):
    kubernetes_validate.validate(build_crd(), version, strict=True)


def spec_schema() -> dict[str, Any]:
    crd = build_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(root["properties"]["spec"])


def validator() -> jsonschema.Draft4Validator:
    # OpenAPI v3.0 schemas are JSON Schema draft 4 (boolean exclusiveMinimum) plus `nullable`.
    return jsonschema.Draft4Validator(spec_schema())


def test_the_example_manifest_passes_the_schema_and_the_models():
    doc = yaml.safe_load((ROOT / "examples" / "raftcluster.yaml").read_text())
    validator().validate(doc["spec"])
    name, spec = load_manifest((ROOT / "examples" / "raftcluster.yaml").read_text())
    assert name == "orders" and spec.replicas == 3 and spec.partitions == 2


BAD = [
    ({"replicas": 0}, "replicas", "greater than or equal to 1"),
    ({"partitions": 5000}, "partitions", "less than or equal to 1024"),
    ({"storage": {"reclaimPolicy": "Keep"}}, "storage.reclaimPolicy", "'Delete' or 'Retain'"),
    ({"storage": {"size": "ten gigs"}}, "storage.size", "should match pattern"),
    ({"snapshotSource": "random"}, "snapshotSource", "'follower-first' or 'leader'"),
    ({"raft": {"backfillThreshold": -1}}, "raft.backfillThreshold", "greater than or equal"),
    ({"raft": {"learnerPromotionStableWindow": 0}}, "raft.learnerPromotionStableWindow", ""),
    ({"replica": 3}, "replica", "Extra inputs are not permitted"),
]


@pytest.mark.parametrize("spec, field, reason", BAD)
def test_a_bad_spec_is_refused_by_the_models_naming_the_field(spec, field, reason):
    with pytest.raises(ValidationError) as e:
        RaftClusterSpec.model_validate(spec)
    err = e.value.errors()[0]
    assert ".".join(str(p) for p in err["loc"]) == field
    assert reason in err["msg"]


@pytest.mark.parametrize("spec, field, reason", [b for b in BAD if b[1] != "replica"])
def test_a_bad_spec_is_refused_by_the_crd_schema_too(spec, field, reason):
    with pytest.raises(jsonschema.ValidationError) as e:
        validator().validate(spec)
    assert ".".join(str(p) for p in e.value.absolute_path) == field


def test_an_incoherent_pair_of_raft_settings_is_refused_with_both_names():
    with pytest.raises(ValidationError, match=r"heartbeatTicks \(10\) must be below electionTicks"):
        RaftClusterSpec.model_validate({"raft": {"electionTicks": 10, "heartbeatTicks": 10}})


@pytest.mark.parametrize("where", ["requests", "limits"])
def test_a_resource_that_is_no_quantity_is_refused_naming_where_it_is(where: str) -> None:
    # The CRD takes any string there: the models alone check them, and must say which one.
    with pytest.raises(ValidationError, match=rf"{where}\.memory: 'lots' is not a Kubernetes"):
        RaftClusterSpec.model_validate({"resources": {where: {"memory": "lots"}}})


def test_a_limit_below_its_request_is_refused_before_any_member_is_touched() -> None:
    # The pod API refused it only after a rolling restart had deleted a healthy member (found
    # on the real cluster: 2 of 3 members left until the limit was put back).
    with pytest.raises(
        ValidationError, match=r"limits\.memory: 64Mi is below requests\.memory 128Mi"
    ):
        RaftClusterSpec.model_validate(
            {"resources": {"requests": {"memory": "128Mi"}, "limits": {"memory": "64Mi"}}}
        )
    # A request above the default limit (1Gi) alone is the same pod.
    with pytest.raises(ValidationError, match=r"limits\.memory: 1Gi is below requests\.memory 2Gi"):
        RaftClusterSpec.model_validate({"resources": {"requests": {"memory": "2Gi"}}})
    ok = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}}
    assert RaftClusterSpec.model_validate({"resources": ok}).resources.limits["cpu"] == "1000m"


def test_the_operators_default_image_fills_in_only_an_unset_image() -> None:
    assert RaftClusterSpec().with_image("ghcr.io/x/op:2").image == "ghcr.io/x/op:2"
    assert RaftClusterSpec(image="mine:1").with_image("ghcr.io/x/op:2").image == "mine:1"


def test_client_certificates_need_the_clusters_tls_secret():
    with pytest.raises(ValidationError, match="peerClientCertAuth: needs tlsSecretName"):
        RaftClusterSpec.model_validate({"peerClientCertAuth": True})
    spec = RaftClusterSpec.model_validate({"peerClientCertAuth": True, "tlsSecretName": "t"})
    assert spec.peer_client_cert_auth


@pytest.mark.parametrize(
    "text, message",
    [
        ("kind: Pod\napiVersion: v1\n", "apiVersion/kind must be raftlog.dev/v1alpha1/RaftCluster"),
        (
            "apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nspec: {}\n",
            "metadata.name is required",
        ),
        (
            "apiVersion: raftlog.dev/v1alpha1\nkind: RaftCluster\nmetadata: {name: a}\n"
            "spec: {replicas: two}\n",
            "spec.replicas: Input should be a valid integer",
        ),
        ("{{{", "not YAML"),
    ],
)
def test_a_bad_manifest_is_refused_with_the_reason(text, message):
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_manifest(text)


def test_every_member_setting_of_the_spec_is_the_nodes_own_definition():
    # Defined once, in the node: the spec takes each field's default, bounds and description,
    # so a cluster that leaves one out runs as a bare node and the CRD refuses what it would.
    from raftlog.node.core.config import RaftConfig
    from raftlog.node.settings import NodeSettings
    from raftlog.operator.models import RaftSettings, Storage

    def definition(model: Any, name: str, text: bool = True) -> tuple[Any, ...]:
        f = model.model_fields[name]
        return (f.annotation, f.default, f.metadata, f.description if text else None)

    member_raft = set(RaftSettings.model_fields) - RaftSettings.OPERATOR_ONLY - {"tick_ms"}
    assert member_raft <= set(RaftConfig.model_fields) and len(member_raft) >= 9
    for name in member_raft:
        assert definition(RaftSettings, name) == definition(RaftConfig, name), name
    assert definition(RaftSettings, "tick_ms") == definition(NodeSettings, "tick_ms")
    # The spec words these two for a volume and a member; the values and bounds are the node's.
    for model, name in ((Storage, "segment_bytes"), (RaftClusterSpec, "snapshot_source")):
        assert definition(model, name, text=False) == definition(NodeSettings, name, text=False)


def test_operator_only_settings_never_reach_a_member():
    from raftlog.node.core.config import RaftConfig
    from raftlog.operator.models import RaftSettings

    raft = RaftClusterSpec.model_validate({"raft": {"learnerPromotionStableWindow": 30}}).raft
    assert "learner_promotion_stable_window" in RaftSettings.OPERATOR_ONLY
    assert not RaftSettings.OPERATOR_ONLY & set(RaftConfig.model_fields)
    assert not any("STABLE_WINDOW" in k for k in raft.node_env())
    assert raft.node_config() == RaftClusterSpec().raft.node_config()
