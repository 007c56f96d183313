"""Parsing of the flags that pin the planner's question (``kplan estimate`` and ``kplan launch``):
``--nodes N`` or ``--nodes LOW-HIGH``, the global batch and the precision."""

from __future__ import annotations

import re

from kplan.core import flags
from kplan.core.errors import InputError

_RANGE = re.compile(r"^\s*(\d{1,7})\s*(?:-\s*(\d{1,7})\s*)?$")
_NODES_HINT = "a node count (--nodes 4) or a range (--nodes 2-8), each between 1 and 1024"
MAX_PLAN_NODES = 1024  # SearchOptions' limit
FIXED_BATCH_MIN_LOCAL = 8  # --fixed-batch: fewest samples per GPU per micro-step


def node_range(value: str | None, flag: str = "--nodes") -> tuple[int, int] | None:
    """``"4"`` -> (4, 4); ``"2-8"`` -> (2, 8); ``None`` -> None; else a one-line InputError."""
    if value is None:
        return None
    m = _RANGE.match(value)
    if m is None:
        raise InputError(f"{flag} {value[:40]!r} is not a node count or range", hint=_NODES_HINT)
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) is not None else low
    if low < 1 or high > MAX_PLAN_NODES:
        raise InputError(f"{flag} {value.strip()} is outside 1..{MAX_PLAN_NODES}", hint=_NODES_HINT)
    if low > high:
        raise InputError(
            f"{flag} {value.strip()}: the low end {low} is above the high end {high}",
            hint=f"e.g. {flag} {high}-{low}",
        )
    return low, high


def check_batches(global_batch: int | None, max_global_batch: int | None, fixed: bool) -> None:
    flags.integer("--global-batch", global_batch, high=flags.MAX_BATCH, hint="samples, e.g. 1024")
    flags.integer(
        "--max-global-batch", max_global_batch, high=flags.MAX_BATCH, hint="samples, e.g. 8192"
    )
    given = [
        name
        for name, on in (
            ("--global-batch", global_batch is not None),
            ("--max-global-batch", max_global_batch is not None),
            ("--fixed-batch", fixed),
        )
        if on
    ]
    if len(given) > 1:
        raise InputError(
            f"give at most one of {', '.join(given)}",
            hint="--global-batch pins the batch, --max-global-batch caps it, --fixed-batch keeps "
            "the profile's",
        )
