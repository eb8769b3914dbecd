"""train-gpt: `python -m gpt train-gpt` (one process) or `torchrun ... -m gpt -- train-gpt` (DDP).

Reads `data/` of the run, trains a GPT (gpt/training/trainer.py), and writes `ckpt/`, `metrics/`
and the exported `model/` (copied on to `--export_uri` when one is given); its flags are
gpt/config/configs.py's TrainConfig.
"""

from __future__ import annotations

from gpt.config.configs import TrainConfig
from gpt.distributed import world as distributed
from gpt.stages import TRAIN_GPT
from gpt.training.stopping import StopRequest
from gpt.training.trainer import Trainer


def main(cfg: TrainConfig) -> None:
    """The stage: set up this process's place among the ranks, train, tear down.

    A SIGTERM or SIGINT once the ranks have met stops training at a checkpoint (`Stopped`).
    Before, while this rank waits for the others, it ends the process as it always did: there is
    nothing to save yet, and a rank that noted it and waited on would hold its pod until the
    SIGKILL: the pod that replaces an evicted one while its peers are leaving waits for them in
    init_process_group, for 30 minutes.
    """
    world = distributed.setup(cfg.device)
    try:
        with StopRequest(TRAIN_GPT.prog) as stop:
            Trainer(cfg, world, stop).fit()
            # The ranks leave together, once rank 0 has exported. A rank that tore down its
            # process group and exited while rank 0 still exported aborted once in CI (gloo,
            # "terminate called without an active exception", SIGABRT; not reproduced in 11 runs
            # here). Only on success: after an error the others may be inside a collective.
            world.barrier()
    finally:
        distributed.teardown(world)
