# syntax=docker/dockerfile:1
# The FlowForge image: the operator, the admission webhook server and the `flowforge` CLI.
#   docker build -t flowforge/operator:0.1.0 .                 # the official Python base
#   make image                                                 # buildah, no Docker engine
# `make image` (deploy/image/build.sh) passes a Debian base made with mmdebstrap when no
# registry base can be pulled. FlowForge goes into a virtual environment (/opt/flowforge),
# so any Debian-like base with Python >= 3.11 works: the official image's /usr/local Python
# and Debian's /usr/bin/python3 alike (Debian's refuses pip outside a venv, PEP 668).
# The default base is pinned to an exact release tag; to pin by digest as well, pass e.g.
#   --build-arg BASE_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest>
ARG BASE_IMAGE=python:3.11.11-slim-bookworm

# Dependencies: the virtual environment /opt/flowforge with exactly the packages pinned in
# deploy/image/requirements.txt (deploy/image/lock.sh makes it from pyproject.toml), in a
# layer keyed by that file alone: a change to the code or to pyproject.toml's tool settings
# reuses it (buildah --layers, Docker's build cache), and so does every pull of a newer image.
# pip itself stays out of that environment (it lives in /opt/pip of the build stages only).
# A build behind a TLS-inspecting proxy passes the CAs to trust as the optional build secret
# `ca-certificates` (make image passes the host's); it is used by pip and never stored.
FROM ${BASE_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
    && python3 -m venv /opt/pip \
    && /opt/pip/bin/pip install --quiet 'setuptools>=77' \
    && python3 -m venv --without-pip /opt/flowforge
WORKDIR /src
COPY deploy/image/requirements.txt ./
RUN --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
    && /opt/pip/bin/pip --python /opt/flowforge/bin/python install --quiet --no-deps \
       --only-binary=:all: --requirement requirements.txt

# FlowForge itself, as a wheel installed under /staging: only its own files (the package and
# the `flowforge` scripts), to be laid over the environment in a small layer.
# `pip check` fails the build when the pins no longer satisfy pyproject.toml.
FROM deps AS build
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/pip/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/pip/bin/pip --python /opt/flowforge/bin/python install --quiet --no-deps \
       --no-compile --no-warn-script-location --root /staging /wheels/flowforge-*.whl \
    && /opt/pip/bin/pip --python /opt/flowforge/bin/python install --quiet --no-deps \
       --no-compile /wheels/flowforge-*.whl \
    && { /opt/pip/bin/pip --python /opt/flowforge/bin/python check \
         || { echo "deploy/image/requirements.txt is stale: run deploy/image/lock.sh" >&2; exit 1; }; }

# Runtime: the base and that environment, nothing else (no pip, no compiler); a fixed
# non-root uid so that `runAsNonRoot` can verify it (the chart's podSecurityContext).
FROM ${BASE_IMAGE}
RUN groupadd --gid 10001 flowforge \
    && useradd --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin flowforge
COPY --from=deps /opt/flowforge /opt/flowforge
COPY --from=build /staging/ /
# `python` and `flowforge` (the chart's commands) are the environment's. The bytecode is
# compiled here (at its final path), so nothing is written at run time (read-only root).
# MALLOC_ARENA_MAX: two glibc arenas instead of one per thread (up to 8 per core); the
# operator's Kubernetes client threads otherwise each keep a fragmented heap of their own.
ENV PATH=/opt/flowforge/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2
RUN python -m compileall -q /opt/flowforge/lib/python3*/site-packages/flowforge
LABEL org.opencontainers.image.title="FlowForge" \
      org.opencontainers.image.description="FlowForge operator, admission webhooks and CLI" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 10001:10001
WORKDIR /tmp
# metrics, health (/healthz, /readyz), webhook HTTPS
EXPOSE 8080 8081 9443
CMD ["python", "-m", "flowforge.operator"]
