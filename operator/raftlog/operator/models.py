"""The `RaftCluster` resource (`raftlog.dev/v1alpha1`): spec and status as pydantic models.

The CRD in `crds/` is generated from these models (`python -m raftlog.operator.crd`), so the
schema the API server enforces, the operator's own validation and the docs cannot drift apart.
Field names are camelCase on the wire (Kubernetes' convention) and snake case in Python; the Raft
settings keep the source documents' names (backfillThreshold, maxBackfillEntriesPerRound, ...).
A setting the members read is defined once, in the node (`RaftConfig`, `NodeSettings`), and taken
here with its default, bounds and description (`_node`); only what the operator alone reads is
defined here.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from kubernetes.utils.quantity import parse_quantity
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from raftlog.node.core.config import RaftConfig, ticks_problem
from raftlog.node.server.restore_target import parse_target
from raftlog.node.settings import NodeSettings

GROUP = "raftlog.dev"
VERSION = "v1alpha1"
KIND = "RaftCluster"
PLURAL = "raftclusters"
SHORT_NAMES = ["raft"]

# A cluster's name is part of its Services' names (`<name>`, `<name>-peers`), which must be DNS
# labels (RFC 1035) of at most 63 characters: a longer name, or one with a dot, was taken and
# then failed every pass with the API server's 422.
NAME_MAX = 63 - len("-peers")
NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE = (
    f"self.metadata.name.size() <= {NAME_MAX} && self.metadata.name.matches('{NAME_PATTERN}')"
)
NAME_MESSAGE = (
    f"metadata.name: at most {NAME_MAX} characters of a-z, 0-9 and '-', starting with a letter "
    "and ending with a letter or digit (its Services are <name> and <name>-peers, DNS labels)"
)


def name_problem(name: str) -> str | None:
    """NAME_RULE's verdict, for a manifest no API server checks (`raftctl local up`)."""
    if len(name) <= NAME_MAX and re.fullmatch(NAME_PATTERN, name):
        return None
    return NAME_MESSAGE


# Kubernetes quantities ("500m", "1Gi", "2"): checked by the schema, interpreted by Kubernetes.
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
# RFC 1123 names of objects the operator creates or refers to.
DNS_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DEFAULT_IMAGE = "ghcr.io/raftlog/raftlog:0.1.0"
# An archive's place: s3://<bucket>/<prefix>, the bucket named by S3's rules (3 to 63 lowercase
# letters, digits, dots and hyphens, a letter or digit at each end); the prefix optional.
S3_URL = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^?#]*)?$"
HTTP_URL = r"^https?://[^/?#\s]+(/[^?#\s]*)?$"
# The keys of spec.archive.credentialsSecret.
ACCESS_KEY_ID_KEY = "accessKeyId"
SECRET_ACCESS_KEY_KEY = "secretAccessKey"


def _node(model: type[BaseModel], name: str) -> FieldInfo:
    """A node setting's own field (default, bounds, description), for use in `Annotated`: the
    spec refuses what the node would refuse, and a cluster that leaves it out runs as a node."""
    return model.model_fields[name]


