"""The operator's own settings (`RAFTLOG_OPERATOR_` environment), and its API client."""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from raftlog.operator.manifests import DEFAULT_MEMBER_URL
from raftlog.operator.models import DEFAULT_IMAGE


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAFTLOG_OPERATOR_", extra="forbid", frozen=True)

    interval_s: float = Field(
        1.0, gt=0, le=300, description="seconds between two reconcile passes of a cluster"
    )
    member_url: str = Field(
        DEFAULT_MEMBER_URL,
        description="how the operator and the members reach a member: a template over "
        "{scheme}, {member}, {cluster}, {namespace}, {port} (the peer port) and {ordinal} (the "
        "default is the headless service's DNS name; change it for another cluster domain); "
        "{scheme} is https for a cluster with spec.tlsSecretName",
    )
    default_image: str = Field(
        DEFAULT_IMAGE,
        min_length=1,
        description="the node image of a RaftCluster without spec.image (the chart sets the "
        "operator's own image)",
    )
    metrics_port: int = Field(
        8000, ge=0, le=65535, description="port of the operator's /metrics (0: none)"
    )


def api_client() -> k8s.ApiClient:
    """In a pod: its service account; elsewhere: the kubeconfig (`KUBECONFIG`)."""
    try:
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
    return k8s.ApiClient()
