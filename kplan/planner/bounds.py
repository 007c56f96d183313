"""Lower bounds on the p90 time and cost of every configuration a search can price, from the
candidates alone (no type grid, no pricing, no Monte-Carlo): a deadline or budget below them
is refused before any work.

Why they hold, for every row the search ranks:

- A step of ``s`` micro-steps of ``l`` samples per worker takes at least ``s (a + c l)``
  (``perfmodel.step_time``: compute, then a power mean with the sync that is never below the
  compute; ``compression.step_time``: the same, or a pipeline whose host side alone is the
  compute; a mix: its slowest worker). With ``W`` workers, ``s l >= B / W``, so a step takes at
  least ``a + c B / W``, and training at global batch ``B`` takes at least
  ``S(B) / B * (a + c B / W)`` seconds, ``S(B)`` the samples to train: at least ``S(B0)`` from
  the profile's batch ``B0`` up and ``S(B0) B / B0`` below it (the GNS model's
  ``(bn + B) / (bn + B0)``, ``bn >= 0``), times a compression option's multiplier where below 1.
- The closed form's p90 time is that work, stretched by checkpoints (``1 + c / tau``), the step
  error (``exp(Z90 sigma) >= 1``) and losses (>= 0), plus provisioning; its p90 cost is the
  cluster's price over the billed p90 time less the idle nodes' share of the waits, which is never
  more than the waits' own billed share. So ``p90 time >= work + provisioning`` and
  ``p90 cost >= price x work``, and a node's share of the work costs at least
  ``price / g x c`` per sample.
- The Monte-Carlo's runs each train for ``work x exp(sigma z)`` plus provisioning and losses;
  the spot refinement's rescaled estimates are held to these bounds (``search``), so no row the
  search ranks is below them.

The bounds take the least over the candidates' parameters (``a``, ``c``, price per GPU) and the
most workers, so they also bound the two-type mixes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kplan.core.flags import MAX_HOURS
from kplan.planner import fmt
from kplan.planner.candidates import Candidate
from kplan.planner.searchopts import SearchOptions
from kplan.planner.workload import Workload


@dataclass(frozen=True)
class Floor:
    """No configuration takes less than ``hours_p90`` or costs less than ``cost_p90_usd``
    (p90; NaN: nothing can be said)."""

    hours_p90: float
    cost_p90_usd: float


def floor(
    cands: list[Candidate], workload: Workload, opts: SearchOptions, grid: NDArray[np.int64]
) -> Floor:
    """The lower bounds over every configuration of ``cands`` on the batches of ``grid``."""
    if not cands:
        return Floor(math.nan, math.nan)
    batch = grid.astype(float)
    # Samples at B per sample at B0: the GNS model's (bn + B) / (bn + B0) over the forecast's
    # trajectories, bn >= 0: at least 1 from B0 up and at least B / B0 below it (a pinned batch
    # without a GNS trains B0's samples: 1). Not the forecast itself: it costs as much as the
    # rest of a refusal.
    factors = np.minimum(batch / workload.base_batch, 1.0)
    mult = min([1.0, *(c.compression_stat.multiplier for c in cands if c.compression_stat)])
    samples = workload.samples_at_base * factors * mult
    a = min(c.pred.params.compute_a for c in cands)
    c_per_sample = min(c.pred.params.compute_b for c in cands)
    workers = opts.max_nodes * max(c.inst.gpu_count for c in cands)
    work = samples / batch * (a + c_per_sample * batch / workers)
    per_sample = min(
        c.offer.usd_per_hour / c.inst.gpu_count * c.pred.params.compute_b for c in cands
    )
    if not np.isfinite(work).any():
        return Floor(math.nan, math.nan)
    hours = (float(np.nanmin(work)) + opts.overheads.provisioning_s) / 3600.0
    cost = per_sample * float(np.nanmin(samples)) / 3600.0
    return Floor(max(hours, 0.0), max(cost, 0.0))


def refusal(f: Floor, opts: SearchOptions) -> tuple[str, str] | None:
    """(message, hint) when the deadline or the budget is below what any configuration can reach
    (worded as ``choose.infeasible_message``'s, with "at least"), or when no configuration ends
    within ``MAX_HOURS`` (the longest --deadline: work of a million hours is a typo in the
    epochs or the samples, and its spot Monte-Carlo would run for minutes); None when they may
    be met."""
    if f.hours_p90 > MAX_HOURS:
        return (
            f"the job takes at least {fmt.duration(f.hours_p90)} on the fastest cluster, more "
            f"than the {MAX_HOURS:,.0f} h kplan plans",
            "check the epochs and the samples per epoch (--epochs, --dataset-size, or the "
            "profile's work)",
        )
    late = opts.deadline_hours is not None and f.hours_p90 > opts.deadline_hours
    dear = opts.budget_usd is not None and f.cost_p90_usd > opts.budget_usd
    if not (late or dear):
        return None  # NaN bounds compare False: never refused on them
    return no_plan(opts, f.cost_p90_usd, f.hours_p90, at_least=True)


def no_plan(
    opts: SearchOptions, cheapest_usd: float, fastest_hours: float, *, at_least: bool
) -> tuple[str, str]:
    """(message, hint) of a search that no plan meets: the limits given, and the cheapest p90
    cost and fastest p90 time (``at_least``: bounds, not priced plans)."""
    parts = []
    if opts.budget_usd is not None:
        parts.append(f"budget {fmt.money(opts.budget_usd)}")
    if opts.deadline_hours is not None:
        parts.append(f"deadline {opts.deadline_hours:g} h")
    least = "at least " if at_least else ""
    hint = (
        f"the cheapest plan costs {least}{fmt.money(cheapest_usd)} (p90) and the fastest "
        f"takes {least}{fmt.duration(fastest_hours)} (p90); raise --budget or --deadline"
    )
    if opts.budget_usd is not None and opts.deadline_hours is not None:
        hint += ", or drop one of them"
    return f"no plan meets the {' and '.join(parts)}", hint


def hold(values: NDArray[np.float64], bound: float) -> None:
    """Raise ``values`` below ``bound`` to it, in place (NaN bounds: nothing)."""
    if math.isfinite(bound):
        np.maximum(values, bound, out=values, where=np.isfinite(values))
