# syntax=docker/dockerfile:1
# The FlowForge image: the operator, the admission webhook server and the `flowforge` CLI.
#   docker build -t flowforge/operator:0.1.0 .
# The base is pinned to an exact release tag; to pin by digest as well, pass e.g.
#   --build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# Builder: the flowforge wheel and wheels of all its dependencies.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --wheel-dir /wheels .

# Runtime: installed from those wheels only (no index, no compiler), run as a fixed non-root
# uid so `runAsNonRoot` can verify it; nothing is written outside /tmp at run time.
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels flowforge \
    && groupadd --system --gid 10001 flowforge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin flowforge
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 9443
CMD ["python", "-m", "flowforge.operator"]
