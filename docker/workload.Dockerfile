# The workload image: the `gpt` package and PyTorch, what the TrainJobs run.
# Build context: the repository root (see .dockerignore). `make build-images` builds it;
# CPU PyTorch by default, a CUDA build with
#   make build-images TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
# and with no index at all from a folder of wheels: make build-images WHEELHOUSE=DIR.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

# The wheels of an air-gapped build, mounted at /wheelhouse while pip runs: empty unless
# `--build-context wheelhouse=DIR` (make build-images WHEELHOUSE=DIR) puts a folder here.
FROM scratch AS wheelhouse

# The official Python image, or a registry's mirror of it (make build-images BASE_IMAGE=...).
FROM ${BASE_IMAGE}

# The PyTorch wheel index: its +cpu (or +cuXXX) build of the torch version pyproject.toml pins
# outranks PyPI's build of the same version; PyPI still serves everything else.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# true: pip asks no index and installs only from /wheelhouse (make build-images WHEELHOUSE=DIR).
ARG PIP_NO_INDEX=false

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# A C/C++ compiler: torch.compile (on by default on CUDA) builds Triton's kernel launchers with
# gcc, and its CPU kernels with g++; without one a compiled run fails at its first step.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends g++=4:12.2.0-3 \
 && rm -rf /var/lib/apt/lists/*

# uid/gid 1000, the runtimes' securityContext (runAsUser/runAsGroup/fsGroup in runtimes/): the
# image's user then owns what it writes, on the PVC at /gpt too. /gpt exists for `docker run`
# without a volume.
RUN groupadd --gid 1000 gpt \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin gpt \
 && install -d -o 1000 -g 1000 /gpt

WORKDIR /opt/gpt-trainjobs
# Dependencies first, read from pyproject.toml, in a layer that survives code changes: the core
# ones, the serve extra's (`transformers serve`, manifests/serve/transformers-serve.yaml) and the
# storage extra's (s3:// and gs:// sources and --export_uri).
COPY pyproject.toml docker/requirements.py ./
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse \
    python requirements.py pyproject.toml > requirements.txt \
 && python requirements.py pyproject.toml serve >> requirements.txt \
 && python requirements.py pyproject.toml storage >> requirements.txt \
 && pip install --find-links /wheelhouse --extra-index-url "${TORCH_INDEX_URL}" \
        --requirement requirements.txt
# The project itself, from pyproject.toml (its dependencies are satisfied by now); the GPT-2 BPE
# ranks ship inside the package, so nothing is downloaded at run time.
COPY README.md ./
COPY gpt/ gpt/
COPY components/ components/
COPY pipeline/ pipeline/
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse \
    pip install --find-links /wheelhouse --extra-index-url "${TORCH_INDEX_URL}" . \
 && pip check \
 && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

USER 1000:1000
WORKDIR /home/gpt
# Smoke test, as the user the cluster runs: the CLI imports and lists its stages.
RUN python -m gpt --help
CMD ["python", "-m", "gpt", "--help"]
