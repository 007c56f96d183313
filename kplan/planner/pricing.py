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

from kplan.planner import compression, costs, efficiency, extra_costs, fit, perfmodel, spotplan
from kplan.planner.candidates import Candidate, capacity_wait
from kplan.planner.frontier import front_mask
from kplan.planner.searchopts import SearchOptions
from kplan.planner.spotnotice import notice_stops
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
    pairs = compression.node_pairs(nodes, c.inst.gpu_count)  # the rounds' distinct inputs
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
                pairs=pairs,
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
    # Without a budget or deadline every finite configuration is feasible: the dominated
    # configurations are counted without pricing them (_groups, _undominated).
    prune = opts.budget_usd is None and opts.deadline_hours is None
    terms = _risk_terms(cands, opts)
    for members in by_grid.values():
        c = cands[members[0]]
        key = (c.offer.cloud, c.offer.instance_type)
        if key not in dense:
            dense[key] = _dense_grid(c, workload, opts, grid, factors, work_sigma)
        tg = type_grid(c, workload, opts, grid, factors, work_sigma, dense[key])
        if tg is None:
            continue
        for group, gap in _groups(members, cands, terms, opts) if prune else [(members, None)]:
            cols = None if gap is None else _undominated(tg, *gap)
            part, n_all, n_ok = _price_group(group, cands, terms, tg, cols, opts, checkpoint_s)
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
    terms: list[tuple[float, float]],
    tg: TypeGrid,
    cols: tuple[NDArray[np.bool_], NDArray[np.intp]] | None,
    opts: SearchOptions,
    checkpoint_s: float,
) -> tuple[dict[str, NDArray[np.generic]], int, int]:
    """The rows of ``group`` (candidates of one type grid) on their own frontiers, and their
    configurations counted (all; those feasible). ``cols``: the configurations priced and, for
    each other one, a priced one of its node count (``_undominated``); None: all priced."""
    sub, at = tg, np.arange(len(tg.nodes))
    if cols is not None:
        at = np.flatnonzero(cols[0])
        sub = TypeGrid(*(a[at] for a in (getattr(tg, f) for f in _GRID_FIELDS)))
    tc = _closed_form([cands[i] for i in group], [terms[i] for i in group], sub, opts, checkpoint_s)
    finite = np.isfinite(tc.cost_usd) & np.isfinite(tc.hours)
    k = len(group)  # both frontiers in one sort: the expected rows, then the p90 rows
    considered = k * len(tg.nodes)
    feasible = int(_within_2d(tc, finite, opts).sum())
    if cols is not None:  # the dropped configurations, counted without pricing them
        feasible += _feasible_dropped(group, cands, terms, tg, ~cols[0], checkpoint_s, opts)
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


def _feasible_dropped(
    group: list[int],
    cands: list[Candidate],
    terms: list[tuple[float, float]],
    tg: TypeGrid,
    dropped: NDArray[np.bool_],
    checkpoint_s: float,
    opts: SearchOptions,
) -> int:
    """How many of the ``dropped`` configurations of ``group`` the closed form would find
    finite (``costs.feasible``, the inputs of ``_closed_form``)."""
    at = np.flatnonzero(dropped)
    if at.size == 0:
        return 0
    members = [cands[i] for i in group]
    ok = costs.feasible(
        instances=tg.nodes[at][None, :],
        preempt_per_hour=np.array([[c.preempt_per_hour] for c in members]),
        co_loss=np.array([[terms[i][1]] for i in group]),
        checkpoint_s=checkpoint_s,
        overheads=opts.overheads,
        notice_stop_s=notice_stops(members[0].offer.cloud, tg.step[at], checkpoint_s)[None, :],
    )
    return int(ok.sum())


