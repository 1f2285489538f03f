"""`raftctl local up -f MANIFEST` and `raftctl local scale`: the reconciler behind the commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftlog.cli.main import main
from raftlog.operator.local_cli import recorded_alive, started_at, stop_recorded

pytestmark = [pytest.mark.operator, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "raftcluster.yaml"


def read_until(proc: subprocess.Popen[str], needle: str, lines: list[str], timeout: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return
    raise AssertionError(f"no {needle!r} in the output: {''.join(lines)}")


def test_local_up_from_a_manifest_then_scale(tmp_path, capsys):
    env = {**os.environ, "RAFTLOG_DURABLE": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftlog.cli.main", "local", "up", "-f", str(EXAMPLE),
         "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    lines: list[str] = []
    try:
        read_until(proc, "Ctrl-C", lines, 60)
        assert "cluster orders: 3 members, 2 partitions" in lines[0]
        assert any("Bootstrapped" in ln for ln in lines)
        assert main(["local", "scale", "orders", "--replicas", "0", "--data-dir", str(tmp_path)])
        assert (
            "spec.replicas: Input should be greater than or equal to 1" in capsys.readouterr().err
        )
        assert main(["local", "scale", "other", "--replicas", "4", "--data-dir", str(tmp_path)])
        assert "holds cluster 'orders', not 'other'" in capsys.readouterr().err
        assert (
            main(["local", "scale", "orders", "--replicas", "4", "--data-dir", str(tmp_path)]) == 0
        )
        read_until(proc, "LearnerAdded", lines, 60)
        read_until(proc, "Promoted", lines, 60)
        read_until(proc, "Ctrl-C", lines, 60)  # Running again, with the new endpoints
        assert main(["local", "status", "--data-dir", str(tmp_path)]) == 0
        assert "4 of 4 nodes running" in capsys.readouterr().out
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_a_manifest_lowering_the_partitions_the_members_hold_is_refused(tmp_path, capsys):
    """On Kubernetes the CRD's rule refuses it; locally nothing else would keep a member that
    restarts (or every member after a hibernation) from coming back with the lower count and
    no longer serving the partitions above it. Refused at `local up -f` (the manifest on disk
    left as it was) and at each pass (the cluster kept as it is)."""
    from raftlog.operator.local import MANIFEST, LocalOperator, ManifestError

    text = EXAMPLE.read_text()
    assert "partitions: 2" in text
    op = LocalOperator.create(tmp_path, text)
    assert op.desired()[1].partitions == 2
    for member in ("c-0", "c-1"):  # what their nodes made of the two partitions
        for p in (0, 1):
            (tmp_path / "members" / member / f"p{p}").mkdir(parents=True)
    lowered = text.replace("partitions: 2", "partitions: 1")
    refused = r"spec.partitions is 1 but the members hold 2 partitions"
    with pytest.raises(ManifestError, match=refused):
        LocalOperator.create(tmp_path, lowered)
    assert "partitions: 2" in (tmp_path / MANIFEST).read_text()
    (tmp_path / MANIFEST).write_text(lowered)  # edited by hand
    with pytest.raises(ManifestError, match=r"set it back to 2 or more"):
        op.desired()
    (tmp_path / MANIFEST).write_text(lowered.replace("partitions: 1", "partitions: 3"))
    assert op.desired()[1].partitions == 3  # raising stays allowed
    (tmp_path / "low.yaml").write_text(lowered)
    assert main(["local", "up", "-f", str(tmp_path / "low.yaml"), "--data-dir", str(tmp_path)]) == 1
    assert "lowering is refused" in capsys.readouterr().err


@pytest.mark.timeout(120)  # a flag ignored again would start the saved cluster and block
def test_local_up_flags_that_would_be_ignored_are_refused(tmp_path, capsys):
    """Found by a review: `--replicas`/`--partitions` given for a data dir that already holds
    a cluster, or beside -f, were dropped without a word and the saved manifest ran."""
    from raftlog.operator.local import LocalOperator

    LocalOperator.create(tmp_path, EXAMPLE.read_text())  # replicas 3, partitions 2
    up = ["local", "up", "--data-dir", str(tmp_path)]
    assert main([*up, "--partitions", "1"]) == 1
    assert (
        f"--partitions 1: the cluster in {tmp_path} has partitions 2 (change it with a "
        "manifest with -f)" in capsys.readouterr().err
    )
    assert main([*up, "--replicas", "5"]) == 1
    assert "has replicas 3 (change it with `raftctl local scale`)" in capsys.readouterr().err
    assert main([*up, "-f", str(EXAMPLE), "--replicas", "3"]) == 1
    assert "--replicas: not with -f" in capsys.readouterr().err
    # A new directory: the flags make the manifest, and the model's own bounds refuse 0.
    new = ["local", "up", "--data-dir", str(tmp_path / "new")]
    assert main([*new, "--replicas", "0"]) == 1
    assert "spec.replicas: Input should be greater than or equal to 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["a" * 58, "orders.v2", "Orders", "9lives", "orders-"])
def test_a_name_its_services_could_not_take_is_refused_as_on_kubernetes(name: str) -> None:
    """The CRD's rule on metadata.name (crds/), for a manifest no API server checks."""
    from raftlog.operator.local import ManifestError, load_manifest

    text = EXAMPLE.read_text().replace("name: orders", f"name: {name}", 1)
    with pytest.raises(ManifestError, match=r"metadata\.name: at most 57 characters"):
        load_manifest(text)
    assert load_manifest(text.replace(f"name: {name}", "name: " + "a" * 57, 1))[0] == "a" * 57


def test_local_down_wakes_a_paused_member_to_stop_it_gracefully() -> None:
    """Found by a planted bug: without its SIGCONT, a SIGSTOPped member never saw the SIGTERM
    and was SIGKILLed once the wait ran out."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = started_at(proc.pid)
        assert started is not None
        proc.send_signal(signal.SIGSTOP)
        state = {"pids": [proc.pid], "started": {str(proc.pid): started}}
        assert stop_recorded([proc.pid], state, wait_s=10) == []  # none had to be killed
        assert proc.wait(5) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_of_another_user_is_not_a_recorded_member(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `cluster.json` from before start times were recorded names pids alone; one that now
    belongs to another user's process (EPERM) is not this cluster's (found by a planted bug)."""

    def not_ours(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", not_ours)
    assert recorded_alive(12345, {"pids": [12345]}) is False
