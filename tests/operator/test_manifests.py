"""Every object the operator creates passes the real Kubernetes schemas and Pod Security
"restricted", for the oldest and newest versions the chart supports."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import kubernetes_validate
import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from tests.operator.test_reconciler import T0, World, running_status

from raftlog.node.settings import NodeSettings
from raftlog.operator import manifests
from raftlog.operator.actions import ChangeMembership
from raftlog.operator.kube import KubeRuntime, pod_stuck
from raftlog.operator.models import MemberStatus, RaftClusterSpec
from raftlog.operator.node_launch import node_env
from raftlog.operator.reconciler import config_hash, decide
from raftlog.operator.safety import majority

VERSIONS = ["1.28", "1.37"]
PEERS = {f"c-{i}": manifests.member_url(manifests.DEFAULT_MEMBER_URL, "c", "ns", f"c-{i}")
         for i in range(3)}  # fmt: skip

FULL = RaftClusterSpec.model_validate(
    {
        "replicas": 3,
        "partitions": 4,
        "storage": {"size": "20Gi", "storageClassName": "fast", "reclaimPolicy": "Retain"},
        "tlsSecretName": "c-tls",
        "authSecretName": "c-token",
        "raft": {"backfillThreshold": 20, "learnerPromotionStableWindow": 10},
        "podTemplate": {
            "labels": {"team": "data"},
            "annotations": {"prometheus.io/scrape": "true"},
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "raft", "effect": "NoSchedule"}
            ],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": {"raftlog.dev/cluster": "c"}},
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }
                    ]
                }
            },
            "priorityClassName": "high",
            "serviceAccountName": "raft",
        },
    }
)


def objects(spec: RaftClusterSpec) -> list[dict[str, Any]]:
    pod = manifests.pod(spec, "c", "ns", "c-1", PEERS, join=True, config_hash=config_hash(spec))
    return [
        pod,
        manifests.pvc(spec, "c", "ns", "c-1"),
        *manifests.services("c", "ns"),
        manifests.pdb("c", "ns", spec.replicas),
        manifests.secret("c", "ns", spec, "s3cret"),
    ]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("spec", [RaftClusterSpec(), FULL], ids=["defaults", "everything-set"])
def test_every_object_passes_the_kubernetes_schema(spec, version):
    for obj in objects(spec):
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_misspelt_field_would_be_caught_by_the_validation():
    bad = objects(RaftClusterSpec())[0]
    bad["spec"]["containers"][0]["imagePullPolice"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def test_member_pods_meet_pod_security_restricted():
    pod = objects(FULL)[0]
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root: every path the node writes is a volume.
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert {manifests.DATA_DIR, "/tmp"} <= mounts
    assert all(not v.get("hostPath") for v in spec["volumes"])


def test_the_pod_carries_the_spec_to_the_node():
    pod = objects(FULL)[0]
    c = pod["spec"]["containers"][0]
    args = c["args"]
    assert args[args.index("--node-id") + 1] == "c-1" and "--join" in args
    assert args[args.index("--partitions") + 1] == "4"
    # Named by namespace and name: a peer of a same-named cluster elsewhere is refused.
    assert args[args.index("--cluster") + 1] == "ns/c"
    assert args[args.index("--peers") + 1].split(",")[0] == ("c-0=http://c-0.c-peers.ns.svc:7002")
    # Clients on 7001, peers and the admin API on 7002: a NetworkPolicy can tell them apart.
    assert args[args.index("--port") + 1] == "7001"
    assert args[args.index("--peer-port") + 1] == "7002"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"client": 7001, "peer": 7002}
    assert "--tls-cert-file" in args and "--auth-token-file" in args
    assert "--peer-client-cert-auth" not in args
    mtls = FULL.model_copy(update={"peer_client_cert_auth": True})
    assert "--peer-client-cert-auth" in objects(mtls)[0]["spec"]["containers"][0]["args"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == node_env(FULL)
    assert env["RAFTLOG_RAFT__BACKFILL_THRESHOLD"] == "20"
    assert env["RAFTLOG_SNAPSHOT_INSTALL"] == "operator"
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    meta = pod["metadata"]
    assert meta["labels"]["team"] == "data" and meta["labels"]["raftlog.dev/member"] == "c-1"
    assert meta["annotations"][manifests.ANNOTATION_HASH] == config_hash(FULL)
    assert pod["spec"]["subdomain"] == "c-peers" and pod["spec"]["hostname"] == "c-1"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["token"]["secret"]["secretName"] == "c-token"
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == "data-c-1"


@pytest.mark.parametrize(("replicas", "min_available"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_the_budget_keeps_a_majority_of_voters(replicas, min_available):
    budget = manifests.pdb("c", "ns", replicas)["spec"]
    assert budget == {
        "minAvailable": min_available,
        "selector": {"matchLabels": manifests.selector("c")},
    }
    # Evictions allowed with every member up never cost the quorum.
    assert replicas - (replicas - budget["minAvailable"]) > replicas // 2


def test_member_pods_mount_no_service_account_token():
    pod = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_the_peer_service_publishes_unready_members():
    svc, client_svc = manifests.services("c", "ns")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert [p["port"] for p in svc["spec"]["ports"]] == [7001, 7002]
    assert [p["port"] for p in client_svc["spec"]["ports"]] == [7001]  # never the peer port


def test_members_are_reached_over_https_when_the_cluster_has_tls():
    template = manifests.DEFAULT_MEMBER_URL
    assert manifests.member_url(template, "c", "ns", "c-2") == "http://c-2.c-peers.ns.svc:7002"
    assert manifests.member_url(template, "c", "ns", "c-2", tls=True) == (
        "https://c-2.c-peers.ns.svc:7002"
    )
    # A template without {scheme} (another cluster domain, say) is used as it is.
    assert manifests.member_url("http://{member}.x:{port}", "c", "ns", "c-0", tls=True) == (
        "http://c-0.x:7002"
    )


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_a_tls_cluster_gives_its_members_the_secrets_files_read_only() -> None:
    # kubernetes.io/tls keys: each flag names its own file of the secret mounted at TLS_DIR.
    pod = objects(FULL)[0]
    c = pod["spec"]["containers"][0]
    assert flag(c["args"], "--tls-cert-file") == f"{manifests.TLS_DIR}/tls.crt"
    assert flag(c["args"], "--tls-key-file") == f"{manifests.TLS_DIR}/tls.key"
    assert flag(c["args"], "--tls-ca-file") == f"{manifests.TLS_DIR}/ca.crt"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["tls"]["secret"] == {"secretName": "c-tls"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": manifests.TLS_DIR, "readOnly": True}
    assert mounts["token"]["readOnly"] is True
    # Both probes speak the members' scheme: an http probe of an https port always fails.
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_the_probes_ask_the_nodes_readiness_and_health() -> None:
    c = objects(RaftClusterSpec())[0]["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "client", "scheme": "HTTP"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "client", "scheme": "HTTP"}


def test_the_pod_template_and_resources_reach_every_pod() -> None:
    s = FULL.model_copy(update={"image_pull_policy": "Always"})
    pod = objects(s)[0]
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    tpl = FULL.pod_template
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["tolerations"] == tpl.tolerations and spec["affinity"] == tpl.affinity
    assert spec["priorityClassName"] == "high" and spec["serviceAccountName"] == "raft"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert c["imagePullPolicy"] == "Always"
    assert c["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }


def test_a_template_label_never_takes_a_member_out_of_its_clusters_selector() -> None:
    # The services, the budget and the operator find members by these labels.
    s = RaftClusterSpec.model_validate(
        {"podTemplate": {"labels": {manifests.LABEL_CLUSTER: "other", "team": "data"}}}
    )
    labels = objects(s)[0]["metadata"]["labels"]
    assert labels[manifests.LABEL_CLUSTER] == "c" and labels["team"] == "data"
    assert manifests.selector("c").items() <= labels.items()


@pytest.mark.parametrize("join", [True, False])
def test_the_pod_says_whether_its_member_joins(join: bool) -> None:
    pod = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=join, config_hash="h")
    assert pod["metadata"]["annotations"][manifests.ANNOTATION_JOIN] == str(join).lower()
    assert ("--join" in pod["spec"]["containers"][0]["args"]) is join


def test_each_members_volume_claims_the_size_and_class_asked() -> None:
    claim = manifests.pvc(FULL, "c", "ns", "c-1")
    assert claim["metadata"]["name"] == "data-c-1"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "fast",
    }
    assert "storageClassName" not in manifests.pvc(RaftClusterSpec(), "c", "ns", "c-1")["spec"]


def test_the_generated_secret_holds_the_file_the_members_read() -> None:
    pod, secret = objects(FULL)[0], objects(FULL)[-1]
    token_file = flag(pod["spec"]["containers"][0]["args"], "--auth-token-file")
    assert token_file.startswith(manifests.TOKEN_DIR + "/")
    assert secret["stringData"] == {token_file.rsplit("/", 1)[1]: "s3cret"}


def test_a_member_url_template_may_use_the_ordinal() -> None:
    template = "http://raft-{ordinal}.example.com:{port}"
    assert manifests.member_url(template, "c", "ns", "c-12") == "http://raft-12.example.com:7002"


def test_the_node_reads_every_setting_the_spec_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through the node's own settings, not by variable names: a misnamed variable would be
    # ignored by the node (its default), not refused.
    s = RaftClusterSpec.model_validate(
        {
            "raft": {"tickMs": 20, "electionTicks": 30, "heartbeatTicks": 3},
            "snapshotSource": "leader",
            "storage": {"segmentBytes": 8 * 1024 * 1024},
        }
    )
    for k, v in node_env(s).items():
        monkeypatch.setenv(k, v)
    node = NodeSettings(
        node_id="a", peers={"a": "http://a:7002"}, data_dir=tmp_path, insecure_no_auth=True
    )
    assert (node.tick_ms, node.snapshot_source, node.snapshot_install) == (20, "leader", "operator")
    assert node.segment_bytes == 8 * 1024 * 1024
    assert node.raft == s.raft.node_config()


class _Applied:
    """The API calls `KubeRuntime.ensure_shared` makes: every applied body, kept; the auth
    Secret read back with a token."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def patch(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.bodies.append(body)

    patch_namespaced_service = patch
    patch_namespaced_pod_disruption_budget = patch

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        token = base64.b64encode(b"t").decode()
        return SimpleNamespace(data=json.dumps({"data": {"token": token}}).encode())


