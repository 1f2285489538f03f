"""Admission of `RaftCluster` resources by the real API server, as a `kubectl` user meets it.

The CRD generated from the models (crds/) is what refuses a bad spec, fills in the defaults,
prunes unknown fields and, with its CEL transition rules, keeps what cannot change after
creation from changing; the scale subresource goes through the same schema. No operator watches
the test namespaces, so nothing here starts a pod: only the API server's answers are tested.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from raftlog.operator.models import (
    GROUP,
    KIND,
    NAME_MAX,
    PLURAL,
    VERSION,
    RaftClusterSpec,
    RaftSettings,
)
from tests.k8s import kube


@pytest.fixture(scope="module")
def shared_namespace(cluster: None) -> Iterator[str]:
    """One namespace for the module: nothing here starts a pod, and a namespace takes seconds
    to delete."""
    ns = f"t-adm-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ns)
    yield ns
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def namespace(shared_namespace: str) -> Iterator[str]:
    yield shared_namespace
    kube.kubectl("delete", "raft", "--all", "-n", shared_namespace, "--timeout=60s")


def manifest(name: str, spec: dict[str, Any]) -> str:
    """A RaftCluster manifest (JSON, which is YAML too) for `kubectl ... -f -`."""
    doc = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    return json.dumps(doc)


def apply(ns: str, name: str, spec: dict[str, Any], *flags: str) -> str:
    return kube.kubectl("apply", "-n", ns, *flags, "-f", "-", stdin=manifest(name, spec))


def refused(ns: str, name: str, spec: dict[str, Any], *flags: str) -> str:
    """The error of an apply the API server must refuse."""
    return kube.kubectl_fails("apply", "-n", ns, *flags, "-f", "-", stdin=manifest(name, spec))


def spec_of(ns: str, name: str) -> dict[str, Any]:
    return dict(kube.get("raftcluster", name, ns)["spec"])


def absent(ns: str, name: str) -> bool:
    done = kube.run(["kubectl", "get", "raftcluster", name, "-n", ns])
    return done.returncode != 0 and "NotFound" in done.stderr


def patch(ns: str, name: str, spec: dict[str, Any]) -> list[str]:
    """`kubectl patch` arguments: a merge patch of the spec."""
    body = json.dumps({"spec": spec})
    return ["patch", "raftcluster", name, "-n", ns, "--type", "merge", "-p", body]


# ------------------------------------------------------------------------ the schema refuses

INVALID = [
    ({"replicas": 99}, "spec.replicas", "should be less than or equal to 15"),
    ({"replicas": 0}, "spec.replicas", "should be greater than or equal to 1"),
    ({"partitions": "two"}, "spec.partitions", "must be of type integer"),
    ({"partitions": 5000}, "spec.partitions", "should be less than or equal to 1024"),
    ({"imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy", 'Unsupported value: "Sometimes"'),
    ({"snapshotSource": "random"}, "spec.snapshotSource", 'Unsupported value: "random"'),
    ({"raft": {"tickMs": 0}}, "spec.raft.tickMs", "should be greater than or equal to 5"),
    (
        {"raft": {"maxBackfillEntriesPerRound": -1}},
        "spec.raft.maxBackfillEntriesPerRound",
        "should be greater than or equal to 1",
    ),
    (
        {"raft": {"learnerPromotionStableWindow": 0}},
        "spec.raft.learnerPromotionStableWindow",
        "should be greater than 0",
    ),
    # The CEL rule of RaftSettings (the models' `_coherent`): electionTicks defaults to 10.
    (
        {"raft": {"heartbeatTicks": 10}},
        "spec.raft.heartbeatTicks",
        "heartbeatTicks must be below electionTicks",
    ),
    ({"storage": {"size": "ten gigs"}}, "spec.storage.size", "should match"),
    # Taken by the API server and refused by the models, it stopped the operator's passes.
    ({"resources": {"requests": {"cpu": "lots"}}}, "spec.resources.requests.cpu", "should match"),
    ({"storage": {"reclaimPolicy": "Keep"}}, "spec.storage.reclaimPolicy", "Unsupported value"),
    ({"authSecretName": "Not_A_Name"}, "spec.authSecretName", "should match"),
    # The spec's CEL rule (the models' `_tls_for_cert_auth`).
    (
        {"peerClientCertAuth": True},
        "spec.peerClientCertAuth",
        "peerClientCertAuth needs tlsSecretName",
    ),
    (
        {"peerClientCertAuth": True, "tlsSecretName": None},
        "spec.peerClientCertAuth",
        "peerClientCertAuth needs tlsSecretName",
    ),
    # The spec's CEL rule (the models' `_restore_needs_archive`): a trailing slash is the same
    # prefix, which the models refused while the API server took it (the operator then warned
    # on every pass).
    (
        {"archive": {"url": "s3://bucket/p"}, "restore": {"url": "s3://bucket/p/"}},
        "spec.restore.url",
        "restore.url is archive.url",
    ),
]


@pytest.mark.parametrize(
    "spec, field, reason", INVALID, ids=[f"{f}={json.dumps(s)}" for s, f, _ in INVALID]
)
def test_an_invalid_spec_is_refused_naming_the_field(
    namespace: str, spec: dict[str, Any], field: str, reason: str
) -> None:
    err = refused(namespace, "bad", spec)
    assert f'The {KIND} "bad" is invalid' in err, err
    assert f"{field}: " in err and reason in err, err
    assert absent(namespace, "bad")


@pytest.mark.parametrize("name", ["a" * (NAME_MAX + 1), "orders.v2", "9lives"])
def test_a_name_its_services_cannot_take_is_refused_naming_the_rule(
    namespace: str, name: str
) -> None:
    """Found by a review: taken, the name failed every pass with the API server's 422 for the
    peers Service, and the RaftCluster showed no status at all."""
    err = refused(namespace, name, {})
    assert f"at most {NAME_MAX} characters" in err and "<name>-peers" in err, err
    assert absent(namespace, name)
    apply(namespace, "a" * NAME_MAX, {})  # the longest that fits


# ------------------------------------------------------------------------ the server defaults


def test_the_server_fills_in_the_defaults_of_an_empty_spec(namespace: str) -> None:
    apply(namespace, "empty", {})
    spec = spec_of(namespace, "empty")
    assert spec["replicas"] == 3
    assert spec["partitions"] == 1
    assert spec["imagePullPolicy"] == "IfNotPresent"
    assert spec["snapshotSource"] == "follower-first"
    # Nested sections are defaulted field by field, to the models' (and so the node's) defaults.
    assert spec["raft"] == RaftSettings().model_dump(mode="json", by_alias=True)
    assert spec["raft"]["electionTicks"] == 10 and spec["raft"]["tickMs"] == 50
    assert spec["storage"] == {"size": "1Gi", "segmentBytes": 64 * 1024 * 1024,
                               "reclaimPolicy": "Delete"}  # fmt: skip
    # What the server stored is what the operator makes of an empty spec.
    assert RaftClusterSpec.model_validate(spec) == RaftClusterSpec()


def test_a_partial_section_gets_the_rest_of_its_defaults(namespace: str) -> None:
    apply(namespace, "partial", {"raft": {"tickMs": 100}, "storage": {"size": "2Gi"}})
    spec = spec_of(namespace, "partial")
    raft = RaftSettings().model_dump(mode="json", by_alias=True)
    assert spec["raft"] == {**raft, "tickMs": 100}
    assert spec["storage"]["size"] == "2Gi" and spec["storage"]["reclaimPolicy"] == "Delete"
    assert spec["replicas"] == 3


# ------------------------------------------------------------------------ unknown fields

UNKNOWN = {"replica": 5, "storage": {"sise": "2Gi"}}


@pytest.mark.parametrize("flags", [(), ("--validate=strict",)], ids=["default", "strict"])
def test_an_unknown_field_is_refused_by_strict_field_validation_naming_it(
    namespace: str, flags: tuple[str, ...]
) -> None:
    # kubectl's default is --validate=strict: the API server's strict field validation.
    err = refused(namespace, "typo", UNKNOWN, *flags)
    assert "strict decoding error" in err, err
    assert 'unknown field "spec.replica"' in err, err
    assert 'unknown field "spec.storage.sise"' in err, err
    assert absent(namespace, "typo")


@pytest.mark.parametrize("verb", ["apply", "create"])
def test_an_unknown_field_is_pruned_when_validation_is_off(namespace: str, verb: str) -> None:
    term = {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": term}]}}  # fmt: skip
    spec = {**UNKNOWN, "podTemplate": {"affinity": affinity}}
    kube.kubectl(verb, "-n", namespace, "--validate=false", "-f", "-", stdin=manifest("typo", spec))
    stored = spec_of(namespace, "typo")
    assert "replica" not in stored and stored["replicas"] == 3, stored
    assert "sise" not in stored["storage"] and stored["storage"]["size"] == "1Gi", stored
    # Pruning is the schema's: a Pod affinity is kept verbatim (preserve-unknown-fields there).
    assert stored["podTemplate"]["affinity"] == affinity, stored


# ------------------------------------------------------------------------ fixed after creation


def test_partitions_may_be_raised_never_lowered(namespace: str) -> None:
    apply(namespace, "fixed", {"partitions": 2})
    message = "partitions cannot be lowered"
    err = kube.kubectl_fails(*patch(namespace, "fixed", {"partitions": 1}))
    assert f'spec.partitions: Invalid value: "integer": {message}' in err, err
    assert spec_of(namespace, "fixed")["partitions"] == 2
    kube.kubectl(*patch(namespace, "fixed", {"partitions": 3}))
    assert spec_of(namespace, "fixed")["partitions"] == 3
    err = refused(namespace, "fixed", {"partitions": 2})
    assert f'spec.partitions: Invalid value: "integer": {message}' in err, err
    assert spec_of(namespace, "fixed")["partitions"] == 3


@pytest.mark.parametrize(
    "before, after",
    [(None, "fast"), ("fast", "slow"), ("fast", None)],
    ids=["set", "changed", "unset"],
)
def test_the_storage_class_cannot_change_after_creation(
    namespace: str, before: str | None, after: str | None
) -> None:
    apply(namespace, "disks", {"storage": {"storageClassName": before} if before else {}})
    # A merge patch's null removes the field.
    err = kube.kubectl_fails(*patch(namespace, "disks", {"storage": {"storageClassName": after}}))
    assert "spec.storage.storageClassName: " in err, err
    assert "storageClassName cannot change after creation" in err, err
    assert spec_of(namespace, "disks")["storage"].get("storageClassName") == before


@pytest.mark.parametrize("field", ["authSecretName", "tlsSecretName"])
@pytest.mark.parametrize(
    "before, after", [(None, "b"), ("a", "b"), ("a", None)], ids=["set", "changed", "unset"]
)
def test_the_token_and_tls_secrets_cannot_change_after_creation(
    namespace: str, field: str, before: str | None, after: str | None
) -> None:
    """Found by a review: a new secret reached no member before the operator's calls failed
    with it (401, or the other scheme), so no pass ever got to the rolling restart."""
    name = f"{field[:4].lower()}-{'-'.join(str(x).lower() for x in (before, after))}"
    apply(namespace, name, {field: before} if before else {})
    err = kube.kubectl_fails(*patch(namespace, name, {field: after}))
    assert f"spec.{field}: " in err and f"{field} cannot change after creation" in err, err
    assert spec_of(namespace, name).get(field) == before


def test_the_reclaim_policy_cannot_go_from_delete_to_retain(namespace: str) -> None:
    apply(namespace, "owned", {"storage": {"reclaimPolicy": "Delete"}})
    err = kube.kubectl_fails(*patch(namespace, "owned", {"storage": {"reclaimPolicy": "Retain"}}))
    assert "spec.storage.reclaimPolicy: " in err, err
    assert "reclaimPolicy cannot change from Delete to Retain after creation" in err, err
    assert spec_of(namespace, "owned")["storage"]["reclaimPolicy"] == "Delete"


def test_what_may_change_after_creation_does(namespace: str) -> None:
    # The transition rules refuse only what they name: everything else is an ordinary update.
    apply(namespace, "live", {"partitions": 2, "storage": {"reclaimPolicy": "Retain"}})
    change = {
        "replicas": 5,
        "image": "example.org/raftlog:2",
        "raft": {"tickMs": 100, "electionTicks": 20},
        "storage": {"size": "2Gi", "segmentBytes": 8 * 1024 * 1024, "reclaimPolicy": "Delete"},
    }
    kube.kubectl(*patch(namespace, "live", change))
    # Re-applying the same partitions (and the rest of the manifest) is not a change.
    apply(namespace, "live", {**change, "partitions": 2})
    spec = spec_of(namespace, "live")
    assert spec["replicas"] == 5 and spec["partitions"] == 2 and spec["raft"]["tickMs"] == 100
    assert spec["storage"]["reclaimPolicy"] == "Delete" and spec["storage"]["size"] == "2Gi"


def test_the_raft_settings_stay_coherent_on_an_update(namespace: str) -> None:
    apply(namespace, "ticks", {"raft": {"electionTicks": 20, "heartbeatTicks": 5}})
    err = kube.kubectl_fails(*patch(namespace, "ticks", {"raft": {"electionTicks": 5}}))
    assert "spec.raft.heartbeatTicks: " in err, err
    assert "heartbeatTicks must be below electionTicks" in err, err


# ------------------------------------------------------------------------ the scale subresource


@pytest.mark.parametrize(
    "replicas, reason",
    [(99, "should be less than or equal to 15"), (0, "should be greater than or equal to 1")],
)
def test_scaling_out_of_the_schema_bounds_is_refused(
    namespace: str, replicas: int, reason: str
) -> None:
    apply(namespace, "scaled", {})
    err = kube.kubectl_fails("scale", "-n", namespace, "raft/scaled", f"--replicas={replicas}")
    assert f"spec.replicas: Invalid value: {replicas}: " in err and reason in err, err
    assert spec_of(namespace, "scaled")["replicas"] == 3
    # The subresource itself works: a count within bounds goes through it.
    kube.kubectl("scale", "-n", namespace, "raft/scaled", "--replicas=5")
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/scaled/scale"
    assert json.loads(kube.kubectl("get", "--raw", path))["spec"]["replicas"] == 5
