"""CPU threads per worker when several workers share one machine's cores.

torch sizes its intra-op thread pool to the machine's cores unless ``OMP_NUM_THREADS`` says
otherwise, and torchrun sets ``OMP_NUM_THREADS=1`` only when it starts several workers itself.
A local job of several worker groups (one torchrun each) would then run every worker with as
many threads as the machine has cores: ``n`` workers x ``cores`` threads time-share ``cores``
cores, and each step waits for the slowest thread of every worker (measured: 2.5x the step time
of the same job at one thread per worker on a quiet 2-core machine, docs/benchmarks.md).

One rule, used by ``kplan profile`` for its workers, by the local launcher for a job's workers
and by the local plan to predict them (so what was measured and what runs agree): the user's
``OMP_NUM_THREADS`` when set to a positive integer, else the usable cores shared evenly by every
worker on the machine, at least one each.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

THREADS_ENV = "OMP_NUM_THREADS"


def usable_cores() -> int:
    """Logical cores this process may run on (its CPU affinity where the OS says, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def user_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """``OMP_NUM_THREADS`` as a positive integer, or None when unset or not one."""
    raw = (os.environ if environ is None else environ).get(THREADS_ENV, "").strip()
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def threads_per_worker(
    workers: int, cores: int | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """Threads each of ``workers`` workers on one machine of ``cores`` cores runs with: the
    user's ``OMP_NUM_THREADS``, else ``cores // workers`` (at least 1)."""
    given = user_threads(environ)
    if given is not None:
        return given
    return max(1, (usable_cores() if cores is None else cores) // max(1, workers))


def oversubscription(workers: int, threads: int, cores: int) -> float:
    """How many threads each core runs, at least 1: ``workers x threads / cores``."""
    return max(1.0, workers * threads / max(1, cores))