def _rules(*rules: dict[str, str]) -> dict[str, Any]:
    """CEL rules the API server checks on the field (the CRD's `x-kubernetes-validations`).

    A rule that names `oldSelf` is a transition rule: it runs on every update of a stored
    object (never on its creation), so it is how a field is fixed after creation. pydantic
    ignores them (the models never see the old object); `crd.py` copies them into the CRD.
    """
    return {"x-kubernetes-validations": list(rules)}


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class RaftSettings(_Model):
    """The node's Raft settings a cluster may set (the rest keep the node's defaults)."""

    # `_coherent` below, enforced by the API server too: refused at admission, not by the
    # operator's next pass. The has() guards are for the CRD's own `default: {}` of `raft`,
    # which the API server checks against the rule without filling in the fields' defaults;
    # an object's `raft` always has both (defaulted before validation).
    model_config = ConfigDict(
        json_schema_extra=_rules(
            {
                "rule": "!has(self.heartbeatTicks) || !has(self.electionTicks)"
                " || self.heartbeatTicks < self.electionTicks",
                "fieldPath": ".heartbeatTicks",
                # Not a messageExpression with both values: string(int) has no size bound, so
                # the API server's cost estimate refuses it.
                "message": "heartbeatTicks must be below electionTicks",
            }
        )
    )

    backfill_threshold: Annotated[int, _node(RaftConfig, "backfill_threshold")]
    max_backfill_entries_per_round: Annotated[
        int, _node(RaftConfig, "max_backfill_entries_per_round")
    ]
    compact_every_operations: Annotated[int, _node(RaftConfig, "compact_every_operations")]
    compact_every_bytes: Annotated[int, _node(RaftConfig, "compact_every_bytes")]
    compact_number_entries: Annotated[int, _node(RaftConfig, "compact_number_entries")]
    max_entries_per_compaction: Annotated[int, _node(RaftConfig, "max_entries_per_compaction")]
    learner_promotion_lag: Annotated[int, _node(RaftConfig, "learner_promotion_lag")]
    learner_promotion_stable_window: float = Field(
        3.0,
        gt=0,
        le=3600,
        description="Seconds the learner's lag must stay within learner_promotion_lag before "
        "the operator asks for the promotion. Read by the operator alone: a change restarts "
        "no member.",
    )
    election_ticks: Annotated[int, _node(RaftConfig, "election_ticks")]
    heartbeat_ticks: Annotated[int, _node(RaftConfig, "heartbeat_ticks")]
    tick_ms: Annotated[int, _node(NodeSettings, "tick_ms")]

    # Not passed to the members (`node_config`, `node_env`) nor part of what they are launched
    # with (`reconciler.config_hash`), so changing them rolls nobody.
    OPERATOR_ONLY: ClassVar[frozenset[str]] = frozenset({"learner_promotion_stable_window"})

    @model_validator(mode="after")
    def _coherent(self) -> RaftSettings:
        # The node's own rule, checked here so that a bad spec never reaches a pod.
        problem = ticks_problem(
            self.heartbeat_ticks, self.election_ticks, names=("heartbeatTicks", "electionTicks")
        )
        if problem:
            raise ValueError(problem)
        return self

    def _raft_fields(self) -> dict[str, Any]:
        return self.model_dump(exclude={"tick_ms", *self.OPERATOR_ONLY})

    def node_config(self) -> RaftConfig:
        """The node's `RaftConfig` these settings give (raises on an incoherent pair)."""
        return RaftConfig(**self._raft_fields())

    def node_env(self) -> dict[str, str]:
        """The node's environment for these settings (`RAFTLOG_RAFT__...`, `RAFTLOG_TICK_MS`)."""
        env = {f"RAFTLOG_RAFT__{k.upper()}": str(v) for k, v in self._raft_fields().items()}
        env["RAFTLOG_TICK_MS"] = str(self.tick_ms)
        return env


# In the CRD too: a value the API server admitted and `_quantities` refused left the
# operator unable to read the spec, so nothing was healed until someone fixed it.
def _quantity_values(schema: dict[str, Any]) -> None:
    schema["additionalProperties"] = {"type": "string", "pattern": QUANTITY}


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity ("10Gi", "500M") as a number, by the client library's rules."""
    return Decimal(parse_quantity(text))  # type: ignore[no-untyped-call]


class Resources(_Model):
    requests: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "250m", "memory": "256Mi"},
        description="Resource requests of each member's container (cpu, memory).",
        json_schema_extra=_quantity_values,
    )
    limits: dict[str, str] = Field(
        default_factory=lambda: {"memory": "1Gi"},
        description="Resource limits of each member's container.",
        json_schema_extra=_quantity_values,
    )

    @model_validator(mode="after")
    def _quantities(self) -> Resources:
        for where, values in (("requests", self.requests), ("limits", self.limits)):
            for name, q in values.items():
                if not re.match(QUANTITY, q):
                    raise ValueError(f"{where}.{name}: {q!r} is not a Kubernetes quantity")
        # The API server refuses such a pod, and only after the operator deleted the member it
        # replaces (a rolling restart): refused here, before anything is touched.
        for name in sorted(self.requests.keys() & self.limits.keys()):
            if quantity(self.limits[name]) < quantity(self.requests[name]):
                raise ValueError(
                    f"limits.{name}: {self.limits[name]} is below requests.{name} "
                    f"{self.requests[name]} (a pod's limit may not be below its request)"
                )
        return self


