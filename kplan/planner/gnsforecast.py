"""Forecast the gradient noise scale over the rest of training, with its uncertainty (issue 13).

The noise scale ``Bn`` grows as training goes on, 10 to 1,000 times from the first epoch to the
last on the shared Pollux curves. Across them, ``log Bn`` is close to a line in ``log p`` (``p``
the fraction of training done, in base-batch progress), with a slope that differs by model:

    log Bn(p) = L + b (log p - log p_now) + e        e ~ N(0, noise_sd^2), heavy tails

A Bayesian linear regression on the points measured so far (``p <= p_now``) gives the level
``L`` (at the present) and the slope ``b``: the prior on ``b`` is the spread of slopes across
models (``GnsPrior``, fitted by ``fit_prior`` on other models' curves), the level is left to the
data. Points are weighted by Huber's rule (iteratively reweighted), so a loss-plateau swing (655,
5263, 1.3M in a few hundred steps) moves the forecast little. The slope that fits the early
points is not the slope of the rest of training (the noise scale bends: learning-rate decays, a
plateau): ``slope_drift_sd`` widens the forecast's slope by what that change was across models,
in proportion to how much the points (rather than the prior) set the slope.

- **Measured part** (``p <= p_now``): the points themselves, each clipped to ``CLIP_SD`` noise
  sds of the median of the five around it, detrended by the repeated-median slope (a Hampel filter:
  one spike, e.g. a first-epoch value 500 times below the next, cannot dominate), linear
  between points, the first held before it. The regression clips further, to
  ``LINE_CLIP_SD`` noise sds of the repeated-median line (Siegel), and weights by Huber's rule.
- **Forecast** (``p > p_now``): the posterior line from the present; ``sample`` draws
  trajectories (level and slope from the posterior, slope widened by the drift).
- **One point** (a profile of a few minutes): the forecast is the prior's growth from that point,
  as wide as the spread of slopes across models. A point at progress 0 is read at
  ``PROGRESS_FLOOR`` (the first epoch of the shared curves, ~1% of training).

numpy only: the planner imports this module.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.planner import nanstat
from kplan.planner.profile import GnsPoint

Array = NDArray[np.float64]

PROGRESS_FLOOR = 0.01  # progress of a point measured at 0 (a profile's run from the start)
HUBER_C = 1.5  # residuals beyond 1.5 noise sds get weight c/|r| (Huber)
CLIP_SD = 2.0  # Hampel filter of the measured points: this many noise sds from the neighbours
MEDIAN = False
LINE_CLIP_SD = 1.0  # the regression's points: this many noise sds from a robust line
LEVEL_PRIOR_SD = 30.0  # the level is the data's: a vague prior (log space)
DONE = 0.999  # a trajectory measured this far needs no forecast


@dataclass(frozen=True)
class GnsPrior:
    """What the other models' curves say about GNS growth (log Bn against log progress)."""

    slope_mean: float  # d log Bn / d log p over a whole curve
    slope_sd: float  # its spread across curves
    noise_sd: float  # residual sd of log Bn about a curve's own line (robust)
    slope_drift_sd: float  # the later slope against the slope fitted on the first 10%

    def __post_init__(self) -> None:
        for name in ("slope_sd", "noise_sd"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r} must be a finite number > 0")
        if not (math.isfinite(self.slope_drift_sd) and self.slope_drift_sd >= 0):
            raise ValueError(f"slope_drift_sd={self.slope_drift_sd!r} must be >= 0")


# Fitted on the 34 validation curves of the six shared Pollux models with three points or more
# (each model's curves weighted as one): `python -m bench.gns_forecast --fit-prior`.
# bench/gns_forecast.py refits it leaving each model out when it scores that model.
PRIOR = GnsPrior(slope_mean=1.71, slope_sd=0.78, noise_sd=0.46, slope_drift_sd=0.59)
_IN_USE: list[GnsPrior] = [PRIOR]


def prior_in_use() -> GnsPrior:
    """The prior every forecast takes when none is given: ``PRIOR``, or the one of the
    innermost ``using_prior`` block."""
    return _IN_USE[-1]


@contextlib.contextmanager
def using_prior(prior: GnsPrior) -> Iterator[None]:
    """Forecast with ``prior`` inside the block (a benchmark scoring a model with the prior of
    the other models: the planner's own forecasts, e.g. in ``planner.online``, take it too)."""
    _IN_USE.append(prior)
    try:
        yield
    finally:
        _IN_USE.pop()


