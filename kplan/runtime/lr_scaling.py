"""Learning-rate factor for a global batch B that differs from the script's base batch B0.

With S = B / B0:

- ``linear``:   factor = S                      (Goyal et al. 2017)
- ``sqrt``:     factor = sqrt(S)                (Krizhevsky 2014; Hoffer et al. 2017)
- ``adascale``: factor = r = (|G|² + tr(Σ)/B0) / (|G|² + tr(Σ)/B), in [1, S]
                (Johnson et al. 2020), from the smoothed GNS statistics; 1 until they exist
- ``none``:     factor = 1

A change of the factor (a new global batch, or the first step at B != B0) is not a jump: the
factor moves linearly from its previous value to the rule's current value over ``ramp_steps``
steps. ``progress`` sums the rule's factor per step: the number of base-batch-equivalent steps
taken, which a schedule can use in place of the step count (AdaScale's scale-invariant time).
"""

from __future__ import annotations

import math
from typing import TypedDict

from kplan.core.errors import InputError
from kplan.runtime.env import LR_RULES, LrRule
from kplan.runtime.gns import adascale_gain


def rule_factor(
    rule: LrRule,
    base_batch: int,
    batch: int,
    grad_sqr: float | None = None,
    grad_var: float | None = None,
) -> float:
    """The unramped LR factor of ``rule`` at global batch ``batch`` (base ``base_batch``)."""
    scale = batch / base_batch
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "adascale":
        if grad_sqr is None or grad_var is None:
            return 1.0
        return adascale_gain(grad_sqr, grad_var, base_batch, batch)
    return 1.0


class LrState(TypedDict):
    """An :class:`LrScaler`'s part of a checkpoint."""

    rule: str
    base_batch: int
    batch: int
    ramp_from: float
    ramp_start: int
    last_factor: float
    progress: float


class LrScaler:
    """The ramped LR factor over steps (one instance per worker; all compute the same)."""

    def __init__(self, rule: LrRule, base_batch: int, batch: int, ramp_steps: int = 50) -> None:
        if rule not in LR_RULES:
            raise InputError(f"LR scaling rule {rule!r} is not one of {LR_RULES}", "pick one")
        if base_batch < 1 or batch < 1:
            raise InputError(
                f"batch sizes must be >= 1, got B0={base_batch}, B={batch}",
                "give the base and new global batch, both >= 1",
            )
        if ramp_steps < 0:
            raise InputError(f"LR ramp_steps={ramp_steps} is negative", "use >= 0")
        self.rule: LrRule = rule
        self.base_batch = base_batch
        self.batch = batch
        self.ramp_steps = ramp_steps
        self._ramp_from = 1.0  # the factor before the current ramp (the base LR at start)
        self._ramp_start = 0
        self.last_factor = 1.0
        self.progress = 0.0

    def set_batch(self, step: int, batch: int) -> None:
        """A new global batch from ``step`` on: ramp from the factor in use now."""
        if batch < 1:
            raise InputError(f"global batch {batch} < 1", "a global batch of 1 or more samples")
        if batch == self.batch:
            return
        self._ramp_from = self.last_factor
        self._ramp_start = step
        self.batch = batch

    def factor(self, step: int, grad_sqr: float | None, grad_var: float | None) -> float:
        """The factor for optimizer step ``step``; call once per step, in order."""
        target = rule_factor(self.rule, self.base_batch, self.batch, grad_sqr, grad_var)
        done = step - self._ramp_start + 1
        if self.ramp_steps == 0 or done >= self.ramp_steps:
            value = target
        else:  # linear ramp from the previous factor to the current target
            frac = max(done, 0) / self.ramp_steps
            value = self._ramp_from + (target - self._ramp_from) * frac
        self.last_factor = value
        self.progress += target
        return value

    def state_dict(self) -> LrState:
        return {
            "rule": self.rule,
            "base_batch": self.base_batch,
            "batch": self.batch,
            "ramp_from": self._ramp_from,
            "ramp_start": self._ramp_start,
            "last_factor": self.last_factor,
            "progress": self.progress,
        }

    def load_state_dict(self, state: LrState, step: int) -> None:
        """Restore; a different batch or rule now (re-planned job) ramps from the saved factor."""
        self.progress = float(state["progress"])
        self.last_factor = float(state["last_factor"])
        same = state["rule"] == self.rule and int(state["base_batch"]) == self.base_batch
        if same and int(state["batch"]) == self.batch:
            self._ramp_from = float(state["ramp_from"])
            self._ramp_start = int(state["ramp_start"])
        else:
            self._ramp_from = self.last_factor
            self._ramp_start = step
