"""Time/cost frontiers: the non-dominated points, near-tie merging, the knee."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


def pareto_front(hours: Array, cost: Array) -> NDArray[np.int64]:
    """Indices of the non-dominated points (less time or less cost), fastest first."""
    if len(hours) == 0:
        return np.zeros(0, dtype=np.int64)
    order = _order(hours, cost)
    sorted_cost = cost[order]
    best_before = np.concatenate([[np.inf], np.minimum.accumulate(sorted_cost)[:-1]])
    front: NDArray[np.int64] = order[sorted_cost < best_before].astype(np.int64)
    return front


def _order(hours: Array, cost: Array) -> NDArray[np.intp]:
    """``np.lexsort((cost, hours))``: by hours, then cost, then position, as a stable sort of
    complex keys (one pass; ``lexsort`` makes two and takes about twice as long). Along the
    last axis."""
    key = np.empty(np.shape(hours), dtype=complex)
    key.real = hours  # set apart: inf * 1j would be nan
    key.imag = cost
    order: NDArray[np.intp] = np.argsort(key, axis=-1, kind="stable")
    return order


def front_mask(hours: Array, cost: Array, finite: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Per row of 2-d arrays, the ``finite`` points on that row's frontier: the rows
    ``pareto_front`` keeps for each row alone (the same points, ties to the first). All rows
    in one sort (``_order``) and one running minimum."""
    c = np.where(finite, cost, np.inf)
    mask = np.zeros(hours.shape, dtype=bool)
    if mask.size == 0:
        return mask
    order = _order(np.where(finite, hours, np.inf), c)
    sc = np.take_along_axis(c, order, axis=-1)
    kept = np.empty(sc.shape, dtype=bool)
    kept[..., 0] = sc[..., 0] < np.inf
    kept[..., 1:] = sc[..., 1:] < np.minimum.accumulate(sc, axis=-1)[..., :-1]
    np.put_along_axis(mask, order, kept, axis=-1)
    return mask


def merge_near_times(hours: Array, tol: float) -> NDArray[np.int64]:
    """Positions kept from a frontier (fastest first, cost falling) after merging points whose
    time is within ``tol`` of their group's fastest: the last, i.e. the cheapest, of each group."""
    keep: list[int] = []
    i, n = 0, len(hours)
    while i < n:
        j = i
        while j + 1 < n and hours[j + 1] <= hours[i] * (1.0 + tol):
            j += 1
        keep.append(j)
        i = j + 1
    return np.array(keep, dtype=np.int64)


def cheapest_of_fastest(
    hours: Array, cost: Array, tol: float
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(the rows within ``tol`` of the fastest time, cheapest first; the others, fastest first)."""
    order = _order(hours, cost)
    tied = hours[order] <= hours[order[0]] * (1.0 + tol)
    head = order[tied]
    head = head[np.argsort(cost[head], kind="stable")]
    return head.astype(np.int64), order[~tied].astype(np.int64)


def knee_index(hours: Array, cost: Array) -> int:
    """The frontier point with the smallest time x cost: going faster from it costs more than
    one percent of money for each percent of time saved, and going cheaper loses more time
    than it saves money. It depends on neither unit nor the frontier's ends (a knee measured
    against the chord between the ends moved to a plan ten times dearer when one slow, cheap
    end left the frontier). Ties go to the cheaper point."""
    score = np.log(hours) + np.log(cost)
    best = np.flatnonzero(score <= score.min() + 1e-9)
    return int(best[np.argmin(cost[best])])
