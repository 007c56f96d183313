"""Gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training").

Notation: G is the true gradient, Σ the per-sample gradient covariance, g_b a mean gradient over
b samples, so E|g_b|² = |G|² + tr(Σ)/b. The simple noise scale is B_noise = tr(Σ)/|G|².

From one "small" and one "big" measurement, |G|² ≈ (B|g_B|² - b|g_b|²)/(B - b) and
tr(Σ) ≈ (|g_b|² - |g_B|²)/(1/b - 1/B), both unbiased.

Unequal per-worker batches (derived here). Worker i has b_i samples and a local mean gradient g_i
with s_i = |g_i|²; the all-reduced gradient is g = Σ (b_i/B) g_i with B = Σ b_i, S = |g|².
Then E[S] = |G|² + tr(Σ)/B (the b_i/B weights make it the full-batch mean). Take the sample-
weighted mean of the local norms, s̄ = Σ (b_i/B) s_i: E[s̄] = |G|² + Σ (b_i/B) tr(Σ)/b_i
= |G|² + k tr(Σ)/B, i.e. a "small" batch of b_eff = B/k. Substituting b_eff:

    |G|²  ≈ (k S - s̄) / (k - 1)          tr(Σ) ≈ B (s̄ - S) / (k - 1)

both unbiased for any split; with equal b_i they are McCandlish's formulas. The same formulas
serve a single worker whose "workers" are gradient-accumulation micro-batches, or two
consecutive steps.

A finite data set (derived here). The sampler draws without replacement within an epoch, so
with N samples, G their mean gradient and Σ their population covariance (divisor N), a mean
over b samples has E|g_b|² = |G|² + (tr(Σ)/b)(N - b)/(N - 1), and the k small batches are
disjoint. Then E[s̄ - S] = tr(Σ) (k - 1) N / (B (N - 1)) and E[S] = |G|² + tr(Σ)(N - B)/(B (N - 1)),
so the formulas above read |G|² low by tr(Σ)/(N - 1) (B_noise high by about 1/(1 - B_noise/N)),
and the unbiased pair is

    tr(Σ) ≈ B (N - 1) (s̄ - S) / (N (k - 1))     |G|² ≈ (k S - s̄)/(k - 1) + B (s̄ - S) / (N (k - 1))

which tends to the formulas above as N grows (``estimate(..., population=N)``). At B = N, |G|²
is S exactly, as it should be.

Each step gives a very noisy pair; :class:`GnsEstimator` keeps bias-corrected exponential moving
averages of |G|² and tr(Σ) separately and reports B_noise as the ratio of the averages (a ratio
of noisy estimates would be biased).

Precision (derived here). With k equal small batches g_i = G + e_i and ē their mean noise, one
step's samples are

    |G|² sample = |G|² + 2 G·ē + mean_{i≠j} e_i·e_j
    tr(Σ) sample = b mean_i |e_i|² - (b / (k - 1)) mean_{i≠j} e_i·e_j      (b = B/k)

both unbiased. For near-Gaussian noise with d_eff = tr(Σ)²/tr(Σ²) their relative standard
deviations are about

    sd(|G|² sample) / |G|²  ~  sqrt(2 k / ((k - 1) d_eff)) · B_noise / B
    sd(tr(Σ) sample) / tr(Σ)  ~  sqrt(2 / ((k - 1) d_eff))

so when B_noise >> B the error of the noise scale is that of the |G|² average: no bias, but a
relative standard error of the first line over sqrt(n_eff), n_eff the averages' effective number
of steps ((1 + β)/(1 - β) for an EMA of weight β: 199 at 0.99). Example (2,048 samples, d_eff
17, B_noise 500, k = 2): at B = 64 one step's |G|² has a relative sd of ~4, so even a 0.998
average (n_eff ~1,000) scatters by ~13% across data orders (the 0.78-1.31 seen across seeds);
at B = 256 it is ~1 and the same average is within ~3%. Smoothing more trades this error for
lag while training. :attr:`GnsEstimator.rel_error` reports this standard error, measured from the
samples' own scatter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from kplan.core.errors import InputError


@dataclass(frozen=True)
class GnsSample:
    """One step's unbiased estimates: ``grad_sqr`` of |G|², ``grad_var`` of tr(Σ)."""

    grad_sqr: float
    grad_var: float


