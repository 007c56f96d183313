"""A global-batch schedule for the chosen cluster: start small, grow as the noise scale grows
(issue 13, item 3).

The samples a base-batch sample's progress costs at batch ``B`` are ``(Bn + B)/(Bn + B0)``
(planner/efficiency.py). The noise scale ``Bn(p)`` grows with progress ``p``, so the batch that
trains fastest on a given cluster grows too: early on a large batch burns samples, late it does
not. On the chosen cluster (its instance type, nodes, workers and accumulation fixed) the
training is split at progress boundaries into segments; in segment ``j``, at batch ``B``:

    samples_j(B) = S0 (p_j+1 - p_j) (1 + (B - B0) E[mean_j 1/(Bn + B0)])
    time_j(B)    = ceil(samples_j(B) / B) T_step(B)

(``S0`` the samples to train at ``B0``; the expectation over the GNS forecast's trajectories,
as the search takes it; ``1 + (B - B0)/(Bn + B0)`` is ``(Bn + B)/(Bn + B0)``). On one cluster
the price per hour is fixed, so the batch that minimises a segment's time also minimises its
cost. A dynamic programme over the segments picks, for each, a batch of the search's grid that
fits the cluster, non-decreasing, in at most ``MAX_PHASES`` phases, minimising the total time.
The whole schedule and the best single batch are then priced by the same cost model (the
caller's ``price``: checkpoints, preemptions, provisioning, billing), and the schedule is kept
only when it beats the single batch by more than the plan's tie tolerance.

The runtime carries it out by base-batch progress (kplan/runtime/batch_schedule.py): the phases'
boundaries are progress fractions, not steps, so a wrong forecast of the noise scale changes
the steps a phase takes, not where it ends. numpy only: the planner imports this module.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from kplan.planner import efficiency, gnsforecast, nanstat, perfmodel
from kplan.planner.profile import GnsPoint

Array = NDArray[np.float64]
Priced = tuple[float, float, float, float]  # hours, USD, hours p90, USD p90

MAX_PHASES = 4
# Candidate phase boundaries (progress fractions): dense early, where the noise scale grows
# fastest in log terms (a power law in progress).
EDGES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0)
_FINE = np.linspace(0.0, 1.0, 401)  # every edge is on this grid (multiples of 1/400)


@dataclass(frozen=True)
class Phase:
    """One phase of a schedule on the chosen cluster."""

    start: float  # progress fraction where it begins
    end: float
    global_batch: int
    local_batch: int
    steps: int
    samples: float
    step_time_s: float

    @property
    def train_s(self) -> float:
        return self.steps * self.step_time_s


@dataclass(frozen=True)
class SchedulePlan:
    """A schedule, its price, and the best single batch's on the same cluster and model."""

    phases: tuple[Phase, ...]
    hours: float
    cost_usd: float
    single_batch: int
    single_hours: float
    single_cost_usd: float
    saving: float  # 1 - schedule / single: cost (objective cost), else time
    # p90s: the step time's and the forecast's spread together (module docstring)
    hours_p90: float = math.nan
    cost_p90_usd: float = math.nan
    single_hours_p90: float = math.nan
    single_cost_p90_usd: float = math.nan
    log_sigma: float = 0.0  # the schedule's forecast spread alone (log space, one sigma)

    def entries(self) -> list[dict[str, float | int]]:
        """What the runtime takes (``KPLAN_BATCH_SCHEDULE``): ``{"progress", "global_batch"}``."""
        return [{"progress": p.start, "global_batch": p.global_batch} for p in self.phases]

    @property
    def steps(self) -> int:
        return sum(p.steps for p in self.phases)

    @property
    def samples(self) -> float:
        return sum(p.samples for p in self.phases)


def segment_inverse_draws(
    gns: Sequence[GnsPoint], base_batch: float, edges: Sequence[float] = EDGES
) -> Array:
    """``mean over segment j of 1/(Bn + B0)`` for each of the forecast's trajectories (rows;
    one row when the measured noise scale covers training) and each segment between ``edges``
    (columns)."""
    fc = gnsforecast.forecast(gns)
    done = fc.now >= gnsforecast.DONE
    bn = fc.median(_FINE)[None, :] if done else fc.sample(_FINE, 256, seed=0)
    inv = 1.0 / (bn + base_batch)
    out = np.empty((inv.shape[0], len(edges) - 1))
    for j, (a, b) in enumerate(itertools.pairwise(edges)):
        sel = (a - 1e-12 <= _FINE) & (b + 1e-12 >= _FINE)
        out[:, j] = np.trapezoid(inv[:, sel], _FINE[sel], axis=1) / (b - a)
    return out


