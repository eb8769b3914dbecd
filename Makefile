# GPT TrainJobs: train a GPT from scratch on your own text with Kubeflow Pipelines and
# Kubeflow Trainer, then talk to it. `make demo` runs it on this machine; `make test` tests it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Local runs live under ROOT/RUN (on a cluster: /gpt/<KFP run id>).
ROOT ?= runs
RUN ?= demo

.DEFAULT_GOAL := help
.PHONY: help install demo test lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

# A fresh machine needs only Python: the venv is created and the project installed on first use,
# and again whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[pipeline,dev]'
	@touch $@

install: $(STAMP)  ## create .venv and install the project with all extras

demo: $(STAMP)  ## run the pipeline's stages end to end on the embedded default corpus
	$(PY) -m gpt corpus --root $(ROOT) --run $(RUN)

test: $(STAMP)  ## run the test suite
	$(PY) -m pytest

lint: $(STAMP)  ## static checks
	$(PY) -m ruff check .

clean:  ## remove local runs and caches (keeps .venv)
	rm -rf $(ROOT) .pytest_cache .ruff_cache .hypothesis
