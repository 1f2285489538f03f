"""The image's two recipes agree: the Dockerfile (a registry build) and `cluster/images.py` (the
build without Docker that `make cluster` runs, and the `k8s` suite's pods run) use the same base
suite, the same Debian packages, the same install script, environment, user and command; and both
install only wheels, as the user the pods run as."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml
from cluster import images
from tests.chart.helm import CHART, ROOT, objects

from raftlog.operator import manifests
from raftlog.operator.models import DEFAULT_IMAGE, RaftClusterSpec

pytestmark = pytest.mark.chart

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str, text: str = DOCKERFILE) -> list[str]:
    text = re.sub(r"\\\n", " ", text)
    return [
        line.split(None, 1)[1].strip()
        for line in text.splitlines()
        if line.split(None, 1)[:1] == [name]
    ]


RUNTIME = DOCKERFILE.rsplit("\nFROM ", 1)[1]  # the last stage


def test_both_recipes_start_from_debian_bookworm():
    [arg] = [a for a in instructions("ARG") if a.startswith("DEBIAN_IMAGE=")]
    assert re.fullmatch(r"debian:bookworm-slim(@sha256:[0-9a-f]{64})?", arg.split("=", 1)[1])
    assert instructions("FROM") == ["${DEBIAN_IMAGE} AS build", "${DEBIAN_IMAGE}"]
    assert all(" bookworm" in m for m in images.MIRRORS)


def test_the_runtime_stage_installs_the_same_packages_and_runs_the_same_script():
    [apt] = [r for r in instructions("RUN", RUNTIME) if "apt-get install" in r]
    packages = apt.split("--no-install-recommends", 1)[1].split()
    assert packages == images.PACKAGES
    [install] = [r for r in instructions("RUN", RUNTIME) if "install-raftlog.sh" in r]
    assert f"source=image/{images.INSTALL.name}" in install
    assert install.endswith(f"sh /tmp/{images.INSTALL.name} /tmp/wheels")
    assert "from=build,source=/wheels" in install
    # Beside the wheels, only the core compiled in the build stage, where cluster/images.py
    # puts the one it compiled.
    assert instructions("COPY", RUNTIME) == [f"--from=build /native {images.NATIVE_DIR}"]


def test_the_environment_user_and_command_are_the_same():
    env: dict[str, str] = {}
    for line in instructions("ENV", RUNTIME):
        env.update(dict(kv.split("=", 1) for kv in line.split()))
    assert env == images.NODE_ENV
    # A read-only root filesystem: no bytecode written at run time, HOME on the /tmp emptyDir.
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["HOME"] == "/tmp"
    assert instructions("USER") == ["10001:10001"]
    assert instructions("WORKDIR", RUNTIME) == ["/var/lib/raftlog"]
    assert instructions("CMD") == ['["raftlog-node", "--help"]']
    source = (ROOT / "cluster" / "images.py").read_text()
    assert 'cmd=["raftlog-node", "--help"]' in source and 'user="10001:10001"' in source
    assert 'workdir="/var/lib/raftlog"' in source


def test_the_install_runs_as_the_pods_user_from_wheels_only():
    script = images.INSTALL.read_text()
    pod = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")
    [deploy] = [o for o in objects() if o["kind"] == "Deployment"]
    uid = pod["spec"]["securityContext"]["runAsUser"]
    assert uid == 10001 == deploy["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert pod["spec"]["securityContext"]["runAsGroup"] == 10001
    assert "useradd --system --uid 10001 --gid 10001" in script
    flat = re.sub(r"\s+", " ", script.replace("\\\n", " "))  # continued lines joined
    assert (
        '--no-index --find-links "$wheels" ${update:+--no-deps --force-reinstall} raftlog' in flat
    )


def test_the_commands_the_pods_run_are_console_scripts_that_start_in_the_build():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    pod = manifests.pod(RaftClusterSpec(), "c", "ns", "c-0", {}, join=False, config_hash="h")
    [deploy] = [o for o in objects() if o["kind"] == "Deployment"]
    commands = {
        pod["spec"]["containers"][0]["command"][0],
        deploy["spec"]["template"]["spec"]["containers"][0]["command"][0],
    }
    assert commands == {"raftlog-node", "raftlog-operator"} and commands <= set(scripts)
    for command in commands:  # the build refuses an image where they do not start
        assert f"{command} --help >/dev/null" in images.INSTALL.read_text()


def test_the_image_the_chart_and_the_crd_default_to_is_the_one_built_locally_and_in_the_readme():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == DEFAULT_IMAGE
    assert images.RAFTLOG_REF == DEFAULT_IMAGE
    readme = (ROOT / "README.md").read_text()
    assert (
        f"docker build -t {DEFAULT_IMAGE} ." in readme and f"docker push {DEFAULT_IMAGE}" in readme
    )
    assert f"docker build -t {DEFAULT_IMAGE} ." in DOCKERFILE


def test_only_the_sources_go_into_the_build_context():
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:1] == ["*"]  # everything out, then the sources back in
    sources = {"!pyproject.toml", "!README.md", "!node/", "!operator/", "!spark/", "!demo/"}
    assert sources | {"!image/"} <= set(ignore)
    copied = {c.split()[0] for c in instructions("COPY") if not c.startswith("--")}
    assert copied == {"pyproject.toml", "node/", "operator/", "spark/", "demo/"}
