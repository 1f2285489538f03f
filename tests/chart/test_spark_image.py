"""The Spark image's two recipes agree: examples/spark/Dockerfile (a registry build) and
`cluster/images.py`'s `spark_image` (the build without Docker the `k8s` suite's Spark pods run):
the same base, packages, install script and its arguments, environment, user and entrypoint."""

from __future__ import annotations

import zipfile

import pytest
from cluster import images
from tests.chart.helm import ROOT
from tests.chart.test_image import instructions

pytestmark = pytest.mark.chart

DOCKERFILE = (ROOT / "examples" / "spark" / "Dockerfile").read_text()
RUNTIME = DOCKERFILE.rsplit("\nFROM ", 1)[1]  # the last stage
SOURCE = (ROOT / "cluster" / "images.py").read_text()


def test_the_same_base_packages_and_install_script_with_the_same_files():
    assert instructions("FROM", DOCKERFILE) == ["${DEBIAN_IMAGE} AS build", "${DEBIAN_IMAGE}"]
    [apt] = [r for r in instructions("RUN", RUNTIME) if "apt-get install" in r]
    packages = apt.split("--no-install-recommends", 1)[1].split()
    assert packages == [*images.PACKAGES, "openjdk-17-jre-headless"]
    assert 'packages=[*PACKAGES, "openjdk-17-jre-headless"]' in SOURCE
    [install] = [r for r in instructions("RUN", RUNTIME) if images.SPARK_INSTALL.name in r]
    args = install.split(f"sh /tmp/image/{images.SPARK_INSTALL.name}", 1)[1].split()
    # The wheels, then the files spark_image copies in, in its order.
    names = [a.rsplit("/", 1)[1] for a in args[1:]]
    assert args[0] == "/tmp/wheels"
    assert names == ["raftlog-spark.jar", images.SPARK_ENTRYPOINT.name, "archive_main.py"]
    build = DOCKERFILE.rsplit("\nFROM ", 1)[0]
    assert any(r.endswith("'.[spark]'") for r in instructions("RUN", build))
    assert 'target=".[spark]"' in SOURCE


def test_the_environment_user_and_entrypoint_are_the_same():
    env: dict[str, str] = {}
    for line in instructions("ENV", RUNTIME):
        env.update(dict(kv.split("=", 1) for kv in line.split()))
    assert env == images.SPARK_ENV
    assert instructions("USER", RUNTIME) == ["185:185"] and 'user="185:185"' in SOURCE
    assert instructions("WORKDIR", RUNTIME) == ["/opt/spark/work-dir"]
    assert 'workdir="/opt/spark/work-dir"' in SOURCE
    assert instructions("ENTRYPOINT", RUNTIME) == ['["/opt/entrypoint.sh"]']
    assert 'entrypoint=["/opt/entrypoint.sh"]' in SOURCE
    script = images.SPARK_INSTALL.read_text()
    assert "useradd --system --uid 185 --gid 185" in script
    assert '--no-index --find-links "$wheels"' in script


def test_the_jar_the_image_is_keyed_by_carries_no_build_time():
    # The image's cache key holds the jar's bytes: a jar stamped with its build time would
    # rebuild the Spark image on every fresh clone (123 s in CI).
    jar = ROOT / "spark" / "raftlog" / "spark" / "jars" / "raftlog-spark.jar"
    with zipfile.ZipFile(jar) as z:
        dates = {info.date_time for info in z.infolist()}
    assert dates == {(1980, 1, 1, 0, 0, 2)}, f"{jar}: entries dated {sorted(dates)[:3]}"
