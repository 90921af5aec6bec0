# One image for every Chronoshard process: the scheduler node (the default command), the
# watchdog, the worker runner and the CLI.
#
#   docker build -t chronoshard .
#   docker run IMAGE                                   # chronoshard-scheduler
#   docker run IMAGE chronoshard-watchdog
#   docker run -v "$PWD:/app:ro" IMAGE chronoshard worker mymod:worker
#   docker run IMAGE chronoshard tasks ls --target sched-1:7070
#
# No ENTRYPOINT, only CMD: the scheduler and the watchdog are programs of their own, not
# `chronoshard` subcommands, so an ENTRYPOINT would either fix one of them or be a shell
# wrapper that every command goes through; with CMD alone, the command given to
# `docker run` is what runs, as PID 1. No init is needed: every long-running command
# (scheduler, watchdog, worker) handles SIGTERM itself — it drains and exits — and starts
# no children (a worker whose handlers start processes of their own: `docker run --init`).
# Needs BuildKit (Docker 23 and later build with it by default) for the cache mount.
#
# Configuration is the programs' own (docs/configuration.md): a TOML file mounted and
# named with --config, or CHRONOSHARD_* variables. Their listen addresses default to the
# loopback, also here: set CHRONOSHARD_GRPC__LISTEN=0.0.0.0:7070 with
# CHRONOSHARD_GRPC__ADVERTISE=<an address peers and workers reach>,
# CHRONOSHARD_METRICS_LISTEN=0.0.0.0:9464 and, for the watchdog,
# CHRONOSHARD_HTTP_LISTEN=0.0.0.0:9465; the image does not guess an address to advertise.
# A worker's code goes in /app (the working directory, which the runner imports from):
# mount it, or build FROM this image and COPY it there.
#
# The Python environment is made by scripts/image-install.sh, which
# tests/integration/test_image.py runs too: the test starts every process from exactly
# what this image installs.

# Python 3.11 on Debian 12, pinned by version and by the digest of the multi-platform
# index (amd64 and arm64 alike), so a rebuild gets the same base until this line changes.
# Both stages start from it: the venv made in one runs in the other.
FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d AS base

FROM base AS builder
WORKDIR /src
# What the wheel is built from, and nothing else (.dockerignore keeps the rest out of
# the build context as well).
COPY pyproject.toml README.md ./
COPY chronoshard/ chronoshard/
COPY scheduler/ scheduler/
COPY worker/ worker/
COPY watchdog/ watchdog/
COPY proto/ proto/
COPY scripts/image-install.sh scripts/
# The cache mount keeps pip's downloads between builds and out of every layer.
RUN --mount=type=cache,target=/root/.cache/pip \
    scripts/image-install.sh /src /tmp/wheels /opt/chronoshard

FROM base AS runtime
# A fixed numeric user, so Kubernetes' runAsNonRoot can check it and volume ownership can
# be set ahead; it owns nothing in the image (the venv and /app are root's, read-only to it).
RUN groupadd --system --gid 10001 chronoshard \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /nonexistent \
        --no-create-home --shell /usr/sbin/nologin chronoshard
COPY --from=builder /opt/chronoshard /opt/chronoshard
ENV PATH=/opt/chronoshard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app
USER 10001:10001
# gRPC (scheduler), Prometheus /metrics (scheduler), /metrics and /healthz (watchdog).
EXPOSE 7070 9464 9465
# Checks a scheduler node: its overall gRPC health on the loopback. For a watchdog
# container use `--health-cmd "chronoshard health --target http://127.0.0.1:9465/healthz"`,
# for a worker `--no-healthcheck`. Kubernetes ignores HEALTHCHECK; its probes are in the
# pod spec (grpc probes, or this command as an exec probe).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["chronoshard", "health", "--target", "127.0.0.1:7070", "--timeout", "4s"]
CMD ["chronoshard-scheduler"]
