"""`python -m gpt <stage> [--flag value ...]`: the single command line for every stage.

The stages are gpt/stages.py's table; a stage's flags are its config's fields
(gpt/config/configs.py), parsed by gpt/config/cli.py. Bad input, and a full volume, end with one
line on stderr and exit status EXIT_FATAL (2); a stage stopped by SIGTERM at a checkpoint exits
EXIT_STOPPED (gpt/errors.py).
"""

from __future__ import annotations

import os
import sys

from gpt.config.cli import parse_config
from gpt.distributed.orphans import die_with_parent
from gpt.errors import EXIT_FATAL, EXIT_STOPPED, InputError
from gpt.rundir import runlock
from gpt.stages import STAGES
from gpt.training.stopping import Stopped

USAGE = "usage: python -m gpt <stage> [--help] [flags]\n\nstages:\n" + "".join(
    f"  {name:<18} {stage.summary}\n" for name, stage in STAGES.items()
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `torchrun -m gpt -- train-gpt ...`: some Pythons pass the "--" on
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in STAGES:
        print(f"gpt: error: unknown stage {name!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    stage = STAGES[name]
    if "LOCAL_RANK" in os.environ:  # a torchrun worker: it must not outlive its agent
        die_with_parent()
    try:
        cfg = parse_config(stage.config, rest, stage.prog, f"{name}: {stage.summary}")
        with runlock.hold(cfg.rundir, stage.prog):
            stage.main(cfg)
    except (ValueError, InputError) as e:
        # ValueError comes from a config's validation, InputError from a stage refusing its
        # input or from a writer finding the volume full (DiskFull); any other exception is a
        # bug and keeps its traceback.
        print(f"{stage.prog}: error: {e}", file=sys.stderr)
        return EXIT_FATAL
    except Stopped as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"{stage.prog}: {e}", file=sys.stderr)
        return EXIT_STOPPED
    return 0


if __name__ == "__main__":
    sys.exit(main())
