"""The built-in adaptation policies: goodput-driven global batch, straggler replacement.

They use only the public policy API (policy.py), as a user's policy would; docs/policies.md
describes them. No torch here.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kplan.core.errors import InputError
from kplan.runtime.policy import Actions, Monitor, Policy

# --- built-in: the global batch that maximises goodput -----------------------------------------


@dataclass(frozen=True)
class _Line:
    """Compute seconds of one rank for b samples per step: a + s b."""

    a: float
    s: float


class GoodputBatch(Policy):
    """Every ``every`` steps, the global batch B maximising goodput = throughput x efficiency.

    Model (per rank r, from recent timed steps; the PID split and earlier batches give the
    spread in b): compute_r(b) = a_r + s_r b, a weighted least-squares line through the median
    time of each local batch seen. The step at B is the balanced compute time T_c(B) (the PID
    equalises the ranks: Σ_r clip((T_c - a_r)/s_r, bounds) = B; equal split without the PID)
    plus the measured sync time c. Then

        throughput(B) = B / (T_c(B) + c),   efficiency(B) = (B_noise + B0) / (B_noise + B)

    with B_noise the measured gradient noise scale: goodput is base-batch-equivalent samples/s.
    B stays in [min_batch (default B0), max_batch (default max_scale x B0)] and the memory and
    data bounds, and within 2x of the batches measured so far (the model is trusted only near
    data). It changes only for a predicted gain above ``min_gain``. With one batch size seen
    and no spread, it first probes 2x (or 1/2x) when the best case could clear ``min_gain``.
    """

    def __init__(
        self,
        *,
        every: int = 10,
        min_batch: int | None = None,
        max_batch: int | None = None,
        max_scale: float = 16.0,
        min_gain: float = 0.05,
        window: int = 200,
        settle: int = 3,
        min_points: int = 5,
    ) -> None:
        if every < 1 or settle < 0 or min_points < 2 or window < 2 * min_points:
            raise InputError(
                f"GoodputBatch(every={every}, settle={settle}, min_points={min_points}, "
                f"window={window}): need every >= 1, settle >= 0, min_points >= 2, "
                "window >= 2 min_points",
                "the defaults: every=10, settle=3, min_points=5, window=200",
            )
        if not (min_gain >= 0 and max_scale >= 1):
            raise InputError(
                f"GoodputBatch: min_gain={min_gain}, max_scale={max_scale}",
                "min_gain >= 0 (default 0.05) and max_scale >= 1 (default 16)",
            )
        self.every = every
        self.min_batch = min_batch
        self.max_batch = max_batch
        self.max_scale = max_scale
        self.min_gain = min_gain
        self.settle = settle
        self.min_points = min_points
        self._history: deque[tuple[tuple[int, ...], tuple[float, ...]]] = deque(maxlen=window)
        self._last_timed: int | None = None
        self._timed_batch = 0
        self._since_change = 0
        self._seen: set[int] = set()
        self._probed: set[int] = set()
        self.last_reason = ""

    def after_step(self, m: Monitor, act: Actions) -> None:
        self._record(m)
        if m.step % self.every or self._timed_batch != m.global_batch:
            return
        if self._since_change < self.settle + self.min_points:
            return
        choice = self.choose(m)
        if choice is not None and choice[0] != m.global_batch:
            act.set_global_batch(choice[0], choice[1])

    def _record(self, m: Monitor) -> None:
        if m.compute_times is None or m.timed_step is None or m.timed_step == self._last_timed:
            return
        self._last_timed = m.timed_step
        batch = sum(m.local_batches)
        if batch != self._timed_batch:
            self._timed_batch = batch
            self._since_change = 0
        self._since_change += 1
        if self._since_change > self.settle and all(t > 0 for t in m.compute_times):
            self._history.append((m.local_batches, m.compute_times))
            self._seen.add(batch)

    def bounds(self, m: Monitor) -> tuple[int, int]:
        lo, hi = m.batch_bounds()
        want_lo = self.min_batch if self.min_batch is not None else m.base_batch
        want_hi = self.max_batch if self.max_batch is not None else self.max_scale * m.base_batch
        top = min(hi, int(want_hi))
        return min(max(lo, want_lo), top), max(top, lo)

    def lines(self, m: Monitor) -> list[_Line] | None:
        """The per-rank compute lines, or None while some rank saw too little spread in b."""
        out = []
        for r in range(m.world_size):
            groups: dict[int, list[float]] = {}
            for batches, times in self._history:
                if len(batches) == m.world_size:
                    groups.setdefault(batches[r], []).append(times[r])
            pts = [(float(b), statistics.median(ts), len(ts)) for b, ts in groups.items()]
            if len(pts) < 2 or max(p[0] for p in pts) < 1.1 * min(p[0] for p in pts):
                return None
            w = sum(n for _, _, n in pts)
            mb = sum(b * n for b, _, n in pts) / w
            mt = sum(t * n for _, t, n in pts) / w
            var = sum(n * (b - mb) ** 2 for b, _, n in pts)
            slope = sum(n * (b - mb) * (t - mt) for b, t, n in pts) / var
            floor = 1e-3 * mt / mb  # flat within noise: all fixed cost (a tiny slope, not 0)
            slope = max(slope, floor)
            a = mt - slope * mb
            if a < 0:  # no negative fixed cost: refit through the origin
                a = 0.0
                slope = sum(n * b * t for b, t, n in pts) / sum(n * b * b for b, _, n in pts)
            out.append(_Line(a, slope))
        return out

    def step_time(self, m: Monitor, lines: Sequence[_Line], batch: int) -> float:
        """Predicted seconds of one step at global batch ``batch`` (compute + sync)."""
        caps = [math.inf if c is None else float(c * m.accum_steps) for c in m.max_local_batches]
        low = float(m.accum_steps)
        if not m.pid:
            share = batch / m.world_size
            compute = max(ln.a + ln.s * share for ln in lines)
        else:  # the balanced time: bisection on T with Σ clip((T - a)/s) = batch

            def samples(t: float) -> float:
                return sum(
                    min(max((t - ln.a) / ln.s, low), cap)
                    for ln, cap in zip(lines, caps, strict=True)
                )

            lo_t, hi_t = 0.0, max(ln.a + ln.s * batch for ln in lines)
            for _ in range(60):
                mid = 0.5 * (lo_t + hi_t)
                lo_t, hi_t = (mid, hi_t) if samples(mid) < batch else (lo_t, mid)
            compute = hi_t
        return compute + (m.sync_time or 0.0)

    def goodput(self, m: Monitor, lines: Sequence[_Line], batch: int) -> float:
        """Base-batch-equivalent samples per second at ``batch``."""
        noise = noise_scale(m) or 0.0
        efficiency = 1.0 if math.isinf(noise) else (noise + m.base_batch) / (noise + batch)
        return batch / self.step_time(m, lines, batch) * efficiency

    def candidates(self, m: Monitor) -> list[int]:
        lo, hi = self.bounds(m)
        seen = self._seen or {m.global_batch}
        lo = max(lo, min(seen) // 2)
        hi = min(hi, 2 * max(seen))
        quantum = m.accum_steps * m.world_size
        out = {m.global_batch}
        value = float(max(lo, 1))
        while value <= hi * 1.0001:
            step = quantum if value >= quantum else m.accum_steps
            b = max(round(value / step) * step, step)
            if lo <= b <= hi:
                out.add(b)
            value *= 2 ** (1 / 4)
        out.update(b for b in (lo, hi) if b % m.accum_steps == 0)
        return sorted(out)

    def choose(self, m: Monitor) -> tuple[int, str] | None:
        """(batch, reason) to run, or None: keep the current batch."""
        noise = noise_scale(m)
        if noise is None:
            return None  # no efficiency without a measured noise scale
        lines = self.lines(m)
        if lines is None:
            return self._probe(m, noise)
        now = self.goodput(m, lines, m.global_batch)
        best = max(self.candidates(m), key=lambda b: self.goodput(m, lines, b))
        gain = self.goodput(m, lines, best) / now - 1.0
        if best == m.global_batch or gain <= self.min_gain:
            return None
        self.last_reason = (
            f"goodput {gain:+.0%} at batch {best} (B_noise {noise:.4g}, predicted step "
            f"{self.step_time(m, lines, best) * 1e3:.3g} ms, now {(m.step_time or 0) * 1e3:.3g} ms)"
        )
        return best, self.last_reason

    def _probe(self, m: Monitor, noise: float) -> tuple[int, str] | None:
        """One batch size seen: measure another if the best case could be worth it."""
        lo, hi = self.bounds(m)
        b = m.global_batch
        quantum = m.accum_steps * m.world_size
        up = min(hi, 2 * b) // quantum * quantum
        down = max(lo, b // 2 // quantum * quantum)
        # best cases: all time fixed going up; all time proportional going down
        for target, bound in (
            (up, target_gain(b, up, noise)),
            (down, 0.0 if math.isinf(noise) else (noise + b) / (noise + down) - 1.0),
        ):
            fresh = target != b and lo <= target <= hi and target not in self._probed
            if fresh and bound > self.min_gain:
                self._probed.add(target)
                self.last_reason = f"probe batch {target}: one batch size measured so far"
                return target, self.last_reason
        return None


def target_gain(batch: int, target: int, noise: float) -> float:
    """Largest goodput gain of ``target`` over ``batch`` when the step time does not grow."""
    if math.isinf(noise):
        return target / batch - 1.0
    return target / batch * (noise + batch) / (noise + target) - 1.0


def noise_scale(m: Monitor) -> float | None:
    """B_noise in samples; inf when the gradient is all noise (|G|² <= 0 < tr(Σ), where the
    runtime's AdaScale gain is the full S = B/B0 too); None before it is measured."""
    if m.grad_sqr is None or m.grad_var is None or m.grad_var <= 0:
        return None
    return m.grad_var / m.grad_sqr if m.grad_sqr > 0 else math.inf


# --- built-in: replace a straggling node -------------------------------------------------------


class StragglerReplace(Policy):
    """Ask the launcher to replace a node whose rank is much slower than the median.

    A rank's speed is its samples per second of compute, local batch / compute time (the PID
    gives a slow rank fewer samples, so its time alone would not show it). When a rank stays
    below ``ratio`` x the median speed for ``sustain`` consecutive timed steps, with at least
    ``min_world`` ranks, its node (rank // LOCAL_WORLD_SIZE) is replaced, at most once per
    ``cooldown_s`` seconds per node.
    """

    def __init__(
        self,
        *,
        ratio: float = 0.6,
        sustain: int = 20,
        cooldown_s: float = 600.0,
        min_world: int = 3,
    ) -> None:
        if not 0 < ratio < 1 or sustain < 1 or cooldown_s < 0 or min_world < 2:
            raise InputError(
                f"StragglerReplace(ratio={ratio}, sustain={sustain}, cooldown_s={cooldown_s}, "
                f"min_world={min_world}): need 0 < ratio < 1, sustain >= 1, min_world >= 2",
                "the defaults: ratio=0.6, sustain=20, cooldown_s=600, min_world=3",
            )
        self.ratio = ratio
        self.sustain = sustain
        self.cooldown_s = cooldown_s
        self.min_world = min_world
        self._slow: dict[int, int] = {}
        self._replaced: dict[int, float] = {}
        self._last_timed: int | None = None

    def after_step(self, m: Monitor, act: Actions) -> None:
        times = m.compute_times
        if m.world_size < self.min_world or times is None or m.timed_step == self._last_timed:
            return
        self._last_timed = m.timed_step
        speeds = [b / t if t > 0 else math.nan for b, t in zip(m.local_batches, times, strict=True)]
        if not all(math.isfinite(v) for v in speeds):
            return
        median = statistics.median(speeds)
        for rank, speed in enumerate(speeds):
            self._slow[rank] = self._slow.get(rank, 0) + 1 if speed < self.ratio * median else 0
            if self._slow[rank] < self.sustain:
                continue
            node = rank // max(m.local_world_size, 1)
            if m.elapsed_s - self._replaced.get(node, -math.inf) < self.cooldown_s:
                continue
            self._replaced[node] = m.elapsed_s
            self._slow = {}
            act.replace_node(
                node,
                f"rank {rank} at {speed:.0f} samples/s < {self.ratio:g} x median "
                f"{median:.0f} for {self.sustain} steps",
            )
            return
