"""Per-worker batch sizes that make fast and slow workers finish a step together.

The controlled variable is each worker's share x_i = b_i / M of the per-micro-step global batch
M (the sum of the b_i is kept at M). The measurement is each worker's compute time t_i for its
b_i samples. If time were proportional to the batch (t_i = τ_i b_i), the shares that equalise
the times are x*_i = (1/τ_i) / Σ_j (1/τ_j); the error is e = x* - x (it sums to zero).

The controller is a PID in velocity form,

    Δx_k = kp (e_k - e_{k-1}) + ki e_k + kd (e_k - 2 e_{k-1} + e_{k-2}),

projected onto the memory bounds (1 <= b_i <= max_i, Σ b_i = M) and rounded to integers that
keep the sum. Because the share-to-time plant has no dynamics of its own (a new split shows its
effect at the next measured step), the integral term does the work: with ki = 0.8 the error
shrinks geometrically by 0.2 per decision without overshoot, and converges to equal times
even when t_i = α_i + τ_i b_i has a fixed cost α_i (x* then moves toward the equal-time split at
each decision). The proportional and derivative terms exist for plants with lag; they are zero
by default because on a static plant they only add overshoot.

Against oscillation and noise: the measurement is the plain mean of the last ``window``
steps taken at the current split (a new split starts a new window; the plant is static, so all
of them are equally good samples); the controller acts only after ``settle_steps`` of them; and
a dead band with hysteresis holds the split while the step-time excess over perfect balance,
max(t̄)/mean(t̄) - 1, stays below ``deadband`` (``resume_band`` once holding) plus
``significance`` standard errors of the means. So noisy timings make the controller wait for
more samples instead of chasing noise, and clean timings let it act after a few steps.

Every worker runs the same controller on the same all-gathered measurements, so all workers
compute the same sizes without another collective.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from kplan.core.errors import InputError


@dataclass(frozen=True)
class PidConfig:
    """Gains and guards of the batch-size controller (see the module docstring)."""

    kp: float = 0.0
    ki: float = 0.8
    kd: float = 0.0
    deadband: float = 0.03
    """Hold the split while max(t)/mean(t) - 1 (predicted) is below this."""
    resume_band: float = 0.06
    """Once holding, act again only when the excess exceeds this (hysteresis)."""
    window: int = 20
    """Measurements (at the current split) averaged; older ones are dropped."""
    significance: float = 2.0
    """Act only when the imbalance exceeds the band by this many standard errors."""
    warmup_steps: int = 2
    """Ignore the first steps (allocation, DDP bucket rebuild)."""
    settle_steps: int = 3
    """Measurements at the current split before the controller acts (>= 2 for a variance)."""
    min_local_batch: int = 1

    def __post_init__(self) -> None:
        for name in ("kp", "ki", "kd"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0.0:
                raise InputError(f"PID gain {name}={value} is not a finite number >= 0", "fix it")
        if not 0.0 < self.ki <= 1.0:
            raise InputError(f"PID gain ki={self.ki} is not in (0, 1]", "use e.g. 0.8")
        if not 0.0 <= self.deadband <= self.resume_band:
            raise InputError(
                f"PID deadband={self.deadband}, resume_band={self.resume_band}: need "
                "0 <= deadband <= resume_band",
                "use e.g. deadband=0.03, resume_band=0.06",
            )
        if not math.isfinite(self.significance) or self.significance < 0.0:
            raise InputError(f"PID significance={self.significance} is not >= 0", "use e.g. 2")
        if self.warmup_steps < 0 or not 2 <= self.settle_steps <= self.window:
            raise InputError(
                f"PID warmup_steps={self.warmup_steps}, settle_steps={self.settle_steps}, "
                f"window={self.window}: need warmup >= 0 and 2 <= settle_steps <= window",
                "fix them",
            )
        if self.min_local_batch < 1:
            raise InputError(f"PID min_local_batch={self.min_local_batch} < 1", "use >= 1")


def split(
    total: int, shares: Sequence[float], lo: Sequence[int], hi: Sequence[int]
) -> tuple[int, ...]:
    """Integers b_i in [lo_i, hi_i] summing to ``total``, closest to ``total * shares``.

    The real-valued target is projected onto the box and the sum (a common shift found by
    bisection: the Euclidean projection), then rounded by largest remainder within the bounds.
    """
    k = len(shares)
    if not (k == len(lo) == len(hi)) or k == 0:
        raise InputError(
            f"split needs equal, non-empty lists; got {k}, {len(lo)}, {len(hi)}",
            "one share, low and high bound per worker",
        )
    if any(a > b for a, b in zip(lo, hi, strict=True)):
        raise InputError(f"lower bounds {list(lo)} exceed upper bounds {list(hi)}", "fix bounds")
    if not sum(lo) <= total <= sum(hi):
        raise InputError(
            f"batch {total} cannot be split over {k} workers with local batches in "
            f"[{min(lo)}, {max(hi)}] (sum of bounds {sum(lo)}..{sum(hi)})",
            "lower the global batch, raise the max local batch, or use gradient accumulation",
        )
    target = [total * s for s in shares]

    def clipped(shift: float) -> list[float]:
        return [min(max(t + shift, a), b) for t, a, b in zip(target, lo, hi, strict=True)]

    low, high = -float(total) - max(hi), float(total) + max(hi)
    for _ in range(200):
        mid = 0.5 * (low + high)
        if sum(clipped(mid)) < total:
            low = mid
        else:
            high = mid
    real = clipped(high)
    out = [min(max(math.floor(r), a), b) for r, a, b in zip(real, lo, hi, strict=True)]
    missing = total - sum(out)
    order = sorted(range(k), key=lambda i: (-(real[i] - out[i]), i))
    while missing > 0:
        moved = False
        for i in order:
            if missing > 0 and out[i] < hi[i]:
                out[i] += 1
                missing -= 1
                moved = True
        if not moved:  # pragma: no cover - excluded by the feasibility check
            raise AssertionError("split: no room left")
    while missing < 0:
        for i in reversed(order):
            if missing < 0 and out[i] > lo[i]:
                out[i] -= 1
                missing += 1
    return tuple(out)


def _mean_and_error(samples: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Per column: the mean and its standard error (sample std / sqrt(n)); n >= 2 rows."""
    n = len(samples)
    means, errors = [], []
    for col in zip(*samples, strict=True):
        mean = sum(col) / n
        var = sum((v - mean) ** 2 for v in col) / (n - 1)
        means.append(mean)
        errors.append(math.sqrt(var / n))
    return means, errors


