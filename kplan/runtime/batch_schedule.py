"""A global-batch schedule the runtime carries out (``KPLAN_BATCH_SCHEDULE``, issue 13).

A schedule is a list of phases ``{"progress": p, "global_batch": B}`` or ``{"step": s,
"global_batch": B}``, triggers non-decreasing. Phase i's batch runs from the first optimizer
step after its trigger is reached until the next phase's.

- ``progress``: a fraction (0 to 1) of the job's statistical target, ``job.progress`` over the
  ``target_progress`` of ``job.epochs(E)`` (``E x N / B0`` base-batch steps). This is the
  planner's own measure (it plans the noise scale against base-batch progress), and it does not
  drift when the forecast of the steps at each batch is wrong: with the default ``adascale`` rule
  ``job.progress`` sums the gain ``B/B0 (Bn + B0)/(Bn + B)``, the planner's efficiency exactly.
  With ``linear``/``sqrt``/``none`` it counts ``S``, ``sqrt(S)`` or 1 per step.
- ``step``: an optimizer step (exact and reproducible; for hand-written schedules and tests).

The batch changes at the end of the step where the trigger is reached, through
``Job.set_global_batch`` (the data split, the PID shares, the LR ramp and the momentum
compensation), so it applies from the first step the data loader has not fetched yet: the
next step with ``num_workers=0``. The index of the last phase applied is checkpointed. A
phase's batch is clamped to what this world can run (a multiple of ``accum_steps``, at most
the memory bounds and the data set). This module imports nothing heavy (the launcher uses it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kplan.core.errors import InputError

Trigger = Literal["progress", "step"]
HINT = (
    'give JSON like [{"progress": 0, "global_batch": 256}, {"progress": 0.3, "global_batch": 512}]'
    ' (or "step": N instead of "progress": p), triggers non-decreasing'
)


@dataclass(frozen=True)
class Phase:
    """From ``at`` (a progress fraction or a step, as the schedule's ``trigger`` says) on."""

    at: float
    global_batch: int


@dataclass(frozen=True)
class BatchSchedule:
    """Phases in trigger order, all of one trigger kind."""

    trigger: Trigger
    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if self.trigger not in ("progress", "step"):
            raise InputError(
                f"batch schedule trigger {self.trigger!r} is not progress or step", HINT
            )
        if not self.phases:
            raise InputError("the batch schedule has no phase", HINT)
        last = -math.inf
        for ph in self.phases:
            if isinstance(ph.global_batch, bool) or not isinstance(ph.global_batch, int):
                raise InputError(
                    f"batch schedule global_batch {ph.global_batch!r} is no integer", HINT
                )
            if ph.global_batch < 1:
                raise InputError(f"batch schedule global_batch {ph.global_batch} < 1", HINT)
            if not math.isfinite(ph.at) or ph.at < 0:
                raise InputError(f"batch schedule {self.trigger} {ph.at!r} is not >= 0", HINT)
            if self.trigger == "progress" and ph.at > 1:
                raise InputError(f"batch schedule progress {ph.at} is above 1", HINT)
            if self.trigger == "step" and ph.at != int(ph.at):
                raise InputError(f"batch schedule step {ph.at} is not an integer", HINT)
            if ph.at < last:
                raise InputError(f"batch schedule {self.trigger}s decrease at {ph.at}", HINT)
            last = ph.at

    def start_batch(self) -> int | None:
        """The batch of the phases that start at 0 (the last of them), None when none does."""
        found = [ph.global_batch for ph in self.phases if ph.at <= 0]
        return found[-1] if found else None

    def due(self, applied: int, step: int, fraction: float | None) -> int:
        """The index of the last phase whose trigger is reached (``applied`` when none new).

        ``step``: optimizer steps done; ``fraction``: progress over the target (None: unknown)."""
        now = float(step) if self.trigger == "step" else fraction
        if now is None:
            return applied
        out = applied
        for i in range(applied + 1, len(self.phases)):
            if self.phases[i].at <= now + 1e-12:
                out = i
        return out

    def to_json(self) -> str:
        return json.dumps(
            [
                {
                    self.trigger: int(p.at) if self.trigger == "step" else p.at,
                    "global_batch": p.global_batch,
                }
                for p in self.phases
            ]
        )


def from_list(data: Sequence[Any], source: str = "batch schedule") -> BatchSchedule:
    """A schedule from a parsed JSON list of ``{"progress"|"step": x, "global_batch": B}``."""
    if not isinstance(data, list) or not data:
        raise InputError(f"{source} is not a non-empty JSON list", HINT)
    kinds: set[str] = set()
    phases = []
    for item in data:
        if not isinstance(item, dict) or "global_batch" not in item:
            raise InputError(f"{source} entry {item!r} has no global_batch", HINT)
        keys = set(item) - {"global_batch"}
        if len(keys) != 1 or not keys <= {"progress", "step"}:
            raise InputError(f"{source} entry {item!r} needs exactly one of progress, step", HINT)
        key = keys.pop()
        at = item[key]
        if isinstance(at, bool) or not isinstance(at, int | float):
            raise InputError(f"{source} entry {item!r}: {key} is not a number", HINT)
        kinds.add(key)
        phases.append(Phase(float(at), item["global_batch"]))
    if len(kinds) > 1:
        raise InputError(f"{source} mixes progress and step triggers", HINT)
    trigger: Trigger = "step" if kinds == {"step"} else "progress"
    return BatchSchedule(trigger, tuple(phases))


def parse(text: str, source: str = "batch schedule") -> BatchSchedule:
    """A schedule from its JSON text (``KPLAN_BATCH_SCHEDULE``)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{source} is not JSON: {err.msg} in {text!r}", HINT) from None
    return from_list(data, source)
