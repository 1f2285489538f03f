#!/bin/sh
# Installs raftlog into a Debian bookworm root filesystem that has python3 and python3-venv:
# the pods' user (10001), its data directory, and a venv at /opt/raftlog holding raftlog and its
# dependencies from the wheels in $1 only (offline). The one recipe of the image: the Dockerfile
# runs it, and so does cluster/images.py, which builds the image without Docker. With --update
# first, it only puts the raftlog wheel of $1 in place of the one an earlier run installed
# (cluster/images.py's layer over a cached base, when only raftlog's sources changed).
set -eu
update=
if [ "${1:-}" = --update ]; then update=1; shift; fi
wheels=${1:?usage: install-raftlog.sh [--update] WHEEL_DIR}
export PATH=/opt/raftlog/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HOME="${HOME:-/root}"
if [ -z "$update" ]; then
    groupadd --system --gid 10001 raftlog
    useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin raftlog
    install -d -o 10001 -g 10001 -m 0750 /var/lib/raftlog
    # No pip in the venv: Debian's bundled pip wheel installs into it from outside.
    python3 -m venv --without-pip /opt/raftlog
fi
# Bytecode is compiled now, as the pods' root filesystem is read-only.
pip_wheel=$(echo /usr/share/python-wheels/pip-*.whl)
/opt/raftlog/bin/python "$pip_wheel/pip" install --quiet --no-index --find-links "$wheels" \
    ${update:+--no-deps --force-reinstall} raftlog
raftlog-node --help >/dev/null
raftlog-operator --help >/dev/null
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/*.log
