"""examples/spark: the SparkApplication and the spark-submit script run the archive job with
arguments it accepts, from the entry file the image bakes in."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from cluster import images

from raftlog.operator import manifests
from raftlog.operator.models import RaftClusterSpec
from raftlog.spark.jobs import archive

pytestmark = [pytest.mark.spark]
EXAMPLES = Path(__file__).parents[2] / "examples" / "spark"


def test_the_spark_application_runs_the_archive_job_with_valid_arguments():
    app = yaml.safe_load((EXAMPLES / "sparkapplication-archive.yaml").read_text())
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert app["kind"] == "SparkApplication"
    spec = app["spec"]
    assert spec["type"] == "Python" and spec["mode"] == "cluster"
    assert spec["mainApplicationFile"] == "local:///opt/raftlog/archive_main.py"
    args = archive.parse_args(spec["arguments"])
    assert args.output.startswith("/data/") and args.checkpoint.startswith("/data/")
    assert args.token_file.startswith("/etc/raftlog/")
    mounts = {m["mountPath"] for m in spec["driver"]["volumeMounts"]}
    assert {"/data", "/etc/raftlog"} <= mounts
    assert "/data" in {m["mountPath"] for m in spec["executor"]["volumeMounts"]}
    # The names the operator gives: members under <cluster>-peers, the token in <cluster>-auth.
    ns, cluster = app["metadata"]["namespace"], "orders"
    peers = manifests.peers_service(cluster)
    assert args.endpoints.split(",") == [
        f"http://{cluster}-{i}.{peers}.{ns}.svc:7001" for i in range(3)
    ]
    secrets = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets == {manifests.auth_secret(cluster, RaftClusterSpec())}
    for role in ("driver", "executor"):  # Pod Security "restricted"
        assert spec[role]["podSecurityContext"]["runAsNonRoot"] is True
        assert spec[role]["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert spec["image"] == images.SPARK_REF
    assert "archive_main.py" in images.SPARK_INSTALL.read_text()


def test_the_spark_submit_script_is_valid_bash_with_valid_job_arguments():
    script = EXAMPLES / "spark-submit-archive.sh"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)
    text = script.read_text().replace("\\\n", " ")
    line = next(x for x in text.splitlines() if x.strip().startswith("exec spark-submit"))
    words = shlex.split(line.replace('"${ENDPOINTS}"', "http://n1:7001"))
    assert words[words.index("--master") + 1].startswith("k8s://")
    job = words[words.index("local:///opt/raftlog/archive_main.py") + 1 :]
    assert job[-1] == "$@"  # the caller's own job arguments come last
    archive.parse_args(job[:-1])


def test_the_archive_job_takes_the_exports_raftctl_local_up_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a review: the README runs the job with `$RAFTLOG_ENDPOINTS` and a retention
    hold but no token, and holds are admin calls, so the hold was refused on any cluster with a
    token while raftctl, in the same shell, read `$RAFTLOG_TOKEN_FILE` by itself."""
    for name in ("RAFTLOG_ENDPOINTS", "RAFTLOG_TOKEN_FILE", "RAFTLOG_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit):
        archive.parse_args(["--output", "/o", "--checkpoint", "/c"])
    assert "--endpoints" in capsys.readouterr().err
    monkeypatch.setenv("RAFTLOG_ENDPOINTS", "http://127.0.0.1:7001")
    monkeypatch.setenv("RAFTLOG_TOKEN_FILE", "/run/token")
    monkeypatch.setenv("RAFTLOG_CA_FILE", "/run/ca.pem")
    args = archive.parse_args(["--output", "/o", "--checkpoint", "/c", "--retention-hold", "a"])
    assert archive.source_options(args) == {
        "endpoints": "http://127.0.0.1:7001",
        "startingOffsets": "earliest",
        "retentionHold": "a",
        "tokenFile": "/run/token",
        "caFile": "/run/ca.pem",
    }
    given = archive.parse_args(["--endpoints", "http://x:1", "--output", "/o", "--checkpoint",
                                "/c", "--token-file", "/t"])  # fmt: skip
    assert (given.endpoints, given.token_file) == ("http://x:1", "/t")
