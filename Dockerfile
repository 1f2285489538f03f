# syntax=docker/dockerfile:1
# One image for both processes: `raftlog-node` (the member pods the operator creates) and
# `raftlog-operator` (the chart's Deployment). Each pod names its command; there is no entrypoint.
#
#   docker build -t ghcr.io/raftlog/raftlog:0.1.0 .
#   docker push ghcr.io/raftlog/raftlog:0.1.0
#
# The same image as `make cluster` builds without Docker (cluster/images.py): Debian bookworm's
# python3 (3.11), raftlog in a venv at /opt/raftlog installed by image/install-raftlog.sh from
# wheels only, run as 10001:10001. Pin the base by digest in your registry's mirror
# (`debian:bookworm-slim@sha256:...`) for reproducible builds.
ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------- build: wheels, no toolchain left
FROM ${DEBIAN_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    gcc python3-dev
WORKDIR /src
COPY pyproject.toml README.md ./
COPY node/ node/
COPY operator/ operator/
COPY spark/ spark/
COPY demo/ demo/
# raftlog and every runtime dependency as wheels (the `spark` and `dev` extras stay out).
RUN python3 -m pip wheel --break-system-packages --wheel-dir /wheels .
# The node's Raft core and peer codec compiled by mypyc from these very sources
# (node/raftlog/node/native.py); a member uses them only while its sources are the same bytes.
RUN python3 -m pip install --break-system-packages mypy \
    && RAFTLOG_NATIVE_DIR=/native PYTHONPATH=/src/node python3 -m raftlog.node.native_build

# ---------------------------------------------------------------- runtime
FROM ${DEBIAN_IMAGE}
ENV PATH=/opt/raftlog/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp RAFTLOG_NATIVE_DIR=/opt/raftlog/native
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates
# The user the pods run as (runAsUser/runAsGroup 10001), the venv, both commands checked.
RUN --mount=type=bind,from=build,source=/wheels,target=/tmp/wheels \
    --mount=type=bind,source=image/install-raftlog.sh,target=/tmp/install-raftlog.sh \
    sh /tmp/install-raftlog.sh /tmp/wheels
COPY --from=build /native /opt/raftlog/native
USER 10001:10001
WORKDIR /var/lib/raftlog
# 7001: a member's client API; 7002: its peers and admin API; 8080: the operator's liveness;
# 8000: its metrics.
EXPOSE 7001 7002 8000 8080
CMD ["raftlog-node", "--help"]