def _groups(
    members: list[int],
    cands: list[Candidate],
    terms: list[tuple[float, float]],
    opts: SearchOptions,
) -> list[tuple[list[int], tuple[float, float] | None]]:
    """A type grid's members in groups priced together, each with the (gap, floor) of
    ``_undominated`` that holds for every member of the group (None: price every
    configuration): the on-demand and spot members together, and any other member.

    On demand (no preemptions) the cost at a node count is a price times billed seconds, which
    do not fall as the time grows: no gap is needed. A spot row's expected cost is
    ``P (billed - q wall)`` with ``P`` the cluster's price per second and ``q = rate x wait``
    (``costs._time_and_cost``: preemptions x unbilled waits), its p90 ``P billed_p90 - U n90``
    with ``U <= P loss`` (``co_loss <= 1``). Above the billing minimum, billed seconds fall short
    of the run by at most one increment, so a ``train_s`` longer by more than
    ``increment / (1 - q)`` is dearer on both, and slower. One group's gap is its spot members'
    (a larger gap drops less: it holds on demand too)."""
    first = cands[members[0]]
    ok: list[int] = []
    rest: list[int] = []
    q_max, any_spot = 0.0, False
    for i in members:
        c = cands[i]
        price = c.offer.usd_per_hour
        if not (math.isfinite(price) and price > 0.0):
            rest.append(i)
        elif c.risk is None and c.preempt_per_hour == 0.0:
            ok.append(i)
        elif c.risk is not None and 0.0 <= c.risk.co_loss <= 1.0 and c.preempt_per_hour >= 0:
            wait, _ = terms[i]
            q_max = max(q_max, c.preempt_per_hour * wait / 3600.0)
            any_spot = True
            ok.append(i)
        else:
            rest.append(i)
    if not (math.isfinite(q_max) and q_max < 1.0):
        return [(members, None)]
    gap, floor = 0.0, -math.inf
    if any_spot:
        gap = first.billing_increment_s / (1.0 - q_max) * (1.0 + 1e-6) + 1e-6
        floor = first.billing_min_s
    out: list[tuple[list[int], tuple[float, float] | None]] = []
    if ok:
        out.append((ok, (gap, floor)))
    if rest:
        out.append((rest, None))
    return out


def _undominated(
    tg: TypeGrid, gap: float, floor: float
) -> tuple[NDArray[np.bool_], NDArray[np.intp]]:
    """(the configurations that may be on a frontier of the group ``_groups`` gave this gap and
    floor, for each configuration dropped a kept one of its node count). A configuration i is
    dropped when another one j of the same node count has ``train_s[j] <= train_s[i] -
    max(gap, 1e-9 train_s[i])``, ``train_s[j] >= floor`` and ``sigma[j] <= sigma[i]``, all finite.

    Why that is safe: at a fixed node count the closed form's time grows with ``train_s`` and
    its p90 time with ``train_s`` and ``sigma`` (the node count sets the preemption rate, the
    checkpoint interval and the useful fraction), and the costs do not fall (``_groups``). One
    exception is taken as not reversing the order: the spot notice's stop grows with the step
    (``spotnotice.stop_before_s``), so a loss costs a longer step up to two steps more progress;
    requiring ``step[j] <= step[i]`` as well dropped a tenth as many configurations (0.2 s more
    on the default estimate). The
    margin is far above the closed form's rounding: j is strictly faster on both times, so it
    comes first in every frontier's order and is no dearer, and i is on no member's expected or
    p90 frontier. A frontier of the configurations kept is then the whole grid's (each one
    dropped is dominated by one kept: the relation is transitive); whether a dropped one is
    finite is ``costs.feasible`` (``_price_group``). tests/test_search_speed.py compares the
    tables."""
    w, s, nodes = tg.train_s, tg.sigma, tg.nodes
    if np.any(nodes[1:] < nodes[:-1]):  # a grid is built by node count first: kept anyway
        order = np.argsort(nodes, kind="stable")
        keep, by = _undominated(
            TypeGrid(*(getattr(tg, f)[order] for f in _GRID_FIELDS)), gap, floor
        )
        out = np.empty_like(keep)
        out[order] = keep
        return out, order[by][np.argsort(order[~keep])]  # in the order of the dropped
    first = np.ones(len(w), dtype=bool)
    first[1:] = nodes[1:] != nodes[:-1]
    seg = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    pos = np.arange(len(w)) - starts[seg]
    # per node count, a row of the train_s that may dominate (inf: none) and of sigma
    can = np.isfinite(w) & np.isfinite(s) & (w >= floor)
    shape = (len(starts), int(pos.max()) + 1)
    w_by, s_by = np.full(shape, np.inf), np.full(shape, np.inf)
    w_by[seg, pos] = np.where(can, w, np.inf)
    s_by[seg, pos] = s
    thr = np.minimum(w * (1.0 - 1e-9), w - gap)
    drop = ((w_by[seg] <= thr[:, None]) & (s_by[seg] <= s[:, None])).any(axis=1)
    drop &= np.isfinite(w) & (w > 0.0) & np.isfinite(s)
    rows = seg[drop]  # the least train_s of a row can dominate: it is kept
    return ~drop, starts[rows] + np.argmin(w_by[rows], axis=1)


