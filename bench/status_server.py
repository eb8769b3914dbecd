"""Status server: what posting progress to Kubeflow Trainer's status server costs train-gpt, with
the server answering, refusing connections, or accepting them and never answering, against no
server at all (gpt/training/trainer_status.py).

Each case runs the real `Trainer(...).fit()` in this process on the default corpus, the default
model, a short run that logs (and so reports) every iteration, the worst case for the hook,
with the three KUBEFLOW_TRAINER_SERVER_* variables set or not. It reports the training loop (the
run's own clock, `elapsed_s`: every iteration's report is in it; and its fastest repeat, the
least a machine busy with other work added), what the fit took after the loop (the last
evaluation and checkpoint, the export, and the wait for the final 100% post), that beyond the
no-server case's, and the warning lines the run printed. The answering server is the test
cluster's model of Trainer's (tests/support/cluster/statusserver.py), applying nowhere; the
silent one is a socket that accepts and never reads.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.harness import Result, Stats, default_corpus, fmt_stats, timed
from gpt.config.configs import TrainConfig
from gpt.distributed import world as distributed
from gpt.training import trainer_status
from gpt.training.trainer import Trainer

ITERS = 30
CASES = ["no server", "answering", "connection refused", "silent (accepts, never answers)"]


@contextlib.contextmanager
def _server(case: str, folder: Path) -> Iterator[dict[str, str]]:
    """The variables for `case` (none for "no server"), its server running meanwhile."""
    if case == "no server":
        yield {}
        return
    # The test cluster's modules import each other as `support.…`, the name pytest gives them
    # with tests/ on its path; behind the project's own folders, as there.
    sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))
    from support.cluster.certs import TokenIssuer
    from support.cluster.render import token_audience
    from support.cluster.statusserver import StatusServer, refused_port, silent_port

    issuer = TokenIssuer()
    model = StatusServer(issuer, lambda ns, name, status: None)
    (folder / "ca.crt").write_bytes(model.cert.ca_pem)
    (folder / "token").write_text(issuer.issue(token_audience("ns", "job"), 3600, "ns",
                                               {"name": "pod", "uid": "1"}))  # fmt: skip
    env = {trainer_status.ENV_CA_CERT: str(folder / "ca.crt"),
           trainer_status.ENV_TOKEN: str(folder / "token")}  # fmt: skip
    try:
        with contextlib.ExitStack() as stack:
            if case == "answering":
                url = model.url("ns", "job")
            elif case == "connection refused":
                url = f"https://127.0.0.1:{refused_port()}/status"
            else:
                url = f"https://127.0.0.1:{stack.enter_context(silent_port())}/status"
            yield {**env, trainer_status.ENV_URL: url}
    finally:
        model.stop()


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fit_once(cfg: TrainConfig, case: str, folder: Path) -> tuple[float, float, int]:
    """One fit: its seconds, the training loop's seconds, the warning lines it printed."""
    world = distributed.setup(cfg.device)
    try:
        with _server(case, folder) as env, _environ(env):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                trainer = Trainer(cfg, world)
                seconds = timed(trainer.fit)
    finally:
        distributed.teardown(world)
    warnings = out.getvalue().count("warning: the TrainJob's status server")
    return seconds, trainer.state.elapsed_s, warnings


def run(quick: bool) -> Result:
    repeats = 1 if quick else 3
    result = Result(
        "status_server",
        {"iterations": ITERS, "log_interval": 1, "repeats": repeats, "order": "cases interleaved",
         "min_interval_s": trainer_status.MIN_INTERVAL_S, "timeout_s": trainer_status.TIMEOUT_S,
         "finish_wait_s": trainer_status.FINISH_WAIT_S,
         "model": "default (4 x 128), default corpus, CPU"},  # fmt: skip
        ["server", "training loop", "fastest loop", "after the loop", "beyond no server",
         "warning lines"],
    )
    with tempfile.TemporaryDirectory() as root:
        rundir = default_corpus(root)
        cfg = TrainConfig(root=root, run=rundir.run_id, resume="never", max_iters=ITERS,
                          log_interval=1, eval_interval=ITERS, ckpt_interval=ITERS)  # fmt: skip
        fit_once(cfg, "no server", Path(root))  # warm-up: imports, allocator, caches
        # Round-robin, so that a machine busy with something else weighs on every case alike.
        runs: dict[str, list[tuple[float, float, int]]] = {case: [] for case in CASES}
        for i in range(repeats):
            for case in CASES:
                print(f"bench: status_server {case} ({i + 1}/{repeats}) ...", flush=True)
                runs[case].append(fit_once(cfg, case, Path(root)))
    after_none = Stats([fit - loop for fit, loop, _ in runs[CASES[0]]]).median
    for case, found in runs.items():
        loop = Stats([r[1] for r in found])
        after = Stats([r[0] - r[1] for r in found])
        result.rows.append({
            "server": case, "training loop": fmt_stats(loop, " s"),
            # The least a busy machine added: what the loop itself costs.
            "fastest loop": f"{min(loop.values):.2f} s",
            "after the loop": fmt_stats(after, " s"),
            "beyond no server": f"{after.median - after_none:+.2f} s",
            "warning lines": max(r[2] for r in found),
            "loop_s": loop.as_dict(), "after_loop_s": after.as_dict(),
        })  # fmt: skip
    return result