def forecast_log_sigma(train_s: Array) -> float:
    """The log-space one-sigma spread of a training time over the forecast's trajectories
    (``efficiency.spread_log_sigma``, as a plan row's; 0 for one trajectory)."""
    if train_s.size < 2:
        return 0.0
    return float(efficiency.spread_log_sigma(np.mean(train_s), nanstat.quantile(train_s, 0.9)))


def best_schedule(segment_time: Array, max_phases: int = MAX_PHASES) -> tuple[float, list[int]]:
    """Minimum total of ``segment_time[j, b]`` over non-decreasing batch indices with at most
    ``max_phases`` distinct runs; (total, batch index per segment). Infinite entries: unfit."""
    n_seg, n_b = segment_time.shape
    inf = math.inf
    # cost[q][b]: best total of segments 0..j ending at batch b with q phases (q = 1..max)
    cost = np.full((max_phases + 1, n_b), inf)
    back: list[np.ndarray] = []
    cost[1] = segment_time[0]
    back.append(np.full((max_phases + 1, n_b, 2), -1, dtype=np.int64))
    for j in range(1, n_seg):
        new = np.full_like(cost, inf)
        ptr = np.full((max_phases + 1, n_b, 2), -1, dtype=np.int64)
        for q in range(1, max_phases + 1):
            for b in range(n_b):
                t = segment_time[j, b]
                if not math.isfinite(t):
                    continue
                best, arg = cost[q, b], (q, b)  # same phase goes on
                if q > 1:
                    prev = cost[q - 1, :b]  # a new phase at a larger batch
                    if prev.size and float(prev.min()) < best:
                        best, arg = float(prev.min()), (q - 1, int(prev.argmin()))
                if math.isfinite(best):
                    new[q, b] = best + t
                    ptr[q, b] = arg
        cost = new
        back.append(ptr)
    qb = np.unravel_index(int(np.argmin(cost)), cost.shape)
    qq, bb = int(qb[0]), int(qb[1])
    total = float(cost[qq, bb])
    if not math.isfinite(total):
        return inf, []
    path = [bb]
    for j in range(n_seg - 1, 0, -1):
        qq, bb = (int(v) for v in back[j][qq, bb])
        path.append(bb)
    return total, path[::-1]


def plan_schedule(
    *,
    gns: Sequence[GnsPoint],
    base_batch: int,
    samples_at_base: float,
    grid: Sequence[int],
    params: perfmodel.PerfParams,
    nodes: int,
    workers: int,
    accum_steps: int,
    max_local_batch: int,
    min_local_batch: int,
    price: Callable[[float, float], Priced],
    objective: str,
    tie_tolerance: float,
    step_log_sigma: float = 0.0,
) -> SchedulePlan | None:
    """The schedule for one cluster, or None when it does not beat the best single batch on
    it by more than ``tie_tolerance`` (or there is no GNS or one batch only). ``price`` turns
    seconds of training and a log sigma into (hours, USD, hours p90, USD p90) on the cluster;
    ``objective``: cost, time or knee; ``step_log_sigma``: the step time's own spread."""
    if not gns or len(grid) < 2:
        return None
    per_micro = workers * accum_steps
    batches = _fitting(grid, per_micro, accum_steps, max_local_batch, min_local_batch)
    if batches.size < 2:
        return None
    local = np.ceil(batches / per_micro)
    step = perfmodel.step_time(params, nodes, workers, local, accum_steps)
    edges = np.array(EDGES)
    widths = np.diff(edges)
    draws = segment_inverse_draws(gns, base_batch)
    inv = draws.mean(axis=0)
    samples = (
        samples_at_base * widths[:, None] * (1.0 + (batches[None, :] - base_batch) * inv[:, None])
    )
    seg_time = samples / batches[None, :] * step[None, :]
    _, path = best_schedule(seg_time)
    if not path:
        return None
    single_time = seg_time.sum(axis=0)
    single = int(np.argmin(single_time))
    phases = _phases(path, batches, local, samples, step, edges)
    if len(phases) < 2:
        return None
    sched_sigma, single_sigma = _spreads(
        samples_at_base, base_batch, widths, draws, batches, step, path, single
    )
    hours, cost, hours_p90, cost_p90 = price(
        sum(p.train_s for p in phases), math.hypot(step_log_sigma, sched_sigma)
    )
    s_samples = float(single_time[single]) / float(step[single]) * float(batches[single])
    s_hours, s_cost, s_hours_p90, s_cost_p90 = price(
        math.ceil(s_samples / batches[single]) * float(step[single]),
        math.hypot(step_log_sigma, single_sigma),
    )
    # On one cluster time and cost move together (the price per hour is fixed); the saving
    # is in the objective's terms: cost for `cost`, time for `time` and `knee`.
    saving = 1.0 - (cost / s_cost if objective == "cost" else hours / s_hours)
    if not saving > tie_tolerance:
        return None
    return SchedulePlan(
        phases=tuple(phases),
        hours=hours,
        cost_usd=cost,
        single_batch=int(batches[single]),
        single_hours=s_hours,
        single_cost_usd=s_cost,
        saving=saving,
        hours_p90=hours_p90,
        cost_p90_usd=cost_p90,
        single_hours_p90=s_hours_p90,
        single_cost_p90_usd=s_cost_p90,
        log_sigma=sched_sigma,
    )


