"""Range checks for the CLI's numeric and enum flags: one line naming the flag, plus a hint.

A flag's value must be finite (``nan`` and ``inf`` are refused: ``--timeout nan`` would switch a
watchdog off, ``--budget inf`` would switch the guard off) and inside a sane range.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kplan.core.errors import InputError

MAX_NODES = 4096  # nodes of one job
MAX_LOCAL_NODES = 64  # local worker groups (processes on this machine)
MAX_LOCAL_WORKERS = 256  # workers of one local group
MAX_USD = 1e9
MAX_HOURS = 1e6
MAX_SECONDS = 1e8
MAX_SAMPLES = 2**53 - 1
MAX_BATCH = 2**24
MAX_EPOCHS = 1e6
MAX_DATA_GB = 1e8  # a training data set (100 PB)
# A move's checkpoint copy between regions (--copy-gbps), Gbit/s: below 1 Mbit/s a checkpoint
# copy takes years (1e-300 priced a 10 GB copy at 8e301 s), above 10 Tbit/s no link runs
MAX_CHECKPOINT_GB = 1e6  # one checkpoint (--checkpoint-gb): 1 PB, launch and simulate alike
MIN_COPY_GBPS = 1e-3
MAX_COPY_GBPS = 1e4
COPY_HINT = "Gbit/s between regions, e.g. --copy-gbps 1"
DATA_HINT = "GB of training data, >= 0, e.g. --data-gb 150"


def number(
    flag: str,
    value: float | None,
    *,
    low: float = 0.0,
    high: float,
    low_open: bool = True,
    hint: str = "",
) -> None:
    """``value`` (when given) is finite and in ``(low, high]`` (``[low, high]`` if not
    ``low_open``)."""
    if value is None:
        return
    if not math.isfinite(value):
        raise InputError(f"{flag}={value} must be a finite number", hint=hint)
    if not (value > low if low_open else value >= low):
        raise InputError(f"{flag}={value:g} must be {'>' if low_open else '>='} {low:g}", hint)
    if not value <= high:
        raise InputError(f"{flag}={value:g} must be <= {high:g}", hint=hint)


def integer(flag: str, value: int | None, *, low: int = 1, high: int, hint: str = "") -> None:
    """``value`` (when given) is in ``[low, high]``."""
    if value is not None and value < low:
        raise InputError(f"{flag}={value} must be >= {low}", hint=hint)
    if value is not None and value > high:
        raise InputError(f"{flag}={value} must be <= {high}", hint=hint)


def text(flag: str, value: str | None, *, choices: Iterable[str] = (), hint: str = "") -> None:
    """``value`` (when given) is non-empty, printable and short (one of ``choices`` if given)."""
    if value is None:
        return
    allowed = tuple(choices)
    if allowed and value not in allowed:
        raise InputError(f"{flag} {value[:60]!r} is not one of {', '.join(allowed)}", hint=hint)
    if not value.strip() or len(value) > 256 or not value.isprintable():
        raise InputError(f"{flag} {value[:60]!r} is empty or not a plain name", hint=hint)


def texts(flag: str, values: Iterable[str], *, hint: str = "") -> None:
    for v in values:
        text(flag, v, hint=hint)
