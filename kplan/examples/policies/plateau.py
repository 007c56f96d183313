"""Grow the global batch when the loss stops falling: an example kplan adaptation policy.

Instead of decaying the learning rate when training stalls, raise the batch (Smith et al.
2018, "Don't Decay the Learning Rate, Increase the Batch Size"); with KPLAN_LR_SCALING the
runtime rescales the learning rate for the new batch. Run it with any kplan job:

    KPLAN_POLICIES=kplan/examples/policies/plateau.py:BatchOnPlateau \\
        python kplan/examples/mlp_regression.py --epochs 3

docs/policies.md walks through this file.
"""

from __future__ import annotations

from kplan.runtime.policy import Actions, Monitor, Policy


class BatchOnPlateau(Policy):
    """Multiply the global batch by ``factor`` when the mean loss of ``window`` steps fell by
    less than ``min_improvement`` (relative) since the previous window, up to ``max_scale``
    times the script's batch. Subclass to change the settings."""

    window = 20
    min_improvement = 0.02
    factor = 2
    max_scale = 8

    def __init__(self) -> None:
        self._losses: list[float] = []
        self._previous: float | None = None

    def after_step(self, m: Monitor, act: Actions) -> None:
        if m.loss is None:
            return
        self._losses.append(m.loss)
        if len(self._losses) < self.window:
            return
        mean = sum(self._losses) / len(self._losses)
        self._losses = []
        previous, self._previous = self._previous, mean
        if previous is None or mean < previous * (1 - self.min_improvement):
            return  # still improving (or the first window)
        _, largest = m.batch_bounds()  # memory bounds and dataset size
        target = min(m.global_batch * self.factor, self.max_scale * m.base_batch, largest)
        target -= target % m.accum_steps  # a whole number of samples per micro-step
        if target > m.global_batch:
            reason = f"loss plateau: mean {mean:.4g} vs {previous:.4g} over {self.window} steps"
            act.set_global_batch(target, reason)
