"""The example RaftClusters: valid for the CRD's schema and the models, and the pods the operator
would make of them valid and Pod Security "restricted"; broken copies refused for the reason the
configuration reference documents."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError
from tests.chart.helm import KUBE_VERSIONS, ROOT

from raftlog.operator import manifests
from raftlog.operator.models import GROUP, KIND, VERSION, RaftClusterSpec
from raftlog.operator.reconciler import config_hash

pytestmark = pytest.mark.chart

EXAMPLES = {"small": ROOT / "examples" / "raftcluster.yaml",
            "production": ROOT / "examples" / "raftcluster-production.yaml"}  # fmt: skip


def load(path: Path) -> dict[str, Any]:
    [doc] = list(yaml.safe_load_all(path.read_text()))
    return dict(doc)


def crd() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "crds" / f"raftclusters.{GROUP}.yaml").read_text()))


def schema_validator() -> jsonschema.Draft4Validator:
    # The whole object against the CRD's openAPIV3Schema (OpenAPI v3.0: draft 4 plus nullable).
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(root)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_is_a_valid_raftcluster(example):
    doc = load(EXAMPLES[example])
    assert doc["apiVersion"] == f"{GROUP}/{VERSION}" and doc["kind"] == KIND
    assert crd()["spec"]["names"]["kind"] == KIND
    schema_validator().validate(doc)
    spec = RaftClusterSpec.model_validate(doc["spec"])
    spec.raft.node_config()  # the node accepts the Raft settings too
    if example == "production":
        assert spec.replicas == 5 and spec.storage.reclaim_policy == "Retain"
        assert spec.pod_template.affinity is not None


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_pods_and_volumes_made_of_an_example_are_valid_and_restricted(example, version):
    doc = load(EXAMPLES[example])
    name, spec = doc["metadata"]["name"], RaftClusterSpec.model_validate(doc["spec"])
    member = f"{name}-{spec.replicas - 1}"
    peers = {f"{name}-{i}": f"http://{name}-{i}:7001" for i in range(spec.replicas)}
    pod = manifests.pod(spec, name, "apps", member, peers, join=True, config_hash=config_hash(spec))
    for obj in (pod, manifests.pvc(spec, name, "apps", member), *manifests.services(name, "apps")):
        kubernetes_validate.validate(obj, version, strict=True)
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [c] = pod["spec"]["containers"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "hostNetwork" not in pod["spec"] and "hostPath" not in str(pod["spec"]["volumes"])


# (example, change, field, the CRD schema's reason, the models' reason)
BROKEN = [
    (
        "small",
        {"replicas": 0},
        "spec.replicas",
        "less than the minimum of 1",
        "greater than or equal to 1",
    ),
    (
        "small",
        {"replicas": 16},
        "spec.replicas",
        "greater than the maximum of 15",
        "less than or equal to 15",
    ),
    (
        "small",
        {"partitions": "two"},
        "spec.partitions",
        "is not of type 'integer'",
        "valid integer",
    ),
    (
        "production",
        {"storage": {"reclaimPolicy": "Keep"}},
        "spec.storage.reclaimPolicy",
        "is not one of ['Delete', 'Retain']",
        "'Delete' or 'Retain'",
    ),
    (
        "production",
        {"storage": {"size": "50 GB"}},
        "spec.storage.size",
        "does not match",
        "should match pattern",
    ),
    (
        "production",
        {"snapshotSource": "any"},
        "spec.snapshotSource",
        "is not one of",
        "'follower-first' or 'leader'",
    ),
    (
        "production",
        {"imagePullPolicy": "always"},
        "spec.imagePullPolicy",
        "is not one of",
        "'Always', 'IfNotPresent' or 'Never'",
    ),
    (
        "production",
        {"raft": {"learnerPromotionStableWindow": 0}},
        "spec.raft.learnerPromotionStableWindow",
        "less than or equal to the minimum of 0",
        "greater than 0",
    ),
    (
        "production",
        {"authSecretName": "Bad_Name"},
        "spec.authSecretName",
        "does not match",
        "should match pattern",
    ),
]


def broken(example: str, change: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(load(EXAMPLES[example]))
    for key, value in change.items():
        if isinstance(value, dict):
            doc["spec"].setdefault(key, {}).update(value)
        else:
            doc["spec"][key] = value
    return doc


@pytest.mark.parametrize("example, change, field, crd_reason, model_reason", BROKEN)
def test_a_broken_example_is_refused_by_the_crd_and_the_models(
    example, change, field, crd_reason, model_reason
):
    doc = broken(example, change)
    errors = list(schema_validator().iter_errors(doc))
    assert [".".join(map(str, e.absolute_path)) for e in errors] == [field]
    assert crd_reason in errors[0].message, errors[0].message
    with pytest.raises(ValidationError) as e:
        RaftClusterSpec.model_validate(doc["spec"])
    err = e.value.errors()[0]
    assert "spec." + ".".join(str(p) for p in err["loc"]) == field
    assert model_reason in err["msg"], err["msg"]


def test_what_the_crd_schema_cannot_say_the_models_refuse_with_the_reason():
    # Pairs of fields, and unknown fields (which the API server prunes from a structural
    # schema, or refuses with kubectl's default strict field validation).
    doc = broken("production", {"raft": {"heartbeatTicks": 10, "electionTicks": 10}})
    schema_validator().validate(doc)
    with pytest.raises(ValidationError, match=r"heartbeatTicks \(10\) must be below electionTicks"):
        RaftClusterSpec.model_validate(doc["spec"])
    doc = broken("small", {"replica": 3})
    with pytest.raises(ValidationError, match="replica\n  Extra inputs are not permitted"):
        RaftClusterSpec.model_validate(doc["spec"])
