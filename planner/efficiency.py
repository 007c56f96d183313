"""Statistical efficiency from the gradient noise scale (McCandlish et al. 2018; Pollux).

With noise scale ``Bn`` the samples needed to make the progress of one base-batch sample grow
with the global batch ``B``:

    dS/dS0 = (Bn + B) / (Bn + B0)

``Bn`` grows as training goes on, so the factor is integrated over the GNS trajectory (progress
measured in base-batch samples, 0 to 1). Efficiency is the inverse: the useful fraction of each
sample at batch ``B`` (1 at ``B0``, falling toward ``(Bn + B0) / B`` at large batches).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kplan.planner.profile import GnsPoint

_GRID = np.linspace(0.0, 1.0, 33)  # progress points for the integral (trapezoid rule)


def noise_scale_grid(gns: Sequence[GnsPoint]) -> NDArray[np.float64]:
    """Bn on a fixed progress grid: linear between points, constant beyond the ends."""
    if not gns:
        raise ValueError("empty GNS trajectory")
    progress = np.array([g.progress for g in gns])
    scale = np.array([g.noise_scale for g in gns])
    out: NDArray[np.float64] = np.interp(_GRID, progress, scale)
    return out


def sample_factor(
    gns: Sequence[GnsPoint], base_batch: float, global_batch: ArrayLike
) -> NDArray[np.float64]:
    """Samples needed at ``global_batch`` per sample needed at ``base_batch`` (>= 1 for B >= B0).

    Without a GNS trajectory nothing can be said about other batch sizes: the factor is 1 at the
    base batch and NaN elsewhere (the search then keeps the user's global batch).
    """
    batch = np.asarray(global_batch, dtype=float)
    if not gns:
        return np.where(np.isclose(batch, base_batch), 1.0, np.nan)
    bn = noise_scale_grid(gns)  # (G,)
    ratio = (bn[:, None] + batch.reshape(1, -1)) / (bn[:, None] + base_batch)  # (G, N)
    factor: NDArray[np.float64] = np.trapezoid(ratio, _GRID, axis=0).reshape(batch.shape)
    return factor


def efficiency(
    gns: Sequence[GnsPoint], base_batch: float, global_batch: ArrayLike
) -> NDArray[np.float64]:
    """Statistical efficiency in (0, 1] for ``global_batch >= base_batch``."""
    return 1.0 / sample_factor(gns, base_batch, global_batch)
