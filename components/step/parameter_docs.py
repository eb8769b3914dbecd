"""One knob, one place: a component's `Args:` are its knobs' own docstrings.

Every parameter of a component is a knob written once, as a dataclass field with a docstring
under it: a flag of its stage (gpt/config/configs.py; the same text is the flag's `--help`), or a
knob of its step (`Placement`: nodes, processes, GPUs, deadlines; `StepKnobs`: backend, image,
namespace, Secret; `Registration`: train-gpt's Model Registry; `Serving`: the deploy step
after train-gpt, which takes train-gpt's knobs for the run it serves). A component writes only its
signature (KFP reads it, and runs the function's own source in the step's container) and the
lines a knob does not describe: its outputs, `Returns:`. `documented` fills in the rest, and
the pipeline takes its parameters and their texts from the components (pipeline/parameters.py),
so a new training flag is two edits: its field in gpt/config/configs.py and its line in
components/train_gpt.py's signature.
tests/kfp_components/step/test_parameter_docs.py holds each signature's names, types and
defaults to the fields'.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from collections.abc import Callable
from typing import TypeVar

import docstring_parser

from components.step.deployment import Serving
from components.step.dispatch import UNSET, StepKnobs
from components.step.registration import Registration
from components.trainjob.placement import Placement
from gpt.config.cli import field_docs
from gpt.stages import STAGES, Stage

F = TypeVar("F", bound=Callable)


def knob_docs(stage: Stage) -> dict[str, str]:
    """Every knob a component of `stage` may have, with its text; a flag unset by default says
    how a KFP parameter leaves it unset."""
    docs = {**field_docs(StepKnobs), **field_docs(Placement), **field_docs(Registration),
            **field_docs(Serving)}
    defaults = {f.name: f.default for f in dataclasses.fields(stage.config)}
    for name, doc in field_docs(stage.config).items():
        docs[name] = f"{doc} ({UNSET}: unset.)" if defaults[name] is None else doc
    return docs


def args_entry(name: str, text: str) -> str:
    """One entry of an `Args:` section as KFP's docstring parser reads it, wrapped."""
    return textwrap.fill(f"{name}: {text}", 96, initial_indent="    ",
                         subsequent_indent="        ", break_on_hyphens=False)


def documented(stage_name: str) -> Callable[[F], F]:
    """Give a component function `Args:` for each parameter its docstring does not describe,
    from the knob of that name (KFP reads the descriptions from `__doc__`)."""

    def fill(func: F) -> F:
        docs = knob_docs(STAGES[stage_name])
        text = inspect.cleandoc(func.__doc__ or "")
        head, sep, tail = text.partition("\nReturns:")
        # what KFP itself reads the descriptions with (kfp's dependency docstring_parser)
        described = {p.arg_name for p in docstring_parser.parse(text).params}
        if "\nArgs:\n" not in head:
            head = head.rstrip() + "\n\nArgs:"
        lines = []
        for name in inspect.signature(func).parameters:
            if name in described:
                continue
            if name not in docs:
                raise TypeError(f"{func.__name__}({name}): no knob of that name and no Args line")
            lines.append(args_entry(name, docs[name]))
        # The docstring as written, its Args: completed in signature order with one
        # `<name>: <the knob's field docstring>` per parameter it did not describe (train_gpt:
        # `metrics`, `report` as written; `run`, `n_layer`, ... from TrainConfig, Placement...).
        func.__doc__ = "\n".join([head.rstrip(), *lines]) + ("\n\nReturns:" + tail if sep else "")
        return func

    return fill
