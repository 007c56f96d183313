"""Two-type (heterogeneous) clusters: mixed instance types or markets in one region.

With PID-controlled per-worker batches, every worker finishes its micro-batch at the same time
``T``. Worker type ``t`` computes ``b`` samples in ``a_t + c_t b``, so for ``n_t`` nodes of
``g_t`` GPUs sharing a micro-step of ``B / s`` samples:

    T = (B / s + sum_t n_t g_t a_t / c_t) / sum_t (n_t g_t / c_t),    b_t = (T - a_t) / c_t

The all-reduce spans every node and runs at the slower group's link. Only pairs among the best
few candidates of each region are tried, and only each pair's time/cost frontier is kept (a
dominated configuration can never be chosen).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from kplan.planner import costs, efficiency, extra_costs, perfmodel
from kplan.planner.plan import Group
from kplan.planner.spotnotice import notice_stops

if TYPE_CHECKING:
    from kplan.planner.candidates import Candidate
    from kplan.planner.searchopts import SearchOptions
    from kplan.planner.workload import Workload

Array = NDArray[np.float64]
NODE_COUNTS = np.array([1, 2, 3, 4, 6, 8, 12, 16], dtype=float)
PER_REGION = 4  # candidates per region considered for pairing


@dataclass(frozen=True)
class ScalarTimeCost:
    hours: float
    hours_p90: float
    cost_usd: float
    cost_p90_usd: float
    preemptions: float
    checkpoint_interval_s: float


@dataclass(frozen=True)
class MixCandidate:
    cloud: str
    region: str
    groups: tuple[Group, ...]
    nodes: int
    global_batch: int
    accum: int
    local_batches: tuple[int, ...]
    step_time: float
    log_sigma: float
    samples: float
    tc: ScalarTimeCost


def search_mixes(
    cands: list[Candidate],
    best_cost: dict[int, float],
    workload: Workload,
    opts: SearchOptions,
    grid: NDArray[np.int64],
    checkpoint_s: float,
) -> list[MixCandidate]:
    by_region: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(cands):
        if i in best_cost:
            by_region.setdefault((c.offer.cloud, c.offer.region), []).append(i)
    out: list[MixCandidate] = []
    per_batch = _per_batch(workload, opts, grid)
    for (cloud, region), members in by_region.items():
        best = sorted(members, key=lambda i: best_cost[i])[:PER_REGION]
        for i, j in itertools.combinations(best, 2):
            out.extend(
                _pair(cands[i], cands[j], cloud, region, workload, opts, per_batch, checkpoint_s)
            )
    return out


def _per_batch(
    workload: Workload, opts: SearchOptions, grid: NDArray[np.int64]
) -> dict[str, Array]:
    """Each global batch of the grid with its samples to train and the GNS forecast's spread,
    and every (n1, n2, accumulation, batch index) a pair may run (the same for every pair:
    computed once)."""
    batch = grid.astype(float)
    counts = NODE_COUNTS[opts.max_nodes >= NODE_COUNTS]
    n1, n2, s, gi = (
        a.ravel()
        for a in np.meshgrid(
            counts,
            counts,
            np.array(opts.accum_steps, dtype=float),
            np.arange(len(batch)),
            indexing="ij",
        )
    )
    keep = n1 + n2 <= opts.max_nodes
    return {
        "batch": batch,
        "samples": workload.samples_at_base
        * efficiency.sample_factor(workload.gns, workload.base_batch, batch),
        "sigma": efficiency.log_sigma(workload.gns, workload.base_batch, batch),
        "n1": n1[keep],
        "n2": n2[keep],
        "s": s[keep],
        "gi": gi[keep],
    }


def _pair(
    c1: Candidate,
    c2: Candidate,
    cloud: str,
    region: str,
    workload: Workload,
    opts: SearchOptions,
    per_batch: dict[str, Array],
    checkpoint_s: float,
) -> list[MixCandidate]:
    """The time/cost frontier of the mixes of ``c1`` and ``c2`` nodes in one region."""
    cfg = _pair_grid(c1, c2, per_batch)
    if cfg is None:
        return []
    step, samples, sigma, tc = _price_pair(c1, c2, cfg, per_batch, opts, checkpoint_s)
    finite = np.flatnonzero(np.isfinite(tc.cost_usd))
    if finite.size == 0:
        return []
    from kplan.planner.frontier import pareto_front

    front = finite[pareto_front(tc.hours[finite], tc.cost_usd[finite])]
    n1, n2, s, batch, b1, b2 = (cfg[name] for name in ("n1", "n2", "s", "batch", "b1", "b2"))
    out = []
    for k in front:
        groups = (_group(c1, int(n1[k]), int(b1[k])), _group(c2, int(n2[k]), int(b2[k])))
        out.append(
            MixCandidate(
                cloud=cloud,
                region=region,
                groups=groups,
                nodes=int(n1[k] + n2[k]),
                global_batch=int(batch[k]),
                accum=int(s[k]),
                local_batches=(int(b1[k]), int(b2[k])),
                step_time=float(step[k]),
                log_sigma=float(sigma[k]),
                samples=float(samples[k]),
                tc=ScalarTimeCost(*(float(getattr(tc, f)[k]) for f in _TIME_COST)),
            )
        )
    return [m for m in out if math.isfinite(m.tc.cost_usd)]


_TIME_COST = (
    "hours",
    "hours_p90",
    "cost_usd",
    "cost_p90_usd",
    "preemptions",
    "checkpoint_interval_s",
)


def _group(c: Candidate, nodes: int, local_batch: int) -> Group:
    o = c.offer
    return Group(
        o.instance_type, o.market, o.zone, nodes, c.inst.gpu_count, c.inst.gpu, local_batch,
        o.usd_per_hour,
    )  # fmt: skip


def _pair_grid(
    c1: Candidate, c2: Candidate, per_batch: dict[str, Array]
) -> dict[str, Array] | None:
    """Node counts, accumulation and global batch of a pair (``_per_batch``'s), with each
    group's local batch (equal finish times, module notes); None when none fits."""
    n1, n2, s, gi = (per_batch[k] for k in ("n1", "n2", "s", "gi"))
    batch = per_batch["batch"][gi]
    p1, p2 = c1.pred.params, c2.pred.params
    g1, g2 = float(c1.inst.gpu_count), float(c2.inst.gpu_count)
    w1, w2 = n1 * g1, n2 * g2
    micro = batch / s
    t = (micro + w1 * p1.compute_a / p1.compute_b + w2 * p2.compute_a / p2.compute_b) / (
        w1 / p1.compute_b + w2 / p2.compute_b
    )
    b1 = np.ceil((t - p1.compute_a) / p1.compute_b)
    b2 = np.ceil((t - p2.compute_a) / p2.compute_b)
    ok = (b1 >= 1) & (b2 >= 1) & (b1 <= c1.pred.max_local_batch) & (b2 <= c2.pred.max_local_batch)
    ok &= (s == 1) | (
        np.ceil(batch / (w1 + w2) / (s / 2)) > max(c1.pred.max_local_batch, c2.pred.max_local_batch)
    )
    if not ok.any():
        return None
    names = ("n1", "n2", "s", "batch", "b1", "b2", "w1", "w2", "gi")
    cols = (n1, n2, s, batch, b1, b2, w1, w2, gi)
    return {k: a[ok] for k, a in zip(names, cols, strict=True)}


def _price_pair(
    c1: Candidate,
    c2: Candidate,
    cfg: dict[str, Array],
    per_batch: dict[str, Array],
    opts: SearchOptions,
    checkpoint_s: float,
) -> tuple[Array, Array, Array, costs.TimeCost]:
    """(step time, samples, log sigma, closed-form time and cost) of each configuration."""
    p1, p2 = c1.pred.params, c2.pred.params
    n1, n2, s, batch = cfg["n1"], cfg["n2"], cfg["s"], cfg["batch"]
    compute = np.maximum(
        perfmodel.compute_time(p1, cfg["b1"]), perfmodel.compute_time(p2, cfg["b2"])
    )
    nodes, workers = n1 + n2, cfg["w1"] + cfg["w2"]
    sync = np.maximum(
        perfmodel.sync_time(p1, nodes, workers), perfmodel.sync_time(p2, nodes, workers)
    )
    step = (s - 1.0) * compute + perfmodel.overlap(
        compute, sync, perfmodel.overlap_gamma(p1, nodes)
    )
    samples = per_batch["samples"][cfg["gi"]]
    steps = np.ceil(samples / batch)
    # the step time's error and the GNS forecast's spread of the samples (as search's rows)
    sigma = np.hypot(max(p1.log_sigma, p2.log_sigma), per_batch["sigma"][cfg["gi"]])
    price = n1 * c1.offer.usd_per_hour + n2 * c2.offer.usd_per_hour
    rate = n1 * c1.preempt_per_hour + n2 * c2.preempt_per_hour
    tc = costs.mixed_time_and_cost(
        train_seconds=steps * step,
        usd_per_hour_total=price,
        preempt_per_hour_total=rate,
        log_sigma=sigma,
        checkpoint_s=checkpoint_s,
        overheads=opts.overheads,
        notice_stop_s=notice_stops(c1.offer.cloud, step, checkpoint_s),  # one cloud
    )
    # both types are in one region: the same disk, storage and egress prices
    tc = extra_costs.add_to(tc, c1.extras.per_hour(nodes), c1.extras.egress_usd)
    return step, samples, sigma, tc
