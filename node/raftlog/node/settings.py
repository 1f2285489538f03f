"""The node's settings: one pydantic model, from flags, `RAFTLOG_` environment and a JSON file.

Precedence: command-line flags, then the environment (`RAFTLOG_NODE_ID`, `RAFTLOG_PEERS`, nested
Raft settings as `RAFTLOG_RAFT__BACKFILL_THRESHOLD`), then the file given by `--config` /
`RAFTLOG_CONFIG`, then the defaults. Everything is validated at start; an error names the field.
"""

from __future__ import annotations

import json
import os
import ssl
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from raftlog.node.core.config import RaftConfig

_config_file: ContextVar[str | None] = ContextVar("raftlog_config_file", default=None)


class NodeSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RAFTLOG_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    node_id: str = Field(description="this node's name; a key of `peers`")
    peers: dict[str, str] = Field(
        description="every member's name and base URL, this node's included, e.g. "
        '{"n1": "http://127.0.0.1:7001", ...}; on a new cluster they are the initial voters'
    )
    cluster: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        description="the cluster's name, the same on every member (the operator gives "
        "`<namespace>/<name>`): a peer that names another cluster is refused (421), so members "
        "of two clusters whose addresses and member names meet never exchange a message; the "
        "data directory keeps it, and a start naming another cluster is refused. Unset: "
        "nothing is checked",
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(
        7001,
        ge=1,
        le=65535,
        description="port of the client API (and, unless `peer_port` is set, of everything)",
    )
    peer_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="a second port for peer traffic and the admin API, so a NetworkPolicy can "
        "tell members from clients; the URLs in `peers` then name this port, and every member "
        "uses the same two ports (a leader hint swaps one for the other)",
    )
    partitions: int = Field(1, ge=1, le=1024, description="how many partitions this cluster has")
    data_dir: Path = Field(description="where the partitions' WAL, snapshots and state live")
    join: bool = Field(
        False, description="start empty and wait to be added as a learner (no bootstrap)"
    )
    tick_ms: int = Field(50, ge=5, le=5000, description="one Raft tick, in milliseconds")
    durable: bool = Field(True, description="fsync before acknowledging (off: tests only)")
    client_fast_path: bool = Field(
        True,
        description="answer single-partition appends on the client listener without aiohttp's "
        "request machinery (`server/listener.py`; about a tenth of its CPU per request); "
        "every other request there is served by aiohttp",
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop",
        description="the event loop the node runs on: uvloop (libuv; its transports and "
        "scheduling are C, not Python: a 1-client append's p50 about 10 % lower) or "
        "the standard library's asyncio loop",
    )
    auth_token_file: Path | None = Field(
        None, description="file holding the shared secret required on peer and admin calls"
    )
    insecure_no_auth: bool = Field(
        False,
        description="run without auth_token_file: anyone who reaches the node can send it Raft "
        "messages, change its members and rewrite its peer addresses (tests and demos only; "
        "shown in the log, the status and the raftlog_insecure_no_auth metric)",
    )
    tls_cert_file: Path | None = Field(None, description="serve HTTPS with this certificate")
    tls_key_file: Path | None = Field(None, description="the certificate's private key")
    tls_ca_file: Path | None = Field(
        None, description="CA bundle that peers' certificates are verified against (https peers)"
    )
    peer_client_cert_auth: bool = Field(
        False,
        description="the peer and admin listener (peer_port) admits only clients with a "
        "certificate signed by tls_ca_file (mutual TLS, as etcd's --peer-client-cert-auth), "
        "besides the bearer token; the node presents its own certificate to its peers",
    )
    max_request_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest request body")
    request_head_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="a request's head must arrive within this many seconds of its first byte, "
        "however slowly it trickles in; else 408 and the connection is closed (checked every "
        "second)",
    )
    request_body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="a request's body must arrive within this many seconds of its head (a "
        "body of max_request_bytes then needs at least that many bytes over it per second); "
        "else 408 and the connection is closed",
    )
    peer_frame_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="a peer's frame stream that holds part of a frame must complete a frame "
        "within this many seconds, else it is closed (its sender reconnects) and counted in "
        "raftlog_peer_streams_timed_out_total; a stream with no frame under way may stay idle, "
        "as a sender's does while it has nothing to send (checked every second)",
    )
    max_client_connections: int = Field(
        4096,
        ge=8,
        le=1_000_000,
        description="connections the client listener holds at once (the only listener without "
        "peer_port); one more is answered 503 and closed. The node raises its open-files limit "
        "to cover both listeners' caps where it can",
    )
    max_peer_connections: int = Field(
        1024,
        ge=8,
        le=1_000_000,
        description="connections the peer and admin listener (peer_port) holds at once, apart "
        "from the client listener's, so a full client listener leaves it answering",
    )
    max_answer_buffer_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes of large answers (reads of records, columns, WAL pages) the node "
        "holds at once until their readers' sockets take them; a read past it is answered 503 "
        "busy (retry), so slow or stalled readers cannot fill the node's memory",
    )
    max_body_buffer_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes of request bodies over 64 KiB the node holds at once, each from its "
        "head (its Content-Length, or max_request_bytes when chunked) until it is answered; a "
        "request past it is answered 503 busy before its body is read (retry), so clients "
        "sending large bodies slowly, or many at once, cannot fill the node's memory",
    )
    answer_send_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="a large answer must be taken by its reader's socket within this many "
        "seconds, else the connection is closed and its bytes let go",
    )
    max_record_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="largest key, value, and headers of a record (each; 413 beyond)",
    )
    max_records_per_append: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="most records one append may carry (413 beyond): the leader takes an "
        "append's records in one turn of its loop, and a much larger batch would hold it past "
        "its followers' election timeout",
    )
    append_timeout_s: float = Field(
        10.0, gt=0, description="how long an append waits for its commit before 503"
    )
    fsync_in_loop_below_ms: float = Field(
        5.0,
        ge=0,
        le=100,
        description="run a partition's fsync in the event loop itself (no thread handoff) "
        "while each of its last 64 fsyncs took less than this and no other partition's fsync "
        "is under way in its thread (a commit index written alone goes where a sync would); 0: "
        "always in a thread. Lower latency on a local disk; the "
        "node's loop waits for such an fsync (one slower than this sends the next 64 to the "
        "thread), and a disk that stalls without warning holds the whole node for that fsync",
    )
    segment_bytes: int = Field(
        64 * 1024 * 1024,
        ge=4096,
        description="each partition's WAL segment size (segments grow with their records; "
        "appends are made durable by the node's journal, which is allocated ahead at "
        "journal_checkpoint_bytes)",
    )
    journal_checkpoint_bytes: int = Field(
        64 * 1024 * 1024,
        ge=64 * 1024,
        description="the node's journal (one log and one fsync for all its partitions) is "
        "checkpointed once it holds this many bytes: each partition's WAL written since is "
        "fsynced and the journal before it deleted; a restart replays at most this much",
    )
    snapshot_install: Literal["auto", "operator"] = Field(
        "auto",
        description="auto: the leader has a snapshot streamed as soon as a follower needs one; "
        "operator: SnapshotRequired waits for an admin snapshot-install call (the operator's)",
    )
    snapshot_source: Literal["follower-first", "leader"] = Field(
        "follower-first",
        description="who streams a snapshot to a follower that needs one: an eligible follower "
        "(RATIS-2428), falling back to the leader; or always the leader",
    )
    archive_url: str | None = Field(
        None,
        description="continuous archive (off when unset): s3://bucket/prefix where each "
        "partition's leader uploads its sealed, committed WAL segments and its snapshots, with "
        "a manifest per partition; compaction then never removes a segment not archived yet",
    )
    archive_endpoint: str | None = Field(
        None,
        description="http(s) URL of the S3 API (a MinIO, SeaweedFS or other compatible "
        "server); unset: the provider's default (AWS S3 of archive_region)",
    )
    archive_region: str | None = Field(
        None, description="the bucket's region (unset: the client's default, us-east-1)"
    )
    archive_credentials_file: Path | None = Field(
        None,
        description="file holding the access key id and the secret (two lines, or JSON "
        '{"access_key_id", "secret_access_key"}: a mounted Kubernetes Secret); unset: '
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment. Never logged",
    )
    archive_interval_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="seconds between two archive passes of a partition (the leader uploads, "
        "every member reads the manifest for its compaction floor)",
    )
    restore_url: str | None = Field(
        None,
        description="s3://bucket/prefix of another cluster's archive: on this member's first "
        "start, each partition of restore_indexes is restored from it (the archived entries up "
        "to its index, and a snapshot there naming this cluster's voters). The object store's "
        "endpoint, region and credentials are archive_endpoint, archive_region and "
        "archive_credentials_file",
    )
    restore_indexes: dict[int, int] = Field(
        default_factory=dict,
        description="partition -> the index it is restored at (0: starts empty), resolved once "
        "for every member by whoever creates the cluster (raftctl restore plan, the operator): "
        "members must restore the same log",
    )
    raft: RaftConfig = Field(default_factory=RaftConfig)

    @field_validator("peers")
    @classmethod
    def _urls(cls, v: dict[str, str]) -> dict[str, str]:
        for name, url in v.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{name}: {url!r} is not an http(s) URL")
        return {k: u.rstrip("/") for k, u in v.items()}

    @model_validator(mode="after")
    def _self_in_peers(self) -> NodeSettings:
        if self.node_id not in self.peers:
            raise ValueError(
                f"node_id {self.node_id!r} is not among the peers {sorted(self.peers)}"
            )
        return self

    @model_validator(mode="after")
    def _auth(self) -> NodeSettings:
        if self.auth_token_file is None and not self.insecure_no_auth:
            raise ValueError(
                "auth_token_file: not set: peer and admin calls would be open to anyone who "
                "reaches this node (forged Raft messages, member and address changes); give a "
                "token file, or insecure_no_auth (--insecure-no-auth) to run without one"
            )
        if self.auth_token_file is not None and self.insecure_no_auth:
            raise ValueError("insecure_no_auth: set, but so is auth_token_file; give one of them")
        return self

    @model_validator(mode="after")
    def _two_ports(self) -> NodeSettings:
        if self.peer_port is not None and self.peer_port == self.port:
            raise ValueError(f"peer_port: {self.peer_port} is also the client port; give another")
        return self

    @model_validator(mode="after")
    def _appends_fit_frames(self) -> NodeSettings:
        # A peer frame holds up to half of max_request_bytes of messages (`transport.peers`),
        # and the peer refuses a larger one: an append must fit in that. Left unset, the bound
        # follows max_request_bytes (`raft_config`); set, it must fit.
        if (
            "max_append_bytes" in self.raft.model_fields_set
            and self.raft.max_append_bytes > self.frame_budget
        ):
            raise ValueError(
                f"raft.max_append_bytes ({self.raft.max_append_bytes}) must be at most half of "
                f"max_request_bytes ({self.max_request_bytes}): peers refuse larger frames"
            )
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> NodeSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file: give both or neither")
        for f in (self.tls_cert_file, self.tls_key_file, self.tls_ca_file):
            if f is not None and not f.is_file():
                raise ValueError(f"{f} is not a file")
        if self.peer_client_cert_auth:
            missing = [
                name
                for name in ("tls_cert_file", "tls_ca_file", "peer_port")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(
                    f"peer_client_cert_auth: needs {' and '.join(missing)} (client certificates "
                    "are asked for on the peer listener only, and checked against the CA)"
                )
        return self

    @field_validator("archive_url", "restore_url")
    @classmethod
    def _archive_url(cls, v: str | None) -> str | None:
        return None if v is None else archive_url(v)

    @field_validator("archive_endpoint")
    @classmethod
    def _archive_endpoint(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith(("http://", "https://")) or not urlsplit(v).netloc):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v.rstrip("/") if v is not None else None

    @model_validator(mode="after")
    def _archive(self) -> NodeSettings:
        given = [
            name
            for name in ("archive_endpoint", "archive_region", "archive_credentials_file")
            if getattr(self, name) is not None
        ]
        if self.archive_url is None and self.restore_url is None and given:
            raise ValueError(
                f"{given[0]}: set, but neither archive_url nor restore_url is (no object store)"
            )
        if self.restore_indexes and self.restore_url is None:
            raise ValueError("restore_indexes: set, but restore_url (where from) is not")
        if self.restore_url is not None and not self.restore_indexes:
            raise ValueError(
                "restore_indexes: required with restore_url (the index of each partition, the "
                "same on every member: `raftctl restore plan` resolves it)"
            )
        for p, i in self.restore_indexes.items():
            if not 0 <= p < self.partitions or i < 0:
                raise ValueError(
                    f"restore_indexes: partition {p} at {i}: partitions are "
                    f"0..{self.partitions - 1} and indexes non-negative"
                )
        if self.restore_url is not None and self.restore_url == self.archive_url:
            raise ValueError(
                "restore_url: the same as archive_url; a restored cluster archives to a prefix "
                "of its own (the source's history must not be written over)"
            )
        if self.archive_credentials_file is not None:
            self.archive_credentials()  # read now: a bad file stops the start, naming the field
        return self

    def archive_credentials(self) -> tuple[str, str] | None:
        """The archive's access key id and secret: from archive_credentials_file, else from
        AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, else None (the client's own lookup).
        Errors name the field, never the secret."""
        f = self.archive_credentials_file
        if f is None:
            key, secret = (
                os.environ.get("AWS_ACCESS_KEY_ID"),
                os.environ.get("AWS_SECRET_ACCESS_KEY"),
            )
            return (key, secret) if key and secret else None
        return read_credentials(f, "archive_credentials_file")

    @property
    def frame_budget(self) -> int:
        """The most message bytes a peer frame carries: half of what a peer takes
        (`max_request_bytes`), leaving room for one entry over an append's bound."""
        return self.max_request_bytes // 2

    def raft_config(self) -> RaftConfig:
        """The Raft settings in force: appends that fit in a peer frame."""
        if self.raft.max_append_bytes <= self.frame_budget:
            return self.raft
        return self.raft.model_copy(update={"max_append_bytes": self.frame_budget})

    def client_url_of(self, peer_url: str) -> str:
        """A member's client URL: its peer URL, on the client port when the ports are split."""
        if self.peer_port is None:
            return peer_url
        u = urlsplit(peer_url)
        if u.port != self.peer_port or u.hostname is None:
            return peer_url
        host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
        return urlunsplit((u.scheme, f"{host}:{self.port}", u.path, "", ""))

    def server_ssl(self, peer: bool = False) -> ssl.SSLContext | None:
        """How a listener serves HTTPS; `peer`: the peer listener, which with
        peer_client_cert_auth refuses a handshake without a certificate the CA signed."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if peer and self.peer_client_cert_auth:
            ctx.load_verify_locations(cafile=str(self.tls_ca_file))
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_ssl(self) -> ssl.SSLContext | None:
        """How this node verifies https peers (the system's CAs unless `tls_ca_file`), and the
        certificate it shows them when they ask for one (peer_client_cert_auth)."""
        if self.tls_ca_file is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.tls_ca_file))
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return ctx

    def token(self) -> str | None:
        if self.auth_token_file is None:
            return None
        token = self.auth_token_file.read_text().strip()
        if not token:
            raise ValueError(f"auth_token_file: {self.auth_token_file} is empty")
        return token

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config = _config_file.get() or os.environ.get("RAFTLOG_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config:
            sources.append(JsonConfigSettingsSource(settings_cls, json_file=config))
        return tuple(sources)


def archive_url(v: str) -> str:
    """`v` as `s3://bucket/prefix` without a slash at its end (ValueError: it is not one)."""
    u = urlsplit(v)
    if u.scheme != "s3" or not u.netloc or u.query or u.fragment:
        raise ValueError(f"{v!r} is not s3://bucket/prefix")
    return f"s3://{u.netloc}/{u.path.strip('/')}".rstrip("/")


def load_settings(flags: dict[str, Any], config_file: str | None = None) -> NodeSettings:
    """Settings from flags (already parsed, None meaning unset), environment and file."""
    if config_file and not Path(config_file).is_file():
        raise ValueError(f"config: {config_file} is not a file")
    token = _config_file.set(config_file)
    try:
        return NodeSettings(**{k: v for k, v in flags.items() if v is not None})
    finally:
        _config_file.reset(token)


def read_credentials(f: Path, field: str) -> tuple[str, str]:
    """An object store's access key id and secret from file `f` (two lines, or JSON); errors
    name `field` and the file, never the secret."""
    try:
        text = f.read_text()
    except OSError as e:
        raise ValueError(f"{field}: {f} cannot be read ({e.strerror})") from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            raise ValueError(f"{field}: {f} is not valid JSON") from None
        key = doc.get("access_key_id") if isinstance(doc, dict) else None
        secret = doc.get("secret_access_key") if isinstance(doc, dict) else None
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        key, secret = (lines[0], lines[1]) if len(lines) == 2 else (None, None)
    if not isinstance(key, str) or not isinstance(secret, str) or not key or not secret:
        raise ValueError(
            f"{field}: {f} must hold the access key id and the secret: two lines, or JSON "
            '{"access_key_id": ..., "secret_access_key": ...}'
        )
    return key, secret
