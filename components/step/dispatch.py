"""One way to run a stage, whatever the backend: validation, then dispatch.

A component hands `run_step` its stage's name (gpt/stages.py's table) and its parameters, every
one a knob (components/step/parameter_docs.py): a flag of the stage under its CLI name (the
component parameter `n_layer` is the flag `--n_layer`), a field of `Placement` or of `StepKnobs`
below.
`run_stage` takes them sorted, and gives back the run-directory files the component turns into
KFP artifacts. With backend "trainjob" the stage runs in a Kubeflow Trainer TrainJob
(components/trainjob/launcher.py), with "local" as a process on this machine
(components/step/local_process.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from components.step import context as step_context
from components.trainjob.placement import Placement
from gpt.config.cli import parse_config
from gpt.rundir.layout import RunDir
from gpt.stages import STAGES, Stage, to_args

BACKENDS = ("trainjob", "local")
# Where every runtime mounts PVC gpt-pvc (runtimes/*.yaml): the root of run directories there.
CLUSTER_ROOT = "/gpt"
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"  # an RFC 1123 label (a namespace's name)
_RFC1123 = re.compile(rf"^{_LABEL}$")
# A Secret's name: a DNS subdomain (dot-separated RFC 1123 labels, 253 characters at most).
_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
# A KFP parameter cannot be None (kfp.local refuses it, and so do pipeline inputs): a component
# parameter whose flag is unset by default (None in gpt/config/configs.py) has this default instead,
# and run_step leaves the flag out. The one "unset" of every component and of the pipeline.
UNSET = -1


@dataclass(frozen=True)
class StepKnobs:
    """What a step needs besides its stage's flags and its `Placement`: where the stage runs."""

    backend: str = "trainjob"
    """trainjob (a Kubeflow Trainer TrainJob) or local (a process on this machine, stdin closed)."""
    workload_image: str = ""
    """Image the TrainJob runs: the gpt package and PyTorch (the pipeline sets it from
    images.env when it compiles; a run may override it, e.g. with a CUDA build)."""
    namespace: str = ""
    """Namespace of the TrainJob and of PVC gpt-pvc; empty: the step's own (its pod's: kubeflow
    on standalone KFP, the profile namespace on multi-user Kubeflow)."""
    storage_secret: str = ""
    """Secret in that namespace whose AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and
    AWS_ENDPOINT_URL, AWS_REGION, ... where present) the TrainJob takes by reference as its
    variables, for s3:// URIs; empty: none (no object storage, or IRSA / Workload Identity)."""
    kfp_run_id: str = ""
    """The pipeline passes its run id here (dsl.PIPELINE_JOB_ID_PLACEHOLDER), the run id when
    `run` is empty; a KFP backend before 2.5 passes it unresolved, and then the step pod's
    `pipeline/runid` label stands in (components/step/context.py)."""


@dataclass(frozen=True)
class StepResult:
    run_id: str
    """The run this step worked on: the next step's `run`."""
    files: dict[str, bytes]
    """The stage's output files that exist, by their path inside the run directory."""


def sort_knobs(stage: Stage, knobs: Mapping[str, Any]) -> tuple[dict[str, Any], Placement,
                                                                  StepKnobs]:
    """A component's parameters -> (the stage's flags, its Placement, its StepKnobs).

    A flag left unset is left out, as the CLI leaves it: UNSET where its config default is None,
    "" where the default is that empty text (`export_uri`: no copy), so a TrainJob's command line
    shows only what a flag says. A parameter that is no knob is refused: a component's signature
    cannot drift from the knobs unseen."""
    config = {f.name: f for f in dataclasses.fields(stage.config)}
    placement = {f.name for f in dataclasses.fields(Placement)}
    step = {f.name for f in dataclasses.fields(StepKnobs)}
    for name in knobs:
        if name not in config.keys() | placement | step:
            raise ValueError(f"{name}: not a flag of {stage.name} nor a knob of its step")
    flags: dict[str, Any] = {}  # in the config's order: --root and --run first
    for name, f in config.items():
        if name in knobs:
            value = knobs[name]
            unset = (f.default is None and value == UNSET) or (f.default == "" == value)
            flags[name] = None if unset else value
    return (flags, Placement(**{k: v for k, v in knobs.items() if k in placement}),
            StepKnobs(**{k: v for k, v in knobs.items() if k in step}))


def run_step(
    name: str,
    knobs: Mapping[str, Any],
    *,
    on_update: Callable[[dict[str, Any]], None] | None = None,
) -> StepResult:
    """What a component does: run stage `name` with the component's parameters `knobs`, on the
    run `run` (empty: this KFP run's id)."""
    stage = STAGES[name]
    flags, placement, step = sort_knobs(stage, knobs)
    flags["run"] = flags.get("run") or step_context.run_id(step.kfp_run_id)
    files = run_stage(name, flags, placement, backend=step.backend, image=step.workload_image,
                      namespace=step.namespace, storage_secret=step.storage_secret,
                      on_update=on_update)  # fmt: skip
    return StepResult(flags["run"], files)


