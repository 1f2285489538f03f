"""The Kubernetes objects of a cluster, built as plain dicts (pure; validated in tests).

Every member is its own Pod with its own PVC (as Strimzi's pod sets do), so the operator decides
which member goes and when. A headless Service gives members stable DNS names for peer traffic, a
client Service spreads applications over the members, a PodDisruptionBudget lets voluntary
evictions take one member at a time, and a Secret holds the generated peer and admin token.
Pods meet Pod Security "restricted".
"""

from __future__ import annotations

from typing import Any

from raftlog.operator.models import (
    ACCESS_KEY_ID_KEY,
    DEFAULT_IMAGE,
    SECRET_ACCESS_KEY_KEY,
    RaftClusterSpec,
)
from raftlog.operator.node_launch import CLIENT_PORT, PEER_PORT, node_args, node_env
from raftlog.operator.safety import majority

LABEL_CLUSTER = "raftlog.dev/cluster"
LABEL_MEMBER = "raftlog.dev/member"
ANNOTATION_HASH = "raftlog.dev/config-hash"
ANNOTATION_JOIN = "raftlog.dev/join"
DATA_DIR = "/var/lib/raftlog"
TOKEN_DIR = "/etc/raftlog/token"
TLS_DIR = "/etc/raftlog/tls"
# {scheme} is https when the cluster has a TLS secret, else http.
DEFAULT_MEMBER_URL = "{scheme}://{member}.{cluster}-peers.{namespace}.svc:{port}"


def labels(cluster: str, member: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "raftlog",
        "app.kubernetes.io/instance": cluster,
        "app.kubernetes.io/managed-by": "raftlog-operator",
        LABEL_CLUSTER: cluster,
    }
    if member is not None:
        out[LABEL_MEMBER] = member
    return out


def selector(cluster: str) -> dict[str, str]:
    return {LABEL_CLUSTER: cluster}


def peers_service(cluster: str) -> str:
    return f"{cluster}-peers"


def auth_secret(cluster: str, spec: RaftClusterSpec) -> str:
    return spec.auth_secret_name or f"{cluster}-auth"


def pvc_name(member: str) -> str:
    return f"data-{member}"


def member_url(template: str, cluster: str, namespace: str, member: str, tls: bool = False) -> str:
    ordinal = member.rsplit("-", 1)[-1]
    return template.format(
        member=member, cluster=cluster, namespace=namespace, port=PEER_PORT, ordinal=ordinal,
        scheme="https" if tls else "http",
    )  # fmt: skip