def estimate(
    local_sqr: Sequence[float],
    local_batch: Sequence[int],
    global_sqr: float,
    population: int | None = None,
) -> GnsSample:
    """Unbiased |G|² and tr(Σ) from k >= 2 local squared norms and the combined one.

    ``local_sqr[i]`` is |g_i|² of the mean gradient over ``local_batch[i]`` samples, and
    ``global_sqr`` is |Σ (b_i/B) g_i|² (what weighted all-reduce averaging produces).
    ``population``: the data set's size N when the batches were drawn from it without
    replacement (the finite-population correction of the module docstring); None, or an N
    below the batch (draws that may repeat samples), treats the data as unlimited.
    """
    k = len(local_sqr)
    if k != len(local_batch):
        raise InputError(
            f"{k} local norms but {len(local_batch)} local batch sizes", "pass one size per norm"
        )
    if k < 2:
        raise InputError(
            f"GNS needs at least 2 gradients, got {k}", "use 2+ workers or micro-steps"
        )
    if any(b < 1 for b in local_batch):
        raise InputError(f"local batch sizes {list(local_batch)} hold a size below 1", "fix them")
    total = float(sum(local_batch))
    mean_small = sum(b * s for b, s in zip(local_batch, local_sqr, strict=True)) / total
    # |G|^2 ~ (k S - s̄)/(k-1);  tr(Σ) ~ B (s̄ - S)/(k-1)   (see the module docstring)
    grad_sqr = (k * global_sqr - mean_small) / (k - 1)
    grad_var = total * (mean_small - global_sqr) / (k - 1)
    if population is not None and population >= total:
        grad_sqr += grad_var / population
        grad_var *= (population - 1) / population
    return GnsSample(grad_sqr=grad_sqr, grad_var=grad_var)


def adascale_gain(grad_sqr: float, grad_var: float, base_batch: int, batch: int) -> float:
    """AdaScale gain r = E|g_B0|² / E|g_B|² = (|G|² + tr(Σ)/B0) / (|G|² + tr(Σ)/B), in [1, B/B0].

    Equivalently r = S (B0 + B_noise)/(B + B_noise) with S = B/B0. Falls back to the bounds when
    the estimates are not yet meaningful (|G|² <= 0 means all noise: r = S).
    """
    scale = batch / base_batch
    var = max(grad_var, 0.0)
    if grad_sqr <= 0.0:
        return scale if var > 0.0 else 1.0
    gain = (grad_sqr + var / base_batch) / (grad_sqr + var / batch)
    lo, hi = min(1.0, scale), max(1.0, scale)
    return min(max(gain, lo), hi)


class GnsState(TypedDict):
    """A :class:`GnsEstimator`'s part of a checkpoint (``moments``: absent before rel_error)."""

    sqr: float
    var: float
    weight: float
    count: int
    moments: NotRequired[list[float]]


