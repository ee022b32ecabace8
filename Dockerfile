# pg-failover-hook image: gunicorn + the Flask hook, nothing else.
#
#   make image                                  # docker build when a Docker daemon answers,
#                                               # else buildah bud (no daemon needed)
#   make image IMAGE=registry.example.com/team/pg-failover-hook:0.1.0
#
# The base is a build argument pinned by digest, used by both stages (so the venv built in the
# first stage runs unchanged in the second). Its default is what a user builds and ships; the
# tests substitute a local stand-in for it (--build-arg BASE=..., testbed/metacontroller/image_build.py), a
# Debian bookworm with Python 3.11 where the official image has it. The digest is the one public
# references record for python:3.11.10-slim-bookworm; it could not be pulled or checked from
# where this was written (no access to Docker Hub). Check it, and move it forward for Debian and
# Python security fixes, with:  docker buildx imagetools inspect python:3.11-slim-bookworm
# (docs/deploy.md, "Build the image"), then change the ARG below.
#
# Dependencies come from the lock requirements/runtime.txt (exact versions, sha256 hashes:
# `make lock` refreshes it), so the image holds the versions the tests passed with.

ARG BASE=python:3.11.10-slim-bookworm@sha256:840e180ebcc6e5c8efab209c43f5e40fd2af98cb49db5c7103c90539c56bb30e

FROM ${BASE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

# A base without Python (or without its venv module) stops here, naming the base.
ARG BASE
RUN python -c 'import venv' 2>/dev/null \
    || { echo "the base image ${BASE} has no python with the venv module on its PATH:" \
              "build FROM a python:3.11 image (ARG BASE)" >&2; exit 1; } \
    && python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# The locked runtime dependencies first (their own layer: cached until the lock changes);
# --require-hashes refuses any file whose hash is not in the lock.
#
# Optional, for networks whose path to PyPI presents a certificate authority that the build
# host trusts but the base does not: hand the host's CA bundle in as the build secret
# "pipcert" (make image does when /etc/ssl/certs/ca-certificates.crt exists); it is mounted
# for this step only and never lands in a layer. PIP_INDEX_URL (a build argument, passed by
# make image when set in its environment) points pip at an index mirror. Without either,
# pip uses PyPI and the base's own CAs.
ARG PIP_INDEX_URL
COPY requirements/runtime.txt ./requirements/
RUN --mount=type=secret,id=pipcert,target=/run/secrets/pipcert \
    if [ -s /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
    && pip install --no-cache-dir --require-hashes --no-deps -r requirements/runtime.txt

COPY pyproject.toml README.md LICENSE ./
# The hook only: the kubectl plugin (pgfh_plugin/, beside hooks/) is a program of its own that
# the image never runs, so it is not copied, and the kubectl-pgfh script pip writes for it
# from pyproject.toml's [project.scripts] is removed below.
COPY hooks ./hooks

# The build backend (pyproject.toml's build-system: setuptools, wheel) from its own lock,
# requirements/build.txt, with hashes, into a venv of its own that the image never ships:
# pip's default build isolation would fetch whatever versions PyPI serves, unchecked. The
# project is built into a wheel there without isolation, and that wheel alone (its
# dependencies are in already) is installed. Then byte-compile everything: the root filesystem
# is read-only at run time, so Python could not write .pyc files there. unchecked-hash .pyc
# files stay valid whatever the files' mtimes. The same optional CA as above.
COPY requirements/build.txt ./requirements/
RUN --mount=type=secret,id=pipcert,target=/run/secrets/pipcert \
    if [ -s /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
    && python -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes --no-deps \
       -r requirements/build.txt \
    && /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation -w /tmp/wheel . \
    && pip install --no-cache-dir --no-deps /tmp/wheel/*.whl \
    && rm -r /tmp/wheel /opt/build \
    && rm /opt/venv/bin/kubectl-pgfh \
    && python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash /opt/venv


FROM ${BASE}

# PROMETHEUS_MULTIPROC_DIR must be in the environment before Python starts (prometheus-client
# picks its value class at import); the Deployment mounts an emptyDir there.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH \
    PROMETHEUS_MULTIPROC_DIR=/run/metrics

# A fixed numeric user: Kubernetes' runAsNonRoot can only verify a numeric USER.
RUN groupadd --system --gid 10001 hook \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin hook \
    && install -d -o 10001 -g 10001 -m 0750 /run/metrics

COPY --from=builder /opt/venv /opt/venv

USER 10001:10001
WORKDIR /tmp
# 8080: Metacontroller's /sync and /customize; 9090: /healthz, /readyz, /metrics.
EXPOSE 8080 9090

# Exec form: gunicorn is PID 1 and receives SIGTERM directly. Bind address, workers/threads
# (GUNICORN_WORKERS, GUNICORN_THREADS), graceful_timeout and worker_tmp_dir come from the
# config module shipped in the package.
ENTRYPOINT ["gunicorn", "-c", "python:hooks.shell.gunicorn_conf", "hooks.shell.app:create_app()"]
