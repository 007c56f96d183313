"""``kplan check`` as plain lines: scope, check, ok/problem/note, detail; a hint under each
problem or note that has one; a last line naming the ready clouds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kplan.core.text import clean

if TYPE_CHECKING:
    from kplan.app.checking import CheckResult


def check_lines(result: CheckResult) -> list[str]:
    width = max((len(line.name) for line in result.lines), default=0)
    out = []
    for line in result.lines:
        head = f"{line.scope:<5} {line.name:<{width}}  {line.level:<7}"
        out.append(f"{head} {' '.join(clean(line.detail).splitlines())}")
        if line.hint and line.level != "ok":
            out.append(f"{'':<{len(head)}} hint: {' '.join(clean(line.hint).splitlines())}")
    ready = result.ready_clouds
    not_ready = [c for c in result.clouds if c not in ready]
    summary = f"ready: {', '.join(ready) or 'none'}"
    if not_ready:
        summary += f"; not ready: {', '.join(not_ready)}"
    out.append(summary)
    return out