def _risk_terms(cands: list[Candidate], opts: SearchOptions) -> list[tuple[float, float]]:
    """Per candidate, (expected capacity wait per loss event, co_loss) of the closed form; 0 on
    demand. Once per spot row: the compression options' candidates share their dense one's."""
    seen: dict[int, tuple[float, float]] = {}
    out = []
    for c in cands:
        if c.risk is None:
            out.append((0.0, 0.0))
            continue
        key = id(c.risk)
        if key not in seen:
            cap = capacity_wait(c.risk, opts)
            seen[key] = (
                spotplan.expected_wait_s(c.risk, opts.allow_on_demand, cap),
                c.risk.co_loss,
            )
        out.append(seen[key])
    return out


def _closed_form(
    members: list[Candidate],
    terms: list[tuple[float, float]],
    tg: TypeGrid,
    opts: SearchOptions,
    checkpoint_s: float,
) -> costs.TimeCost:
    """(candidates, configurations) arrays of the closed form: the candidates share a type
    grid (cloud, instance type, compression) and differ in region, market, price and risk."""

    def column(values: list[float]) -> Array:
        return np.array(values, dtype=float)[:, None]

    waits, co = zip(*terms, strict=True)
    first = members[0]
    tc = costs.time_and_cost(
        train_seconds=tg.train_s[None, :],
        instances=tg.nodes[None, :],
        usd_per_hour=column([c.offer.usd_per_hour for c in members]),
        preempt_per_hour=column([c.preempt_per_hour for c in members]),
        log_sigma=tg.sigma[None, :],
        checkpoint_s=checkpoint_s,
        billing_min_s=first.billing_min_s,
        billing_increment_s=first.billing_increment_s,
        overheads=opts.overheads,
        co_loss=column(list(co)),
        outage_wait_s=column(list(waits)),
        # the notice's checkpoint (spotnotice.py): the members share the type grid's cloud
        notice_stop_s=notice_stops(first.offer.cloud, tg.step, checkpoint_s)[None, :],
    )
    # the region's disks, storage and egress (extra_costs.py): in the budget and the frontier
    per_hour = np.stack([c.extras.per_hour(tg.nodes) for c in members])
    return extra_costs.add_to(tc, per_hour, column([c.extras.egress_usd for c in members]))


def _within_2d(
    tc: costs.TimeCost, finite: NDArray[np.bool_], opts: SearchOptions
) -> NDArray[np.bool_]:
    ok = finite.copy()
    if opts.budget_usd is not None:
        ok &= tc.cost_p90_usd <= opts.budget_usd
    if opts.deadline_hours is not None:
        ok &= tc.hours_p90 <= opts.deadline_hours
    return ok