@dataclass(frozen=True)
class GnsForecast:
    """Measured points up to ``now``, a posterior line after it."""

    progress: tuple[float, ...]  # measured points, sorted
    log_scale: tuple[float, ...]  # their log Bn after the Hampel filter
    now: float  # progress of the latest point
    level: float  # posterior mean of log Bn at ``now``
    slope: float  # posterior mean slope
    cov: tuple[tuple[float, float], tuple[float, float]]  # of (level, slope), drift included
    noise_sd: float

    @property
    def slope_sd(self) -> float:
        return math.sqrt(self.cov[1][1])

    def _measured(self, p: Array) -> Array:
        out: Array = np.interp(p, self.progress, np.exp(self.log_scale))
        return out

    def median(self, progress: ArrayLike) -> Array:
        """Bn at each progress: the measured points up to now, the posterior median after."""
        p = np.asarray(progress, dtype=float)
        dx = np.log(np.maximum(p, PROGRESS_FLOOR)) - math.log(self.now)
        ahead = self.level + self.slope * dx
        out: Array = np.where(p <= self.now, self._measured(p), np.exp(ahead))
        return out

    def quantile(self, progress: ArrayLike, q: float) -> Array:
        """The ``q`` quantile of the forecast Bn (the line's uncertainty, not the point noise)."""
        p = np.asarray(progress, dtype=float)
        dx = np.log(np.maximum(p, PROGRESS_FLOOR)) - math.log(self.now)
        (vl, c), (_, vs) = self.cov
        sd = np.sqrt(np.maximum(vl + 2 * c * dx + vs * dx**2, 0.0))
        z = _z(q)
        ahead = self.level + self.slope * dx + z * sd
        out: Array = np.where(p <= self.now, self._measured(p), np.exp(ahead))
        return out

    def band(self, progress: float, q: float) -> tuple[float, float]:
        """The central ``q`` interval where a new measurement at ``progress`` (after ``now``)
        should fall: the line's uncertainty and the points' own scatter (``noise_sd``)."""
        dx = math.log(max(progress, PROGRESS_FLOOR)) - math.log(self.now)
        (vl, c), (_, vs) = self.cov
        sd = math.sqrt(max(vl + 2 * c * dx + vs * dx**2, 0.0) + self.noise_sd**2)
        mid, z = self.level + self.slope * dx, _z(0.5 + q / 2)
        return math.exp(mid - z * sd), math.exp(mid + z * sd)

    def sample(self, progress: ArrayLike, n: int, seed: int = 0) -> Array:
        """``n`` trajectories of Bn at ``progress`` (shape ``(n, len(progress))``): a Latin
        hypercube over (level, slope), so that a few hundred draws give stable quantiles."""
        p = np.asarray(progress, dtype=float)
        dx = np.log(np.maximum(p, PROGRESS_FLOOR)) - math.log(self.now)
        rng = np.random.default_rng(seed)
        strata = np.array([_z((i + 0.5) / n) for i in range(n)])
        z = np.column_stack([strata[rng.permutation(n)], strata[rng.permutation(n)]])
        chol = np.linalg.cholesky(np.array(self.cov) + 1e-18 * np.eye(2))
        draws = np.array([self.level, self.slope]) + z @ chol.T
        ahead = draws[:, :1] + draws[:, 1:] * dx[None, :]
        out: Array = np.where(p[None, :] <= self.now, self._measured(p)[None, :], np.exp(ahead))
        return out


def _z(q: float) -> float:
    """Standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q!r} must be in (0, 1)")
    a = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
         -30.66479806614716, 2.506628277459239)  # fmt: skip
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
         -13.28068155288572)  # fmt: skip
    c = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734,
         4.374664141464968, 2.938163982698783)  # fmt: skip
    d = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
    lo = 0.02425
    if q < lo or q > 1 - lo:
        t = math.sqrt(-2 * math.log(min(q, 1 - q)))
        num = ((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]
        x = num / ((((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1)
        return x if q < lo else -x
    r = q - 0.5
    s = r * r
    num = (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5]) * r
    return num / (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1)


def _hampel(x: Array, logs: Array, sd: float, k: float = CLIP_SD, width: int = 5) -> Array:
    """Hampel's filter: a value further than ``k * sd`` from the median of the ``width`` points
    around it (the window shifted inside at the ends, detrended by the repeated-median slope of all
    the points) is replaced by that median."""
    n = len(logs)
    out = logs.copy()
    if n < 3:
        return out
    slope = _robust_slope(x, logs)
    w = min(width, n)
    for i in range(n):
        lo = min(max(0, i - w // 2), n - w)
        ref = float(nanstat.median(logs[lo : lo + w] - slope * (x[lo : lo + w] - x[i])))
        if abs(logs[i] - ref) > k * sd:
            out[i] = ref
    return out


def _points(points: Sequence[GnsPoint]) -> tuple[Array, Array]:
    good = [g for g in points if math.isfinite(g.noise_scale) and g.noise_scale > 0]
    if not good:
        raise ValueError("no positive GNS point to forecast from")
    good.sort(key=lambda g: g.progress)
    p = np.array([g.progress for g in good], dtype=float)
    y = np.log(np.array([g.noise_scale for g in good], dtype=float))
    return p, y


def _huber_line(
    x: Array, y: Array, prior: GnsPrior
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Posterior (mean, covariance) of (level, slope): Gaussian prior, Huber-weighted points
    (iteratively reweighted least squares)."""
    design = np.column_stack([np.ones_like(x), x])
    prior_mean = np.array([0.0, prior.slope_mean])
    prior_prec = np.diag([LEVEL_PRIOR_SD**-2, prior.slope_sd**-2])
    s2 = prior.noise_sd**2
    w = np.ones_like(y)
    cov: NDArray[np.float64] = np.linalg.inv(prior_prec)
    beta: NDArray[np.float64] = prior_mean.astype(np.float64)
    for _ in range(30):
        cov = np.linalg.inv(prior_prec + design.T @ (design * w[:, None]) / s2).astype(np.float64)
        new: NDArray[np.float64] = cov @ (prior_prec @ prior_mean + design.T @ (w * y) / s2)
        r = np.abs(y - design @ new) / prior.noise_sd
        w = np.where(r <= HUBER_C, 1.0, HUBER_C / np.maximum(r, 1e-12))
        done = bool(np.allclose(new, beta, atol=1e-9))
        beta = new
        if done:
            break
    return beta, cov


