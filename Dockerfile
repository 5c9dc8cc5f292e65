# The operator image: `colocgrpo-operator` (kopf) and the `colocgrpo` CLI. No torch, vLLM or TRL:
# only the `[operator]` extra of the colocgrpo distribution is installed.
#
#   docker build -t colocgrpo/operator:0.1.0 .
#
# The chart (charts/colocgrpo-operator) runs it as user 10001 with a read-only root filesystem and a
# writable /tmp, so nothing here may need to write outside /tmp at run time.

# --- build: a virtual environment with the operator and its dependencies -------------------------------
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/colocgrpo
ENV PATH=/opt/colocgrpo/bin:$PATH

WORKDIR /src
# Only what the distribution is built from (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY training/ training/
# A regular (non-editable) install: the image must not depend on /src. The version ranges live in
# pyproject.toml (the `operator` extra), hence no pins on this line.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[operator]" \
    && python -c "import colocgrpo_operator, kopf, urllib3" \
    && ! python -c "import torch" 2>/dev/null \
    && ! python -c "import kubernetes" 2>/dev/null

# --- runtime -------------------------------------------------------------------------------------------
FROM python:3.11-slim

LABEL org.opencontainers.image.title="colocgrpo-operator" \
      org.opencontainers.image.description="Kubernetes operator for GRPO with vLLM colocated in DeepSpeed ZeRO-3 training" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric non-root user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 colocgrpo \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin colocgrpo

COPY --from=build /opt/colocgrpo /opt/colocgrpo

ENV PATH=/opt/colocgrpo/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

USER 10001:10001
WORKDIR /tmp

# 8080: liveness (/healthz); 9090: Prometheus metrics (/metrics).
EXPOSE 8080 9090

ENTRYPOINT ["colocgrpo-operator"]
