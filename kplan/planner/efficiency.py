"""Statistical efficiency from the gradient noise scale (McCandlish et al. 2018; Pollux).

With noise scale ``Bn`` the samples needed to make the progress of one base-batch sample grow
with the global batch ``B``:

    dS/dS0 = (Bn + B) / (Bn + B0)

``Bn`` grows as training goes on, so the factor is integrated over the GNS trajectory (progress
measured in base-batch samples, 0 to 1). Efficiency is the inverse: the useful fraction of each
sample at batch ``B`` (1 at ``B0``, falling toward ``(Bn + B0) / B`` at large batches).

The trajectory is the measured points up to the latest and the forecast of ``gnsforecast``
after it (``forecast=True``, the default): a profile's single point grows as the shared curves
grew, with the spread of that growth in ``sample_factor_band``. ``forecast=False`` holds the
last point (Pollux's planning, and the closed form ``(Bn + B) / (Bn + B0)`` for one point).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.planner import gnsforecast, nanstat
from kplan.planner.profile import GnsPoint

_Z90 = 1.2815515655446004  # standard normal 90th percentile


def sample_factor(
    gns: Sequence[GnsPoint],
    base_batch: float,
    global_batch: ArrayLike,
    *,
    start: float = 0.0,
    forecast: bool = True,
) -> NDArray[np.float64]:
    """Samples needed at ``global_batch`` per sample needed at ``base_batch`` (>= 1 for B >= B0),
    over progress ``start`` to 1: the expected value over the forecast's trajectories (the
    objectives are expected cost and time; the few trajectories whose noise scale stops growing
    pull it above their median, which keeps a plan from one GNS point from betting on growth).

    Without a GNS trajectory nothing can be said about other batch sizes: the factor is 1 at the
    base batch and NaN elsewhere (the search then keeps the user's global batch).
    """
    return sample_factor_band(gns, base_batch, global_batch, start=start, forecast=forecast)[0]


def sample_factor_band(
    gns: Sequence[GnsPoint],
    base_batch: float,
    global_batch: ArrayLike,
    *,
    start: float = 0.0,
    quantile: float = 0.9,
    forecast: bool = True,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(expected value, ``quantile``) of ``sample_factor`` over the GNS forecast's uncertainty."""
    batch = np.asarray(global_batch, dtype=float)
    if not gns:
        out = np.where(np.isclose(batch, base_batch), 1.0, np.nan)
        return out, out.copy()
    if not forecast:
        grid = np.linspace(start, 1.0, 129)  # as the forecast's integral
        progress = np.array([g.progress for g in gns])
        scale = np.array([g.noise_scale for g in gns])
        bn = np.interp(grid, progress, scale)
        ratio = (bn[:, None] + batch.reshape(1, -1)) / (bn[:, None] + base_batch)
        span = grid[-1] - grid[0]
        held = np.trapezoid(ratio, grid, axis=0) / span if span > 0 else ratio[0]
        flat: NDArray[np.float64] = held.reshape(batch.shape)
        return flat, flat.copy()
    unique, inverse = np.unique(batch.reshape(-1), return_inverse=True)
    mid, hi = _forecast_band(
        tuple(gns),
        float(base_batch),
        tuple(unique.tolist()),
        min(start, gnsforecast.DONE),
        quantile,
        gnsforecast.prior_in_use(),
    )
    return mid[inverse].reshape(batch.shape), hi[inverse].reshape(batch.shape)


@functools.lru_cache(maxsize=128)
def _forecast_band(
    gns: tuple[GnsPoint, ...],
    base_batch: float,
    batches: tuple[float, ...],
    start: float,
    q: float,
    prior: gnsforecast.GnsPrior,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Mean and ``q`` quantile over the forecast's trajectories (cached: the search and the
    mixes ask for the same trajectory many times; ``prior``, the one in use, keys the cache)."""
    samples = gnsforecast.factor_samples(gns, base_batch, np.array(batches), start=start)
    mid: NDArray[np.float64] = np.mean(samples, axis=0)
    hi: NDArray[np.float64] = nanstat.quantile(samples, q, axis=0)
    mid.setflags(write=False)
    hi.setflags(write=False)
    return mid, hi


def log_sigma(
    gns: Sequence[GnsPoint], base_batch: float, global_batch: ArrayLike, *, start: float = 0.0
) -> NDArray[np.float64]:
    """The log-space one-sigma uncertainty of the samples to train that the GNS forecast adds
    (0 where the points cover the rest of training, large from a single profile point): to be
    combined in quadrature with the step time's."""
    mid, p90 = sample_factor_band(gns, base_batch, global_batch, start=start)
    return spread_log_sigma(mid, p90)


def spread_log_sigma(mean: ArrayLike, p90: ArrayLike) -> NDArray[np.float64]:
    """The log-space one sigma a spread of forecast draws states: ``log(p90 / mean) / Z90``,
    at least 0, and 0 where undefined (shared with kplan/planner/batchsched.py's schedules)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out: NDArray[np.float64] = np.maximum(np.log(np.divide(p90, mean)), 0.0) / _Z90
    return np.where(np.isfinite(out), out, 0.0)


def efficiency(
    gns: Sequence[GnsPoint], base_batch: float, global_batch: ArrayLike
) -> NDArray[np.float64]:
    """Statistical efficiency in (0, 1] for ``global_batch >= base_batch``."""
    return 1.0 / sample_factor(gns, base_batch, global_batch)


def forecast_note(gns: Sequence[GnsPoint]) -> str | None:
    """One line for a plan whose samples to train rest on a GNS forecast (None: the measured
    trajectory reaches the end of training, or there is none)."""
    if not gns:
        return None
    fc = gnsforecast.forecast(gns)
    if fc.now >= gnsforecast.DONE:
        return None
    lo, mid, hi = (float(fc.quantile([1.0], q)[0]) for q in (0.1, 0.5, 0.9))
    times = "once" if len(gns) == 1 else f"{len(gns)} times"
    return (
        f"the gradient noise scale was measured {times}, up to {fc.now:.0%} of training: the "
        f"samples to train take it to grow as on the shared Pollux curves, to {mid:,.0f} at the "
        f"end (80% band {lo:,.0f} to {hi:,.0f}); larger global batches are a forecast"
    )
