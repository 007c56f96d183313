"""Finding and signalling every process of a local instance through ``/proc``.

A local instance is a supervisor process (``local_agent``) and everything it starts: the
bootstrap shell, torchrun, and torchrun's workers. torchrun starts each worker in a session of
its own, so no single process group holds them all. Two ways find them, and both are used:

- **the marker**: every process of the instance inherits ``KPLAN_LOCAL_INSTANCE=<id>:<token>``
  in its environment (``/proc/<pid>/environ``), even after its parent died and it was
  reparented; the random token keeps two kplan homes with the same job id apart;
- **the tree**: the supervisor is a child subreaper, so orphans are reparented to it and stay
  its descendants while it lives.

A pid is always checked against its start time (``/proc/<pid>/stat`` field 22) before it is
signalled, so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable

from kplan.core.procs import PROC, alive, pids, read_stat, start_ticks
from kplan.core.procs import descendants as all_descendants

__all__ = [
    "MARKER",
    "PROC",
    "alive",
    "become_subreaper",
    "descendants",
    "kill_all",
    "living",
    "marked",
    "read_stat",
    "signal_all",
    "start_ticks",
    "wait_gone",
]

MARKER = "KPLAN_LOCAL_INSTANCE"
"""Environment variable carrying ``<instance id>:<token>`` into every process of an instance."""

_PR_SET_CHILD_SUBREAPER = 36


def marked(value: str) -> dict[int, int]:
    """Live processes whose environment holds ``KPLAN_LOCAL_INSTANCE=<value>``: pid -> ticks."""
    needle = f"{MARKER}={value}".encode()
    found: dict[int, int] = {}
    for pid in pids():
        try:
            environ = (PROC / str(pid) / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            stat = read_stat(pid)
            if stat is not None and stat.state not in ("Z", "X"):
                found[pid] = stat.start_ticks
    return found


def descendants(root: int) -> dict[int, int]:
    """Live descendants of ``root``: pid -> start ticks."""
    return living(all_descendants(root))


def signal_all(pids: dict[int, int], sig: signal.Signals) -> None:
    """Send ``sig`` to each pid that is still the process recorded with those start ticks."""
    for pid, ticks in pids.items():
        if alive(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def living(pids: dict[int, int]) -> dict[int, int]:
    return {pid: ticks for pid, ticks in pids.items() if alive(pid, ticks)}


def wait_gone(pids: dict[int, int], timeout_s: float, poll_s: float = 0.05) -> dict[int, int]:
    """Wait until none of ``pids`` lives, at most ``timeout_s``; returns those still alive."""
    deadline = time.monotonic() + timeout_s
    left = living(pids)
    while left and time.monotonic() < deadline:
        time.sleep(poll_s)
        left = living(left)
    return left


def kill_all(
    find: Callable[[], dict[int, int]], rounds: int = 3, timeout_s: float = 5.0
) -> dict[int, int]:
    """SIGKILL every process ``find()`` returns, asking again each round (late forks).

    Returns what survived all rounds (empty on success).
    """
    left: dict[int, int] = {}
    for _ in range(rounds):
        targets = find()
        signal_all(targets, signal.SIGKILL)
        left = wait_gone(targets, timeout_s / rounds)
        if not left:
            return {}
    return left


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
