"""A job's process tree: start it in its own session, remember every descendant, kill them all.

torchrun starts each worker in a session of its own, so killing torchrun's process group does
not reach the workers. The tree is therefore tracked by parent links read from ``/proc`` while
the job runs, and cleanup signals every process ever seen (checking each one's start time, so a
recycled pid is never hit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    state: str  # "R", "S", "Z" (zombie), ...
    start_ticks: int  # start time since boot, clock ticks: tells a recycled pid apart


def read_stat(pid: int) -> ProcStat | None:
    """The parts of ``/proc/<pid>/stat`` kplan needs; None if there is no such process."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    rest = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid=pid, ppid=int(rest[1]), state=rest[0], start_ticks=int(rest[19]))


def all_stats() -> list[ProcStat]:
    out = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None:
                out.append(stat)
    return out


def descendants(root: int) -> dict[int, int]:
    """Every living descendant of ``root``: pid -> start ticks."""
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


def is_running(pid: int, start_ticks: int | None = None) -> bool:
    """True if ``pid`` is a live (not zombie) process, the same one if ``start_ticks`` is given."""
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return False
    return start_ticks is None or stat.start_ticks == start_ticks


class ProcessTree:
    """One job: a leader process in a new session and everything it starts."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        stdout: IO[bytes] | int | None,
        stderr: IO[bytes] | int | None,
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        leader = read_stat(self.proc.pid)
        self.seen: dict[int, int] = {self.proc.pid: leader.start_ticks if leader else -1}

    def refresh(self) -> None:
        """Record the descendants alive now (call it often while the job runs)."""
        self.seen.update(descendants(self.proc.pid))

    def poll(self) -> int | None:
        return self.proc.poll()

    def running(self) -> list[int]:
        """Pids seen so far that are still alive."""
        return [pid for pid, ticks in self.seen.items() if is_running(pid, ticks)]

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM the whole tree, then SIGKILL what is left after ``grace_s``; reap the leader."""
        if self.proc.poll() is None:
            self.refresh()
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.running():
            time.sleep(0.05)
        if self.running():
            self._signal_all(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL cannot be ignored
            self.proc.wait(timeout=5.0)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and self.running():
            time.sleep(0.05)

    def _signal_all(self, sig: signal.Signals) -> None:
        for pid in self.running():
            for send in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    send(pid, sig)
