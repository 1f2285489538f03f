"""`kubectl raft` as a user runs it: kubectl finds the plugin `kubectl-raft` on PATH (the venv's
bin, where `make install` puts it) and the plugin talks to the real API server.

A RaftCluster of 3 voters and 2 partitions under the chart's operator: `status` (text, JSON,
the namespace's list) agrees with the resource's `.status`; `pause`/`resume` set and remove the
annotation; `switchover` writes its request; refusals (an unknown member, too many removals, an
unknown cluster) change nothing and exit 1; a usage error exits 2. Then `switchover --wait`
follows the operator's status.switchover to done. What else the operator does with these
requests is tested with the operator (tests/operator).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

from raftlog.operator import controls
from tests.k8s import kube

VENV_BIN = kube.ROOT / ".venv" / "bin"
SPEC: dict[str, Any] = {
    "replicas": 3,
    "partitions": 2,
    # The machine has 2 cores: members of the default 250m leave little room for the rest.
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
}


def env() -> dict[str, str]:
    """kubectl's environment with the venv's bin first; PATH entries that do not exist are left
    out (`kubectl plugin list` fails on them)."""
    base = kube.env()
    dirs = [d for d in base.get("PATH", "").split(os.pathsep) if d and os.path.isdir(d)]
    return {**base, "PATH": os.pathsep.join([str(VENV_BIN), *dirs])}


def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], capture_output=True, text=True, timeout=120, env=env(), cwd=kube.ROOT
    )


def raft(*args: str, expect: int = 0) -> str:
    """`kubectl raft ARGS`: its stdout; it must exit with `expect` (its stderr when not 0)."""
    done = kubectl("raft", *args)
    assert done.returncode == expect, (
        f"kubectl raft {' '.join(args)} -> {done.returncode} (want {expect}): "
        f"{done.stdout}{done.stderr}"
    )
    return done.stdout if expect == 0 else done.stderr


def resource(ns: str, name: str) -> dict[str, Any]:
    return kube.get("raftcluster", name, ns)


def settled(obj: dict[str, Any]) -> bool:
    st = obj.get("status") or {}
    members = st.get("members") or []
    return (
        st.get("phase") == "Running"
        and len(members) == 3
        and all(m["role"] == "voter" and m["ready"] for m in members)
        and sorted(st.get("leaders") or {}) == ["0", "1"]
    )


def text_agrees(text: str, status: dict[str, Any]) -> bool:
    """The text names every member in the members table and each partition's leader."""
    lines = text.splitlines()
    members: dict[str, list[str]] = {}
    for line in lines:  # the members table comes first (snapshot installs name members too)
        if line[:1] and line[0] != " ":
            members.setdefault(line.split()[0], line.split())
    for m in status["members"]:
        row = members.get(m["name"])
        assert row is not None, f"{m['name']} missing from:\n{text}"
        if row[1:3] != [m["role"], "yes" if m["ready"] else "no"]:
            return False
    for p, leader in status["leaders"].items():
        if not any(line.split()[:2] == [p, leader] for line in lines):
            return False
    return True


def json_agrees(view: dict[str, Any], obj: dict[str, Any]) -> bool:
    st = obj["status"]
    leads = {m["name"]: list(st["leaders"].values()).count(m["name"]) for m in st["members"]}
    return (
        view["phase"] == st["phase"]
        and view["replicas"] == st["replicas"]
        and view["readyReplicas"] == st["readyReplicas"]
        and view["observedGeneration"] == st["observedGeneration"]
        and [(m["name"], m["role"], m["ready"], m["leaderships"]) for m in view["members"]]
        == [(m["name"], m["role"], m["ready"], leads[m["name"]]) for m in st["members"]]
        and {str(p["partition"]): p["leader"] for p in view["partitions"]} == st["leaders"]
        and [c["type"] for c in view["conditions"]] == [c["type"] for c in st["conditions"]]
    )


def annotations_of(ns: str, name: str) -> dict[str, str]:
    return dict(resource(ns, name)["metadata"].get("annotations") or {})