class Storage(_Model):
    size: str = Field(
        "1Gi",
        pattern=QUANTITY,
        description="Size of each member's volume (a quantity). Raising it expands every "
        "member's claim, without a restart, where the StorageClass allows volume expansion "
        "(status.problems says so where it does not); a volume never shrinks (a size below "
        "a member's volume is listed in status.problems: a member made then would get it).",
    )
    storage_class_name: str | None = Field(
        None,
        description="Storage class of the members' volumes (the cluster default if unset); "
        "fixed after creation.",
    )
    segment_bytes: Annotated[
        int,
        _node(NodeSettings, "segment_bytes"),
        # The node's default and bounds; this text adds what a volume must hold.
        Field(
            description="Size of a partition's WAL segment; compaction removes whole segments "
            "behind a snapshot. Segments grow with their records; each member's journal (one for "
            "all its partitions) is allocated ahead, at 64 MiB, so size the volume for the "
            "retained log and snapshots of every partition plus about 130 MiB."
        ),
    ]
    reclaim_policy: Literal["Delete", "Retain"] = Field(
        "Delete",
        description="What happens to a member's volume when the member is removed or the "
        "cluster deleted: Delete removes it, Retain keeps it. Retain may become Delete after "
        "creation, Delete may not become Retain.",
        # Under Delete the operator makes the RaftCluster own each volume it creates (owner
        # references), so the garbage collector deletes them with it whatever the policy says by
        # then: a later Retain would not keep them. Retain to Delete is safe (the operator then
        # deletes the unowned volumes by name).
        json_schema_extra=_rules(
            {
                "rule": "self == oldSelf || self == 'Delete'",
                "message": "reclaimPolicy cannot change from Delete to Retain after creation: "
                "the volumes already created are owned by the RaftCluster and would still be "
                "deleted with it",
            }
        ),
    )


class PodTemplate(_Model):
    """Overrides applied to every member's pod."""

    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Pod tolerations, as in a Pod spec."
    )
    affinity: dict[str, Any] | None = Field(None, description="Pod affinity, as in a Pod spec.")
    priority_class_name: str | None = Field(None, description="Pod priorityClassName.")
    service_account_name: str | None = Field(None, description="Pod serviceAccountName.")


def check_s3_url(v: str) -> str:
    """The node's own check (`NodeSettings.archive_url`) and a bucket name S3 accepts."""
    u = urlsplit(v)
    if u.scheme != "s3" or u.query or u.fragment or not re.match(S3_URL, v):
        raise ValueError(
            f"{v!r} is not s3://bucket/prefix (a bucket of 3 to 63 lowercase letters, "
            "digits, dots and hyphens; no query)"
        )
    return v


class ArchiveSpec(_Model):
    """Continuous archive to S3-compatible object storage: each partition's leader uploads its
    committed WAL segments and its snapshots, with a manifest per partition; compaction never
    removes what is not archived yet (the node's `archive_*` settings)."""

    url: str = Field(
        description="Where the partitions' archives go: s3://bucket/prefix (each partition "
        "under <prefix>/p<N>/). The bucket must exist.",
        json_schema_extra={"pattern": S3_URL},
    )
    endpoint: str | None = Field(
        None,
        description="http(s) URL of the S3 API (MinIO, SeaweedFS, ...); unset: AWS S3.",
        json_schema_extra={"pattern": HTTP_URL},
    )
    region: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The bucket's region; unset: us-east-1.",
    )
    credentials_secret: str | None = Field(
        None,
        pattern=DNS_NAME,
        description=f"Secret in the cluster's namespace with the keys `{ACCESS_KEY_ID_KEY}` and "
        f"`{SECRET_ACCESS_KEY_KEY}`, given to every member; the operator reads it only to "
        "plan a restore and to record backups; "
        "unset: the members use no credentials of the operator's (the S3 client's own lookup, "
        "e.g. a pod identity).",
    )
    interval_seconds: Annotated[
        float,
        _node(NodeSettings, "archive_interval_s"),
        Field(
            description="Seconds between two archive passes of a partition (its leader uploads "
            "what is new; every member reads the manifest, which bounds its compaction)."
        ),
    ]

    backup_interval_minutes: int | None = Field(
        None,
        ge=5,
        le=525_600,
        description="Take a backup (a point every partition is archived up to, recorded in the "
        "archive as backups/scheduled-<time>.json) this often; unset: only on request "
        "(the raftlog.dev/backup annotation, `kubectl raft backup`).",
    )

    @field_validator("url")
    @classmethod
    def _s3_url(cls, v: str) -> str:
        return check_s3_url(v)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and (not re.match(HTTP_URL, v) or not urlsplit(v).netloc):
            raise ValueError(f"{v!r} is not an http(s) URL (e.g. https://s3.example.com)")
        return v

    @property
    def bucket(self) -> str:
        return urlsplit(self.url).netloc

    def node_env(self) -> dict[str, str]:
        """The node's archive settings (`RAFTLOG_ARCHIVE_*`); the credentials are the
        runtime's to give (a Secret's keys on Kubernetes, a file locally)."""
        env = {
            "RAFTLOG_ARCHIVE_URL": self.url,
            "RAFTLOG_ARCHIVE_INTERVAL_S": str(self.interval_seconds),
        }
        if self.endpoint is not None:
            env["RAFTLOG_ARCHIVE_ENDPOINT"] = self.endpoint
        if self.region is not None:
            env["RAFTLOG_ARCHIVE_REGION"] = self.region
        return env