def _robust_slope(x: Array, y: Array, most: int = 300) -> float:
    """Siegel's repeated median slope (half the points may be outliers), over the latest
    ``most`` points; 0 without two distinct progresses."""
    xs, ys = x[-most:], y[-most:]
    dx = xs[None, :] - xs[:, None]
    dy = ys[None, :] - ys[:, None]
    ok = np.abs(dx) > 1e-12
    if not ok.any():
        return 0.0
    slopes = np.where(ok, dy / np.where(ok, dx, 1.0), np.nan)
    rows = ok.any(axis=1)
    return float(nanstat.median(nanstat.nan_median(slopes[rows], axis=1)))


def _robust_line(x: Array, y: Array) -> Array:
    """The repeated-median line at ``x`` (the points themselves when fewer than three)."""
    if len(x) < 3:
        return y.copy()
    slope = _robust_slope(x, y)
    out: Array = float(nanstat.median(y - slope * x)) + slope * x
    return out


def forecast(points: Sequence[GnsPoint], prior: GnsPrior | None = None) -> GnsForecast:
    """The forecast of Bn from the points measured so far (progress as a fraction of training);
    ``prior``: ``prior_in_use()`` (``PRIOR`` unless a benchmark leaves a model out)."""
    prior = prior or prior_in_use()
    p, raw = _points(points)
    now = max(float(p[-1]), PROGRESS_FLOOR)
    x = np.log(np.maximum(p, PROGRESS_FLOOR)) - math.log(now)
    y = _hampel(x, raw, prior.noise_sd)
    # The line's outliers (a spike at either end, where a point has the most leverage and the
    # fewest neighbours) are clipped to LINE_CLIP_SD noise sds of a high-breakdown line.
    band = LINE_CLIP_SD * prior.noise_sd
    line = _robust_line(x, y)
    beta, cov = _huber_line(x, np.clip(y, line - band, line + band), prior)
    cov = cov.copy()
    # The drift applies as far as the job's own points set the slope: none with one point
    # (the prior's spread already is the spread of whole curves), all of it with many.
    learned = max(0.0, 1.0 - float(cov[1, 1]) / prior.slope_sd**2)
    cov[1, 1] += learned * prior.slope_drift_sd**2
    return GnsForecast(
        progress=tuple(float(v) for v in p),
        log_scale=tuple(float(v) for v in y),
        now=now,
        level=float(beta[0]),
        slope=float(beta[1]),
        cov=((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
        noise_sd=prior.noise_sd,
    )


def _grid(start: float, end: float, n: int = 129) -> Array:
    out: Array = np.linspace(start, end, n)
    return out


def factor_samples(
    points: Sequence[GnsPoint],
    base_batch: float,
    global_batch: ArrayLike,
    *,
    start: float = 0.0,
    end: float = 1.0,
    prior: GnsPrior | None = None,
    n: int = 256,
    seed: int = 0,
) -> Array:
    """Samples per base-batch sample at each batch over progress ``[start, end]``, one row per
    forecast trajectory: the mean over ``[start, end]`` of ``(Bn(p) + B) / (Bn(p) + B0)``.

    Shape ``(n, *global_batch.shape)``; every row is the same when no forecast is needed (the
    points reach ``end``). Base-batch steps to reach ``end`` from ``start`` at batch B: the
    base-batch progress of the span times a row's value.
    """
    if not 0.0 <= start < end <= 1.0:
        raise ValueError(f"progress span [{start}, {end}] must lie in [0, 1] with start < end")
    batch = np.asarray(global_batch, dtype=float)
    fc = forecast(points, prior)
    grid = _grid(start, end)
    done = fc.now >= min(end, DONE)
    bn = fc.median(grid)[None, :] if done else fc.sample(grid, n, seed)
    # (Bn + B) / (Bn + B0) = 1 + (B - B0) / (Bn + B0): one integral per trajectory serves
    # every batch, and each batch's factor is monotone in it (quantiles carry over).
    inverse: Array = np.asarray(np.trapezoid(1.0 / (bn + base_batch), grid, axis=1)) / (end - start)
    if inverse.shape[0] == 1:
        inverse = np.repeat(inverse, n)
    out: Array = 1.0 + (batch.reshape(1, -1) - base_batch) * inverse[:, None]
    return out.reshape((n, *batch.shape))


def steps_to_target(
    points: Sequence[GnsPoint],
    base_batch: float,
    global_batch: ArrayLike,
    *,
    base_steps: float,
    start: float = 0.0,
    target: float = 1.0,
    prior: GnsPrior | None = None,
    quantile: float = 0.9,
    n: int = 256,
) -> tuple[Array, Array]:
    """(median, ``quantile``) optimizer steps at each ``global_batch`` to go from progress
    ``start`` to ``target`` (fractions of training; ``base_steps`` base-batch steps make the
    whole, 0 to 1). A step at B does ``B / B0`` base-batch samples, less by the efficiency.
    The median, as every point prediction of kplan (the step-time fit is one in log space); the
    mean would be pulled up by the few trajectories whose noise scale stops growing."""
    if not (math.isfinite(base_steps) and base_steps > 0):
        raise ValueError(f"base_steps={base_steps!r} must be > 0")
    batch = np.asarray(global_batch, dtype=float)
    f = factor_samples(points, base_batch, batch, start=start, end=target, prior=prior, n=n)
    scale = base_steps * (target - start) * base_batch / batch
    mid: Array = scale * nanstat.median(f, axis=0)
    hi: Array = scale * nanstat.quantile(f, quantile, axis=0)
    return mid, hi


def fit_prior(
    curves: Sequence[Sequence[GnsPoint]], groups: Sequence[str], cut: float = 0.1
) -> GnsPrior:
    """A prior from whole GNS curves (``groups`` names each curve's model; a model's curves
    count as one): slopes and residuals of each curve's robust line, and the drift between the
    slope a forecast from the first ``cut`` of a curve finds and the curve's slope after it."""
    if len(curves) != len(groups) or not curves:
        raise ValueError("need one group name per curve, and at least one curve")
    weight = {g: 1.0 / list(groups).count(g) for g in set(groups)}
    slopes, resid, drift, ws, wd = [], [], [], [], []
    loose = GnsPrior(slope_mean=1.0, slope_sd=100.0, noise_sd=0.5, slope_drift_sd=0.0)
    for curve, g in zip(curves, groups, strict=True):
        p, y = _points(curve)
        if len(p) < 3:
            continue
        pts = [GnsPoint(float(a), float(math.exp(b))) for a, b in zip(p, y, strict=True)]
        line = forecast(pts, loose)
        x = np.log(np.maximum(p, PROGRESS_FLOOR)) - math.log(line.now)
        slopes.append(line.slope)
        ws.append(weight[g])
        resid.extend((y - line.level - line.slope * x).tolist())
    slopes_a, ws_a = np.array(slopes), np.array(ws)
    mean = float(np.average(slopes_a, weights=ws_a))
    sd = float(np.sqrt(np.average((slopes_a - mean) ** 2, weights=ws_a)))
    r = np.array(resid)
    noise = float(1.4826 * nanstat.median(np.abs(r - nanstat.median(r))))
    base = GnsPrior(slope_mean=mean, slope_sd=sd, noise_sd=noise, slope_drift_sd=0.0)
    for curve, g in zip(curves, groups, strict=True):
        p, y = _points(curve)
        early, late = p <= cut + 1e-9, p > cut + 1e-9
        if not early.any() or late.sum() < 3:
            continue
        pts = [GnsPoint(float(a), float(math.exp(b))) for a, b in zip(p, y, strict=True)]
        head = forecast([q for q, e in zip(pts, early, strict=True) if e], base)
        tail = forecast([q for q, e in zip(pts, late, strict=True) if e], loose)
        drift.append(tail.slope - head.slope)
        wd.append(weight[g])
    drift_sd = float(np.sqrt(np.average(np.square(drift), weights=wd))) if drift else 0.0
    return GnsPrior(slope_mean=mean, slope_sd=sd, noise_sd=noise, slope_drift_sd=drift_sd)
