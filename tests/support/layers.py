"""gpt/'s rooms in their import layers: tests/test_architecture.py holds the code to them, and
tests/test_docs.py holds docs/architecture.md's map of gpt/ to them."""

from __future__ import annotations

from gpt.stages import STAGES

# Inside gpt/, its rooms (a subpackage, or a module at its top) in layers, each importing only
# its own room and the layers below it; docs/architecture.md draws the same. A new room must be
# placed here.
GPT_LAYERS = [
    {"__main__", *(s.name.replace("-", "_") for s in STAGES.values())},  # the command, the stages
    {"training", "generation", "data"},  # each stage's work: train-gpt's, generative-prompt's,
    {"models"},                          # load-corpus's (the corpus path)
    {"stages"},
    {"config"},
    {"fetch", "tokenizer", "distributed"},
    {"rundir"},
    {"memory"},
    {"errors", "cores", "progress"},
]
