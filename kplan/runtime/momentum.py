"""Momentum compensation when the global batch changes (dynamic mini-batch SGD; issue 13).

SGD with momentum (PyTorch's form, dampening 0): ``v <- m v + g``, ``w <- w - lr v``. A
gradient's weight in later updates decays by ``m`` per step, so the momentum averages about
``B / (1 - m)`` samples, and each gradient moves the weights by ``lr / (1 - m)`` in all (the
SGD-equivalent step). When the batch grows by ``k`` (``B -> k B``) with ``m`` fixed, every step
covers ``k`` times the samples and the average reaches ``k`` times further back in samples: the
small-batch gradients already in the buffer keep acting, at the new, larger step, for as many
steps as before (the "delayed noise" of Lin et al. 2019, *Dynamic Mini-batch SGD for Elastic
Distributed Training*, who ramp the change over ``T`` steps for that reason).

``horizon`` compensation keeps the average's memory *in samples*: a decay of ``m`` per ``B``
samples is ``m^k`` per ``kB``-sample step, so

    m' = m^k                     (k = B / B_ref, B_ref the batch the job started at)
    lr' = lr x f x (1 - m') / (1 - m)

with ``f`` the LR rule's factor (kplan/runtime/lr_scaling.py): the extra ``(1 - m')/(1 - m)`` keeps
the SGD-equivalent step ``lr' / (1 - m') = f x lr / (1 - m)``, so the rule scales exactly what it
scales for plain SGD and only the memory changes. A shrinking batch (``k < 1``) raises ``m``
the same way. ``k`` moves linearly from its previous value to ``B / B_ref`` over ``ramp_steps``
optimizer steps (the LR ramp's ``T``), together with the LR factor; a job that never changes
its batch has ``k = 1`` throughout (nothing changes: the script's momentum is taken as right at
the batch the plan starts with, as the linear-scaling practice keeps it for a static batch).

Adam-like optimizers (``betas``): both moments are averages with decay ``beta1``, ``beta2`` per
step, so ``beta_i' = beta_i^k`` keeps their memory in samples; Adam's step is normalised (the
bias-corrected averages are means, not sums), so no LR correction. The bias correction uses
``beta^t`` with the current beta; after the first hundreds of steps it is 1 either way.
Groups with ``momentum == 0``, or SGD with ``dampening != 0``, are left as they are.

The compensated values are set only for the duration of ``optimizer.step()`` and restored after
it (as the LR factor is), so the script's scheduler keeps owning ``momentum`` and ``betas``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any, Literal, TypedDict

from kplan.core.errors import InputError

MomentumMode = Literal["horizon", "off"]
MOMENTUM_MODES: tuple[MomentumMode, ...] = ("horizon", "off")


def compensated(m: float, k: float) -> float:
    """``m^k``: the decay per step that keeps a decay of ``m`` per base step's samples."""
    if not 0.0 <= m < 1.0:
        raise InputError(f"momentum {m} is not in [0, 1)", "use the optimizer's momentum, e.g. 0.9")
    return float(m**k)


def lr_correction(m: float, k: float) -> float:
    """``(1 - m^k) / (1 - m)``: keeps the SGD-equivalent step ``lr / (1 - m)`` (1 for m = 0)."""
    if m <= 0.0:
        return 1.0
    return (1.0 - compensated(m, k)) / (1.0 - m)


class MomentumState(TypedDict):
    """A :class:`MomentumCompensator`'s part of a checkpoint."""

    mode: str
    ref_batch: int
    batch: int
    ratio_from: float
    ramp_start: int


class SavedGroup(TypedDict, total=False):
    """What :meth:`MomentumCompensator.apply` changed in one optimizer group, as it was."""

    betas: Any  # Adam's (beta1, beta2) as the optimizer held them
    momentum: Any  # SGD's momentum as the optimizer held it


