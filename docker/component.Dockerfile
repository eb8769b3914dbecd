# The component image: kfp, the kubernetes client, `components/` and `pipeline/`, what the KFP
# pipeline steps run. No PyTorch: the steps only create, watch and clean up TrainJobs.
# Build context: the repository root (see .dockerignore). `make build-images` builds it.
FROM python:3.11.14-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/gpt-trainjobs
# The `pipeline` extra of pyproject.toml: kfp at exactly the version that compiles the pipeline
# (so KFP's launch command finds it installed and fetches nothing), and the kubernetes client.
COPY pyproject.toml docker/requirements.py ./
RUN python requirements.py pyproject.toml pipeline > requirements.txt \
 && pip install --requirement requirements.txt
# The project with --no-deps: its core dependencies are the workload's (PyTorch and friends); the
# steps import only `components`, `pipeline` and gpt's standard-library config types.
COPY README.md images.env ./
COPY gpt/ gpt/
COPY components/ components/
COPY pipeline/ pipeline/
# Importing a component module names its base image from images.env (components/images.py), so
# the image carries that file where images.py looks. Which workload image a TrainJob runs is not
# decided here: the compiled pipeline passes it (parameter workload_image).
# Smoke test: every module of both packages imports as installed (-I: not from the source here).
RUN pip install --no-deps . \
 && cp images.env "$(python -I -c 'from components.images import IMAGES_ENV; print(IMAGES_ENV)')" \
 && python -I -c "import importlib, pkgutil, kfp, components, pipeline; \
print('kfp', kfp.__version__, *[importlib.import_module(f'{p.__name__}.{m.name}').__name__ \
for p in (components, pipeline) for m in pkgutil.iter_modules(p.__path__)])"

# No USER: KFP v2 steps write their artifacts under /minio, /s3 or /gcs at the filesystem root,
# which a non-root user cannot create (kubeflow/pipelines#10397); KFP's pod spec decides the user.
