"""Backups and restore (`server/restore.py`, `raftctl backup`, `raftctl restore plan`) against
the real S3-compatible server: a source cluster archives under appends, a backup point is taken,
more records follow, and new clusters restored to the backup, to an index and to a time hold
exactly the records up to the point, none after, and take appends after it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.cli.main import main as raftctl
from raftlog.client import Client
from raftlog.harness.local import LocalCluster
from raftlog.harness.s3 import S3Server
from raftlog.node.server.archive import S3ObjectStore
from raftlog.node.server.restore import (
    Backup,
    RestoreError,
    resolve,
    write_backup,
)
from raftlog.node.server.restore_target import Target, parse_target
from raftlog.node.settings import NodeSettings

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.e2e]

BUCKET = "restore"
T0 = 1_700_000_000_000  # the records' timestamps: T0 + i seconds for record i of a batch


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3"), buckets=(BUCKET,)) as server:
        yield server


@pytest.fixture(scope="module")
def creds(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("creds") / "archive-credentials"
    f.write_text(f"{s3.access_key}\n{s3.secret_key}\n")
    return f


def store_env(s3: S3Server, creds: Path) -> dict[str, str]:
    return {
        "RAFTLOG_ARCHIVE_ENDPOINT": s3.endpoint,
        "RAFTLOG_ARCHIVE_REGION": s3.region,
        "RAFTLOG_ARCHIVE_CREDENTIALS_FILE": str(creds),
    }


def store_args(s3: S3Server, creds: Path, url: str) -> list[str]:
    return [
        "--archive", url, "--s3-endpoint", s3.endpoint, "--s3-region", s3.region,
        "--s3-credentials-file", str(creds),
    ]  # fmt: skip


def run_raftctl(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = raftctl(args)
    return code, out.getvalue(), err.getvalue()


def backup(
    src: LocalCluster, s3: S3Server, creds: Path, url: str, name: str
) -> tuple[int, str, str]:
    """`raftctl backup create --json NAME` of the cluster `src` into the archive at `url`."""
    return run_raftctl(
        [
            "backup",
            "create",
            "--endpoints",
            ",".join(src.endpoints),
            "--json",
            *store_args(s3, creds, url),
            name,
        ]
    )


def plan(s3: S3Server, creds: Path, url: str, target: str) -> tuple[int, str, str]:
    """`raftctl restore plan --json` of two partitions to `target` from the archive at `url`."""
    args = ["restore", "plan", "--partitions", "2", "--to", target, "--json"]
    return run_raftctl([*args, *store_args(s3, creds, url)])


def append(client: Client, p: int, tag: str, n: int, t0: int) -> list[tuple[int, str]]:
    """`n` records to partition `p` in batches, stamped t0 + i s: their (index, value)."""
    out = []
    for i in range(0, n, 5):
        recs = [
            {"key": f"k{j % 11}", "value": f"{tag}-{j}", "timestamp_ms": t0 + j * 1000}
            for j in range(i, min(n, i + 5))
        ]
        r = client.append(p, recs)
        out += [(r.first_index + k, str(rec["value"])) for k, rec in enumerate(recs)]
    return out


def read_all(client: Client, p: int, min_index: int = 0) -> dict[int, str]:
    got: dict[int, str] = {}
    start = 1
    while True:
        reply = client.read(p, start, limit=1000, min_index=min_index)
        got.update({r["index"]: r["value"] for r in reply["records"]})
        if reply["next"] == start:
            return got
        start = reply["next"]


def source_env(s3: S3Server, creds: Path, prefix: str) -> dict[str, str]:
    return {
        **store_env(s3, creds),
        "RAFTLOG_ARCHIVE_URL": f"s3://{BUCKET}/{prefix}",
        "RAFTLOG_ARCHIVE_INTERVAL_S": "0.3",
        "RAFTLOG_SEGMENT_BYTES": "4096",  # many segments, so restores read many objects
    }


def restored(
    tmp: Path, s3: S3Server, creds: Path, source: str, indexes: dict[str, int], partitions: int
) -> LocalCluster:
    env = {
        **store_env(s3, creds),
        "RAFTLOG_RESTORE_URL": f"s3://{BUCKET}/{source}",
        "RAFTLOG_RESTORE_INDEXES": json.dumps(indexes),
        "RAFTLOG_ARCHIVE_URL": f"s3://{BUCKET}/{tmp.name}",  # its own history from here on
    }
    return LocalCluster(tmp, replicas=3, partitions=partitions, durable=False, env=env)


def test_backup_then_restore_to_the_backup_an_index_and_a_time(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    url = f"s3://{BUCKET}/src"
    with LocalCluster(
        tmp_path / "src", replicas=3, partitions=2, durable=False, env=source_env(s3, creds, "src")
    ) as src:
        src.wait_ready()
        with Client(src.endpoints, retries=20) as c:
            before = {p: append(c, p, f"a{p}", 60, T0) for p in range(2)}
            code, out, err = backup(src, s3, creds, url, "nightly")
            assert code == 0, err
            point = {int(p): i for p, i in json.loads(out)["partitions"].items()}
            # The backup point holds every record acknowledged before it was asked for.
            assert all(point[p] >= before[p][-1][0] for p in range(2)), (point, before)
            after = {p: append(c, p, f"b{p}", 40, T0 + 3_600_000) for p in range(2)}
            # A second backup of the same name is refused: a backup point never moves.
            code, _, err = backup(src, s3, creds, url, "nightly")
            assert code == 1 and "exists already" in err
            # The active segment's committed records are archived on a flush (a backup) only:
            # a second backup takes the later records, and "latest" then has them.
            code, _, err = backup(src, s3, creds, url, "final")
            assert code == 0, err

    # The plan for the backup names the backup's indexes; the source is gone by now.
    code, out, err = plan(s3, creds, url, "backup:nightly")
    assert code == 0, err
    indexes = json.loads(out)["restore_indexes"]
    assert {int(p): i for p, i in indexes.items()} == point

    with restored(tmp_path / "r1", s3, creds, "src", indexes, 2) as r1:
        r1.wait_ready()
        with Client(r1.endpoints, retries=20) as c:
            for p in range(2):
                got = read_all(c, p)
                want = {i: v for i, v in before[p]}
                assert {i: got.get(i) for i in want} == want, f"partition {p}: lost"
                later = {i for i, _ in after[p]}
                assert not later & {i for i, v in got.items() if v.startswith("b")}
                assert max(got) <= point[p]
                # New appends follow the restored log.
                r = c.append(p, [{"key": "new", "value": "after-restore"}])
                assert r.first_index > point[p]
                assert read_all(c, p, r.first_index)[r.first_index] == "after-restore"
            # Every member holds the same restored log (read from each).
            for e in r1.endpoints:
                with Client([e], retries=20) as one:
                    assert {i: v for i, v in before[0]}.items() <= read_all(one, 0).items()

    # To a time: the first hour's records (stamped T0..T0+59 s), none of the later ones.
    code, out, err = plan(s3, creds, url, f"time:{T0 + 30500}")
    assert code == 0, err
    plan_t = {int(p): i for p, i in json.loads(out)["restore_indexes"].items()}
    for p in range(2):
        # records a{p}-0..30 are at or before the time; a{p}-31 is the first after it.
        assert plan_t[p] == before[p][31][0] - 1, (p, plan_t, before[p][30:32])
    with restored(tmp_path / "r2", s3, creds, "src", json.loads(out)["restore_indexes"], 2) as r2:
        r2.wait_ready()
        with Client(r2.endpoints, retries=20) as c:
            for p in range(2):
                values = set(read_all(c, p).values())
                assert {v for _, v in before[p][:31]} <= values
                assert not values & {v for _, v in before[p][31:] + after[p]}

    # Latest: every record, the later ones included.
    code, out, err = plan(s3, creds, url, "latest")
    assert code == 0, err
    plan_l = {int(p): i for p, i in json.loads(out)["restore_indexes"].items()}
    assert all(plan_l[p] >= after[p][-1][0] for p in range(2)), (plan_l, after)

    # To an index of each partition: exactly that.
    code, out, err = plan(s3, creds, url, "index:0=40,1=45")
    assert code == 0, err
    assert json.loads(out)["restore_indexes"] == {"0": 40, "1": 45}


def test_a_restore_carries_the_new_clusters_voters_not_the_sources(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    """The source's membership changed through its log (a member added and an original one
    removed); the restored cluster's members must still elect and commit among themselves."""
    with LocalCluster(
        tmp_path / "src", replicas=3, partitions=1, durable=False, env=source_env(s3, creds, "m")
    ) as src:
        src.wait_ready()
        with Client(src.endpoints, retries=20) as c:
            acked = append(c, 0, "m", 30, T0)
            n4 = src.add_node()
            src.start(n4.name)
            c.change_membership(0, "add_learner", n4.name, n4.url)
            deadline = time.monotonic() + 30
            while True:
                try:
                    c.change_membership(0, "promote", n4.name)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.3)
            leader = c.leader(0)
            gone = next(n for n, node in src.nodes.items() if node.url != leader and n != "n4")
            c.change_membership(0, "remove", gone)
            acked += append(c, 0, "m2", 30, T0)
            code, out, err = backup(src, s3, creds, f"s3://{BUCKET}/m", "b1")
            assert code == 0, err
            indexes = json.loads(out)["partitions"]
    with restored(tmp_path / "rm", s3, creds, "m", indexes, 1) as r:
        r.wait_ready()
        with Client(r.endpoints, retries=30) as c:
            got = read_all(c, 0)
            assert all(got.get(i) == v for i, v in acked)
            c.append(0, [{"value": "committed by the new voters"}])
            status = c.status(r.endpoints[0])
            part = status["partitions"][0]
            assert sorted(part["voters"]) == ["n1", "n2", "n3"], part