class RestoreSpec(_Model):
    """Create the cluster from another cluster's archive: every partition comes back at the
    index the target resolves to (once, before the first member starts; status.restore says
    which), with every archived record up to it and none after."""

    url: str = Field(
        description="The source's archive: s3://bucket/prefix (its spec.archive.url). Read "
        "through this cluster's spec.archive endpoint, region and credentials.",
        json_schema_extra={"pattern": S3_URL},
    )
    target: str = Field(
        "latest",
        description="latest (what the archive holds), index:N (every partition), "
        "index:P=N,P=N (per partition), time:<RFC 3339 time with a zone, or epoch ms> (each "
        "partition up to its first record stamped after it), or backup:<name>.",
    )

    @field_validator("url")
    @classmethod
    def _s3_url(cls, v: str) -> str:
        return check_s3_url(v)

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        parse_target(v)  # its error names what is wrong
        return v


class RaftClusterSpec(_Model):
    # Refused at admission too (`_tls_for_cert_auth`): without the secret there is no CA to
    # check the members' certificates against, nor a certificate to show.
    model_config = ConfigDict(
        json_schema_extra=_rules(
            {
                "rule": "!has(self.peerClientCertAuth) || !self.peerClientCertAuth"
                " || has(self.tlsSecretName)",
                "fieldPath": ".peerClientCertAuth",
                "message": "peerClientCertAuth needs tlsSecretName (the CA that signs the "
                "members' certificates)",
            },
            # A member's token and TLS are its pod's: a new secret reached no member before
            # the operator's calls failed with it (401, or the other scheme), and with no
            # member answering, the rolling restart that would carry it never came.
            *(
                {
                    "rule": f"has(self.{field}) == has(oldSelf.{field})"
                    f" && (!has(self.{field}) || self.{field} == oldSelf.{field})",
                    "fieldPath": f".{field}",
                    "message": f"{field} cannot change after creation: {why}",
                }
                for field, why in (
                    ("authSecretName", "members keep the token they were made with"),
                    ("tlsSecretName", "members keep the scheme and CA they were made with"),
                )
            ),
            {
                "rule": "!has(self.restore) || has(self.archive)",
                "fieldPath": ".restore",
                "message": "restore needs archive (the object store to read through, and "
                "where the restored cluster archives from then on)",
            },
            {
                # As the models compare them (`rstrip("/")`): the same url with a trailing
                # slash on either side is the same prefix.
                "rule": "!has(self.restore) || !has(self.archive)"
                " || (self.restore.url != self.archive.url"
                " && self.restore.url != self.archive.url + '/'"
                " && self.restore.url + '/' != self.archive.url)",
                "fieldPath": ".restore.url",
                "message": "restore.url is archive.url: the restored cluster archives to a url "
                "of its own",
            },
        )
    )

    replicas: int = Field(3, ge=1, le=15, description="Voting members of every partition.")
    partitions: int = Field(
        1,
        ge=1,
        le=1024,
        description="Partitions (independent Raft groups). May be raised: the members restart "
        "one at a time with the new count and the new partitions start empty; never lowered.",
        # Every member is launched with `--partitions` and keeps one Raft group (its WAL,
        # snapshots and membership) per partition on its volume: fewer would drop groups with
        # their records; the operator neither splits nor merges them.
        json_schema_extra=_rules(
            {
                "rule": "self >= oldSelf",
                "message": "partitions cannot be lowered: each member keeps one Raft group, "
                "with its records, per partition on its volume",
            }
        ),
    )
    image: str | None = Field(
        None,
        min_length=1,
        description="The node image; unset: the operator's default image (the chart sets it to "
        "the operator's own image, so members follow a chart upgrade).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Pull policy of the node image."
    )
    resources: Resources = Field(default_factory=Resources, description="Container resources.")
    storage: Storage = Field(
        default_factory=Storage,
        description="Each member's volume.",
        # On the object, not on storageClassName: a transition rule on an optional field runs
        # only when both versions have it, and unset -> set must be refused too. A PVC's class
        # is immutable and the operator never moves a member's data to another volume, so a new
        # class would only reach members created later.
        json_schema_extra=_rules(
            {
                "rule": "has(self.storageClassName) == has(oldSelf.storageClassName)"
                " && (!has(self.storageClassName)"
                " || self.storageClassName == oldSelf.storageClassName)",
                "fieldPath": ".storageClassName",
                "message": "storageClassName cannot change after creation: the members' volumes "
                "keep the class they were created with",
            }
        ),
    )
    raft: RaftSettings = Field(default_factory=RaftSettings, description="Raft settings.")
    snapshot_source: Annotated[
        Literal["follower-first", "leader"],
        _node(NodeSettings, "snapshot_source"),
        Field(
            description="Who streams a snapshot to a member in SnapshotRequired: an eligible, "
            "ranked follower (RATIS-2428) with the leader as fallback, or always the leader."
        ),
    ]
    auth_secret_name: str | None = Field(
        None,
        pattern=DNS_NAME,
        description="Secret (key `token`) holding the peer and admin token; generated if unset. "
        "Fixed after creation (the token cannot be rotated yet).",
    )
    tls_secret_name: str | None = Field(
        None,
        pattern=DNS_NAME,
        description="Secret of type kubernetes.io/tls (with `ca.crt`): members serve and verify "
        "https when set. Fixed after creation.",
    )
    peer_client_cert_auth: bool = Field(
        False,
        description="Members admit on their peer port (Raft traffic, snapshots, the admin API) "
        "only clients showing a certificate signed by the CA of tlsSecretName, besides the "
        "token (mutual TLS, as etcd's --peer-client-cert-auth). The secret's certificate must "
        "allow client authentication too: members and the operator show it.",
    )
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate, description="Overrides of the members' pods."
    )
    fenced_members: list[Annotated[str, Field(pattern=DNS_NAME)]] = Field(
        default_factory=list,
        description="Members that must not serve (as CloudNativePG's fencedInstances): each "
        "gives its leaderships away, then its pod is stopped and not made again; its volume and "
        "its place in every partition stay. Refused for now (the reason in status.lastAction and "
        "the Progressing condition) while it would leave a partition without a ready majority. "
        "Taking a name out brings the member back on its data.",
    )
    hibernate: bool = Field(
        False,
        description="Stop every member's pod and keep the volumes; false again brings the "
        "cluster back as it was (same members, same data).",
    )
    remove_members: list[Annotated[str, Field(pattern=DNS_NAME)]] = Field(
        default_factory=list,
        description="The members a lower `replicas` removes first, instead of the highest "
        "ordinals. Raising `replicas` back before a removal reached any partition cancels it.",
    )
    archive: ArchiveSpec | None = Field(
        None,
        description="Continuous archive of every partition to S3-compatible object storage "
        "(off when unset). A change restarts the members one at a time (but for "
        "backupIntervalMinutes alone: the operator's schedule). status.archive shows "
        "each partition's archived index and lag; an archive that fails (the store down, "
        "refused credentials) is named in status.problems while appends go on and compaction "
        "waits for it.",
    )

    restore: RestoreSpec | None = Field(
        None,
        description="Create the cluster from another cluster's archive (a restore, to the "
        "latest archived index, an index, a time or a backup). Needs spec.archive (the object "
        "store, and where this cluster archives from then on: another url). Read only when the "
        "cluster is created; status.restore says where each partition came back.",
    )

    @model_validator(mode="after")
    def _restore_needs_archive(self) -> RaftClusterSpec:
        if self.restore is None:
            return self
        if self.archive is None:
            raise ValueError(
                "restore: needs archive (the object store to read through, and where the "
                "restored cluster archives from then on)"
            )
        if self.archive.url.rstrip("/") == self.restore.url.rstrip("/"):
            raise ValueError(
                "restore.url: the same as archive.url; the restored cluster archives to a url "
                "of its own (the source's history is never written over)"
            )
        return self

    @model_validator(mode="after")
    def _tls_for_cert_auth(self) -> RaftClusterSpec:
        if self.peer_client_cert_auth and self.tls_secret_name is None:
            raise ValueError(
                "peerClientCertAuth: needs tlsSecretName (the CA that signs the members' "
                "certificates)"
            )
        return self

    def with_image(self, default_image: str) -> RaftClusterSpec:
        """This spec with `image` resolved: its own, or the operator's default."""
        return self if self.image else self.model_copy(update={"image": default_image})


