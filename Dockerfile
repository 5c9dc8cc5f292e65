# The operator image: `colocgrpo-operator` (kopf) and the `colocgrpo` CLI. No torch, vLLM or TRL:
# only the `[operator]` extra of the colocgrpo distribution is installed.
#
#   docker build -t colocgrpo/operator:0.1.0 .
#
# `make images` builds it without a Docker daemon (images/build.py). The chart (charts/colocgrpo-operator) runs it
# as user 10001 with a read-only root filesystem and a writable /tmp, so nothing here may need to write outside /tmp
# at run time.
FROM debian:bookworm-slim

LABEL org.opencontainers.image.title="colocgrpo-operator" \
      org.opencontainers.image.description="Kubernetes operator for GRPO with vLLM colocated in DeepSpeed ZeRO-3 training" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Debian 12's own CPython 3.11. Debian's versions move with its security updates, so they are not pinned here.
# A fixed numeric non-root user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 colocgrpo \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin colocgrpo

# PIP_CERT: a CA bundle for pip, where a TLS-inspecting proxy sits between the build and PyPI; pass it as the
# secret `pip-ca` and name it: --secret id=pip-ca,src=BUNDLE --build-arg PIP_CERT=/run/secrets/pip-ca.
# Unset, pip uses its own bundle. pip's wheel cache is a build cache mount, never part of the image.
ARG PIP_CERT
ARG PIP_VERSION=26.3
RUN --mount=type=secret,id=pip-ca --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/colocgrpo/venv \
    && /opt/colocgrpo/venv/bin/pip install "pip==${PIP_VERSION}"
ENV PATH=/opt/colocgrpo/venv/bin:$PATH

# The dependencies first, read from pyproject.toml (the base and the `operator` extra; the version ranges live
# there, hence no pins here), so that a change to the code rebuilds only the last layers.
COPY pyproject.toml /tmp/src/
# hadolint ignore=DL3013
RUN --mount=type=secret,id=pip-ca --mount=type=cache,target=/root/.cache/pip \
    python -c 'import tomllib; p = tomllib.load(open("/tmp/src/pyproject.toml", "rb")); \
print("\n".join(p["build-system"]["requires"] + p["project"]["dependencies"] + p["project"]["optional-dependencies"]["operator"]))' \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm -rf /tmp/src /tmp/requirements.txt

# A regular (non-editable) install: the image must not depend on /tmp/src. pyproject.toml names README.md as the
# package's long description, which the image has no use for: a one-line stand-in keeps a documentation change
# from rebuilding the image.
COPY pyproject.toml /tmp/src/
COPY operator/ /tmp/src/operator/
COPY training/ /tmp/src/training/
RUN echo "colocgrpo" > /tmp/src/README.md \
    && pip install --no-cache-dir --no-deps --no-build-isolation /tmp/src \
    && rm -rf /tmp/src \
    && python -c "import colocgrpo_operator, kopf, urllib3" \
    && ! python -c "import torch" 2>/dev/null \
    && ! python -c "import kubernetes" 2>/dev/null

ENV HOME=/tmp
USER 10001:10001
WORKDIR /tmp

# 8080: liveness (/healthz); 9090: Prometheus metrics (/metrics).
EXPOSE 8080 9090

ENTRYPOINT ["colocgrpo-operator"]
