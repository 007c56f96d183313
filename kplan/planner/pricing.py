"""Every (nodes, accumulation, global batch) of every candidate, priced in closed form, and
pruned to the rows that can still be chosen or shown: each candidate's own time/cost frontier
(expected or p90). A row off it is dominated by a row of the same cluster type, market and
region on both time and cost under every later pricing (the Monte-Carlo rescales a candidate's
rows together), so it is counted (``considered``, ``feasible``) but never ranked."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kplan.planner import compression, costs, efficiency, fit, perfmodel, spotplan
from kplan.planner.candidates import Candidate, capacity_wait
from kplan.planner.frontier import front_mask
from kplan.planner.searchopts import SearchOptions
from kplan.planner.table import Table
from kplan.planner.workload import Workload

Array = NDArray[np.float64]


@dataclass(frozen=True)
class TypeGrid:
    """Every (nodes, accumulation, global batch) of one instance type, with step times."""

    nodes: Array
    accum: Array
    batch: Array
    local: Array
    step: Array
    samples: Array
    train_s: Array
    sigma: Array


def type_grid(
    c: Candidate,
    workload: Workload,
    opts: SearchOptions,
    grid: NDArray[np.int64],
    factors: Array,
    work_sigma: Array,
    dense: TypeGrid | None = None,
) -> TypeGrid | None:
    """The candidate's configurations with its compression option (``dense``: the same
    type's dense grid, when already built: the options share it)."""
    base = dense if dense is not None else _dense_grid(c, workload, opts, grid, factors, work_sigma)
    if base is None or c.compression == "none":
        return base
    # The option's step time and samples; unless pinned, only where it saves more than the
    # tie tolerance over dense on the same multi-node configuration.
    nodes, accum, batch, local = base.nodes, base.accum, base.batch, base.local
    workers = nodes * c.inst.gpu_count
    p = c.pred.params
    comp = compression.parse(c.compression)
    stat = c.compression_stat or compression.prior(comp)
    dense_s = base.train_s
    inputs = compression.variant_inputs(
        comp, workload, p.gradient_bytes or workload.gradient_bytes, c.pred.codec_factor
    )
    step = np.minimum.reduce(  # auto: the faster of AR's and AG's
        [
            compression.step_time(
                p,
                cc,
                shapes,
                nodes,
                workers,
                local,
                accum,
                codec,
                forward_share=workload.forward_share,
            )
            for cc, shapes, (codec, _) in inputs
        ]
    )
    samples = base.samples * stat.multiplier
    steps = np.ceil(samples / batch)
    sigma = np.hypot(base.sigma, stat.log_sigma)
    if opts.compression is None:
        keep = (nodes >= 2) & (steps * step < (1.0 - opts.tie_tolerance) * dense_s)
        if not keep.any():
            return None
        nodes, accum, batch, local, step, samples, steps, sigma = (
            a[keep] for a in (nodes, accum, batch, local, step, samples, steps, sigma)
        )
    return TypeGrid(nodes, accum, batch, local, step, samples, steps * step, sigma)


def _dense_grid(
    c: Candidate,
    workload: Workload,
    opts: SearchOptions,
    grid: NDArray[np.int64],
    factors: Array,
    work_sigma: Array,
) -> TypeGrid | None:
    """Every (nodes, accumulation, global batch) the type can run, dense."""
    g = c.inst.gpu_count
    nodes, accum, gi = (
        a.ravel()
        for a in np.meshgrid(
            np.arange(opts.min_nodes, opts.max_nodes + 1, dtype=float),
            np.array(opts.accum_steps, dtype=float),
            np.arange(len(grid)),
            indexing="ij",
        )
    )
    batch = grid[gi].astype(float)
    workers = nodes * g
    local = np.ceil(batch / (workers * accum))
    # At least min_local_batch samples per GPU (a global batch below it: one GPU, no accum).
    ok = (local <= c.pred.max_local_batch) & (
        batch >= workers * accum * np.minimum(opts.min_local_batch, batch)
    )
    # Accumulation only when a batch does not fit: otherwise it is strictly slower.
    ok &= (accum == 1) | (np.ceil(batch / (workers * (accum / 2))) > c.pred.max_local_batch)
    if not ok.any():
        return None
    nodes, accum, batch, local, workers, gi = (
        a[ok] for a in (nodes, accum, batch, local, workers, gi)
    )
    p = c.pred.params
    step = perfmodel.step_time(p, nodes, workers, local, accum)
    samples = workload.samples_at_base * factors[gi]
    steps = np.ceil(samples / batch)
    sigma = np.hypot(fit.prior_log_sigma(p, nodes, workers), work_sigma[gi])
    return TypeGrid(nodes, accum, batch, local, step, samples, steps * step, sigma)


