# The component image: kfp, the kubernetes client, `components/` and `pipeline/`, what the KFP
# pipeline steps run. No PyTorch: the steps only create, watch and clean up TrainJobs.
# Build context: the repository root (see .dockerignore). `make build-images` builds it; base
# image, wheelhouse and PIP_NO_INDEX as in workload.Dockerfile.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM scratch AS wheelhouse

FROM ${BASE_IMAGE}
ARG PIP_NO_INDEX=false

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/gpt-trainjobs
# The `pipeline` extra of pyproject.toml: kfp at exactly the version that compiles the pipeline
# (so KFP's launch command finds it installed and fetches nothing), and the kubernetes client.
COPY pyproject.toml docker/requirements.py ./
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse \
    python requirements.py pyproject.toml pipeline > requirements.txt \
 && pip install --find-links /wheelhouse --requirement requirements.txt
# The project with --no-deps: its core dependencies are the workload's (PyTorch and friends); the
# steps import only `components`, `pipeline` and gpt's standard-library config types.
COPY README.md images.env ./
COPY gpt/ gpt/
COPY components/ components/
COPY pipeline/ pipeline/
# Importing a component module names its base image from images.env (components/step/image_names.py), so
# the image carries that file where images.py looks. Which workload image a TrainJob runs is not
# decided here: the compiled pipeline passes it (parameter workload_image).
# Smoke test: every module of both packages imports as installed (-I: not from the source here).
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse \
    pip install --find-links /wheelhouse --no-deps . \
 && cp images.env "$(python -I -c 'from components.step.image_names import IMAGES_ENV; print(IMAGES_ENV)')" \
 && python -I -c "import importlib, pkgutil, kfp, components, pipeline; \
print('kfp', kfp.__version__, *[importlib.import_module(f'{p.__name__}.{m.name}').__name__ \
for p in (components, pipeline) for m in pkgutil.iter_modules(p.__path__)])"

# A non-root user, uid/gid 1000 as in the workload image. KFP v2's launcher writes a step's
# artifacts under /gcs, /minio and /s3 at the filesystem root, which a non-root user cannot create
# (kubeflow/pipelines#5673, #10397; newer backends mount emptyDirs there, #10538, older ones do
# not): the image makes them, owned by the user and writable by group 0 (OpenShift's arbitrary
# uids run with gid 0).
RUN groupadd --gid 1000 gpt \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin gpt \
 && install -d -o 1000 -g 0 -m 0775 /gcs /minio /s3
USER 1000:1000
WORKDIR /home/gpt