def validate(
    stage: Stage,
    values: Mapping[str, Any],
    placement: Placement,
    *,
    backend: str,
    image: str,
    namespace: str,
    storage_secret: str = "",
) -> list[str]:
    """Check everything before anything is created; return the stage's arguments.

    Raises ValueError naming the parameter. The stage's flags are parsed by the stage's own
    config class, exactly as `python -m gpt <stage>` will parse them.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: must be one of {', '.join(BACKENDS)}")
    if backend == "trainjob":
        if not _RFC1123.match(namespace) or len(namespace) > 63:
            raise ValueError(f"namespace {namespace!r}: not a valid Kubernetes namespace name")
        if values.get("root") != CLUSTER_ROOT:
            raise ValueError(
                f"root {values.get('root')!r}: the trainjob backend keeps runs on PVC gpt-pvc, "
                f"mounted at {CLUSTER_ROOT} by the runtimes; use root={CLUSTER_ROOT!r}"
            )
        if not image:
            raise ValueError("workload_image: empty; a TrainJob needs the image to run the stage")
    if not stage.distributed and not placement.single_process:
        raise ValueError(f"num_nodes/num_proc_per_node: {stage.name} runs as one process")
    if storage_secret and (not _SUBDOMAIN.match(storage_secret) or len(storage_secret) > 253):
        raise ValueError(f"storage_secret {storage_secret!r}: not a valid Kubernetes Secret name")
    if backend == "local" and storage_secret:
        raise ValueError(
            f"storage_secret {storage_secret!r}: the local backend has no Secrets; it reads "
            "the object-store variables (AWS_ACCESS_KEY_ID, ...) from this machine's environment"
        )
    if backend == "local" and placement.num_nodes != 1:
        raise ValueError(
            f"num_nodes {placement.num_nodes}: the local backend runs on this one machine"
        )
    args = to_args(values)
    # Parsed twice by design: here, in the step, only to refuse a bad flag before a TrainJob (or
    # a process) exists, the parse thrown away; the stage parses `args` again where it runs
    # (gpt/__main__.py, with the same parse_config), and that is the parse the stage runs on.
    _parse_with_stage_config(stage, args)
    return args


def _parse_with_stage_config(stage: Stage, args: list[str]) -> None:
    # The stages' configs (gpt/config/configs.py) import no PyTorch, numpy or tiktoken, so they load
    # here too, in the component image that has none of them.
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse_config(stage.config, args, stage.prog, "")
    except SystemExit:
        # argparse's complaint (unknown flag, bad choice) is its last line.
        raise ValueError(err.getvalue().strip().splitlines()[-1]) from None
    except Exception as e:  # the config's own checks: ValueError, InputError
        raise ValueError(str(e)) from None


def run_stage(
    name: str,
    values: Mapping[str, Any],
    placement: Placement,
    *,
    backend: str,
    image: str = "",
    namespace: str = "",
    storage_secret: str = "",
    on_update: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, bytes]:
    """Run stage `name` with `values` (its flags, `root` and `run` included) to the end.

    `image` is the workload image the TrainJob runs (backend "trainjob"): the pipeline fixes it
    when it compiles (from images.env), so a step never guesses it from where it runs.
    `namespace` is where the TrainJob goes; empty: the step's own (components/step/context.py).
    `storage_secret` names a Secret there whose object-store credentials the TrainJob's
    container takes as its variables (`launcher.secret_env`); empty: none.
    Returns the stage's output files that exist, by their path inside the run directory.
    """
    stage = STAGES[name]
    if backend == "trainjob":
        namespace = step_context.namespace(namespace)
    args = validate(stage, values, placement, backend=backend, image=image, namespace=namespace,
                    storage_secret=storage_secret)  # fmt: skip
    rundir = RunDir.of(values["root"], values["run"])
    if backend == "local":
        return _run_local(stage, args, placement, rundir, say)
    return _run_trainjob(stage, args, placement, rundir, image=image, namespace=namespace,
                         storage_secret=storage_secret, on_update=on_update, say=say)  # fmt: skip


def _run_local(
    stage: Stage, args: list[str], placement: Placement, rundir: RunDir, say: Callable[[str], None]
) -> dict[str, bytes]:
    """The local backend: the stage as a process here; its output files, read from rundir."""
    from components.step.local_process import run_as_process

    run_as_process(stage, args, placement, say=say)
    found = [rundir.path / out.rel for out in stage.carried]
    return {str(p.relative_to(rundir.path)): p.read_bytes() for p in found if p.is_file()}


def _run_trainjob(
    stage: Stage,
    args: list[str],
    placement: Placement,
    rundir: RunDir,
    *,
    image: str,
    namespace: str,
    storage_secret: str,
    on_update: Callable[[dict[str, Any]], None] | None,
    say: Callable[[str], None],
) -> dict[str, bytes]:
    """The trainjob backend: the stage in a TrainJob; its output files, from node 0's log."""
    from components.trainjob import launcher
    from components.trainjob.claims import check_multi_node
    from components.trainjob.stagelog import container_command

    # torchrun takes --nnodes, --nproc_per_node, --node_rank, --master_addr/port from the PET_*
    # variables the Trainer's torch policy sets from numNodes and numProcPerNode;
    # gpt.distributed.torchrun is torchrun exiting with its workers' status, which the train
    # runtime's failure policy reads.
    torchrun = ["python", "-m", "gpt.distributed.torchrun"] if stage.distributed else None
    spec = launcher.TrainJobSpec(
        stage=stage.name,
        runtime=stage.runtime,
        image=image,
        command=container_command(str(rundir.path), [out.rel for out in stage.carried]),
        args=stage.command(args, torchrun=torchrun),
        env={"PYTHONUNBUFFERED": "1"},
        storage_secret=storage_secret,
        placement=placement,
    )
    check_multi_node(placement.num_nodes, namespace)
    outcome = launcher.launch(spec, namespace, rundir.run_id, on_update=on_update, say=say)
    files = outcome.files
    missing = [out.rel for out in stage.outputs if out.rel not in files]  # optional ones aside
    if missing:
        say(f"note: not found in the log of {outcome.name}: {', '.join(missing)}")
    return files
