"""The image's Dockerfile, checked statically (no Docker engine here to build it): a pinned base,
a multi-stage build, a non-root user that is the one the pods run as, and the commands the pods
run installed as console scripts."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml
from tests.chart.helm import CHART, ROOT, objects

from raftlog.operator import manifests
from raftlog.operator.models import DEFAULT_IMAGE, RaftClusterSpec

pytestmark = pytest.mark.chart

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    return [
        line.split(None, 1)[1].strip()
        for line in text.splitlines()
        if line.split(None, 1)[:1] == [name]
    ]


def test_the_base_is_pinned_to_an_exact_python_311_release():
    [arg] = [a for a in instructions("ARG") if a.startswith("PYTHON_IMAGE=")]
    base = arg.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    froms = instructions("FROM")
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]  # multi-stage, one base


def test_the_runtime_stage_runs_as_the_pods_user_and_installs_only_wheels():
    [user] = instructions("USER")
    uid, gid = user.split(":")
    pod = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")
    assert int(uid) == pod["spec"]["securityContext"]["runAsUser"] != 0
    assert int(gid) == pod["spec"]["securityContext"]["runAsGroup"]
    [deploy] = [o for o in objects() if o["kind"] == "Deployment"]
    assert int(uid) == deploy["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert "useradd --system --uid 10001" in DOCKERFILE
    runtime = DOCKERFILE.rsplit("\nFROM ", 1)[1]  # the last stage
    assert "--no-index --find-links /wheels" in runtime and "COPY" not in runtime
    # A read-only root filesystem: no bytecode written at run time, HOME on the /tmp emptyDir.
    assert "PYTHONDONTWRITEBYTECODE=1" in runtime and "HOME=/tmp" in runtime


def test_the_commands_the_pods_run_are_console_scripts_of_the_distribution():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    pod = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")
    [deploy] = [o for o in objects() if o["kind"] == "Deployment"]
    commands = {
        pod["spec"]["containers"][0]["command"][0],
        deploy["spec"]["template"]["spec"]["containers"][0]["command"][0],
    }
    assert commands == {"raftlog-node", "raftlog-operator"} and commands <= set(scripts)
    for command in commands:  # the build refuses an image where they do not start
        assert f"{command} --help >/dev/null" in DOCKERFILE


def test_the_image_the_chart_and_the_crd_default_to_is_the_one_the_readme_builds():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == DEFAULT_IMAGE
    readme = (ROOT / "README.md").read_text()
    assert (
        f"docker build -t {DEFAULT_IMAGE} ." in readme and f"docker push {DEFAULT_IMAGE}" in readme
    )
    assert f"docker build -t {DEFAULT_IMAGE} ." in DOCKERFILE


def test_only_the_sources_go_into_the_build_context():
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:1] == ["*"]  # everything out, then the sources back in
    assert {"!pyproject.toml", "!README.md", "!node/", "!operator/", "!spark/"} <= set(ignore)
    copied = {c.split()[0] for c in instructions("COPY") if not c.startswith("--")}
    assert copied == {"pyproject.toml", "node/", "operator/", "spark/"}
