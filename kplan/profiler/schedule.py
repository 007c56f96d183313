"""The profile schedule: which per-worker batch sizes to sweep, how many steps, and the GNS run.

The schedule type and its environment variable belong to the runtime
(``kplan.runtime.env.ProfileSchedule``, ``KPLAN_PROFILE_SCHEDULE``); this module chooses the
sizes. The runtime runs ``warmup_steps + steps_per_batch`` steps at each local batch in
ascending order (equal on every worker), then ``gns_steps`` steps at ``gns_batch``.
"""

from __future__ import annotations

from kplan.core.errors import InputError
from kplan.runtime.env import ProfileSchedule

__all__ = ["ProfileSchedule", "sweep_sizes", "sweep_steps"]


def sweep_sizes(min_batch: int, max_batch: int) -> tuple[int, ...]:
    """Powers of two and the midpoints between them (1, 2, 3, 4, 6, 8, 12, ...) in a range.

    ``max_batch`` itself is always included, so the sweep reaches the requested ceiling.
    """
    if min_batch < 1 or max_batch < min_batch:
        raise InputError(
            f"batch range {min_batch}..{max_batch} is empty",
            hint="need 1 <= --min-local-batch <= --max-local-batch",
        )
    sizes: set[int] = {max_batch}
    power = 1
    while power <= max_batch:
        for size in (power, power + power // 2):
            if min_batch <= size <= max_batch:
                sizes.add(size)
        power *= 2
    return tuple(sorted(sizes))


def sweep_steps(schedule: ProfileSchedule) -> int:
    """Steps the sweep runs if no size runs out of memory."""
    return len(schedule.local_batches) * (schedule.warmup_steps + schedule.steps_per_batch)
