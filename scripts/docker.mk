# Containers (Dockerfile, docs/docker.md), included by the Makefile, which names the IMAGE.
# VARIANT=cpu: on Debian's Python with torch's CPU build, for machines without an NVIDIA GPU. LOGS and
# DATA: the host's folders mounted as the container's logs/ and data/, so runs and downloads outlive it.
# The run is the caller's user, so its files are; --gpus all where Docker has NVIDIA's runtime.
# DOCKER_BUILD and DOCKER_RUN: more flags for docker build and docker run.
VARIANT ?= cuda
LOGS ?= $(CURDIR)/logs
DATA ?= $(CURDIR)/data
DOCKER_BUILD ?=
DOCKER_RUN ?=
CPU_VARIANT := --build-arg BASE=python:3.11-slim-bookworm \
	--build-arg TORCH="torch==2.15.0 --index-url https://download.pytorch.org/whl/cpu"
GPUS = $(if $(findstring nvidia,$(shell docker info --format '{{json .Runtimes}}' 2>/dev/null)),--gpus all)
docker_run = mkdir -p "$(LOGS)" "$(DATA)" && docker run --rm --init --user "$$(id -u):$$(id -g)" $(GPUS) \
	-v "$(abspath $(LOGS)):/app/logs" -v "$(abspath $(DATA)):/app/data" $(DOCKER_RUN) $(IMAGE)

.PHONY: docker-build docker-train docker-doctor

docker-build:  ## the image, installed as the README says (VARIANT=cpu: without CUDA)
	docker build -t $(IMAGE) $(if $(filter cpu,$(VARIANT)),$(CPU_VARIANT)) $(DOCKER_BUILD) .

docker-train:  ## train in the image with logs/ and data/ from here: KEY=VALUE overrides, ARGS="..."
	$(docker_run) .venv/bin/python -m lightspeed.train $(HYDRA_ARGS) \
		|| bash scripts/exit_code.sh $$? docker-train

docker-doctor:  ## make doctor in the image: its CUDA, and whether this host's driver can run it
	$(docker_run) make doctor ARGS=$(call _sq,$(value ARGS)) || bash scripts/exit_code.sh $$? docker-doctor
