# GPT TrainJobs: train a GPT from scratch on your own text with Kubeflow Pipelines and
# Kubeflow Trainer, then talk to it. `make demo` runs it on this machine; `make test` tests it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Local runs live under ROOT/RUN (on a cluster: /gpt/<KFP run id>).
ROOT ?= runs
RUN ?= demo
# Container images. images.env is the one source of their names (components/step/image_names.py reads it
# too); `make ... IMAGE_REGISTRY=... IMAGE_TAG=...` overrides it, and the export hands the same
# names to every command make runs, compiling the pipeline among them.
include images.env
export IMAGE_REGISTRY IMAGE_TAG
WORKLOAD_IMAGE = $(IMAGE_REGISTRY)/gpt-workload:$(IMAGE_TAG)
COMPONENT_IMAGE = $(IMAGE_REGISTRY)/gpt-component:$(IMAGE_TAG)
# Docker, Podman or Buildah: the first of them that can build here, unless CONTAINER_TOOL names one
# (looked for once, and only by the targets that use it).
CONTAINER_TOOLS := docker podman buildah
ifndef CONTAINER_TOOL
CONTAINER_TOOL = $(eval CONTAINER_TOOL := $(firstword $(foreach tool,$(CONTAINER_TOOLS),$(if \
	$(shell $(tool) info >/dev/null 2>&1 && echo up),$(tool)))))$(CONTAINER_TOOL)
endif
# Buildah (and Podman's builds) here: chroot isolation (no nested runtime needed, as root) and
# every step a cached layer, so a rebuild after a code change reuses the dependency layers.
export BUILDAH_ISOLATION ?= chroot
export BUILDAH_LAYERS ?= true
# CPU PyTorch; https://download.pytorch.org/whl/cu128 (or another CUDA index) for a CUDA build.
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# BASE_IMAGE: the Python image both images start from (default: the Dockerfiles' pinned official
# one); a registry's mirror of it, or docker/debian-base.sh's stand-in.
BASE_IMAGE ?=
# WHEELHOUSE=DIR: an air-gapped build, pip installing only from DIR's wheels and asking no index
# (fill DIR with `make wheelhouse WHEELHOUSE=DIR` on a connected machine).
WHEELHOUSE ?=
BUILD_FLAGS = $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) \
	$(if $(WHEELHOUSE),--build-context wheelhouse=$(abspath $(WHEELHOUSE)) --build-arg PIP_NO_INDEX=true)

.DEFAULT_GOAL := help
.PHONY: help install demo prompt compile test test-quick test-images test-serving bench bench-quick lint clean build-images push-images set-images container-tool wheelhouse

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

# A fresh machine needs only Python: the venv is created and the project installed on first use,
# and again whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[pipeline,serve,storage,dev]'
	@touch $@

# Stoplight Prism (npm, pinned by tests/fixtures/model_registry/'s package-lock), the server that
# checks the Model Registry client's requests against the registry's OpenAPI spec
# (tests/support/registry.py), installed into the venv; where npm is missing, those tests skip
# and say so.
CONTRACT := tests/fixtures/model_registry
PRISM_STAMP := $(VENV)/prism/.installed
$(PRISM_STAMP): $(CONTRACT)/package.json $(CONTRACT)/package-lock.json
	@if command -v npm >/dev/null; then \
		mkdir -p $(VENV)/prism && cp $^ $(VENV)/prism/ \
		&& npm ci --prefix $(VENV)/prism --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "make: npm not found: Prism not installed, the Model Registry contract tests skip"; fi

install: $(STAMP) $(PRISM_STAMP)  ## create .venv and install the project with all extras (and Prism)

# The compiled pipeline itself, run by kfp.local: every stage a local process under ROOT/RUN,
# the prompt stage one-shot. Step artifacts (metrics, report, transcript): ROOT/kfp-outputs/RUN/.
DEMO_PROMPTS ?= ["To be, or not to be", "ANTIPHOLUS:"]
demo: $(STAMP)  ## run the compiled pipeline end to end here with kfp.local (embedded corpus)
	$(PY) -m pipeline run-local --root $(ROOT) --run $(RUN) --set 'prompt=$(DEMO_PROMPTS)'