def test_kubectl_raft_status_pause_resume_switchover(operator: str) -> None:
    ns = operator
    assert (VENV_BIN / "kubectl-raft").exists(), "no kubectl-raft in .venv/bin: run make install"
    plugins = kubectl("plugin", "list")
    assert plugins.returncode == 0, plugins.stderr
    assert f"{VENV_BIN}/kubectl-raft" in plugins.stdout, plugins.stdout

    body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": "kr"}, "spec": SPEC}  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(body))
    kube.until("kr Running with 3 ready voters and 2 leaders",
               lambda: settled(resource(ns, "kr")), 300)  # fmt: skip

    # ------------------------------------------------------------------ status
    # Read twice around the plugin's run: a leadership moving in between is retried.
    def status_text() -> bool:
        text = raft("status", "kr", "-n", ns)
        return text_agrees(text, resource(ns, "kr")["status"])

    kube.until("kubectl raft status names the members and the leaders", status_text, 60)
    text = raft("status", "kr", "-n", ns)
    assert text.startswith(f"RaftCluster {ns}/kr: "), text
    assert "MEMBER" in text and "PARTITION" in text, text

    def status_json() -> bool:
        return json_agrees(json.loads(raft("status", "kr", "-n", ns, "-o", "json")),
                           resource(ns, "kr"))  # fmt: skip

    kube.until("kubectl raft status -o json matches .status", status_json, 60)
    listed = raft("status", "-n", ns).splitlines()
    assert listed[0].split()[:3] == ["NAME", "PHASE", "READY"], listed
    assert [line.split()[:3] for line in listed[1:]] == [["kr", "Running", "3/3"]], listed
    everywhere = json.loads(raft("status", "-A", "-o", "json"))["items"]
    assert (ns, "kr") in [(v["namespace"], v["name"]) for v in everywhere]

    # ------------------------------------------------------------------ refusals, errors
    err = raft("status", "nope", "-n", ns, expect=1)
    assert err == f"error: raftcluster {ns}/nope not found\n"
    before = resource(ns, "kr")
    err = raft("fence", "kr", "nobody", "-n", ns, expect=1)
    assert f"raftcluster {ns}/kr has no member nobody (its members: kr-0, kr-1, kr-2)" in err
    err = raft("remove", "kr", "kr-0", "kr-1", "kr-2", "-n", ns, expect=1)
    assert "spec.replicas 3: removing 3 would leave 0" in err
    assert "the following arguments are required: --to" in raft("switchover", "kr", expect=2)
    after = resource(ns, "kr")
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]

    # ------------------------------------------------------------------ pause, resume
    try:
        out = raft("pause", "kr", "-n", ns)
        assert out == f"raftcluster {ns}/kr: paused; the operator leaves it alone until " \
            "`kubectl raft resume`\n"  # fmt: skip
        assert annotations_of(ns, "kr")[controls.PAUSE] == "true"
    finally:
        # A paused cluster must not outlive the test: deleting it needs the operator.
        raft("resume", "kr", "-n", ns)
    assert controls.PAUSE not in annotations_of(ns, "kr")

    # ------------------------------------------------------------------ switchover
    st = resource(ns, "kr")["status"]
    leader = st["leaders"]["0"]
    target = next(m["name"] for m in st["members"] if m["name"] != leader)
    out = raft("switchover", "kr", "-n", ns, "--to", target, "--partition", "0")
    value = annotations_of(ns, "kr")[controls.SWITCHOVER]
    assert re.fullmatch(rf"{target}:0@\d{{8}}T\d{{6}}\.\d{{6}}Z", value), value
    assert out.startswith(f"raftcluster {ns}/kr: switchover requested ({controls.SWITCHOVER}=")
    asked = controls.parse({controls.SWITCHOVER: value}).switchover
    assert asked is not None and (asked.target, asked.partitions) == (target, (0,))
    # The same command again is a new request (its own @id).
    raft("switchover", "kr", "-n", ns, "--to", target, "--partition", "0")
    assert annotations_of(ns, "kr")[controls.SWITCHOVER] != value


def test_kubectl_raft_switchover_waits_for_the_operator(operator: str) -> None:
    """`switchover --wait` follows status.switchover to `done`; the leadership moved."""
    ns = operator
    body = {"apiVersion": "raftlog.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": "kr"}, "spec": SPEC}  # fmt: skip
    kube.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(body))
    kube.until("kr Running with 3 ready voters and 2 leaders",
               lambda: settled(resource(ns, "kr")), 300)  # fmt: skip
    st = resource(ns, "kr")["status"]
    target = next(m["name"] for m in st["members"] if m["name"] != st["leaders"]["1"])
    # The operator fails a switchover whose target is not fit to lead within 120 s.
    out = raft("switchover", "kr", "-n", ns, "--to", target, "-p", "1", "--wait",
               "--timeout", "240").splitlines()  # fmt: skip
    value = annotations_of(ns, "kr")[controls.SWITCHOVER]
    assert out[0] == f"raftcluster {ns}/kr: switchover requested ({controls.SWITCHOVER}={value})"
    assert out[-1].startswith(f"switchover to {target}: done"), out
    st = resource(ns, "kr")["status"]
    assert (st["switchover"]["request"], st["switchover"]["state"]) == (value, "done")
    kube.until(f"{target} leads partition 1 in the status",
               lambda: resource(ns, "kr")["status"]["leaders"]["1"] == target, 30)  # fmt: skip
    assert f"to {target}, partition 1: done" in raft("status", "kr", "-n", ns)
