# The Sluice image: `sluice controller`, `sluice gateway` and the Ray head and workers of
# deploy/kuberay.yaml all run it (docs/deploy.md, step 1):
#   docker build -t ghcr.io/sluice/sluice-serve:0.1.0 .
# GPU workers whose groups run a `command` server add it (one image per server and version):
#   docker build --build-arg EXTRA_PACKAGES="vllm==0.11.0" -t ghcr.io/sluice/sluice-serve-vllm:0.1.0 .
# CI lints this file (hadolint) and checks its install step against pyproject.toml and the
# manifests (tests/unit/test_deploy_manifests.py).

# Python as pyproject.toml asks (requires-python), pinned to a patch release.
ARG PYTHON_VERSION=3.11.14

# The wheel is the compiled build (setup.py; pyproject.toml's [tool.sluice] compiled: the
# decision kernel and the gateway's request path, compiled with mypyc, the same decisions as
# the pure Python, bench/README.md): gcc, mypy (which brings mypyc), the package's
# dependencies and its `compile` extra (type stubs) in this stage only: mypyc type-checks
# the modules strictly, as `make typecheck` does (without pydantic's types a model class is
# Any, and the build fails).
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG MYPY_VERSION=2.4.1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY sluice ./sluice
# hadolint ignore=DL3013
RUN python -m pip install --no-cache-dir "mypy==${MYPY_VERSION}" "setuptools>=69" ".[compile]" \
    && SLUICE_COMPILE=1 python -m pip wheel --no-cache-dir --no-deps --no-build-isolation \
        --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim-bookworm
# SLUICE_VERSION: pyproject.toml's version (the wheel's name has it: another fails the build;
# the rest of the name is the Python and platform it was compiled for).
# RAY_VERSION: deploy/kuberay.yaml's rayVersion; every node and every driver runs the same.
ARG SLUICE_VERSION=0.1.0
ARG RAY_VERSION=2.60.0
ARG EXTRA_PACKAGES=""

# wget: KubeRay's probes of the Ray head and workers run `wget ... | grep success`.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/*

# A user of its own: no process of the image runs as root (runAsNonRoot: uid 10001).
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/sluice sluice \
    && install -d -o sluice -g sluice -m 0750 /var/lib/sluice

# The package by its distribution name with its `ray` extra, and Ray at the cluster's
# version with `default` besides `client`: the dashboard and its agent, which the head and
# the workers need for KubeRay's probes.
COPY --from=build /wheels /wheels
# hadolint ignore=DL3013,SC2086
RUN wheel="$(echo /wheels/sluice_serve-${SLUICE_VERSION}-*.whl)" \
    && pip install --no-cache-dir \
        "${wheel}[ray]" \
        "ray[default,client]==${RAY_VERSION}" \
        ${EXTRA_PACKAGES} \
    && rm -rf /wheels

ENV SLUICE_HOME=/var/lib/sluice \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/sluice
# gateway, control API, gateway metrics (worker i: 9090 + i), controller health
EXPOSE 8080 8081 9090 9091
ENTRYPOINT ["sluice"]
CMD ["--help"]