def applied_budget(s: RaftClusterSpec, members: Sequence[MemberStatus] = ()) -> dict[str, Any]:
    """The PodDisruptionBudget the Kubernetes runtime applies for spec `s` and the status's
    `members`."""
    runtime = KubeRuntime(ApiClient(), "ns", "c", adopt=lambda body: None)
    api = _Applied()
    runtime.core = runtime.policy = cast(Any, api)  # the calls it makes, answered here
    asyncio.run(runtime.ensure_shared(s, members))
    return next(b for b in api.bodies if b["kind"] == "PodDisruptionBudget")


@pytest.mark.parametrize(("replicas", "min_available"), [(1, 1), (3, 2), (5, 3)])
def test_the_budget_applied_keeps_a_majority_of_a_settled_cluster(
    replicas: int, min_available: int
) -> None:
    budget = applied_budget(RaftClusterSpec(replicas=replicas))
    assert budget["spec"]["minAvailable"] == min_available


def test_during_a_scale_down_the_budget_keeps_a_majority_of_the_voters_still_there() -> None:
    members = ["c-0", "c-1", "c-2", "c-3", "c-4"]
    s = RaftClusterSpec(replicas=3, partitions=2)
    w = World(members)
    status = running_status(members)
    plan = decide("c", s, status, w.observed(), T0)
    assert plan.action == ChangeMembership(0, "c-0", "remove", "c-4")  # still a voter
    voters = len(w.voters[0])
    budget = applied_budget(s, status.members)["spec"]["minAvailable"]
    evictable = len(members) - budget  # every pod up
    assert voters - evictable >= majority(voters), (voters, evictable)


