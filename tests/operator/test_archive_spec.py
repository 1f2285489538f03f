"""`spec.archive` (issue 21): validation naming the field, the node settings and the Secret every
member gets, the launch hash, and `status.archive` / `status.problems` from the nodes' archive
status, shown by `kubectl raft status`. No I/O; on real processes and a real S3 server:
tests/s3/test_local_archive.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from pydantic import ValidationError
from tests.operator.test_crd import validator
from tests.operator.test_reconciler import NAME, T0, World, spec

from raftlog.node.settings import NodeSettings
from raftlog.operator import manifests, raftview
from raftlog.operator.cluster_views import ArchiveView, Observed, parse_node_status
from raftlog.operator.local import LocalRuntime
from raftlog.operator.models import MemberStatus, RaftClusterSpec, RaftClusterStatus
from raftlog.operator.node_launch import node_env
from raftlog.operator.reconciler import config_hash, decide

URL = "s3://raft-archive/orders"
ARCHIVE = {
    "url": URL,
    "endpoint": "https://s3.example.com",
    "region": "eu-west-1",
    "credentialsSecret": "orders-s3",
    "intervalSeconds": 5,
}
# config_hash of a spec without archive before spec.archive existed: members of clusters that
# do not archive are not rolled by an operator upgrade.
HASH_BEFORE_ARCHIVE = "e4d50f77cbb3b620"

BAD = [
    ({"url": "http://raft-archive/x"}, "url", "is not s3://bucket/prefix"),
    ({"url": "s3://Raft_Archive/x"}, "url", "is not s3://bucket/prefix"),
    ({"url": "s3://ab/x"}, "url", "is not s3://bucket/prefix"),  # a bucket has 3 or more
    ({"url": "s3:///prefix"}, "url", "is not s3://bucket/prefix"),
    ({"url": "s3://raft-archive/x?versionId=1"}, "url", "is not s3://bucket/prefix"),
    ({"url": URL, "endpoint": "s3.example.com:9000"}, "endpoint", "is not an http(s) URL"),
    ({"url": URL, "endpoint": "ftp://s3.example.com"}, "endpoint", "is not an http(s) URL"),
    ({"url": URL, "region": ""}, "region", "at least 1 character"),
    ({"url": URL, "region": "eu west"}, "region", "should match pattern"),
    ({"url": URL, "credentialsSecret": "S3_Creds"}, "credentialsSecret", "should match pattern"),
    ({"url": URL, "intervalSeconds": 0}, "intervalSeconds", "greater than 0"),
    ({"url": URL, "intervalSeconds": 7200}, "intervalSeconds", "less than or equal to 3600"),
    ({"url": URL, "bucket": "x"}, "bucket", "Extra inputs are not permitted"),
    ({}, "url", "Field required"),
]


@pytest.mark.parametrize("archive, field, reason", BAD)
def test_a_bad_archive_is_refused_by_the_models_naming_the_field(archive, field, reason):
    with pytest.raises(ValidationError) as e:
        RaftClusterSpec.model_validate({"archive": archive})
    err = e.value.errors()[0]
    assert ".".join(str(p) for p in err["loc"]) == f"archive.{field}"
    assert reason in err["msg"], err["msg"]


@pytest.mark.parametrize("archive, field, reason", [b for b in BAD if b[1] != "bucket"])
def test_a_bad_archive_is_refused_by_the_crd_schema_too(archive, field, reason):
    with pytest.raises(jsonschema.ValidationError) as e:
        validator().validate({"archive": archive})
    where = ".".join(str(p) for p in e.value.absolute_path)
    assert where in (f"archive.{field}", "archive"), where  # `required` names the object


@pytest.mark.parametrize(
    "url", ["s3://raft-archive", "s3://raft-archive/", "s3://raft.archive/a/b/c", "s3://abc/x-1"]
)
def test_what_the_spec_accepts_the_node_accepts(url, tmp_path, monkeypatch):
    archive = RaftClusterSpec.model_validate({"archive": {**ARCHIVE, "url": url}}).archive
    assert archive is not None
    validator().validate({"archive": {**ARCHIVE, "url": url}})
    for k, v in archive.node_env().items():
        monkeypatch.setenv(k, v)
    node = NodeSettings(
        node_id="a", peers={"a": "http://a:7002"}, data_dir=tmp_path, insecure_no_auth=True
    )
    assert node.archive_url == url.rstrip("/")
    assert node.archive_endpoint == "https://s3.example.com"
    assert node.archive_region == "eu-west-1" and node.archive_interval_s == 5


def test_every_member_gets_the_archive_settings_and_the_secrets_keys():
    s = RaftClusterSpec.model_validate({"archive": ARCHIVE})
    env = node_env(s)
    assert {k: v for k, v in env.items() if k.startswith("RAFTLOG_ARCHIVE_")} == {
        "RAFTLOG_ARCHIVE_URL": URL,
        "RAFTLOG_ARCHIVE_ENDPOINT": "https://s3.example.com",
        "RAFTLOG_ARCHIVE_REGION": "eu-west-1",
        "RAFTLOG_ARCHIVE_INTERVAL_S": "5.0",
    }
    pod = manifests.pod(s, "c", "ns", "c-0", {"c-0": "http://c-0:7002"}, join=False,
                        config_hash=config_hash(s))  # fmt: skip
    container = pod["spec"]["containers"][0]
    by_name = {e["name"]: e for e in container["env"]}
    assert by_name["RAFTLOG_ARCHIVE_URL"]["value"] == URL
    # The Secret reaches the node as the variables it reads when it has no credentials file;
    # the kubelet reads it (the operator never does), and a missing key keeps the pod waiting.
    assert by_name["AWS_ACCESS_KEY_ID"]["valueFrom"] == {
        "secretKeyRef": {"name": "orders-s3", "key": "accessKeyId"}
    }
    assert by_name["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "orders-s3", "key": "secretAccessKey"}
    }
    assert "--archive-credentials-file" not in container["args"]
    for version in ("1.28", "1.37"):
        kubernetes_validate.validate(pod, version, strict=True)


def test_without_a_secret_or_an_archive_nothing_of_it_reaches_a_member():
    bare = RaftClusterSpec.model_validate({"archive": {"url": URL}})
    env = node_env(bare)
    assert env["RAFTLOG_ARCHIVE_URL"] == URL and env["RAFTLOG_ARCHIVE_INTERVAL_S"] == "10.0"
    assert "RAFTLOG_ARCHIVE_ENDPOINT" not in env and "RAFTLOG_ARCHIVE_REGION" not in env
    pod = manifests.pod(bare, "c", "ns", "c-0", {}, join=False, config_hash="h")
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert "AWS_ACCESS_KEY_ID" not in names and "AWS_SECRET_ACCESS_KEY" not in names
    off = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")
    assert not any(e["name"].startswith(("RAFTLOG_ARCHIVE", "AWS_"))
                   for e in off["spec"]["containers"][0]["env"])  # fmt: skip


def test_an_endpoint_without_a_region_reaches_the_members_alone() -> None:
    # Each optional setting travels on its own (a MinIO endpoint needs no region).
    minio = {"url": URL, "endpoint": "http://minio:9000"}
    env = node_env(RaftClusterSpec.model_validate({"archive": minio}))
    assert env["RAFTLOG_ARCHIVE_ENDPOINT"] == "http://minio:9000"
    assert "RAFTLOG_ARCHIVE_REGION" not in env


def test_an_archive_change_rolls_the_members_and_none_leaves_the_hash_as_it_was():
    assert config_hash(RaftClusterSpec()) == HASH_BEFORE_ARCHIVE
    base = config_hash(RaftClusterSpec.model_validate({"archive": ARCHIVE}))
    assert base != HASH_BEFORE_ARCHIVE
    for field, value in [
        ("url", "s3://raft-archive/other"),
        ("endpoint", "https://minio.example.com"),
        ("region", "us-east-2"),
        ("credentialsSecret", "other-s3"),
        ("intervalSeconds", 30),
    ]:
        changed = RaftClusterSpec.model_validate({"archive": {**ARCHIVE, field: value}})
        assert config_hash(changed) != base, field


def test_the_nodes_archive_status_is_read():
    body = {
        "node": "c-0",
        "partitions": [
            {
                "partition": 0, "role": "leader", "member": "voter", "term": 2, "leader": "c-0",
                "high_water_mark": 90, "compaction_floor": 1, "voters": ["c-0"], "learners": [],
                "archive": {"archived_index": 64, "lag_entries": 26, "last_error": None,
                            "last_upload_at": 1.5},
            },
            {
                "partition": 1, "role": "leader", "member": "voter", "term": 2, "leader": "c-0",
                "high_water_mark": 9, "compaction_floor": 1, "voters": ["c-0"], "learners": [],
            },
        ],
    }  # fmt: skip
    view = parse_node_status(body)
    assert view.partitions[0].archive == ArchiveView(64, 26, None, 1.5)
    assert view.partitions[1].archive is None  # a node that does not archive


# ----------------------------------------------------------------------------- status


def archiving(world: World, errors: dict[tuple[str, int], str] | None = None) -> Observed:
    """What `world` shows, each member archiving each partition (archived 60 of 100)."""
    observed = world.observed()
    members = {}
    for name, seen in observed.members.items():
        if seen.node is not None:
            parts = {
                p: dataclasses.replace(
                    v, archive=ArchiveView(60, 40, (errors or {}).get((name, p)), T0 - 5)
                )
                for p, v in seen.node.partitions.items()
            }
            seen = dataclasses.replace(seen, node=dataclasses.replace(seen.node, partitions=parts))
        members[name] = seen
    return Observed(members, observed.urls)


def steady(names: list[str]) -> RaftClusterStatus:
    return RaftClusterStatus(
        bootstrapped=True,
        next_ordinal=len(names),
        members=[
            MemberStatus(name=n, ordinal=i, role="voter", bootstrap=True)
            for i, n in enumerate(names)
        ],
    )


def archive_spec(**kw: Any) -> RaftClusterSpec:
    return spec(archive={"url": URL, "credentialsSecret": "orders-s3"}, **kw)


NAMES = ["c-0", "c-1", "c-2"]


def test_status_archive_is_each_partitions_leaders_report():
    world = World(NAMES)
    world.leader[1] = "c-1"
    s = archive_spec()
    plan = decide(NAME, s, steady(NAMES), archiving(world), T0)
    archive = plan.status.archive
    assert archive is not None and archive.url == URL
    got = [
        (a.partition, a.archived_index, a.lag_entries, a.reported_by, a.last_error)
        for a in archive.partitions
    ]
    assert got == [(0, 60, 40, "c-0", None), (1, 60, 40, "c-1", None)]
    assert plan.status.problems == []
    assert plan.status.phase == "Running"
    # Without spec.archive: none.
    off = decide(NAME, spec(), plan.status, archiving(world), T0 + 1)
    assert off.status.archive is None


def test_a_failing_archive_is_a_problem_naming_the_partition_and_the_error_until_it_works():
    world = World(NAMES)
    s = archive_spec()
    first = decide(NAME, s, steady(NAMES), archiving(world), T0).status
    error = "GenericError: Generic S3 error: error sending request: Connection refused"
    down = {(n, 0): error for n in NAMES}
    plan = decide(NAME, s, first, archiving(world, down), T0 + 1)
    st = plan.status
    assert st.problems == [f"spec.archive: partition 0: archiving fails on c-0, c-1, c-2: {error}"]
    entry = st.archive.partitions[0] if st.archive else None
    assert entry is not None and entry.last_error == error and entry.failing_on == NAMES
    assert st.archive is not None and st.archive.partitions[1].last_error is None
    degraded = next(c for c in st.conditions if c.type == "Degraded")
    assert degraded.status == "True" and degraded.reason == "ArchiveFailing"
    assert "partition 0" in degraded.message and error in degraded.message
    assert st.phase == "Degraded"
    # Available: appends go on while the store is down.
    assert next(c for c in st.conditions if c.type == "Available").status == "True"
    assert [e.reason for e in plan.events] == ["ArchiveFailing"]
    # Still failing: no second event.
    again = decide(NAME, s, st, archiving(world, down), T0 + 2)
    assert "ArchiveFailing" not in [e.reason for e in again.events]
    assert again.status.problems == st.problems
    # Back: the problem goes, with an event.
    back = decide(NAME, s, again.status, archiving(world), T0 + 3)
    assert back.status.problems == [] and back.status.phase == "Running"
    assert [e.reason for e in back.events] == ["ArchiveRecovered"]
    degraded = next(c for c in back.status.conditions if c.type == "Degraded")
    assert degraded.status == "False"


def test_a_follower_that_cannot_read_the_manifest_is_named_too():
    world = World(NAMES)
    plan = decide(NAME, archive_spec(), steady(NAMES),
                  archiving(world, {("c-2", 1): "PermissionDeniedError: 403"}), T0)  # fmt: skip
    assert plan.status.problems == [
        "spec.archive: partition 1: archiving fails on c-2: PermissionDeniedError: 403"
    ]
    entry = plan.status.archive.partitions[1] if plan.status.archive else None
    assert entry is not None and entry.last_error is None and entry.failing_on == ["c-2"]


def test_many_failing_partitions_are_summed_up_and_long_errors_cut():
    names = NAMES
    world = World(names, partitions=8)
    long = "x" * 450
    down = {(n, p): long for n in names for p in range(8)}
    st = steady(names)
    plan = decide(NAME, archive_spec(partitions=8), st, archiving(world, down), T0)
    assert len(plan.status.problems) == 6
    assert plan.status.problems[-1] == "spec.archive: 3 more partitions fail to archive (5, 6, 7)"
    assert all(len(p) < 300 for p in plan.status.problems)


def test_a_partition_without_a_leader_keeps_its_last_entry():
    world = World(NAMES)
    s = archive_spec()
    first = decide(NAME, s, steady(NAMES), archiving(world), T0).status
    world.leader[1] = None
    plan = decide(NAME, s, first, archiving(world), T0 + 1)
    assert plan.status.archive is not None
    assert [a.partition for a in plan.status.archive.partitions] == [0, 1]
    assert plan.status.archive.partitions[1].reported_by == "c-0"


# ----------------------------------------------------------------------------- kubectl raft


def resource(status: RaftClusterStatus, archive: dict[str, Any] | None) -> dict[str, Any]:
    spec_doc: dict[str, Any] = {"replicas": 3, "partitions": 2}
    if archive is not None:
        spec_doc["archive"] = archive
    return {
        "metadata": {"name": "orders", "namespace": "ns", "generation": 1},
        "spec": spec_doc,
        "status": status.model_dump(mode="json", by_alias=True),
    }


def test_kubectl_raft_status_shows_the_archive():
    world = World(NAMES)
    s = archive_spec()
    error = "GenericError: Generic S3 error: error sending request: Connection refused"
    st = decide(NAME, s, steady(NAMES), archiving(world, {("c-0", 0): error}), T0).status
    v = raftview.view(resource(st, {"url": URL}))
    assert v["archive"]["url"] == URL
    assert v["archive"]["partitions"][0] == {
        "partition": 0, "archivedIndex": 60, "lagEntries": 40, "lastError": error,
        "failingOn": ["c-0"], "lastUploadAt": T0 - 5, "reportedBy": "c-0",
    }  # fmt: skip
    text = raftview.render(v)
    assert f"Archive to {URL}:" in text
    lines = text.splitlines()
    header = lines.index(f"Archive to {URL}:") + 1
    assert lines[header].split() == ["PARTITION", "ARCHIVED", "LAG", "LAST", "ERROR"]
    assert lines[header + 1].split()[:3] == ["0", "60", "40"] and error in lines[header + 1]
    assert lines[header + 2].split() == ["1", "60", "40", "-"]
    assert f"spec.archive: partition 0: archiving fails on c-0: {error}" in text  # Degraded
    # A cluster that asks for an archive no member reported yet says so.
    fresh = raftview.view(resource(RaftClusterStatus(), {"url": URL}))
    assert "no member has reported its archive yet" in raftview.render(fresh)
    # Without an archive: no key, no section.
    plain = raftview.view(resource(RaftClusterStatus(), None))
    assert "archive" not in plain and "Archive" not in raftview.render(plain)


# ----------------------------------------------------------------------------- local runtime


def test_the_local_runtime_gives_the_members_the_secret_from_its_folder(tmp_path: Path):
    s = RaftClusterSpec.model_validate({"archive": {"url": URL, "credentialsSecret": "s3"}})
    runtime = LocalRuntime(tmp_path, tmp_path / "token")
    with pytest.raises(RuntimeError, match=r"spec.archive.credentialsSecret: no secret s3 in"):
        runtime.archive_env(s)
    secret = tmp_path / "secrets" / "s3"
    secret.mkdir(parents=True)
    (secret / "accessKeyId").write_text("AKID\n")
    with pytest.raises(RuntimeError, match=r"no key secretAccessKey"):
        runtime.archive_env(s)
    (secret / "secretAccessKey").write_text("s3cr3t")
    env = runtime.archive_env(s)
    creds = Path(env["RAFTLOG_ARCHIVE_CREDENTIALS_FILE"])
    assert creds.read_text().splitlines() == ["AKID", "s3cr3t"]
    assert creds.stat().st_mode & 0o777 == 0o600
    assert env["RAFTLOG_ARCHIVE_URL"] == URL
    # No secret named: no credentials of the runtime's; no archive: nothing at all.
    bare = RaftClusterSpec.model_validate({"archive": {"url": URL}})
    assert "RAFTLOG_ARCHIVE_CREDENTIALS_FILE" not in runtime.archive_env(bare)
    assert runtime.archive_env(RaftClusterSpec()) == {}


def test_with_no_leader_yet_a_members_report_is_taken_and_its_failure_said_once():
    # Found by a mutant of the local test: while nobody led, every pass announced the failure
    # again (no entry to remember it by).
    world = World(NAMES)
    world.leader = {0: None, 1: None}
    down = {(n, p): "GenericError: refused" for n in NAMES for p in range(2)}
    s = archive_spec()
    first = decide(NAME, s, steady(NAMES), archiving(world, down), T0)
    assert first.status.archive is not None
    assert [a.reported_by for a in first.status.archive.partitions] == ["c-0", "c-0"]
    assert [e.reason for e in first.events] == ["ArchiveFailing", "ArchiveFailing"]
    second = decide(NAME, s, first.status, archiving(world, down), T0 + 1)
    assert "ArchiveFailing" not in [e.reason for e in second.events]
    assert len(second.status.problems) == 2


def test_an_archive_failing_beside_another_problem_is_not_said_to_be_the_only_one() -> None:
    # ArchiveFailing only when every problem is the archive's; an unknown fenced member is not.
    s = archive_spec(fencedMembers=["c-7"])
    plan = decide(NAME, s, steady(NAMES), archiving(World(NAMES), {("c-0", 0): "boom"}), T0)
    degraded = next(c for c in plan.status.conditions if c.type == "Degraded")
    assert degraded.reason == "CannotAct"
    assert "c-7 is not a member" in degraded.message and "boom" in degraded.message
