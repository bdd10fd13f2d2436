# syntax=docker/dockerfile:1
# se-bridge: one image for the agent (a Kubernetes DaemonSet, packaging/kubernetes/daemonset.yaml)
# and the standalone consumer (packaging/kubernetes/consumer-deployment.yaml).
#   docker build -t se-bridge:0.1.0 .
#   docker run --rm se-bridge:0.1.0 --version
#   docker run -d -v /etc/se-bridge:/etc/se-bridge:ro se-bridge:0.1.0 consume --config /etc/se-bridge/consumer.toml
# Secrets never go in the image: settings come from a mounted TOML file or SE_BRIDGE_* variables
# at run time, and cloud sinks use a managed or workload identity by default.

# Build stage: wheels for the package and every dependency, with the full toolchain.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge ./bridge
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Runtime stage: only the installed wheels, no compilers, no pip cache, no wheel files.
FROM python:3.11-slim AS runtime
# What the image is and where it came from (OCI annotations): give the commit at build time,
#   docker build --build-arg REVISION="$(git rev-parse HEAD)" -t se-bridge:0.1.0 .
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/se-bridge/se-bridge
LABEL org.opencontainers.image.title="se-bridge" \
      org.opencontainers.image.description="Azure Scheduled Events agent and consumer" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
RUN groupadd --system --gid 10001 se-bridge \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/se-bridge --create-home \
      --shell /usr/sbin/nologin se-bridge
# Installed from the build stage's wheels only (--no-index): the runtime stage needs no network.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels se-bridge
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SE_BRIDGE_AGENT_STATE_DIR=/var/lib/se-bridge
WORKDIR /var/lib/se-bridge
VOLUME ["/var/lib/se-bridge"]
# No HEALTHCHECK: the probes (/healthz, /readyz) are opt-in, on an address the deployment
# chooses (agent.metrics_address, consumer.metrics_address), and Kubernetes ignores HEALTHCHECK
# and uses its own probes (packaging/kubernetes). The Heartbeat record (every 5 minutes, with
# ImdsHealthy and SpoolDepth) is watched centrally; a fatal error exits non-zero.
HEALTHCHECK NONE
# SIGTERM (docker stop, Kubernetes) makes the agent flush and exit 0: allow ~45 s for it.
STOPSIGNAL SIGTERM
ENTRYPOINT ["se-bridge"]
CMD ["agent"]