# ----------------------------------------------------------------------------- status


class _Status(BaseModel):
    """Status parts: written by the operator (mutable while a pass builds the next status)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(_Status):
    type: Literal["Available", "Progressing", "Degraded", "Paused", "Hibernated"]
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="One CamelCase word: why the condition is what it is.")
    message: str = ""
    last_transition_time: str = Field(description="RFC 3339 time of the last status change.")


class MemberPartition(_Status):
    partition: int
    lag: int | None = Field(None, description="Leader's commit minus this member's match.")
    state: str | None = Field(None, description="Progress state: probe, replicate or snapshot.")
    snapshot_required: bool = False


class Promotion(_Status):
    """A learner's promotion window: its lag must stay within the limit for the whole window."""

    window_started_at: float | None = Field(
        None, description="Epoch seconds the current window began; null while it lags."
    )
    window_seconds: float = Field(description="The window's length (learnerPromotionStableWindow).")
    elapsed_seconds: float = 0.0
    restarts: int = Field(0, description="Times a lag excursion restarted the window.")
    max_lag: int | None = Field(None, description="The learner's largest lag over its partitions.")
    sampled_at: float | None = Field(
        None, description="Epoch seconds of the last pass that saw the learner's lag."
    )


MemberRole = Literal["voter", "learner", "joining", "removing"]


