"""How a member's node is launched: its flags and environment, the same for every runtime."""

from __future__ import annotations

import json

from raftlog.operator.models import RaftClusterSpec, RaftClusterStatus

CLIENT_PORT = 7001
# Peers and the admin API on a port of their own, so a NetworkPolicy can keep clients off it.
PEER_PORT = 7002


def node_args(
    spec: RaftClusterSpec,
    name: str,
    peers: dict[str, str],
    *,
    join: bool,
    data_dir: str,
    port: int = CLIENT_PORT,
    peer_port: int | None = PEER_PORT,
    host: str = "0.0.0.0",
    token_file: str | None = None,
    cluster: str | None = None,
) -> list[str]:
    """`raftlog-node` flags of member `name` (the Raft settings travel in `node_env`).

    `peers` are peer-port URLs; without `peer_port` the node serves everything on `port`;
    `cluster` names the cluster on every peer call (`--cluster`)."""
    args = [
        "--node-id", name,
        "--peers", ",".join(f"{n}={u}" for n, u in sorted(peers.items())),
        "--host", host,
        "--port", str(port),
        "--data-dir", data_dir,
        "--partitions", str(spec.partitions),
    ]  # fmt: skip
    if peer_port is not None:
        args += ["--peer-port", str(peer_port)]
    if join:
        args.append("--join")
    if token_file is not None:
        args += ["--auth-token-file", token_file]
    if cluster is not None:
        args += ["--cluster", cluster]
    return args


def node_env(spec: RaftClusterSpec) -> dict[str, str]:
    """The Raft settings, the operator-driven snapshot installs and the archive (its
    credentials aside: each runtime gives them its own way), as `RAFTLOG_` variables."""
    env = spec.raft.node_env()
    # SnapshotRequired waits for the operator's install call, which picks the source.
    env["RAFTLOG_SNAPSHOT_INSTALL"] = "operator"
    env["RAFTLOG_SNAPSHOT_SOURCE"] = spec.snapshot_source
    env["RAFTLOG_SEGMENT_BYTES"] = str(spec.storage.segment_bytes)
    if spec.archive is not None:
        env.update(spec.archive.node_env())
    return env


def restore_env(status: RaftClusterStatus) -> dict[str, str]:
    """The restore plan (status.restore, once planned) for the members that start the cluster:
    each writes its partitions from the source's archive on its first start, at these indexes."""
    r = status.restore
    if r is None or r.state != "planned":
        return {}
    return {
        "RAFTLOG_RESTORE_URL": r.url,
        "RAFTLOG_RESTORE_INDEXES": json.dumps({str(p.partition): p.index for p in r.partitions}),
    }
