"""Config dataclasses become command lines: field = flag, field docstring = its help.

One name per knob: a field `block_size` is the flag `--block_size`, the KFP parameter
`block_size` and the key in saved configs. Validation lives in each config's `__post_init__`
and raises `ValueError` naming the flag.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from gpt.rundir import RunDir, check_run_id

C = TypeVar("C")


@dataclass
class RunConfig:
    """What every stage shares: where the run directory is."""

    root: str = "runs"
    """Directory that holds one sub-directory per run (`/gpt` on the cluster)."""
    run: str = "demo"
    """Run id: the sub-directory of --root this stage reads and writes (the KFP run id on a
    cluster)."""

    def __post_init__(self) -> None:
        if not self.root:
            raise ValueError("--root: must not be empty")
        check_run_id(self.run)

    @property
    def rundir(self) -> RunDir:
        return RunDir.of(self.root, self.run)


@dataclass
class ModelConfig:
    """The model's shape, as a person chooses it: `train`'s model flags. `gpt.model.GPTConfig`
    adds the vocabulary size, which comes from the data. The defaults are the training recipe's
    (bench/recipe_trials.md): nanoGPT's CPU "baby GPT" shape with dropout for a small corpus."""

    n_layer: int = 4
    """Number of transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide n_embd (into an even head size with --position
    rope, which turns pairs of dimensions)."""
    n_embd: int = 128
    """Width of the residual stream (embedding dimension)."""
    block_size: int = 64
    """Context window in tokens: the most the model attends over, and each training window's
    length."""
    dropout: float = 0.2
    """Dropout probability while training, in [0, 1). 0.2 holds off overfitting on a small corpus
    (the default one is 26k tokens); 0 for a corpus far larger than the tokens trained on."""
    bias: bool = False
    """Bias terms in linear layers and LayerNorms (GPT-2 has them; without is a little faster)."""
    position: Literal["rope", "learned"] = "rope"
    """How attention knows token order: rope (rotary embeddings: relative, no parameters) or
    learned (GPT-2's table of absolute positions). rope learned more per step here."""
    activation: Literal["relu2", "gelu"] = "relu2"
    """The MLP's nonlinearity: relu2 (squared ReLU, as in Primer) or gelu (GPT-2's). relu2
    learned more per step here at the same cost."""

    def __post_init__(self) -> None:
        for name in ("block_size", "n_layer", "n_head", "n_embd"):
            check_positive_int(name, getattr(self, name))
        if self.n_embd % self.n_head:
            raise ValueError(
                f"--n_embd {self.n_embd}: must be divisible by --n_head {self.n_head}"
            )
        if self.position not in ("rope", "learned"):
            raise ValueError(f"--position {self.position!r}: expected rope or learned")
        if self.activation not in ("relu2", "gelu"):
            raise ValueError(f"--activation {self.activation!r}: expected relu2 or gelu")
        if self.position == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"--n_embd {self.n_embd} / --n_head {self.n_head}: the head size must be even "
                "(rotary position embeddings turn pairs of dimensions)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout {self.dropout!r}: must be in [0, 1)")


def check_positive_int(name: str, value: Any) -> None:
    """Refuse anything but an int >= 1 (a bool is no int here), naming the flag."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--{name} {value!r}: must be a positive integer")


@dataclass
class SamplingConfig:
    """How the next token is chosen. Validated on construction (and on `dataclasses.replace`)."""

    temperature: float = 0.8
    """Softmax temperature: below 1 is more conservative, above 1 more adventurous; 0 is greedy
    (always the most likely token)."""
    top_k: int | None = None
    """Sample only among the k most likely tokens (k >= 1; unset: no limit)."""
    top_p: float = 1.0
    """Nucleus sampling: sample only among the most likely tokens whose probabilities add up to
    at least p, in (0, 1]; 1 keeps all."""
    max_new_tokens: int = 200
    """Most tokens generated per reply (fewer if the model emits end-of-text)."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"--temperature {self.temperature!r}: must be >= 0 (0 = greedy)")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"--top_k {self.top_k!r}: must be >= 1 (leave it unset for no limit)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top_p {self.top_p!r}: must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max_new_tokens {self.max_new_tokens!r}: must be >= 1")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each dataclass field, for every class in the MRO."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_field(parser: argparse.ArgumentParser, f: dataclasses.Field, hint: Any, doc: str) -> None:
    flag = f"--{f.name}"
    # the hyphenated spelling (`--idle-timeout`, as DESIGN.md writes it) reaches the same field
    flags = dict.fromkeys([flag, flag.replace("_", "-")])
    default = _default(f)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    optional = origin in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    help_text = f"{doc} (default: {default})" if doc else f"(default: {default})"
    if hint is bool:
        parser.add_argument(
            *flags, type=_bool, default=default, metavar="{true,false}", help=help_text
        )
    elif origin is Literal:
        parser.add_argument(*flags, choices=list(args), default=default, help=help_text)
    elif origin in (list, tuple):
        parser.add_argument(*flags, action="append", type=args[0], default=None, help=help_text)
    elif hint in (int, float, str):
        parser.add_argument(*flags, type=hint, default=default, help=help_text)
    else:
        raise TypeError(f"{flag}: unsupported config field type {hint!r}")


def build_parser(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        _add_field(parser, f, hints[f.name], docs.get(f.name, ""))
    return parser


def parse_config(cls: type[C], argv: list[str], prog: str, description: str) -> C:
    """Parse `argv` into `cls`.

    argparse exits 2 on an unknown flag or a bad value; `__post_init__` raises ValueError.
    """
    ns = build_parser(cls, prog, description).parse_args(argv)
    values = {k: v for k, v in vars(ns).items() if v is not None or _field_default(cls, k) is None}
    for f in dataclasses.fields(cls):  # repeatable flags given zero times take the field default
        if f.name not in values:
            values[f.name] = _field_default(cls, f.name)
    return cls(**values)


def _field_default(cls: type, name: str) -> Any:
    return _default(next(f for f in dataclasses.fields(cls) if f.name == name))


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def fields_of(cfg: Any, part: type) -> dict[str, Any]:
    """`cfg`'s values of the fields of `part`, one of its dataclass bases (e.g. the model or
    sampling settings of a stage's config), to build a `part` or a subclass of it."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(part)}