@dataclass(frozen=True)
class Priced:
    """The closed-form pricing of every configuration: the kept rows, and the counts."""

    table: Table
    considered: int  # configurations priced (kept or not)
    feasible: int  # of those, finite and within the budget and deadline


_GRID_FIELDS = ("nodes", "accum", "batch", "local", "step", "samples", "train_s", "sigma")
_FIELDS = ("nodes", "batch", "local", "accum", "step", "sigma", "samples")
_PRICES = ("hours", "hours_p90", "cost_usd", "cost_p90_usd", "preemptions", "checkpoint_interval_s")
_COLUMNS = ("hours", "hours_p90", "cost", "cost_p90", "preempt", "tau")


def price_candidates(
    cands: list[Candidate],
    workload: Workload,
    opts: SearchOptions,
    grid: NDArray[np.int64],
    checkpoint_s: float,
) -> Priced:
    """Price each candidate's configurations in closed form (the candidates sharing a type grid
    at once) and keep the rows on their candidate's frontier, in candidate then grid order."""
    factors = efficiency.sample_factor(workload.gns, workload.base_batch, grid)
    # The GNS forecast's spread of the samples to train, per global batch: it widens the time
    # and cost p90 (in quadrature with the step time's), not the step time's own.
    work_sigma = efficiency.log_sigma(workload.gns, workload.base_batch, grid)
    if opts.global_batch is not None and not workload.gns:
        factors = np.ones_like(factors)  # pinned batch, no GNS: same samples as at B0 (noted)
    by_grid: dict[tuple[str, str, str], list[int]] = {}
    for i, c in enumerate(cands):
        by_grid.setdefault((c.offer.cloud, c.offer.instance_type, c.compression), []).append(i)
    parts: list[dict[str, NDArray[np.generic]]] = []
    considered = feasible = 0
    dense: dict[tuple[str, str], TypeGrid | None] = {}  # each type's, shared by its options
    # Without a budget or deadline every finite configuration is feasible: the on-demand
    # members' dominated configurations are counted without pricing them (_undominated).
    prune = opts.budget_usd is None and opts.deadline_hours is None
    for members in by_grid.values():
        c = cands[members[0]]
        key = (c.offer.cloud, c.offer.instance_type)
        if key not in dense:
            dense[key] = _dense_grid(c, workload, opts, grid, factors, work_sigma)
        tg = type_grid(c, workload, opts, grid, factors, work_sigma, dense[key])
        if tg is None:
            continue
        fixed = [i for i in members if _fixed_price(cands[i], opts)] if prune else []
        groups: list[tuple[list[int], NDArray[np.bool_] | None]] = [(members, None)]
        if fixed:
            rest = [i for i in members if not _fixed_price(cands[i], opts)]
            groups = [(fixed, _undominated(tg)), (rest, None)]
        for group, cols in groups:
            if group:
                part, n_all, n_ok = _price_group(group, cands, tg, cols, opts, checkpoint_s)
                considered, feasible = considered + n_all, feasible + n_ok
                parts.append(part)
    names = ("cand", *_FIELDS, *_COLUMNS)
    if not parts:
        cols0 = {n: np.zeros(0) for n in names}
        cols0["cand"] = np.zeros(0, dtype=np.int64)
        return Priced(Table(**cols0), considered, feasible)  # type: ignore[arg-type]
    joined = {n: np.concatenate([p[n] for p in parts]) for n in names}
    order = np.argsort(joined["cand"], kind="stable")  # candidate, then grid order
    table = Table(**{n: a[order] for n, a in joined.items()})  # type: ignore[arg-type]
    return Priced(table, considered, feasible)


def _price_group(
    group: list[int],
    cands: list[Candidate],
    tg: TypeGrid,
    cols: NDArray[np.bool_] | None,
    opts: SearchOptions,
    checkpoint_s: float,
) -> tuple[dict[str, NDArray[np.generic]], int, int]:
    """The rows of ``group`` (candidates of one type grid) on their own frontiers, and their
    configurations counted (all; those feasible). ``cols``: the configurations priced (the
    others are dominated for every member and feasible: ``_undominated``); None: all."""
    sub, at = tg, np.arange(len(tg.nodes))
    if cols is not None:
        at = np.flatnonzero(cols)
        sub = TypeGrid(*(a[at] for a in (getattr(tg, f) for f in _GRID_FIELDS)))
    tc = _closed_form([cands[i] for i in group], sub, opts, checkpoint_s)
    finite = np.isfinite(tc.cost_usd) & np.isfinite(tc.hours)
    k = len(group)  # both frontiers in one sort: the expected rows, then the p90 rows
    considered = k * len(tg.nodes)
    feasible = int(_within_2d(tc, finite, opts).sum()) + k * (len(tg.nodes) - len(at))
    both = front_mask(
        np.concatenate([tc.hours, tc.hours_p90]),
        np.concatenate([tc.cost_usd, tc.cost_p90_usd]),
        np.concatenate([finite, finite]),
    )
    ks, kept = np.nonzero(both[:k] | both[k:])  # member by member, each in grid order
    part: dict[str, NDArray[np.generic]] = {f: getattr(sub, f)[kept] for f in _FIELDS}
    part.update({col: getattr(tc, p)[ks, kept] for p, col in zip(_PRICES, _COLUMNS, strict=True)})
    part["cand"] = np.asarray(group, dtype=np.int64)[ks]
    return part, considered, feasible


