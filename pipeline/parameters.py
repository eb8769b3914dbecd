"""The pipeline's parameters are its steps' parameters: names, types, defaults and texts.

A knob that several steps have (`seed`, `block_size`, `namespace`, ...) is one pipeline
parameter handed to each; the steps must agree on its type and default (checked here, when the
pipeline is defined). A knob each step has with its own default (`timeout`) is renamed per step
(`train_timeout`); a step's parameter that the pipeline wires itself (train-gpt's `run`, from
load-corpus's output) is no pipeline parameter. KFP calls the pipeline function with its
parameters in signature order; `with_step_parameters` hands them to the body as one
`PipelineParameters`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from kfp.dsl.base_component import BaseComponent

from components.step.parameter_docs import args_entry


class PipelineParameters(dict):
    """The pipeline's parameters (KFP's channels while it compiles), by name."""

    def __init__(self, values: Mapping[str, Any], names: Mapping[str, Mapping[str, str]]):
        super().__init__(values)
        self._names = names

    def of(self, step: BaseComponent) -> dict[str, Any]:
        """The pipeline parameters `step` takes, under the step's own parameter names."""
        return {own: self[name] for own, name in self._names[step.name].items()}


def _step_parameters(step: BaseComponent) -> dict[str, tuple[inspect.Parameter, str]]:
    """The step's parameters that are inputs (not its output artifacts), with their texts."""
    inputs = step.component_spec.inputs or {}
    return {name: (p, inputs[name].description or "")
            for name, p in inspect.signature(step.python_func).parameters.items()
            if name in inputs}  # fmt: skip


def with_step_parameters(
    steps: list[BaseComponent],
    *,
    wired: Mapping[str, set[str]],
    renamed: Mapping[str, Mapping[str, str]],
    defaults: Mapping[str, Any],
) -> Callable[[Callable[[PipelineParameters], Any]], Callable[..., Any]]:
    """Make `body(knobs)` a pipeline function whose parameters are the `steps`' parameters:
    all but those `wired` (by step name), each under its `renamed` name (by step name), with the
    pipeline's own `defaults` where it chooses otherwise."""
    params, docs, names = _collect(steps, wired, renamed, defaults)

    def decorate(body: Callable[[PipelineParameters], Any]) -> Callable[..., Any]:
        order = list(params)

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            given = {**dict(zip(order, args, strict=False)), **kwargs}
            return body(PipelineParameters(given, names))

        # What KFP compiles the pipeline's inputs from: every step's parameters but the wired
        # ones, keyword-only, in step order, each once, renamed and with the pipeline's defaults
        # (load-corpus's `run`, `source`, ..., `start_timeout`; then those train-gpt adds,
        # `n_layer`, ..., `train_timeout`; then generative-prompt's); `body` gets one
        # PipelineParameters.
        pipeline.__signature__ = inspect.Signature(list(params.values()))  # type: ignore[attr-defined]
        pipeline.__name__ = body.__name__
        pipeline.__qualname__ = body.__qualname__
        pipeline.__module__ = body.__module__
        # `body`'s docstring and an Args: entry per parameter, its step's text (a renamed one's
        # prefixed "train-gpt's `timeout`: "): the descriptions KFP compiles into the YAML.
        entries = [args_entry(name, docs[name]) for name in order]
        pipeline.__doc__ = (inspect.cleandoc(body.__doc__ or "") + "\n\nArgs:\n"
                            + "\n".join(entries))
        return pipeline

    return decorate


def _collect(
    steps: list[BaseComponent],
    wired: Mapping[str, set[str]],
    renamed: Mapping[str, Mapping[str, str]],
    defaults: Mapping[str, Any],
) -> tuple[dict[str, inspect.Parameter], dict[str, str], dict[str, dict[str, str]]]:
    """The pipeline's parameters and their texts, by name, and the pipeline parameter each
    step's own parameter is, by step name (`with_step_parameters`'s rules)."""
    params: dict[str, inspect.Parameter] = {}
    docs: dict[str, str] = {}
    names: dict[str, dict[str, str]] = {}
    given_by: dict[str, str] = {}  # the step whose parameter each pipeline parameter is
    for step in steps:
        names[step.name] = {}
        for own, (p, doc) in _step_parameters(step).items():
            if own in wired.get(step.name, ()):
                continue
            name = renamed.get(step.name, {}).get(own, own)
            names[step.name][own] = name
            default = defaults.get(name, p.default)
            param = p.replace(name=name, default=default, kind=inspect.Parameter.KEYWORD_ONLY)
            if name != own:
                doc = f"{step.name}'s `{own}`: {doc}"
            if name in params:
                _check_agree(name, given_by[name], params[name], step.name, param)
                continue
            params[name] = param
            docs[name] = doc
            given_by[name] = step.name
    return params, docs, names


def _check_agree(
    name: str, first: str, given: inspect.Parameter, step: str, param: inspect.Parameter
) -> None:
    """Refuse, in one line, a step whose parameter `name` differs in type or default from the
    step `first` that gave the pipeline parameter `name`."""
    if (given.annotation, given.default) == (param.annotation, param.default):
        return

    def typed(p: inspect.Parameter) -> str:
        return f"{getattr(p.annotation, '__name__', p.annotation)} = {p.default!r}"

    raise TypeError(
        f"pipeline parameter `{name}`: {first} has {typed(given)}, {step} has {typed(param)}; "
        "give one of them its own name (`renamed`) or make them agree"
    )
