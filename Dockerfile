# se-bridge: one image for the agent (e.g. a Kubernetes DaemonSet) and the standalone consumer.
# Build stage: build the wheel with the full toolchain; runtime stage: only the installed package.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge ./bridge
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/se-bridge --create-home se-bridge
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER se-bridge
ENV PYTHONUNBUFFERED=1 SE_BRIDGE_AGENT_STATE_DIR=/var/lib/se-bridge
VOLUME ["/var/lib/se-bridge"]
ENTRYPOINT ["se-bridge"]
CMD ["agent"]