class GnsEstimator:
    """Bias-corrected EMAs of |G|² and tr(Σ); B_noise = EMA(tr Σ) / EMA(|G|²).

    ``smoothing`` is the EMA weight of the past: the averages' mean age is
    ``smoothing / (1 - smoothing)`` steps (0.99: about the last 100 steps), so while training
    the reported value lags the current one (``window_steps``). The samples' second moments are
    averaged with the same weights, which gives the ratio's standard error (``rel_error``).
    """

    def __init__(self, smoothing: float = 0.99) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise InputError(f"GNS smoothing {smoothing} is not in [0, 1)", "use e.g. 0.99")
        self.smoothing = smoothing
        self._sqr = 0.0
        self._var = 0.0
        self._weight = 0.0  # 1 - smoothing**n: the Adam-style bias correction
        self.count = 0
        # EMAs of sqr², var², sqr·var and of the squared weights (for n_eff); None when resumed
        # from a state saved without them (rel_error is then unknown).
        self._moments: list[float] | None = [0.0, 0.0, 0.0, 0.0]

    def update(self, sample: GnsSample) -> None:
        """Fold in one step's estimates; non-finite samples are skipped."""
        q, v = sample.grad_sqr, sample.grad_var
        if not (math.isfinite(q) and math.isfinite(v)):
            return
        beta = self.smoothing
        self._sqr = beta * self._sqr + (1.0 - beta) * q
        self._var = beta * self._var + (1.0 - beta) * v
        self._weight = beta * self._weight + (1.0 - beta)
        self.count += 1
        if self._moments is not None:
            m = self._moments
            w = 1.0 - beta
            m[0] = beta * m[0] + w * q * q
            m[1] = beta * m[1] + w * v * v
            m[2] = beta * m[2] + w * q * v
            m[3] = beta * beta * m[3] + w * w  # Σ w_i² of the (unnormalised) weights

    @property
    def window_steps(self) -> float:
        """The mean age of the averages, in steps (what "a moving average over about the last
        N steps" means here)."""
        return self.smoothing / (1.0 - self.smoothing)

    @property
    def effective_steps(self) -> float:
        """n_eff = (Σ w_i)² / Σ w_i²: how many independent steps the averages are worth
        (``count`` at first, (1 + β)/(1 - β) in the long run)."""
        if self._moments is None or not self.count or self._moments[3] <= 0.0:
            return float(self.count)
        return self._weight**2 / self._moments[3]

    @property
    def grad_sqr(self) -> float | None:
        """Smoothed |G|², None before the first sample."""
        return self._sqr / self._weight if self.count else None

    @property
    def grad_var(self) -> float | None:
        """Smoothed tr(Σ), None before the first sample."""
        return self._var / self._weight if self.count else None

    @property
    def gns(self) -> float | None:
        """B_noise = tr(Σ)/|G|² in samples; None until both averages are positive."""
        sqr, var = self.grad_sqr, self.grad_var
        if sqr is None or var is None or sqr <= 0.0 or var <= 0.0:
            return None
        return var / sqr

    @property
    def rel_error(self) -> float | None:
        """Relative standard error of :attr:`gns` from the samples' scatter (delta method:
        var(V/Q)/(V/Q)² ~ (s_V²/V² + s_Q²/Q² - 2 s_VQ/(V Q)) / (n_eff - 1), with the weighted
        sample (co)variances), a first-order value: beyond ~0.2 it reads low (the ratio's
        scatter is then skewed). None without a value or before 3 samples. It counts the samples
        as independent: within an epoch at fixed parameters they are slightly anti-correlated
        (disjoint batches), so it errs high; while training it includes the drift of the
        window."""
        gns, n = self.gns, self.effective_steps
        if gns is None or self._moments is None or self.count < 3 or n <= 1.0:
            return None
        w = self._weight
        q, v = self._sqr / w, self._var / w
        m = self._moments
        var_q = max(m[0] / w - q * q, 0.0)
        var_v = max(m[1] / w - v * v, 0.0)
        cov = m[2] / w - q * v
        rel_sq = (var_v / (v * v) + var_q / (q * q) - 2.0 * cov / (q * v)) / (n - 1.0)
        return math.sqrt(max(rel_sq, 0.0))

    def state_dict(self) -> GnsState:
        state: GnsState = {
            "sqr": self._sqr,
            "var": self._var,
            "weight": self._weight,
            "count": self.count,
        }
        if self._moments is not None:
            state["moments"] = list(self._moments)
        return state

    def load_state_dict(self, state: GnsState) -> None:
        self._sqr = float(state["sqr"])
        self._var = float(state["var"])
        self._weight = float(state["weight"])
        self.count = int(state["count"])
        moments = state.get("moments")  # absent in states saved before rel_error existed
        self._moments = None if moments is None else [float(x) for x in moments]