def test_plans_that_the_archive_cannot_give_are_refused_naming_the_partition(
    s3: S3Server, creds: Path, tmp_path: Path
) -> None:
    url = f"s3://{BUCKET}/refusals"
    with LocalCluster(
        tmp_path / "src",
        replicas=1,
        partitions=2,
        durable=False,
        env=source_env(s3, creds, "refusals"),
    ) as src:
        src.wait_ready()
        with Client(src.endpoints, retries=20) as c:
            append(c, 0, "x", 20, T0)
            code, _out, err = backup(src, s3, creds, url, "only")
            assert code == 0, err
    for args, why in (
        (
            ["--partitions", "2", "--to", "index:100000"],
            "partition 0: index 100000 is not archived",
        ),
        (["--partitions", "1"], "at least 2 partitions"),
        (["--partitions", "2", "--to", "backup:nope"], "backup 'nope': no"),
        (["--partitions", "2", "--to", "time:2026-01-01T00:00:00"], "give a zone"),
        (["--partitions", "2", "--to", "yesterday"], "give latest, index:N"),
    ):
        code, _, err = run_raftctl(["restore", "plan", *args, *store_args(s3, creds, url)])
        assert code == 1 and why in err, (args, err)


def test_targets_parse_and_settings_refuse_what_cannot_be_restored(tmp_path: Path) -> None:
    assert parse_target("latest") == Target("latest")
    assert parse_target("index:7") == Target("index", index=7)
    assert parse_target("index:0=5,1=9") == Target("index", indexes={0: 5, 1: 9})
    assert parse_target("time:1970-01-01T00:00:01Z") == Target("time", time_ms=1000)
    assert parse_target("backup:nightly-1") == Target("backup", backup="nightly-1")
    for bad in ("index:-1", "index:x", "backup:../etc", "time:", "later"):
        with pytest.raises(ValueError):
            parse_target(bad)
    base: dict[str, Any] = {
        "node_id": "n1",
        "peers": {"n1": "http://127.0.0.1:1"},
        "insecure_no_auth": True,
        "data_dir": str(tmp_path),
        "partitions": 2,
    }
    for extra, field in (
        ({"restore_url": "s3://b/p"}, "restore_indexes: required"),
        ({"restore_indexes": {0: 3}}, "restore_indexes: set, but restore_url"),
        ({"restore_url": "s3://b/p", "restore_indexes": {2: 3}}, "partition 2"),
        ({"restore_url": "s3://b/p", "archive_url": "s3://b/p", "restore_indexes": {0: 1}}, "same"),
        ({"restore_url": "http://b/p", "restore_indexes": {0: 1}}, "s3://bucket/prefix"),
    ):
        with pytest.raises(ValueError, match=field):
            NodeSettings(**base, **extra)