prompt: $(STAMP)  ## talk to the trained model of ROOT/RUN (after make demo); exit or Ctrl-D ends
	$(PY) -m gpt generative-prompt --root $(ROOT) --run $(RUN)

# What serve=kserve does on a cluster, here: transformers serve on the run's model/, on
# localhost:8000 (OpenAI's API under /v1), after printing the curl and openai calls that reach it.
.PHONY: serve
serve: $(STAMP)  ## serve the model of ROOT/RUN (after make demo) on localhost:8000 with OpenAI's API
	$(PY) -m pipeline serve-local --root $(ROOT) --run $(RUN)

compile: $(STAMP)  ## compile the pipeline to pipeline/gpt_trainjobs_pipeline.yaml (commit it)
	$(PY) -m pipeline compile

# One process per core (more made every test slower: the CPU time grew by half), each with one
# OpenMP thread (torch's pool is one thread per core, so the workers' pools would fight over the
# cores: 21 CPU minutes instead of 16) and compiling torch.compile's kernels itself (inductor's
# default, a pool of compile processes per worker, cost 3-9 s more CPU per cold compile test);
# the tests that take minutes start first (tests/conftest.py). TEST_WORKERS=0 runs the suite in
# this one process.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
test: $(STAMP) $(PRISM_STAMP)  ## run the test suite (but the serving tests: make test-serving)
	OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 $(PY) -m pytest -m 'not serving' -n $(TEST_WORKERS) --dist load --maxschedchunk 1 --durations=20

# The edit loop's answer: the tests that start no process, use no cluster and compile nothing
# (tests/support/quick.py; a test that does any of these carries a marker, and in every run an
# unmarked one that does fails). CI runs `make test`, the whole suite, then `make test-serving`.
test-quick: $(STAMP)  ## the tests that start no process, use no cluster, compile nothing (the edit loop)
	OMP_NUM_THREADS=1 $(PY) -m pytest --quick -n $(TEST_WORKERS) --dist load --durations=5

# The tests against KServe's own Hugging Face server (marker `serving`: the test cluster's KServe,
# tests/support/cluster/kserve.py), which runs from a virtualenv of its own (3.3 GB, about 6
# minutes to install from PyPI with ../shared/peers/kserve-huggingfaceserver/install.sh):
# installed once into KSERVE_SERVER_VENV, outside the project, and kept for the next runs.
# Without ../shared there is nothing to install, and the tests skip, saying why.
KSERVE_SERVER_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpt-trainjobs/kserve-huggingfaceserver-v0.20.0
KSERVE_SERVER_INSTALL := ../shared/peers/kserve-huggingfaceserver/install.sh
$(KSERVE_SERVER_VENV)/.installed:
	@if [ -f $(KSERVE_SERVER_INSTALL) ]; then \
		rm -rf $(KSERVE_SERVER_VENV) && bash $(KSERVE_SERVER_INSTALL) $(KSERVE_SERVER_VENV) && touch $@; \
	else echo "make: $(KSERVE_SERVER_INSTALL) not found: KServe's server not installed, the serving tests skip"; fi

test-serving: $(STAMP) $(KSERVE_SERVER_VENV)/.installed  ## the tests against KServe's own server (installs it once, 3.3 GB)
	OMP_NUM_THREADS=1 GPT_KSERVE_SERVER_VENV=$(KSERVE_SERVER_VENV) $(PY) -m pytest -m serving -n $(TEST_WORKERS) --dist load --durations=10

# Root with Buildah and mmdebstrap (apt-get install buildah mmdebstrap); skipped, with the reason,
# elsewhere. Layers, the base image and the wheelhouse stay on the machine for the next run.
test-images: $(STAMP)  ## build both images here and run the stages and a pipeline step inside them
	GPT_TEST_IMAGES=1 $(PY) -m pytest tests/images

