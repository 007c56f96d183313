"""Time/cost frontiers: the non-dominated points, near-tie merging, the knee."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


def pareto_front(hours: Array, cost: Array) -> NDArray[np.int64]:
    """Indices of the non-dominated points (less time or less cost), fastest first."""
    if len(hours) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((cost, hours))
    sorted_cost = cost[order]
    best_before = np.concatenate([[np.inf], np.minimum.accumulate(sorted_cost)[:-1]])
    front: NDArray[np.int64] = order[sorted_cost < best_before].astype(np.int64)
    return front


def front_mask(hours: Array, cost: Array, finite: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Per row of 2-d arrays, the ``finite`` points on that row's frontier: the rows
    ``pareto_front`` keeps for each row alone (the same points, ties to the first). Rows with
    the same hours (the on-demand regions of a type: only the price differs) share one sort
    where their costs rank the same within every tie of hours; else a row sorts on its own."""
    h = np.where(finite, hours, np.inf)
    c = np.where(finite, cost, np.inf)
    mask = np.zeros(c.shape, dtype=bool)
    groups: dict[bytes, list[int]] = {}
    for r in range(h.shape[0]):
        groups.setdefault(h[r].tobytes(), []).append(r)
    for rows in groups.values():
        first = rows[0]
        order = np.lexsort((c[first], h[first]))
        sc = c[rows][:, order]
        hs = h[first][order]
        tied = np.flatnonzero(hs[1:] == hs[:-1])  # positions whose next has the same hours
        alike = np.ones(len(rows), dtype=bool)
        if tied.size:
            a, b = sc[:, tied], sc[:, tied + 1]
            alike = np.all((b > a) | ((b == a) & (order[tied + 1] > order[tied])), axis=1)
        best = np.minimum.accumulate(sc, axis=1)
        best_before = np.concatenate([np.full((len(rows), 1), np.inf), best[:, :-1]], axis=1)
        same = np.asarray(rows)[alike]
        mask[same[:, None], order[None, :]] = (sc < best_before)[alike]
        for r in np.asarray(rows)[~alike].tolist():  # ranks differ inside a tie: its own sort
            own = np.lexsort((c[r], h[r]))
            own_c = c[r][own]
            mask[r, own] = own_c < np.concatenate([[np.inf], np.minimum.accumulate(own_c)[:-1]])
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
    order = np.lexsort((cost, hours))
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
