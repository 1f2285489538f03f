# syntax=docker/dockerfile:1
# One image for both processes: `raftlog-node` (the member pods the operator creates) and
# `raftlog-operator` (the chart's Deployment). Each pod names its command; there is no entrypoint.
#
#   docker build -t ghcr.io/raftlog/raftlog:0.1.0 .
#   docker push ghcr.io/raftlog/raftlog:0.1.0
#
# The base is pinned to an exact Python release; pin it by digest as well in your registry's
# mirror (`python:3.11.11-slim-bookworm@sha256:...`) for reproducible builds.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---------------------------------------------------------------- build: wheels, no toolchain left
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY node/ node/
COPY operator/ operator/
COPY spark/ spark/
# raftlog and every runtime dependency as wheels (the `spark` and `dev` extras stay out).
RUN python -m pip wheel --wheel-dir /wheels .

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The user the pods run as (runAsUser/runAsGroup 10001), with no login and no home.
RUN groupadd --system --gid 10001 raftlog \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin raftlog \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/raftlog
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links /wheels raftlog \
 && raftlog-node --help >/dev/null && raftlog-operator --help >/dev/null
USER 10001:10001
WORKDIR /var/lib/raftlog
# 7001: a member's client API; 7002: its peers and admin API; 8080: the operator's liveness;
# 8000: its metrics.
EXPOSE 7001 7002 8000 8080
CMD ["raftlog-node", "--help"]
