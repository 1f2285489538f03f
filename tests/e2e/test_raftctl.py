"""`raftctl` against a running local cluster, and `raftctl local up` itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from tests.steady import STEADY_RAFT

from raftlog.cli.main import main
from raftlog.client import Client
from raftlog.harness.local import LocalCluster

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(
        tmp_path_factory.mktemp("ctl"), replicas=3, durable=False, raft=STEADY_RAFT
    ) as c:
        c.wait_ready()
        yield c


def ctl(cluster: LocalCluster, capsys, *args: str) -> tuple[int, str, str]:
    code = main([*args, "--endpoints", ",".join(cluster.endpoints)])
    out = capsys.readouterr()
    return code, out.out, out.err


def appended_last(out: str) -> str:
    """The last index `raftctl append` printed (`indexes FIRST..LAST, ...`), for --min-index."""
    return out.split("indexes ")[1].split("..")[1].split(",")[0]


def test_append_read_status_and_json(cluster, capsys):
    code, out, _ = ctl(cluster, capsys, "append", "--key", "user", "one", "two")
    assert code == 0 and "indexes" in out
    last = appended_last(out)
    # Read-your-writes: without it the read may land on a follower that has not heard of the
    # commit yet (CI saw "(no records)" there).
    code, out, _ = ctl(cluster, capsys, "read", "--min-index", last)
    assert code == 0 and "user\tone" in out and "user\ttwo" in out
    code, out, _ = ctl(cluster, capsys, "status")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "PARTITION", "NODE", "ROLE", "TERM", "LEADER", "HWM", "APPLIED", "FLOOR", "LAG",
    ]  # fmt: skip
    assert sum("leader" in line.split()[2] for line in out.splitlines()[1:]) == 1
    code, out, _ = ctl(cluster, capsys, "status", "--json")
    assert code == 0 and set(json.loads(out)) == set(cluster.nodes)


def test_idempotent_append_and_refusals(cluster, capsys):
    args = ("append", "--producer-id", "ctl", "--sequence", "0", "x")
    assert ctl(cluster, capsys, *args)[0] == 0
    code, out, _ = ctl(cluster, capsys, *args)
    assert code == 0 and "already appended" in out
    code, _, err = ctl(cluster, capsys, "members", "promote", "n9")
    assert code == 1 and "409" in err and "not a learner" in err
    code, _, err = ctl(cluster, capsys, "read", "-p", "5")
    assert code == 1 and "404" in err


def test_admin_commands_go_to_the_leader_the_endpoints_name(cluster, capsys):
    leader = cluster.leader(0)
    assert leader is not None
    follower = next(n for n in sorted(cluster.nodes) if n != leader)
    code, out, _ = ctl(cluster, capsys, "lag", follower)
    assert code == 0 and f"{follower} on partition 0: lag " in out, out
    code, out, _ = ctl(cluster, capsys, "leader", "transfer", follower)
    assert code == 0 and f"partition 0: leader is now {follower}" in out, out


def test_a_cluster_that_does_not_answer_is_named_unreachable(capsys):
    assert main(["read", "--endpoints", "http://127.0.0.1:9"]) == 1
    assert "raftctl: cannot reach the cluster: " in capsys.readouterr().err


def test_tail_prints_the_last_records_like_tail(cluster, capsys):
    values = [f"t{i}" for i in range(25)]
    code, out, _ = ctl(cluster, capsys, "append", "-p", "0", "--key", "tail", *values)
    assert code == 0
    last = appended_last(out)
    # Read-your-writes, as for `read`: the first endpoint may be a follower a commit behind.
    code, out, _ = ctl(cluster, capsys, "tail", "-p", "0", "--min-index", last)
    assert code == 0 and [line.split("\t")[2:] for line in out.splitlines()] == [
        ["tail", v] for v in values[-10:]
    ], out
    code, out, _ = ctl(cluster, capsys, "tail", "-p", "0", "-n", "3", "--min-index", last)
    assert code == 0 and [line.split("\t")[3] for line in out.splitlines()] == values[-3:], out
    code, out, _ = ctl(cluster, capsys, "tail", "-p", "0", "-n", "0")
    assert code == 0 and out == ""


def test_tail_of_a_compacted_partition_prints_its_last_records(tmp_path, capsys):
    """`tail` asked for entry 1 to learn the high-water mark, and the 410 of a partition
    compacted past it (any long-lived one) was its answer: exit 1, nothing printed."""
    with LocalCluster(
        tmp_path, replicas=1, durable=False,
        raft={"compact_every_operations": 10**6, "compact_number_entries": 0},
        env={"RAFTLOG_SEGMENT_BYTES": "4096"},
    ) as c:  # fmt: skip
        c.wait_ready()
        with Client(c.endpoints) as client:
            for i in range(30):
                client.append(0, [{"key": "k", "value": f"old{i}-" + "x" * 300}])
            code, body = c.request("n1", "POST", "/v1/admin/partitions/0/compact")
            assert code == 200 and body["compaction_floor"] > 2, body
            for i in range(3):
                client.append(0, [{"key": "k", "value": f"new{i}"}])
        code, out, err = ctl(c, capsys, "tail", "-n", "3")
    assert code == 0, err
    assert [line.split("\t")[3] for line in out.splitlines()] == ["new0", "new1", "new2"], out


def test_local_up_status_and_down(tmp_path, capsys):
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftlog.cli.main", "local", "up", "--replicas", "3",
         "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "Ctrl-C" in line:
            break
    assert any(line.startswith("export RAFTLOG_ENDPOINTS=") for line in lines), lines
    pids = json.loads((tmp_path / "cluster.json").read_text())["pids"]
    assert len(pids) == 3
    assert main(["local", "status", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 nodes running" in out and "leader" in out
    assert main(["local", "down", "--data-dir", str(tmp_path)]) == 0
    assert "stopped 3 nodes" in capsys.readouterr().out
    assert proc.wait(timeout=30) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
