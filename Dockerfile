# Lightspeed in a container: `make docker-build`, then `make docker-train KEY=VALUE ...` (docs/docker.md).
#
# BASE is the image to build on. The default is NVIDIA's CUDA runtime for the CUDA that TORCH's build
# carries (PyPI's torch 2.15.0 is built for CUDA 13.2): the two move together, and a test holds them to it.
# `make docker-build VARIANT=cpu` builds on Debian's Python with torch's CPU build instead.
# Any Debian or Ubuntu base will do: what it lacks is installed below.
ARG BASE=nvidia/cuda:13.2.0-runtime-ubuntu24.04
FROM ${BASE}

ARG TORCH="torch==2.15.0"
ARG EXTRAS=dev

# HOME: the user a run is started as (`docker run --user`, so that its files are the caller's) has none.
# EXTRAS stays set, so that `make doctor` in the container finds the venv it was built with.
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 HOME=/tmp EXTRAS=${EXTRAS}

# What the base lacks of: Python with venv, make (the README's commands), git (a project made by `make
# new-project` pins its engine by a git URL), and a C++ compiler with Python's headers (torch.compile
# builds kernels with them: inductor on the CPU, Triton's launchers on the GPU).
RUN need=""; \
    command -v python3 >/dev/null || need="python3"; \
    python3 -m venv -h >/dev/null 2>&1 || need="$need python3-venv"; \
    python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_path("include") + "/Python.h"))' \
        2>/dev/null || need="$need python3-dev"; \
    command -v make >/dev/null || need="$need make"; \
    command -v git >/dev/null || need="$need git"; \
    command -v g++ >/dev/null || need="$need g++"; \
    if [ -n "$need" ]; then \
        apt-get update && apt-get install -y --no-install-recommends $need ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /app
# As the README installs it: `make install` (torch, then this package with EXTRAS, in /app/.venv).
COPY pyproject.toml Makefile README.md ./
COPY scripts ./scripts
COPY src ./src
RUN make install PYTHON=python3 TORCH="$TORCH" && rm -rf /tmp/* /root/.cache
COPY conf ./conf

# logs/ and data/ are the host's (make docker-train mounts them): runs and downloads outlive the container.
VOLUME ["/app/logs", "/app/data"]
CMD [".venv/bin/python", "-m", "lightspeed.train"]
