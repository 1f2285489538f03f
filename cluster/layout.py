"""Where everything lives, which versions are built, and the cluster's network plan."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "cluster"
# The running cluster's state: certificates, data, logs, pids, kubeconfig (git-ignored).
STATE = ROOT / ".cluster"
BIN = STATE / "bin"
# Built binaries and images, outside the repository and keyed by version, so that a fresh
# clone on the same machine builds nothing.
CACHE = Path(os.environ.get("RAFTLOG_CLUSTER_CACHE", Path.home() / ".cache" / "raftlog-cluster"))

KUBERNETES = "v1.33.13"
ETCD = "v3.5.21"  # the etcd server Kubernetes 1.33 is tested with (its go.mod's client)
HELM = "v3.22.0"
COREDNS = "v1.14.7"
LOCAL_PATH = "v0.0.30"
# The S3-compatible server of the tests and the local mode (not the cluster's): SeaweedFS publishes
# no tagged module, so it is pinned at one pseudo-version (weed 4.53); built only on demand.
SEAWEEDFS = "v0.0.0-20261109003541-7506e5f91cd6"

# The cluster runs in a network namespace of its own, joined to the host by a veth pair: its
# addresses are the namespace's, its iptables rules vanish with it.
NETNS = "raftlog-k8s"
HOST_VETH, NS_VETH = "rlk8s-host", "rlk8s-ns"
HOST_IP = "10.250.0.2"  # the host's end of the veth
NODE_IP = "10.250.0.1"  # the node (API server, kubelet) inside the namespace
LINK_CIDR = "10.250.0.0/30"
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
NODE_NAME = "raftlog-node"
API_PORT = 6443
ETCD_CLIENT = "http://127.0.0.1:2379"

KUBECONFIG = STATE / "kubeconfig"
