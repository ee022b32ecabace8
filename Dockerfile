# pg-failover-hook image: gunicorn + the Flask hook, nothing else.
#
#   docker build -t ghcr.io/adg-io/pg-failover-hook:0.1.0 .
#
# Both stages use the same base (same Python path), so the venv built in the first stage runs
# unchanged in the second. python:3.11-slim-bookworm pins the Python minor version and the
# Debian release; pin it by digest (python:3.11-slim-bookworm@sha256:...) for bit-for-bit
# reproducible builds.

FROM python:3.11-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY pyproject.toml README.md ./
COPY hooks ./hooks

# A regular (non-editable) install of the project and its runtime dependencies only, then
# byte-compile everything: the root filesystem is read-only at run time, so Python could not
# write .pyc files there. unchecked-hash .pyc files stay valid whatever the files' mtimes.
RUN pip install --no-cache-dir . \
    && python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash /opt/venv


FROM python:3.11-slim-bookworm

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
EXPOSE 8080

# Exec form: gunicorn is PID 1 and receives SIGTERM directly. Bind address, workers/threads
# (GUNICORN_WORKERS, GUNICORN_THREADS), graceful_timeout and worker_tmp_dir come from the
# config module shipped in the package.
ENTRYPOINT ["gunicorn", "-c", "python:hooks.gunicorn_conf", "hooks.app:create_app()"]