class MomentumCompensator:
    """The ramped batch ratio ``k`` over steps and its application to optimizer param groups."""

    def __init__(self, mode: MomentumMode, ref_batch: int, ramp_steps: int) -> None:
        if mode not in MOMENTUM_MODES:
            raise InputError(
                f"momentum compensation {mode!r} is not one of {MOMENTUM_MODES}",
                "'horizon' (the default) or 'off' (KPLAN_MOMENTUM)",
            )
        if ref_batch < 1 or ramp_steps < 0:
            raise InputError(
                f"ref_batch={ref_batch}, ramp_steps={ramp_steps}: need >= 1, >= 0",
                "ref_batch >= 1 and ramp_steps >= 0",
            )
        self.mode: MomentumMode = mode
        self.ref_batch = ref_batch
        self.batch = ref_batch
        self.ramp_steps = ramp_steps
        self._ratio_from = 1.0
        self._ramp_start = 0

    def ratio(self, step: int) -> float:
        """``k`` at optimizer step ``step`` (1 when off)."""
        if self.mode == "off":
            return 1.0
        target = self.batch / self.ref_batch
        done = step - self._ramp_start + 1
        if self.ramp_steps == 0 or done >= self.ramp_steps:
            return target
        frac = max(done, 0) / self.ramp_steps
        return self._ratio_from + (target - self._ratio_from) * frac

    def set_batch(self, step: int, batch: int) -> None:
        """A new global batch from optimizer step ``step`` on: ramp from the ratio in use."""
        if batch == self.batch:
            return
        self._ratio_from = self.ratio(step - 1)
        self._ramp_start = step
        self.batch = batch

    def targets(self, groups: Iterable[MutableMapping[str, Any]], k: float) -> list[Any]:
        """Each group's compensated momentum (SGD) or betas (Adam), None where untouched."""
        out: list[Any] = []
        for g in groups:
            if "betas" in g and _floats(g["betas"]):
                out.append(tuple(compensated(float(b), k) for b in g["betas"]))
            elif sgd_momentum(g):
                out.append(compensated(float(g["momentum"]), k))
            else:
                out.append(None)
        return out

    def apply(self, groups: Sequence[MutableMapping[str, Any]], k: float) -> list[SavedGroup]:
        """Set the compensated values in ``groups`` (the LR already holds the rule's factor);
        returns what to give back to ``restore`` after the optimizer step."""
        saved: list[SavedGroup] = []
        for g in groups:
            keep: SavedGroup = {}
            if k != 1.0 and "betas" in g and _floats(g["betas"]):
                keep["betas"] = g["betas"]
                g["betas"] = tuple(compensated(float(b), k) for b in g["betas"])
            elif k != 1.0 and sgd_momentum(g):
                m = float(g["momentum"])
                keep["momentum"] = g["momentum"]
                g["momentum"] = compensated(m, k)
                g["lr"] = g["lr"] * lr_correction(m, k)
            saved.append(keep)
        return saved

    @staticmethod
    def restore(groups: Sequence[MutableMapping[str, Any]], saved: list[SavedGroup]) -> None:
        for g, keep in zip(groups, saved, strict=True):
            g.update(keep)

    def state_dict(self) -> MomentumState:
        return {
            "mode": self.mode,
            "ref_batch": self.ref_batch,
            "batch": self.batch,
            "ratio_from": self._ratio_from,
            "ramp_start": self._ramp_start,
        }

    def load_state_dict(self, state: MomentumState, step: int, batch: int) -> None:
        """Restore; a different batch now (a re-planned job) ramps from the saved ratio."""
        self.ref_batch = int(state["ref_batch"])
        self.batch = int(state["batch"])
        self._ratio_from = float(state["ratio_from"])
        self._ramp_start = int(state["ramp_start"])
        self.set_batch(step, batch)


def _floats(values: Any) -> bool:
    return isinstance(values, tuple | list) and all(isinstance(v, float | int) for v in values)


def sgd_momentum(g: MutableMapping[str, Any]) -> bool:
    """Whether compensation changes this group's SGD momentum (0 < m < 1, no dampening)."""
    m = g.get("momentum")
    return (
        isinstance(m, float | int)
        and 0.0 < float(m) < 1.0
        and not g.get("dampening", 0.0)
        and math.isfinite(float(g["lr"]))
    )