def _fitting(
    grid: Sequence[int], per_micro: int, accum_steps: int, max_local: int, min_local: int
) -> NDArray[np.float64]:
    """The global batches of ``grid`` the cluster can run (whole micro-steps, each worker's
    share within memory and at least ``min_local`` samples)."""
    return np.array(
        [
            b
            for b in grid
            if b % accum_steps == 0
            and math.ceil(b / per_micro) <= max_local
            and b >= per_micro * min(min_local, b)
        ],
        dtype=float,
    )


def _phases(
    path: Sequence[int],
    batches: NDArray[np.float64],
    local: NDArray[np.float64],
    samples: NDArray[np.float64],
    step: NDArray[np.float64],
    edges: NDArray[np.float64],
) -> list[Phase]:
    """The schedule's phases: one per segment of ``path``, neighbours of one batch merged."""
    phases: list[Phase] = []
    for j, b in enumerate(path):
        if phases and phases[-1].global_batch == int(batches[b]):
            last = phases[-1]
            merged = last.samples + float(samples[j, b])
            steps = math.ceil(merged / last.global_batch)
            phases[-1] = replace(last, end=float(edges[j + 1]), steps=steps, samples=merged)
            continue
        s = float(samples[j, b])
        phases.append(
            Phase(
                float(edges[j]),
                float(edges[j + 1]),
                int(batches[b]),
                int(local[b]),
                math.ceil(s / batches[b]),
                s,
                float(step[b]),
            )
        )
    return phases


def _spreads(
    samples_at_base: float,
    base_batch: int,
    widths: NDArray[np.float64],
    draws: NDArray[np.float64],
    batches: NDArray[np.float64],
    step: NDArray[np.float64],
    path: Sequence[int],
    single: int,
) -> tuple[float, float]:
    """The forecast's log sigma of the training time of the schedule (phases fixed) and of
    the single batch, over the forecast's trajectories."""
    path_b = np.asarray(path)
    per_sample = step / batches  # seconds per sample at each batch
    sched_draws = (
        samples_at_base
        * (widths[None, :] * (1.0 + (batches[path_b][None, :] - base_batch) * draws))
        @ per_sample[path_b]
    )
    single_draws = (
        samples_at_base
        * (widths[None, :] * (1.0 + (batches[single] - base_batch) * draws)).sum(axis=1)
        * per_sample[single]
    )
    sched_sigma = forecast_log_sigma(sched_draws)
    single_sigma = forecast_log_sigma(single_draws)
    return sched_sigma, single_sigma


def describe(entries: Sequence[dict[str, float | int]], saving: float | None = None) -> str:
    """The schedule in words, e.g. ``256 until 20%, 512 until 60%, 1,024 after; saves 12%``."""
    parts = []
    for i, e in enumerate(entries):
        batch = f"{int(e['global_batch']):,}"
        if i + 1 < len(entries):
            parts.append(f"{batch} until {float(entries[i + 1]['progress']):.0%}")
        else:
            parts.append(f"{batch} after")
    text = ", ".join(parts)
    return text if saving is None else f"{text}; saves {saving:.0%}"