class ControllerState(TypedDict):
    """A :class:`BatchController`'s part of a checkpoint."""

    world_size: int
    total: int
    sizes: list[int]
    e1: list[float]
    e2: list[float]
    holding: bool
    decisions: int


class BatchController:
    """Per-worker micro-batch sizes from measured compute times (one instance per worker)."""

    def __init__(
        self,
        world_size: int,
        total: int,
        max_local: Sequence[int | None] | None = None,
        config: PidConfig | None = None,
    ) -> None:
        if world_size < 1:
            raise InputError(f"world size {world_size} < 1", "at least one worker")
        self.config = config or PidConfig()
        self.world_size = world_size
        caps = list(max_local) if max_local is not None else [None] * world_size
        if len(caps) != world_size:
            raise InputError(
                f"{len(caps)} max local batches for {world_size} workers",
                "give one cap per worker, or None",
            )
        self._caps = caps
        self._hi = [total if c is None else min(int(c), total) for c in caps]
        self._lo = [self.config.min_local_batch] * world_size
        self.total = total
        self.sizes = split(total, [1.0 / world_size] * world_size, self._lo, self._hi)
        self._reset_measurements()
        self._e1 = [0.0] * world_size
        self._e2 = [0.0] * world_size
        self.holding = False
        self.decisions = 0

    def _reset_measurements(self) -> None:
        self._samples: deque[tuple[float, ...]] = deque(maxlen=self.config.window)

    def set_total(self, total: int) -> tuple[int, ...]:
        """Change the per-micro-step global batch, keeping the learned shares."""
        self._hi = [total if c is None else min(int(c), total) for c in self._caps]
        shares = [b / self.total for b in self.sizes]
        self.total = total
        self.sizes = split(total, shares, self._lo, self._hi)
        self._reset_measurements()
        return self.sizes

    def observe(
        self, step: int, sizes: Sequence[int], times: Sequence[float]
    ) -> tuple[int, ...] | None:
        """One step's measurement; returns new sizes when the split should change, else None.

        ``sizes`` are the local batches the times were measured with; a measurement taken with
        another split than the current one (a change still in flight) is ignored.
        """
        cfg = self.config
        if len(times) != self.world_size or tuple(sizes) != self.sizes:
            return None
        if step < cfg.warmup_steps or self.world_size == 1:
            return None
        if any(not math.isfinite(t) or t <= 0.0 for t in times):
            return None
        self._samples.append(tuple(times))
        n = len(self._samples)
        if n < cfg.settle_steps:
            return None
        means, errors = _mean_and_error(self._samples)
        avg = sum(means) / len(means)
        excess = max(means) / avg - 1.0  # step-time excess over perfect balance
        band = cfg.resume_band if self.holding else cfg.deadband
        if excess < band + cfg.significance * max(errors) / avg:
            self.holding = True
            self._e1 = [0.0] * self.world_size
            self._e2 = [0.0] * self.world_size
            return None
        self.holding = False
        speed = [b / t for b, t in zip(sizes, means, strict=True)]  # samples per second
        target = [s / sum(speed) for s in speed]
        shares = [b / self.total for b in self.sizes]
        e = [t - x for t, x in zip(target, shares, strict=True)]
        # Velocity-form PID: Δx = kp (e - e1) + ki e + kd (e - 2 e1 + e2)
        delta = [
            cfg.kp * (ek - e1) + cfg.ki * ek + cfg.kd * (ek - 2 * e1 + e2)
            for ek, e1, e2 in zip(e, self._e1, self._e2, strict=True)
        ]
        self._e2, self._e1 = self._e1, e
        new = split(
            self.total, [x + d for x, d in zip(shares, delta, strict=True)], self._lo, self._hi
        )
        if new == self.sizes:
            return None
        self.sizes = new
        self.decisions += 1
        self._reset_measurements()
        return new

    def state_dict(self) -> ControllerState:
        return {
            "world_size": self.world_size,
            "total": self.total,
            "sizes": list(self.sizes),
            "e1": list(self._e1),
            "e2": list(self._e2),
            "holding": self.holding,
            "decisions": self.decisions,
        }

    def load_state_dict(self, state: ControllerState) -> None:
        """Restore a split; ignored (equal split kept) when the world size or batch changed."""
        if int(state["world_size"]) != self.world_size or int(state["total"]) != self.total:
            return
        sizes = tuple(int(b) for b in state["sizes"])
        if any(not lo <= b <= hi for b, lo, hi in zip(sizes, self._lo, self._hi, strict=True)):
            return
        self.sizes = sizes
        self._e1 = [float(v) for v in state["e1"]]
        self._e2 = [float(v) for v in state["e2"]]
        self.holding = bool(state["holding"])
        self.decisions = int(state["decisions"])
        self._reset_measurements()
