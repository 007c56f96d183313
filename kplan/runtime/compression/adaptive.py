"""The adaptive top-k ratio (GraVAC-style): the compression gain over a window of steps sets
the next ratio within the option's [MIN, MAX] (kplan/core/compression_spec.py)."""

from __future__ import annotations

import math
from typing import TypedDict

import torch  # noqa: TID253 (torch is the runtime's core dependency)

Future = torch.futures.Future


class AdaptiveState(TypedDict):
    """An :class:`AdaptiveRatio`'s part of a checkpoint."""

    ratio: float
    sum_in: float
    sum_out: float
    steps: int


class AdaptiveRatio:
    """GraVAC-style ratio control from the measured compression gain.

    Over a window of ``window`` compressed steps the gain is G = Σ|C(a)|² / Σ|a|² (sums over
    the window and all workers, from the all-gathered step statistics, so every rank gets the
    same G). At the window's end: G >= ``high`` (compression loses little) -> halve the ratio
    (compress more); G < ``low`` -> double it; in between keep it; always within
    [min_ratio, max_ratio]. It starts at max_ratio (the least compression).
    """

    def __init__(
        self,
        min_ratio: float,
        max_ratio: float,
        window: int = 20,
        high: float = 0.7,
        low: float = 0.4,
    ) -> None:
        self.min_ratio = min_ratio
        self.max_ratio = max_ratio
        self.window = window
        self.high = high
        self.low = low
        self.ratio = max_ratio
        self.sum_in = 0.0
        self.sum_out = 0.0
        self.steps = 0

    def observe(self, sq_in: float, sq_out: float) -> float | None:
        """Add one step's summed |a|² and |C(a)|²; the window's gain G when this step closed a
        window (the ratio is then already the next one), else None."""
        if not (math.isfinite(sq_in) and math.isfinite(sq_out)) or sq_in <= 0:
            return None
        self.sum_in += sq_in
        self.sum_out += sq_out
        self.steps += 1
        if self.steps < self.window:
            return None
        gain = self.sum_out / self.sum_in
        self.sum_in = self.sum_out = 0.0
        self.steps = 0
        if gain >= self.high:
            self.ratio = max(self.min_ratio, self.ratio / 2)
        elif gain < self.low:
            self.ratio = min(self.max_ratio, self.ratio * 2)
        return gain

    def state_dict(self) -> AdaptiveState:
        return {
            "ratio": self.ratio,
            "sum_in": self.sum_in,
            "sum_out": self.sum_out,
            "steps": self.steps,
        }

    def load_state_dict(self, state: AdaptiveState) -> None:
        self.ratio = float(state["ratio"])
        self.sum_in = float(state["sum_in"])
        self.sum_out = float(state["sum_out"])
        self.steps = int(state["steps"])