class MemberStatus(_Status):
    name: str
    ordinal: int
    role: MemberRole = Field(
        description="voter; learner (added, waiting for its promotion window); joining "
        "(created, being added as a learner); removing (being taken out of the cluster)."
    )
    bootstrap: bool = Field(False, description="One of the initial voters.")
    ready: bool = Field(
        False,
        description="Its node runs, answers, and knows a leader of every partition (what its "
        "pod's readiness probe says).",
    )
    partitions: list[MemberPartition] = Field(default_factory=list)
    promotion: Promotion | None = None
    fenced: bool = Field(False, description="Listed in spec.fencedMembers and stopped.")
    pod_deleted: bool = Field(
        False,
        description="The operator deleted its pod (a restart, fencing, hibernation, a removal) "
        "or is about to, and has not made it again yet.",
    )


class SnapshotInstall(_Status):
    member: str
    partition: int
    source: str = Field(description='The member that streams the snapshot, or "leader".')
    state: Literal["pending", "installed", "failed"] = "pending"
    attempts: int = 0
    next_attempt_at: float = 0.0
    started_at: float
    finished_at: float | None = None
    last_error: str | None = None
    detail: str | None = None
    bytes_done: int | None = Field(
        None,
        description="Bytes of the snapshot the member holds, as its source last reported while "
        "streaming it (every few seconds; null until the first report).",
    )
    bytes_total: int | None = Field(
        None, description="The snapshot's size in bytes, as its source reported it."
    )


class Switchover(_Status):
    request: str = Field(description="The raftlog.dev/switchover value this is about.")
    target: str
    partitions: list[int] | None = Field(None, description="null: every partition.")
    state: Literal["pending", "done", "failed"] = "pending"
    message: str = ""
    started_at: float
    finished_at: float | None = None


