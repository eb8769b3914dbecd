"""`python -m pipeline compile|upload|run-local|serve-local`: the compiled pipeline, to a
cluster or run here, and its model served here.

  compile      write pipeline/gpt_trainjobs_pipeline.yaml (committed; a test fails when it is stale)
  upload       upload that YAML to Kubeflow Pipelines with kfp.Client (a new version if it exists)
  run-local    run that YAML with kfp.local, every stage a local process (backend=local)
  serve-local  serve a local run's model on OpenAI's API with `transformers serve` (make serve),
               what serve=kserve does on a cluster, after printing the calls that reach it
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

COMPILED = Path(__file__).resolve().parent / "gpt_trainjobs_pipeline.yaml"


def compile_pipeline(output: Path = COMPILED) -> Path:
    from kfp import compiler

    from pipeline.pipeline import gpt_trainjobs_pipeline

    compiler.Compiler().compile(gpt_trainjobs_pipeline, str(output))
    return output


def upload(package: Path, host: str | None, name: str, version: str | None) -> None:
    import kfp

    client = kfp.Client(host=host)
    try:
        existing = client.get_pipeline_id(name)
    except Exception:  # noqa: BLE001  (the server answers "not found" in several ways)
        existing = None
    if existing:
        version = version or _content_version(package)
        result = client.upload_pipeline_version(
            str(package), pipeline_version_name=version, pipeline_id=existing
        )
        print(f"uploaded version {version} of pipeline {name} ({existing}): {result}")
    else:
        result = client.upload_pipeline(str(package), pipeline_name=name)
        print(f"uploaded pipeline {name}: {result}")


def _content_version(package: Path) -> str:
    import hashlib

    return "v-" + hashlib.sha256(package.read_bytes()).hexdigest()[:12]


def _value(text: str) -> Any:
    """A `--set key=value` value: YAML, so 12 is an int, true a bool and [a, b] a list."""
    return yaml.safe_load(text)


def run_pipeline_locally(
    package: Path, root: Path, run_id: str, overrides: dict[str, Any]
) -> dict[str, Any]:
    """Run the compiled pipeline with kfp.local's SubprocessRunner, under root/run_id.

    The run's lock (gpt/rundir/runlock.py) is held for the whole pipeline, so a second pipeline on
    the same run fails at once instead of interleaving its stages with ours; the stages, our child
    processes, run under it. The steps' outputs (metrics, report, transcript) are staged and land
    in root/kfp-outputs/<run>/ when the pipeline succeeds, so a pipeline killed half-way leaves
    none of them behind. kfp.local's workspace directory (which it deletes when the pipeline
    ends, and so is never root) is staged with them: a killed pipeline's is swept with its
    outputs by the next run, not left in the system's temporary directory.
    """
    from kfp import components, local

    from components.step.deployment import refuse_local
    from gpt.rundir import atomic, runlock
    from gpt.rundir.layout import RunDir

    refuse_local(overrides.get("serve", ""), "local")  # before anything runs, not after training
    root = root.resolve()
    rundir = RunDir.of(root, run_id)
    outputs = root / "kfp-outputs" / run_id
    with runlock.hold(rundir, "python -m pipeline run-local"):
        atomic.sweep(outputs.parent, run_id)  # what a killed pipeline of this run staged
        os.environ.update(runlock.environment_for_children(rundir))
        try:
            with atomic.staged_dir(outputs, what="the steps' outputs") as staged:
                workspace = staged / ".kfp-workspace"
                workspace.mkdir()
                local.init(
                    runner=local.SubprocessRunner(use_venv=False),
                    pipeline_root=str(staged),
                    workspace_root=str(workspace),
                    raise_on_error=True,
                )
                pipeline = components.load_component_from_file(str(package))
                arguments = {"backend": "local", "root": str(root), "run": run_id, **overrides}
                result = pipeline(**arguments)
        finally:
            del os.environ[runlock.LOCK_ENV]
    print(f"step outputs (metrics, report, transcript): {outputs}")
    return result


def serve_local(root: Path, run_id: str, host: str, port: int, say=print) -> list[str]:
    """The command that serves run `run_id`'s model/ on OpenAI's API here (`transformers serve`,
    a cache of its own, offline), after saying the curl and openai calls that reach it. Raises
    ValueError (one line) when the run has no model."""
    import json

    from components.serving.completion import Endpoint, curl_call, openai_call, probe_tokens
    from gpt.rundir.layout import RunDir

    model = RunDir.of(root, run_id).model_dir
    if not (model / "config.json").is_file():
        raise ValueError(f"{model}: no model there; train one first (make demo)")
    config = json.loads((model / "config.json").read_text())
    # GPT-NeoX's and GPT-2's names for the context (gpt/models/hf.py)
    tokens = probe_tokens(config.get("max_position_embeddings") or config.get("n_positions")
                          or 64)  # fmt: skip
    # transformers serve names the model by the folder it was given, under /v1
    endpoint = Endpoint(f"http://{'localhost' if host in ('127.0.0.1', '0.0.0.0') else host}"
                        f":{port}/v1", str(model))  # fmt: skip
    say(f"serving {model} on {endpoint.base_url} (Ctrl-C stops it); from another terminal:\n\n"
        f"{curl_call(endpoint, max_tokens=tokens)}\n\n"
        f"{Path(sys.executable).parent / 'python'} - <<'PY'\n"
        f"{openai_call(endpoint, max_tokens=tokens)}PY\n")  # fmt: skip
    return [str(Path(sys.executable).with_name("transformers")), "serve", str(model),
            "--host", host, "--port", str(port), "--device", "cpu"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compile", help="compile the pipeline to YAML")
    p.add_argument("--output", type=Path, default=COMPILED)
    p = sub.add_parser("upload", help="upload the compiled YAML to Kubeflow Pipelines")
    p.add_argument("--package", type=Path, default=COMPILED)
    p.add_argument("--host", default=None, help="KFP API endpoint (default: kfp.Client's)")
    p.add_argument("--name", default="gpt-trainjobs")
    p.add_argument("--version", default=None, help="version name (default: a content hash)")
    p = sub.add_parser("run-local", help="run the compiled pipeline here with kfp.local")
    p.add_argument("--package", type=Path, default=COMPILED)
    p.add_argument("--root", type=Path, default=Path("runs"))
    p.add_argument("--run", default="demo")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a pipeline parameter, e.g. --set max_iters=50 (repeatable)")
    p = sub.add_parser("serve-local", help="serve a local run's model with transformers serve")
    p.add_argument("--root", type=Path, default=Path("runs"))
    p.add_argument("--run", default="demo")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    if args.command == "compile":
        print(f"compiled {compile_pipeline(args.output)}")
    elif args.command == "upload":
        upload(args.package, args.host, args.name, args.version)
    elif args.command == "serve-local":
        try:
            command = serve_local(args.root, args.run, args.host, args.port)
        except ValueError as e:
            print(f"python -m pipeline serve-local: error: {e}", file=sys.stderr)
            return 2
        sys.stdout.flush()
        # Its own cache (its /v1/models needs one), nothing downloaded; the server replaces
        # this process, so Ctrl-C reaches it.
        env = {**os.environ, "HF_HOME": str(args.root / "hf-home"), "HF_HUB_OFFLINE": "1"}
        os.execve(command[0], command, env)
    else:
        overrides = {}
        for item in args.overrides:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error(f"--set {item!r}: expected KEY=VALUE")
            overrides[key] = _value(value)
        try:
            run_pipeline_locally(args.package, args.root, args.run, overrides)
        except Exception as e:  # noqa: BLE001  (one line; the steps' own logs came before)
            print(f"python -m pipeline run-local: error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