def _fixed_price(c: Candidate, opts: SearchOptions) -> bool:
    """Whether the candidate's closed form is the same for every member of its kind: no
    preemptions (an on-demand row, or spot without a spot model), a finite positive price, and
    every such configuration feasible (useful time 1 >= the least useful fraction)."""
    o = opts.overheads or costs.Overheads()
    price = c.offer.usd_per_hour
    return (
        c.risk is None
        and c.preempt_per_hour == 0.0
        and math.isfinite(price)
        and price > 0.0
        and o.min_useful_fraction <= 1.0
    )


def _undominated(tg: TypeGrid) -> NDArray[np.bool_]:
    """The configurations that may be on the frontier of a candidate without preemptions
    (``_fixed_price``), whatever its price; each other configuration i is dominated by an
    earlier one j of the same node count with ``train_s[j] <= train_s[i] * (1 - 1e-9)`` and
    ``sigma[j] <= sigma[i]``, and is finite.

    Why that is safe: without preemptions, at a fixed node count, the closed form's time is
    increasing in ``train_s`` and its p90 time in ``train_s`` and ``sigma``, and the cost is the
    node count's price times the billed seconds, which do not fall as the time grows. The margin
    (far above the rounding of the closed form) makes j strictly faster on both times, so j comes
    first in every frontier's order and is no dearer: i is on no member's expected or p90
    frontier. A frontier of the configurations kept is then the whole grid's frontier (each
    configuration dropped is dominated by one kept: the relation is transitive), and
    tests/test_search_speed.py compares the tables."""
    w, s = tg.train_s, tg.sigma
    order = np.lexsort((w, tg.nodes))  # by node count, then train_s (ties: grid order)
    n_s, w_s, s_s = tg.nodes[order], w[order], s[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = n_s[1:] != n_s[:-1]
    seg = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    pos = np.arange(len(order)) - starts[seg]
    pad = np.full((len(starts), int(pos.max()) + 1), np.inf)
    pad[seg, pos] = s_s
    least = np.minimum.accumulate(pad, axis=1)  # the least sigma up to each place
    drop = np.zeros(len(order), dtype=bool)
    later = np.flatnonzero(~first)
    drop[later] = (
        (w_s[later - 1] <= w_s[later] * (1.0 - 1e-9))
        & (least[seg[later], pos[later] - 1] <= s_s[later])
        & np.isfinite(w_s[later])
        & (w_s[later] > 0.0)
        & np.isfinite(s_s[later])
    )
    keep = np.ones(len(order), dtype=bool)
    keep[order[drop]] = False
    return keep


def _closed_form(
    members: list[Candidate], tg: TypeGrid, opts: SearchOptions, checkpoint_s: float
) -> costs.TimeCost:
    """(candidates, configurations) arrays of the closed form: the candidates share a type
    grid (cloud, instance type, compression) and differ in region, market, price and risk."""

    def column(values: list[float]) -> Array:
        return np.array(values, dtype=float)[:, None]

    waits, co = [], []
    for c in members:
        co.append(c.risk.co_loss if c.risk is not None else 0.0)
        waits.append(
            0.0
            if c.risk is None
            else spotplan.expected_wait_s(c.risk, opts.allow_on_demand, capacity_wait(c.risk, opts))
        )
    first = members[0]
    return costs.time_and_cost(
        train_seconds=tg.train_s[None, :],
        instances=tg.nodes[None, :],
        usd_per_hour=column([c.offer.usd_per_hour for c in members]),
        preempt_per_hour=column([c.preempt_per_hour for c in members]),
        log_sigma=tg.sigma[None, :],
        checkpoint_s=checkpoint_s,
        billing_min_s=first.billing_min_s,
        billing_increment_s=first.billing_increment_s,
        overheads=opts.overheads,
        co_loss=column(co),
        outage_wait_s=column(waits),
    )


def _within_2d(
    tc: costs.TimeCost, finite: NDArray[np.bool_], opts: SearchOptions
) -> NDArray[np.bool_]:
    ok = finite.copy()
    if opts.budget_usd is not None:
        ok &= tc.cost_p90_usd <= opts.budget_usd
    if opts.deadline_hours is not None:
        ok &= tc.hours_p90 <= opts.deadline_hours
    return ok