# Benchmarks report, never fail: tables on stdout, JSON per benchmark and summary.md in
# bench/results/. `make bench BENCH=train` runs one.
bench: $(STAMP)  ## run every benchmark in bench/ (a few minutes on 2 cores)
	$(PY) -m bench $(BENCH)

bench-quick: $(STAMP)  ## the benchmarks with fewer repeats and cases (under a minute)
	$(PY) -m bench --quick $(BENCH)

lint: $(STAMP)  ## static checks
	$(PY) -m ruff check .
	$(VENV)/bin/hadolint docker/*.Dockerfile
	$(PY) -m yamllint --strict runtimes manifests

build-images: container-tool  ## build both images, then point runtimes/ and the pipeline at them
	$(if $(WHEELHOUSE),$(if $(wildcard $(WHEELHOUSE)/*.whl),,$(error WHEELHOUSE=$(WHEELHOUSE) has no wheels: fill it with make wheelhouse WHEELHOUSE=$(WHEELHOUSE))))
	$(CONTAINER_TOOL) build --file docker/workload.Dockerfile $(BUILD_FLAGS) \
		--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL) --tag $(WORKLOAD_IMAGE) .
	$(CONTAINER_TOOL) build --file docker/component.Dockerfile $(BUILD_FLAGS) \
		--tag $(COMPONENT_IMAGE) .
	$(MAKE) --no-print-directory set-images compile

push-images: container-tool  ## push both images to IMAGE_REGISTRY
	$(CONTAINER_TOOL) push $(WORKLOAD_IMAGE)
	$(CONTAINER_TOOL) push $(COMPONENT_IMAGE)

set-images:  ## point runtimes/ (kustomize images:) at IMAGE_REGISTRY/IMAGE_TAG without building
	$(PYTHON) docker/set_image.py runtimes/kustomization.yaml gpt-workload=$(WORKLOAD_IMAGE)

# Every wheel both images install, their build backend's too, for WHEELHOUSE builds: run it with
# the images' Python (3.11, Linux x86_64), as pip builds the wheels of sdist-only packages.
wheelhouse:  ## fill WHEELHOUSE=DIR with the wheels both images install (on a connected machine)
	$(if $(WHEELHOUSE),,$(error make wheelhouse: name the folder to fill, WHEELHOUSE=DIR))
	@mkdir -p $(WHEELHOUSE)
	{ for extra in '' serve storage pipeline build-system; do \
		$(PYTHON) docker/requirements.py pyproject.toml $$extra || exit 1; done; } \
		> $(WHEELHOUSE)/requirements.txt.tmp && mv $(WHEELHOUSE)/requirements.txt.tmp $(WHEELHOUSE)/requirements.txt
	$(PYTHON) -m pip wheel --wheel-dir $(WHEELHOUSE) --requirement $(WHEELHOUSE)/requirements.txt \
		$(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL))

# One line saying what is missing, before any build starts: $(error) stops make right here.
container-tool:
	$(if $(CONTAINER_TOOL),,$(error no container tool can build here: none of $(CONTAINER_TOOLS) answers '<tool> info' (no Docker engine, Podman or Buildah); install one (apt-get install buildah) or start the Docker daemon))
	$(if $(shell command -v $(CONTAINER_TOOL) 2>/dev/null),,$(error $(CONTAINER_TOOL) not found: install Docker, Podman or Buildah and pass CONTAINER_TOOL=docker, podman or buildah))
	$(if $(shell $(CONTAINER_TOOL) info >/dev/null 2>&1 && echo up),,$(error $(CONTAINER_TOOL) is installed but no engine answers '$(CONTAINER_TOOL) info': start the Docker daemon or the Podman machine))

clean:  ## remove local runs and caches (keeps .venv)
	rm -rf $(ROOT) .pytest_cache .ruff_cache .hypothesis