class VolumeExpansion(_Status):
    size: str = Field(description="The spec.storage.size asked of every member's volume.")
    state: Literal["requested", "done", "failed"]
    at: float = Field(description="Epoch seconds of the latest request or refusal.")
    message: str = ""


class PartitionArchive(_Status):
    partition: int
    archived_index: int = Field(
        description="Highest index archived contiguously (0: nothing yet), as the partition's "
        "leader reports it. The WAL segment being written is archived once it is sealed."
    )
    lag_entries: int = Field(description="The leader's commit index minus archivedIndex.")
    last_error: str | None = Field(
        None, description="Why the last archive pass failed (null: it succeeded)."
    )
    failing_on: list[str] = Field(
        default_factory=list,
        description="Members whose last archive pass of this partition failed (the leader's "
        "error is lastError; a follower's failing pass holds its compaction).",
    )
    last_upload_at: float | None = Field(None, description="Epoch seconds of the last upload.")
    reported_by: str = Field(description="The member that reported it (the leader).")


class ArchiveStatus(_Status):
    url: str = Field(description="The spec.archive.url this is about.")
    partitions: list[PartitionArchive] = Field(default_factory=list)


class PartitionIndex(_Status):
    partition: int
    index: int


class RestoreStatus(_Status):
    url: str = Field(description="The spec.restore.url read.")
    target: str = Field(description="The spec.restore.target resolved.")
    state: Literal["planning", "planned", "failed"]
    partitions: list[PartitionIndex] = Field(
        default_factory=list,
        description="The index each partition comes back at (0: nothing archived, it starts "
        "empty); every member is given these.",
    )
    message: str | None = Field(None, description="Why the plan failed.")
    at: float | None = Field(None, description="Epoch seconds of the plan or the failure.")


class BackupStatus(_Status):
    name: str
    scheduled: bool = Field(False, description="Taken by spec.archive.backupIntervalMinutes.")
    state: Literal["pending", "done", "failed"]
    requested_at: float
    finished_at: float | None = None
    partitions: list[PartitionIndex] = Field(
        default_factory=list, description="The index each partition is archived up to."
    )
    message: str | None = Field(None, description="Why it failed.")


class RaftClusterStatus(_Status):
    observed_generation: int | None = None
    phase: str = Field("Pending", description="Pending, Bootstrapping, Running, Scaling, ...")
    replicas: int = Field(0, description="Members (for the scale subresource).")
    ready_replicas: int = 0
    selector: str = Field("", description="Label selector of the members' pods.")
    leaders: dict[str, str] = Field(
        default_factory=dict, description="Leader of each partition (its number as a string)."
    )
    leader_summary: str = Field("", description="The leaders, compactly (printer column).")
    bootstrapped: bool = Field(False, description="Every partition of the initial voters elected.")
    next_ordinal: int = 0
    members: list[MemberStatus] = Field(default_factory=list)
    snapshot_installs: list[SnapshotInstall] = Field(
        default_factory=list, description="Pending installs, then the most recent finished ones."
    )
    conditions: list[Condition] = Field(default_factory=list)
    last_action: str = Field("", description="The operator's most recent step.")
    restarted_at: str | None = Field(
        None,
        description="The raftlog.dev/restartedAt value every member has been restarted for.",
    )
    switchover: Switchover | None = Field(
        None, description="The latest raftlog.dev/switchover request and how it went."
    )
    volume_expansion: VolumeExpansion | None = Field(
        None, description="The latest volume expansion (spec.storage.size raised)."
    )
    archive: ArchiveStatus | None = Field(
        None, description="Each partition's continuous archive (spec.archive); null when off."
    )
    restore: RestoreStatus | None = Field(
        None, description="Where each partition came back (spec.restore); null when not restored."
    )
    backups: list[BackupStatus] = Field(
        default_factory=list, description="The most recent backups, oldest first."
    )
    backup_request: str | None = Field(
        None,
        description="The raftlog.dev/backup value last acted on: the same value is never "
        "taken again, even once its entry has left status.backups.",
    )
    problems: list[str] = Field(
        default_factory=list,
        description="What the operator was asked and cannot act on, and an archive that fails, "
        "each with the reason.",
    )

    def member(self, name: str) -> MemberStatus | None:
        return next((m for m in self.members if m.name == name), None)
