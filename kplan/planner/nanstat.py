"""``np.nanmedian`` and ``np.nanquantile`` without ``numpy.ma``: numpy answers a short axis
through masked arrays, and importing ``numpy.ma`` costs more than the planner's every median
together (a few hundredths of a second at start-up)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray


def nan_median(a: ArrayLike, axis: int = -1) -> NDArray[np.float64]:
    """The median of the values that are not NaN along ``axis`` (NaN where there are none), the
    same values as ``np.nanmedian``: the middle value, or the sum of the two middle ones halved
    (as numpy's masked median computes it), with infinities ranked as numbers."""
    x = np.moveaxis(np.asarray(a, dtype=float), axis, -1)
    s = np.sort(x, axis=-1)  # NaN sorts last
    n = np.sum(~np.isnan(x), axis=-1)
    hi = np.minimum(n // 2, max(x.shape[-1] - 1, 0))[..., None]
    lo = np.where(n % 2 == 1, hi[..., 0], np.maximum(n // 2 - 1, 0))[..., None]
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        mid = (np.take_along_axis(s, lo, -1) + np.take_along_axis(s, hi, -1))[..., 0] / 2.0
    out: NDArray[np.float64] = np.where(n > 0, mid, np.nan)
    return out


def nan_quantile(a: ArrayLike, q: float, axis: int = -1) -> NDArray[np.float64]:
    """The ``q`` quantile of the values that are not NaN along ``axis`` (NaN where there are
    none), numpy's linear method as ``np.nanquantile`` has it."""
    x = np.moveaxis(np.asarray(a, dtype=float), axis, -1)
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], np.nan)
    s = np.sort(x, axis=-1)  # NaN sorts last
    n = np.sum(~np.isnan(x), axis=-1)
    virtual = np.maximum(n - 1, 0) * float(q)
    prev = np.floor(virtual).astype(np.intp)
    nxt = np.minimum(prev + 1, np.maximum(n - 1, 0))
    gamma = virtual - prev
    lo = np.take_along_axis(s, prev[..., None], -1)[..., 0]
    hi = np.take_along_axis(s, nxt[..., None], -1)[..., 0]
    with np.errstate(invalid="ignore"):
        diff = hi - lo
        out = np.where(gamma >= 0.5, hi - diff * (1 - gamma), lo + diff * gamma)
    result: NDArray[np.float64] = np.where(n > 0, out, np.nan)
    return result


def quantile(a: ArrayLike, q: float, axis: int | None = None) -> NDArray[np.float64]:
    """``np.quantile(a, q, axis=axis)`` (its default, linear method) computed the way numpy
    computes it, without the ``numpy.ma`` import numpy makes on the way: the same values, NaN
    where a slice holds one. ``axis=None``: over every value."""
    x = np.asarray(a, dtype=float)
    x = x.ravel() if axis is None else np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("quantile of an empty slice")
    s = np.sort(x, axis=-1)  # NaN sorts last
    virtual = (n - 1) * float(q)
    if virtual >= n - 1:
        prev = nxt = n - 1
    else:
        prev = max(math.floor(virtual), 0)
        nxt = prev + 1
    gamma = virtual - (-1 if virtual >= n - 1 else prev)  # numpy's, with its -1 at the top
    lo, hi = s[..., prev], s[..., nxt]
    with np.errstate(invalid="ignore"):
        diff = hi - lo
        out = np.asarray(lo + diff * gamma)
        if gamma >= 0.5:
            out = np.asarray(hi - diff * (1 - gamma))
    out = np.where(np.isnan(s[..., -1]), np.nan, out)
    return out


def median(a: ArrayLike, axis: int | None = None) -> NDArray[np.float64]:
    """``np.median(a, axis=axis)``: the middle value, or the mean of the two middle ones; NaN
    where a slice holds one."""
    x = np.asarray(a, dtype=float)
    x = x.ravel() if axis is None else np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    if n == 0:
        raise ValueError("median of an empty slice")
    s = np.sort(x, axis=-1)
    hi = n // 2
    with np.errstate(invalid="ignore", over="ignore"):
        mid = s[..., hi] if n % 2 == 1 else (s[..., hi - 1] + s[..., hi]) / 2.0
    out: NDArray[np.float64] = np.where(np.isnan(s[..., -1]), np.nan, mid)
    return out