def _restricted() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod(
    spec: RaftClusterSpec,
    cluster: str,
    namespace: str,
    member: str,
    peers: dict[str, str],
    *,
    join: bool,
    config_hash: str,
    restore: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Member `member`'s pod; `restore`: the restore plan's settings (`restore_env`), for the
    members that start a restored cluster."""
    tls = spec.tls_secret_name is not None
    args = node_args(
        spec, member, peers, join=join, data_dir=DATA_DIR, token_file=f"{TOKEN_DIR}/token",
        cluster=f"{namespace}/{cluster}",
    )  # fmt: skip
    if tls:
        args += [
            "--tls-cert-file",
            f"{TLS_DIR}/tls.crt",
            "--tls-key-file",
            f"{TLS_DIR}/tls.key",
            "--tls-ca-file",
            f"{TLS_DIR}/ca.crt",
        ]
        if spec.peer_client_cert_auth:
            args.append("--peer-client-cert-auth")
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(node_env(spec).items())]
    env += [{"name": k, "value": v} for k, v in sorted((restore or {}).items())]
    env += archive_credentials_env(spec)
    scheme = "HTTPS" if tls else "HTTP"
    mounts = [
        {"name": "data", "mountPath": DATA_DIR},
        {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": pvc_name(member)}},
        {"name": "token", "secret": {"secretName": auth_secret(cluster, spec)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if tls:
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": spec.tls_secret_name}})
    tpl = spec.pod_template
    pod_spec: dict[str, Any] = {
        "hostname": member,
        "subdomain": peers_service(cluster),  # DNS: <member>.<cluster>-peers.<namespace>.svc
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
        # A node never calls the API server: no ServiceAccount token in its pod.
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "node",
                "image": spec.image or DEFAULT_IMAGE,  # the operator resolves it first
                "imagePullPolicy": spec.image_pull_policy,
                "command": ["raftlog-node"],
                "args": args,
                "env": env,
                "ports": [
                    {"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"},
                    {"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
                ],
                "readinessProbe": {
                    "httpGet": {"path": "/readyz", "port": "client", "scheme": scheme},
                    "periodSeconds": 2,
                    "failureThreshold": 3,
                },
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": "client", "scheme": scheme},
                    "periodSeconds": 10,
                    "failureThreshold": 6,
                },
                "resources": {
                    "requests": dict(spec.resources.requests),
                    "limits": dict(spec.resources.limits),
                },
                "securityContext": _restricted(),
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if tpl.node_selector:
        pod_spec["nodeSelector"] = dict(tpl.node_selector)
    if tpl.tolerations:
        pod_spec["tolerations"] = list(tpl.tolerations)
    if tpl.affinity is not None:
        pod_spec["affinity"] = dict(tpl.affinity)
    if tpl.priority_class_name:
        pod_spec["priorityClassName"] = tpl.priority_class_name
    if tpl.service_account_name:
        pod_spec["serviceAccountName"] = tpl.service_account_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": member,
            "namespace": namespace,
            "labels": {**tpl.labels, **labels(cluster, member)},
            "annotations": {
                **tpl.annotations,
                ANNOTATION_HASH: config_hash,
                ANNOTATION_JOIN: str(join).lower(),
            },
        },
        "spec": pod_spec,
    }


def archive_credentials_env(spec: RaftClusterSpec) -> list[dict[str, Any]]:
    """spec.archive.credentialsSecret's keys as the node's `AWS_ACCESS_KEY_ID` and
    `AWS_SECRET_ACCESS_KEY` (which it reads when no archive_credentials_file is given): the
    kubelet reads the Secret, so the operator never does, and a missing Secret or key keeps the
    pod from starting (CreateContainerConfigError, naming it) rather than running unarchived."""
    name = spec.archive.credentials_secret if spec.archive is not None else None
    if name is None:
        return []
    return [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}
        for var, key in (
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY_KEY),
        )
    ]


def pvc(spec: RaftClusterSpec, cluster: str, namespace: str, member: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": spec.storage.size}},
    }
    if spec.storage.storage_class_name:
        body["storageClassName"] = spec.storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name(member),
            "namespace": namespace,
            "labels": labels(cluster, member),
        },
        "spec": body,
    }


def services(cluster: str, namespace: str) -> list[dict[str, Any]]:
    client_port = {"name": "client", "port": CLIENT_PORT, "targetPort": "client", "protocol": "TCP"}
    peer_port = {"name": "peer", "port": PEER_PORT, "targetPort": "peer", "protocol": "TCP"}
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": peers_service(cluster),
            "namespace": namespace,
            "labels": labels(cluster),
        },
        "spec": {
            "clusterIP": "None",
            # Members must find each other before they are ready (an election needs them).
            "publishNotReadyAddresses": True,
            "selector": selector(cluster),
            # Both: the members' peer URLs and clients that address one member by name.
            "ports": [client_port, peer_port],
        },
    }
    client = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": cluster, "namespace": namespace, "labels": labels(cluster)},
        "spec": {"type": "ClusterIP", "selector": selector(cluster), "ports": [client_port]},
    }
    return [headless, client]


def pdb(cluster: str, namespace: str, voters: int, others: int = 0) -> dict[str, Any]:
    """Voluntary evictions never take the cluster below a majority of its `voters` (with 1 or
    2: none at all, as losing one would cost the quorum). The budget selects every member's
    pod, so the `others` (learners, members joining or being removed) are counted on top: the
    evictions it allows may all fall on voters."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": cluster, "namespace": namespace, "labels": labels(cluster)},
        "spec": {
            "minAvailable": majority(voters) + others,
            "selector": {"matchLabels": selector(cluster)},
        },
    }


def secret(cluster: str, namespace: str, spec: RaftClusterSpec, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": auth_secret(cluster, spec),
            "namespace": namespace,
            "labels": labels(cluster),
        },
        "type": "Opaque",
        "stringData": {"token": token},
    }
