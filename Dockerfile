# syntax=docker/dockerfile:1
# se-bridge: one image for the agent (a Kubernetes DaemonSet, packaging/kubernetes/overlays/agent
# and agent-drain) and the standalone consumer (packaging/kubernetes/overlays/consumer).
#   docker build -t se-bridge:0.1.0 .
#   docker run --rm se-bridge:0.1.0 --version
#   docker run -d -v /etc/se-bridge:/etc/se-bridge:ro se-bridge:0.1.0 consume --config /etc/se-bridge/consumer.toml
# Secrets never go in the image: settings come from a mounted TOML file or SE_BRIDGE_* variables
# at run time, and cloud sinks use a managed or workload identity by default.

# The base image, pinned by the digest of its multi-platform index: a rebuild takes the same
# bytes until the pin is moved on purpose (Dependabot's docker ecosystem, .github/dependabot.yml).
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

# Build stage: the locked wheels (packaging/requirements/image.txt, exported from uv.lock: the
# image runs the consumer and the agent, which drains its node with the kubernetes extra's
# client when [kubernetes] is on), each checked against its sha256, installed with
# the project's own wheel into /opt/se-bridge, a virtual environment: the same steps work on
# the slim image and on a base of Debian's packages (tests/image), whose python3 has no `pip`
# on PATH and refuses installs into the system (PEP 668, externally managed). The locked
# dependencies come first, so a change of the sources rebuilds only the last layer.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python3 -m venv /opt/se-bridge
COPY packaging/requirements/image.txt ./requirements.txt
RUN /opt/se-bridge/bin/pip download --no-cache-dir --require-hashes --only-binary :all: \
      --dest /wheels -r requirements.txt \
 && /opt/se-bridge/bin/pip install --no-cache-dir --no-index --find-links /wheels \
      --require-hashes -r requirements.txt
COPY pyproject.toml README.md ./
COPY bridge ./bridge
RUN /opt/se-bridge/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && /opt/se-bridge/bin/pip install --no-cache-dir --no-index --no-deps /wheels/se_bridge-*.whl

# Runtime stage: only the installed environment, no compilers, no pip cache, no wheel files.
FROM ${PYTHON_IMAGE} AS runtime
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
# The state directory closed to other users, as the agent makes it (useradd's is 0755): else
# the agent closes it, and says so, at every start.
RUN groupadd --system --gid 10001 se-bridge \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/se-bridge --create-home \
      --shell /usr/sbin/nologin se-bridge \
 && chmod 0750 /var/lib/se-bridge
# The build stage's virtual environment and nothing else: the runtime stage runs no pip and
# needs no network. (A COPY, not a bind mount of the build stage's wheels: Debian's podman
# mounts a cached stage without its files, and keeps a layer that mounted one when it changed.)
COPY --from=build /opt/se-bridge /opt/se-bridge
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001
ENV PATH=/opt/se-bridge/bin:$PATH \
    PYTHONUNBUFFERED=1 \
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
