"""Typer's coercion of option values, without importing pydantic when the answer is plain.

Typer (0.29) coerces every option value through a pydantic ``TypeAdapter``, built for each
parameter the first time a command line is parsed: importing pydantic and building the adapters
is about a fifth of a short ``kplan estimate``'s time, whatever the flags. ``install`` puts a
coercer in front of typer's own that answers, without pydantic, the values whose coercion is the
identity or a plain conversion typer's adapter gives identically:

- a ``str`` option's text;
- an ``int`` or ``float`` option's default (already an ``int``/``float``), or a text of plain
  digits (``4``, ``0.25``: ``int(text)``/``float(text)``, what the adapter returns), inside the
  option's ``min``/``max`` and without ``clamp``;
- a list option's items, each by the rules above (an empty list included).

Anything else (a sign, an exponent, a bad value, a bound crossed, a path, a choice, a custom
parser) goes to typer's own coercer, built then: the same values, and the same messages for bad
input. On a typer without this hook (other versions) nothing is installed.
"""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

_DIGITS = re.compile(r"[0-9]{1,15}")
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?")
_OTHER = object()  # not answered here: typer's coercer decides


def _plain(annotation: Any, info: Any, value: Any) -> Any:
    """``value`` coerced to ``annotation`` where that is plain (module notes), else _OTHER."""
    if annotation is str:
        return value if type(value) is str else _OTHER
    if annotation not in (int, float):
        return _OTHER
    if type(value) is str:
        pattern = _DIGITS if annotation is int else _DECIMAL
        if not pattern.fullmatch(value):
            return _OTHER
        number: Any = annotation(value)
    elif type(value) is int or (annotation is float and type(value) is float):
        number = annotation(value)
    else:
        return _OTHER
    if getattr(info, "clamp", None):
        return _OTHER
    low, high = getattr(info, "min", None), getattr(info, "max", None)
    if (low is not None and not number >= low) or (high is not None and not number <= high):
        return _OTHER  # typer's coercer words the refusal
    return number


class PlainFirst:
    """A typer runtime parameter: plain values here, the rest by typer's own (built once, on the
    first value it must take)."""

    def __init__(self, descriptor: Any, build: Any) -> None:
        self._descriptor = descriptor
        self._build = build
        self._typer: Any = None

    def _full(self) -> Any:
        if self._typer is None:
            self._typer = self._build(self._descriptor)
        return self._typer

    def _answer(self, value: Any) -> Any:
        d = self._descriptor
        info = d.parameter_info
        if getattr(d, "file_annotation", None) is not None or info.parser is not None:
            return _OTHER
        annotation = d.annotation
        if get_origin(annotation) is list:
            (inner,) = get_args(annotation) or (Any,)
            if not isinstance(value, (list, tuple)):
                return _OTHER
            items = [_plain(inner, info, v) for v in value]
            return _OTHER if any(x is _OTHER for x in items) else items
        return _plain(annotation, info, value)

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        if not (multi and isinstance(value, str)):
            answer = self._answer(value)
            if answer is not _OTHER:
                return answer
        return self._full().coerce(value, param=param, ctx=ctx)


def install() -> None:
    """Put ``PlainFirst`` in front of typer's runtime coercion (once; nothing on a typer that
    has no such hook)."""
    try:
        from typer import core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    build = getattr(core, "build_runtime_param", None)
    if build is None or getattr(build, "kplan_plain_first", False):
        return

    def plain_first(descriptor: Any) -> PlainFirst:
        return PlainFirst(descriptor, build)

    plain_first.kplan_plain_first = True  # type: ignore[attr-defined]
    setattr(core, "build_runtime_param", plain_first)  # noqa: B010 (typer does not export it)
