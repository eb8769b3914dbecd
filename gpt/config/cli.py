"""Config dataclasses become command lines: field = flag, field docstring = its help.

One name per knob: a field `block_size` of a config (gpt/config/configs.py) is the flag
`--block_size`. `parse_config` is how `python -m gpt <stage>` (gpt/__main__.py) reads a stage's
flags, and how a component checks them before it starts anything; gpt/stages.py's `to_args` is the
way back.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from typing import Any, Literal, TypeVar

C = TypeVar("C")


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
    # the hyphenated spelling (`--idle-timeout`) reaches the same field
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


