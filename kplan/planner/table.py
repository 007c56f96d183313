"""The table of priced configurations the search ranks: parallel arrays, one entry per row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kplan.planner import spotplan
from kplan.planner.mix import MixCandidate
from kplan.planner.searchopts import SearchOptions

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Table:
    """Priced configurations as parallel arrays, one entry per row (a single type or a mix)."""

    cand: NDArray[np.int64]  # candidate index; -1 - j for mix j
    nodes: Array
    batch: Array
    local: Array
    accum: Array
    step: Array
    sigma: Array
    samples: Array
    hours: Array
    hours_p90: Array
    cost: Array
    cost_p90: Array
    preempt: Array
    tau: Array
    mixes: tuple[MixCandidate, ...] = ()
    spot: dict[int, spotplan.SpotPricing] = field(default_factory=dict)  # Monte-Carlo rows

    def take(self, rows: NDArray[np.int64]) -> Table:
        arrays = {
            f: getattr(self, f)[rows]
            for f in self.__dataclass_fields__
            if f not in ("mixes", "spot")
        }
        return Table(**arrays, mixes=self.mixes)

    def best_per_candidate(self) -> dict[int, float]:
        """Cheapest expected cost reached by each single-type candidate."""
        finite = np.isfinite(self.cost) & (self.cand >= 0)
        if not finite.any():
            return {}
        best = np.full(int(self.cand[finite].max()) + 1, np.inf)
        np.minimum.at(best, self.cand[finite], self.cost[finite])
        return {i: float(c) for i, c in enumerate(best) if np.isfinite(c)}

    def with_mixes(self, mixes: list[MixCandidate]) -> Table:
        if not mixes:
            return self
        m = mixes
        extra = {
            "cand": np.array([-1 - j for j in range(len(m))], dtype=np.int64),
            "nodes": np.array([x.nodes for x in m], dtype=float),
            "batch": np.array([x.global_batch for x in m], dtype=float),
            "local": np.array([x.local_batches[0] for x in m], dtype=float),
            "accum": np.array([x.accum for x in m], dtype=float),
            "step": np.array([x.step_time for x in m]),
            "sigma": np.array([x.log_sigma for x in m]),
            "samples": np.array([x.samples for x in m]),
            "hours": np.array([x.tc.hours for x in m]),
            "hours_p90": np.array([x.tc.hours_p90 for x in m]),
            "cost": np.array([x.tc.cost_usd for x in m]),
            "cost_p90": np.array([x.tc.cost_p90_usd for x in m]),
            "preempt": np.array([x.tc.preemptions for x in m]),
            "tau": np.array([x.tc.checkpoint_interval_s for x in m]),
        }
        fields_: dict[str, Any] = {
            k: np.concatenate([getattr(self, k), v]) for k, v in extra.items()
        }
        return Table(**fields_, mixes=tuple(m), spot=dict(self.spot))


def within(t: Table, finite: NDArray[np.bool_], opts: SearchOptions) -> NDArray[np.bool_]:
    """The ``finite`` rows whose p90 cost and time fit the budget and deadline."""
    ok = finite.copy()
    if opts.budget_usd is not None:
        ok &= t.cost_p90 <= opts.budget_usd
    if opts.deadline_hours is not None:
        ok &= t.hours_p90 <= opts.deadline_hours
    return ok