def test_a_learners_pod_counts_on_top_of_the_voters_majority() -> None:
    # Scaling 4 -> 5: four voters and a learner. Two evictions of voters would leave 2 of 4.
    status = running_status(["c-0", "c-1", "c-2", "c-3", "c-4"])
    status.members[4].role = "learner"
    budget = applied_budget(RaftClusterSpec(replicas=5), status.members)["spec"]
    assert budget["minAvailable"] == 4  # a majority of 4 voters, and the learner
    # A member joining or being removed is counted as not a voter: never fewer kept.
    status.members[3].role = "removing"
    assert (
        applied_budget(RaftClusterSpec(replicas=5), status.members)["spec"]["minAvailable"] == 2 + 2
    )


def test_a_pod_that_cannot_start_by_itself_is_told_from_one_on_its_way():
    def pod(**status: object) -> dict[str, object]:
        return {"metadata": {"name": "c-1"}, "status": status}

    def waiting(reason: str) -> dict[str, object]:
        return pod(phase="Pending", containerStatuses=[
            {"name": "node", "state": {"waiting": {"reason": reason}}}])  # fmt: skip

    assert pod_stuck(waiting("ImagePullBackOff")) == "ImagePullBackOff"
    assert pod_stuck(waiting("ErrImagePull")) == "ErrImagePull"
    assert pod_stuck(waiting("CrashLoopBackOff")) == "CrashLoopBackOff"
    assert pod_stuck(waiting("ContainerCreating")) is None  # on its way
    why = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity"
    unschedulable = pod(phase="Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": why}])  # fmt: skip
    assert pod_stuck(unschedulable) == f"Unschedulable: {why}"
    assert pod_stuck(pod(phase="Pending")) is None
    assert pod_stuck(pod(phase="Running", containerStatuses=[
        {"name": "node", "state": {"running": {}}}])) is None  # fmt: skip