def test_resolve_refuses_an_archive_with_a_run_that_does_not_reach_the_index(
    s3: S3Server,
) -> None:
    """No manifest at all: partitions come back empty (0), which is what a cluster with
    nothing archived is; an index asked of it is refused."""
    store = S3ObjectStore(
        f"s3://{BUCKET}/empty", s3.endpoint, s3.region, (s3.access_key, s3.secret_key)
    )
    assert asyncio.run(resolve(store, store.prefix, 2, Target("latest"))) == {0: 0, 1: 0}
    with pytest.raises(RestoreError, match="partition 0: index 5 is not archived"):
        asyncio.run(resolve(store, store.prefix, 2, Target("index", index=5)))


def test_backup_show_and_the_plans_shell_lines_with_credentials_from_the_environment(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{BUCKET}/show"
    store = S3ObjectStore(url, s3.endpoint, s3.region, (s3.access_key, s3.secret_key))
    asyncio.run(
        write_backup(store, store.prefix, Backup("b1", "2026-01-02T03:04:05Z", {0: 40, 1: 45}))
    )
    monkeypatch.delenv("RAFTLOG_ARCHIVE_CREDENTIALS_FILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    at = ["--archive", url, "--s3-endpoint", s3.endpoint, "--s3-region", s3.region]
    code, out, err = run_raftctl(["backup", "show", *at, "b1"])
    assert (code, out) == (0, "b1\n  partition 0: index 40\n  partition 1: index 45\n"), err
    code, out, err = run_raftctl(["backup", "show", *at, "--json", "b1"])
    assert code == 0 and json.loads(out) == {
        "name": "b1", "created_at": "2026-01-02T03:04:05Z", "partitions": {"0": 40, "1": 45}
    }, err  # fmt: skip
    code, out, err = run_raftctl(["backup", "show", *at, "nope"])
    assert (code, out) == (1, "") and err.startswith("raftctl: backup 'nope': no "), err
    # Nothing archived there: every partition comes back empty, at the latest point.
    code, out, err = run_raftctl(["restore", "plan", *at, "--partitions", "2"])
    assert code == 0 and out.splitlines() == [
        f"restore {url} to latest:",
        "  partition 0: index 0",
        "  partition 1: index 0",
        f"RAFTLOG_RESTORE_URL={url}",
        """RAFTLOG_RESTORE_INDEXES='{"0": 0, "1": 0}'""",
    ], err


def test_the_archive_commands_say_in_one_line_what_the_options_and_the_store_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive that is not s3://bucket/prefix, half the credentials in the environment, a
    credentials file that cannot be read, a store that does not answer: each is one `raftctl:`
    line and exit 1 (2 for the option), never a traceback with obstore's debug dump."""
    monkeypatch.delenv("RAFTLOG_ARCHIVE_CREDENTIALS_FILE", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    down = ["--archive", "s3://b/p", "--s3-endpoint", "http://127.0.0.1:9"]  # nothing listens
    said = io.StringIO()
    with contextlib.redirect_stderr(said), pytest.raises(SystemExit) as exit_:
        raftctl(["backup", "show", "--archive", "http://b/p", "b1"])
    assert exit_.value.code == 2
    assert "argument --archive: 'http://b/p' is not s3://bucket/prefix" in said.getvalue()
    code, out, err = run_raftctl(["backup", "show", *down, "b1"])
    assert (code, out, err) == (
        1,
        "",
        "raftctl: AWS_SECRET_ACCESS_KEY: not set, but AWS_ACCESS_KEY_ID is (set both, or "
        "--s3-credentials-file)\n",
    )
    missing = tmp_path / "creds"
    code, out, err = run_raftctl(
        ["restore", "plan", *down, "--partitions", "1", "--s3-credentials-file", str(missing)]
    )
    assert (code, out) == (1, "") and err == (
        f"raftctl: --s3-credentials-file: {missing} cannot be read (No such file or directory)\n"
    )
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    for command in (["backup", "show", "b1"], ["restore", "plan", "--partitions", "1"]):
        code, out, err = run_raftctl([*command, *down])
        assert (code, out) == (1, "") and len(err.splitlines()) == 1, err
        assert err.startswith("raftctl: the object store of s3://b/p: "), err
        assert "127.0.0.1:9" in err, err
