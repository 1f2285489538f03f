#!/bin/sh
# Installs raftlog with Spark into a Debian bookworm root filesystem that has python3,
# python3-venv and a Java 17 runtime: the image Spark on Kubernetes runs the raftlog source and
# the archive job in, driver and executors alike. Spark is pyspark's own distribution (its jars
# include the Kubernetes resource manager); the venv at /opt/raftlog holds raftlog[spark] from
# the wheels in $1 only (offline), raftlog-jvm's jar goes among Spark's jars, and the entrypoint
# Spark's Kubernetes pods expect is /opt/entrypoint.sh. Run as 185:185 (Spark's image's user).
# The one recipe of the image: examples/spark/Dockerfile runs it, and so does cluster/images.py.
# With --update first, it only puts the raftlog wheel of $1, the jar, the entrypoint and the job
# in place of those an earlier run installed (cluster/images.py's layer over a cached base).
set -eu
update=
if [ "${1:-}" = --update ]; then update=1; shift; fi
wheels=${1:?usage: install-spark.sh [--update] WHEEL_DIR JAR ENTRYPOINT ARCHIVE_MAIN}
jar=${2:?} entrypoint=${3:?} archive_main=${4:?}
export PATH=/opt/raftlog/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HOME="${HOME:-/root}"
if [ -z "$update" ]; then
    # Hadoop's login looks the user up by uid: it must be in /etc/passwd.
    groupadd --system --gid 185 spark
    useradd --system --uid 185 --gid 185 --no-create-home --home-dir /opt/spark/work-dir \
        --shell /usr/sbin/nologin spark
    python3 -m venv --without-pip /opt/raftlog
fi
pip_wheel=$(echo /usr/share/python-wheels/pip-*.whl)
/opt/raftlog/bin/python "$pip_wheel/pip" install --quiet --no-index --find-links "$wheels" \
    ${update:+--no-deps --force-reinstall} 'raftlog[spark]'
spark_home=$(/opt/raftlog/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
install -m 0644 "$jar" "$spark_home/jars/raftlog-spark.jar"
install -m 0755 "$entrypoint" /opt/entrypoint.sh
install -m 0644 "$archive_main" /opt/raftlog/archive_main.py
if [ -z "$update" ]; then
    ln -s "$spark_home" /opt/spark-home
    # Executors fetch files into their working directory; Spark mounts its conf at
    # /opt/spark/conf.
    install -d -o 185 -g 185 -m 0755 /opt/spark /opt/spark/work-dir
fi
/opt/raftlog/bin/python -c 'import raftlog.spark.source, pyarrow'
java -version 2>&1 | head -1
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/*.log
