"""One way to run a stage, whatever the backend: the stage table, flags, validation, dispatch.

A component hands `run_stage` the stage's CLI values under their CLI names (one name per knob:
the component parameter `n_layer` is the flag `--n_layer`), and gets back the run-directory files
it turns into KFP artifacts. With backend "trainjob" the stage runs in a Kubeflow Trainer
TrainJob (components/launcher.py), with "local" as a process on this machine (components/local.py).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpt.rundir import RunDir

BACKENDS = ("trainjob", "local")
# Where every runtime mounts PVC gpt-pvc (runtimes/*.yaml): the root of run directories there.
CLUSTER_ROOT = "/gpt"
_RFC1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Stage:
    cli: str
    """`python -m gpt <cli>`."""
    name: str
    """Pipeline step and TrainJob name prefix."""
    runtime: str
    """The ClusterTrainingRuntime in runtimes/."""
    outputs: tuple[str, ...]
    """Run-directory files the component reports back, as `RunDir` attribute names."""
    distributed: bool = False
    """Runs under torchrun (several processes per node, several nodes)."""


STAGES: dict[str, Stage] = {
    s.cli: s
    for s in (
        Stage(
            "corpus",
            "load-corpus",
            "gpt-load-corpus",
            ("meta_json", "source_json"),
        ),
        Stage(
            "train",
            "train-gpt",
            "gpt-train",
            ("train_jsonl", "report_md", "loss_png"),
            distributed=True,
        ),
        Stage(
            "prompt",
            "generative-prompt",
            "gpt-generative-prompt",
            ("transcript_jsonl",),
        ),
    )
}


def cli_args(values: Mapping[str, Any]) -> list[str]:
    """`{"n_layer": 4, "compact": True, "prompt": ["a", "b"]}` -> the stage's command line.

    Booleans become true/false (the CLI's boolean flags take a value), a list repeats its flag,
    None leaves the flag out (the CLI's default, e.g. no top-k limit).
    """
    args: list[str] = []
    for key, value in values.items():
        if value is None:
            continue
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            text = str(item).lower() if isinstance(item, bool) else str(item)
            args += [f"--{key}", text]
    return args


def validate(
    stage: Stage,
    values: Mapping[str, Any],
    *,
    backend: str,
    image: str,
    namespace: str,
    num_nodes: int,
    num_proc_per_node: int,
    timeout: float,
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
    if num_nodes < 1:
        raise ValueError(f"num_nodes {num_nodes}: must be at least 1")
    if num_proc_per_node < 1:
        raise ValueError(f"num_proc_per_node {num_proc_per_node}: must be at least 1")
    if not stage.distributed and (num_nodes, num_proc_per_node) != (1, 1):
        raise ValueError(f"num_nodes/num_proc_per_node: {stage.name} runs as one process")
    if backend == "local" and num_nodes != 1:
        raise ValueError(f"num_nodes {num_nodes}: the local backend runs on this one machine")
    if not timeout > 0:
        raise ValueError(f"timeout {timeout}: must be a positive number of seconds")
    args = cli_args(values)
    _parse_with_stage_config(stage, args)
    return args


def _parse_with_stage_config(stage: Stage, args: list[str]) -> None:
    # The stage modules import PyTorch, numpy and tiktoken only inside main(), so their configs
    # load here too, in the component image that has none of them.
    from gpt.__main__ import STAGES as CLI_STAGES
    from gpt.config import parse_config

    module_name, class_name, _ = CLI_STAGES[stage.cli]
    config_class = getattr(importlib.import_module(module_name), class_name)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse_config(config_class, args, f"python -m gpt {stage.cli}", "")
    except SystemExit:
        # argparse's complaint (unknown flag, bad choice) is its last line.
        raise ValueError(err.getvalue().strip().splitlines()[-1]) from None
    except Exception as e:  # the config's own checks: ValueError, InputError
        raise ValueError(str(e)) from None


def run_stage(
    cli: str,
    values: Mapping[str, Any],
    *,
    backend: str,
    image: str = "",
    namespace: str = "training",
    num_nodes: int = 1,
    num_proc_per_node: int = 1,
    timeout: float = 3600,
    resources_per_node: dict[str, Any] | None = None,
    on_update: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, bytes]:
    """Run stage `cli` with `values` (its flags, `root` and `run` included) to the end.

    `image` is the workload image the TrainJob runs (backend "trainjob"): the pipeline fixes it
    when it compiles (from images.env), so a step never guesses it from where it runs.
    Returns the stage's output files that exist, by their path inside the run directory.
    """
    stage = STAGES[cli]
    args = validate(
        stage,
        values,
        backend=backend,
        image=image,
        namespace=namespace,
        num_nodes=num_nodes,
        num_proc_per_node=num_proc_per_node,
        timeout=timeout,
    )
    rundir = RunDir.of(values["root"], values["run"])
    rels = [str(getattr(rundir, f).relative_to(rundir.path)) for f in stage.outputs]
    if backend == "local":
        from components.local import run_local

        run_local(stage.cli, args, num_proc_per_node=num_proc_per_node, timeout=timeout, say=say)
        found = [rundir.path / rel for rel in rels]
        return {str(p.relative_to(rundir.path)): p.read_bytes() for p in found if p.is_file()}

    from components import launcher

    if stage.distributed:
        # torchrun takes --nnodes, --nproc_per_node, --node_rank, --master_addr/port from the
        # PET_* variables the Trainer's torch policy sets from numNodes and numProcPerNode.
        # "--": torchrun's parser would take the stage's --run as an abbreviation of --run-path.
        program = ["torchrun", "-m", "gpt", "--", stage.cli]
    else:
        program = ["python", "-m", "gpt", stage.cli]
    spec = launcher.TrainJobSpec(
        stage=stage.name,
        runtime=stage.runtime,
        image=image,
        command=["sh", "-c", launcher.emit_script(str(rundir.path), rels), stage.name],
        args=program + args,
        env={"PYTHONUNBUFFERED": "1"},
        num_nodes=num_nodes,
        num_proc_per_node=num_proc_per_node,
        resources_per_node=resources_per_node,
    )
    outcome = launcher.launch(
        spec,
        namespace,
        values["run"],
        timeout,
        on_update=on_update,
        say=say,
    )
    files = launcher.files_from_log(outcome.log)
    missing = [rel for rel in rels if rel not in files]
    if missing:
        say(f"note: not found in the log of {outcome.name}: {', '.join(missing)}")
    return files
