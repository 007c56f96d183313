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
from pathlib import Path
from typing import IO

from kplan.core.procs import alive, descendants, read_stat

__all__ = ["ProcessTree", "descendants", "is_running", "read_stat"]

# ``is_running`` is the profiler's name for the shared liveness check.
is_running = alive


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
