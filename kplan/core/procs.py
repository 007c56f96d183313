"""Processes through Linux ``/proc``: parent links, start times, liveness.

Shared by the profiler (a job's process tree) and the local provider (an instance's processes).
A pid is identified together with its start time (``/proc/<pid>/stat`` field 22), so a recycled
pid is never mistaken for the process that was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    state: str  # "R", "S", "Z" (zombie), ...
    start_ticks: int  # start time since boot in clock ticks: tells a recycled pid apart


def read_stat(pid: int) -> ProcStat | None:
    """The fields of ``/proc/<pid>/stat`` kplan uses; None when there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = text[text.rindex(")") + 2 :].split()  # the command (field 2) may hold spaces
    return ProcStat(pid=pid, ppid=int(rest[1]), state=rest[0], start_ticks=int(rest[19]))


def pids() -> list[int]:
    """Every pid in ``/proc`` now."""
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def all_stats() -> list[ProcStat]:
    """The stat of every process that still exists when read."""
    return [stat for pid in pids() if (stat := read_stat(pid)) is not None]


def start_ticks(pid: int) -> int | None:
    stat = read_stat(pid)
    return None if stat is None else stat.start_ticks


def alive(pid: int, ticks: int | None = None) -> bool:
    """True if ``pid`` is a live (not zombie) process started at ``ticks`` (any start if None)."""
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    return ticks is None or stat.start_ticks == ticks


def descendants(root: int) -> dict[int, int]:
    """Every descendant of ``root`` now (zombies included): pid -> start ticks."""
    children: dict[int, list[ProcStat]] = {}
    for stat in all_stats():
        children.setdefault(stat.ppid, []).append(stat)
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in found:
                found[child.pid] = child.start_ticks
                todo.append(child.pid)
    return found