class _NoSecret(_Applied):
    """The API server after the auth Secret was deleted: created again on request."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[dict[str, Any]] = []

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        if not self.created:
            raise ApiException(status=404)
        token = base64.b64encode(self.created[-1]["stringData"]["token"].encode()).decode()
        return SimpleNamespace(data=json.dumps({"data": {"token": token}}).encode())

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.created.append(body)

    running: tuple[str, ...] = ()  # the member pods running

    def list_namespaced_pod(self, namespace: str, **_: Any) -> Any:
        labels = {manifests.LABEL_CLUSTER: "c"}
        items = [
            {"metadata": {"name": n, "labels": {**labels, manifests.LABEL_MEMBER: n}},
             "status": {"phase": "Running"}}
            for n in self.running
        ]  # fmt: skip
        return SimpleNamespace(data=json.dumps({"items": items}).encode())

    def list_namespaced_persistent_volume_claim(self, namespace: str, **_: Any) -> Any:
        return SimpleNamespace(data=json.dumps({"items": []}).encode())


def test_a_lost_auth_secret_is_made_again_only_with_the_token_the_members_hold():
    members = [MemberStatus(name=f"c-{i}", ordinal=i, role="voter") for i in range(3)]

    def runtime(api: _NoSecret) -> KubeRuntime:
        r = KubeRuntime(ApiClient(), "ns", "c", adopt=lambda body: None)
        r.core = r.policy = cast(Any, api)
        return r

    # A new cluster: a new token.
    api = _NoSecret()
    assert (
        asyncio.run(runtime(api).ensure_shared(RaftClusterSpec()))
        == (api.created[0]["stringData"]["token"])
    )
    # Deleted while this operator ran: made again with the token it knew.
    known = runtime(api)
    token = asyncio.run(known.ensure_shared(RaftClusterSpec(), members))
    api.created.clear()
    assert asyncio.run(known.ensure_shared(RaftClusterSpec(), members)) == token
    assert api.created[0]["stringData"]["token"] == token
    # Deleted while no operator ran: the token lives only in the running members; a new one
    # would split the cluster at its next restart (it did, on the real cluster): asked for.
    api = _NoSecret()
    api.running = ("c-0", "c-2")
    said = r"secret c-auth is gone, with the token members c-0, c-2 run with .* exec c-0 -- cat "
    with pytest.raises(RuntimeError, match=said + "/etc/raftlog/token/token"):
        asyncio.run(runtime(api).ensure_shared(RaftClusterSpec(), members))
    assert not api.created
    # With no member running (hibernated), nobody holds the old token: a new one.
    api.running = ()
    assert asyncio.run(runtime(api).ensure_shared(RaftClusterSpec(), members))
    assert len(api.created) == 1
