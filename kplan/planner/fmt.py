"""Money, durations and step times as people read them (plain strings, no rich).

The planner's own sentences (a plan's reason, notes, the infeasible message) and the CLI's tables
use the same forms, so a figure reads the same everywhere ``kplan estimate`` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

UNBOUNDED = "no bound"  # a p90 past which runs never end (a market busier than the job recovers)


def money(usd: float, extra: int = 0) -> str:
    """``$1,234`` from $100, ``$12.34`` from 10 cents, two significant digits below (``$0.045``,
    ``$0.0045``); ``extra`` more decimals."""
    if not math.isfinite(usd):
        return UNBOUNDED if usd > 0 else f"${usd}"
    sign, x = ("-", -usd) if usd < 0 else ("", usd)
    if x >= 100 and not extra:
        text = f"{x:,.0f}"
    elif x >= 0.1 or x == 0:
        text = f"{x:,.{2 + extra}f}"
    else:
        digits = 1 - math.floor(math.log10(x)) + extra  # two significant digits
        text = f"{x:.{digits}f}"
    return f"{sign}${text}"


def moneys(usd: Sequence[float], most_extra: int = 3) -> list[str]:
    """``money`` of each, with more decimals where different amounts would read the same."""
    out = [money(x) for x in usd]
    for extra in range(1, most_extra + 1):
        if not _clash(usd, out):
            break
        out = [money(x, extra) for x in usd]
    return out


def duration(hours: float, extra: int = 0) -> str:
    """Seconds below a minute, minutes below an hour, else hours; ``extra`` more decimals."""
    if not math.isfinite(hours):
        return UNBOUNDED if hours > 0 else f"{hours} h"
    s = hours * 3600.0
    if s < 60:
        return f"{s:.{extra}f} s"
    if s < 3600:
        return f"{s / 60:.{1 + extra}f} min"
    return f"{hours:,.{(1 if hours >= 10 else 2) + extra}f} h"


def durations(hours: Sequence[float], most_extra: int = 3) -> list[str]:
    """``duration`` of each, with as many more decimals as it takes (up to ``most_extra``) for
    different values to read differently."""
    out = [duration(h) for h in hours]
    for extra in range(1, most_extra + 1):
        if not _clash(hours, out):
            break
        out = [duration(h, extra) for h in hours]
    return out


def _clash(values: Sequence[float], texts: Sequence[str]) -> bool:
    seen: dict[str, float] = {}
    for v, t in zip(values, texts, strict=True):
        if t in seen and seen[t] != v:
            return True
        seen[t] = v
    return False


def step(seconds: float) -> str:
    """A step time: milliseconds below a second (``103 ms``, ``0.45 ms``), else ``1.20 s``."""
    if not math.isfinite(seconds) or seconds >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * 1000.0
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms:.2g} ms"


def percent(fraction: float) -> str:
    """``5%`` (no decimals when whole)."""
    return f"{fraction * 100:g}%"
