"""The search keeps only each candidate's own time/cost frontier before ranking
(kplan/planner/pricing.py): the plans, frontier and counts must be those of the unpruned table.

The unpruned table is built here the way the search built it until 2026-11-28 (every
configuration of every candidate priced one candidate at a time) on the small test catalog; each
objective, with and without limits, is chosen on both tables (closed form, no Monte-Carlo). The
README commands' plans before and after the change are compared outside the suite (the
``--json`` outputs of 15 commands: the same chosen plans, plan lists and frontiers)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kplan.core.errors import InfeasibleError
from kplan.planner import costs, efficiency, spotplan
from kplan.planner.candidates import Candidate, batch_grid, candidates, capacity_wait
from kplan.planner.choose import choose
from kplan.planner.frontier import front_mask, pareto_front
from kplan.planner.pricing import price_candidates, type_grid
from kplan.planner.searchopts import SearchOptions
from kplan.planner.spotnotice import notice_stops
from kplan.planner.table import Table, within
from kplan.planner.workload import Workload
from tests.planner_fixtures import catalog, device_model, workload


def _unpruned(cands: list[Candidate], wl: Workload, opts: SearchOptions, ck: float) -> Table:
    grid = batch_grid(wl, opts)
    factors = efficiency.sample_factor(wl.gns, wl.base_batch, grid)
    sigma = efficiency.log_sigma(wl.gns, wl.base_batch, grid)
    cols: dict[str, list[np.ndarray]] = {}
    for i, c in enumerate(cands):
        tg = type_grid(c, wl, opts, grid, factors, sigma)
        if tg is None:
            continue
        wait = 0.0
        if c.risk is not None:
            wait = spotplan.expected_wait_s(
                c.risk, opts.allow_on_demand, capacity_wait(c.risk, opts)
            )
        tc = costs.time_and_cost(
            train_seconds=tg.train_s,
            instances=tg.nodes,
            usd_per_hour=c.offer.usd_per_hour,
            preempt_per_hour=c.preempt_per_hour,
            log_sigma=tg.sigma,
            checkpoint_s=ck,
            billing_min_s=c.billing_min_s,
            billing_increment_s=c.billing_increment_s,
            overheads=opts.overheads,
            co_loss=c.risk.co_loss if c.risk is not None else 0.0,
            outage_wait_s=wait,
            notice_stop_s=notice_stops(c.offer.cloud, tg.step, ck),  # the spot notice's stop
        )
        parts = {
            "cand": np.full(tg.nodes.size, i, dtype=np.int64),
            **{f: getattr(tg, f) for f in ("nodes", "batch", "local", "accum", "step", "sigma")},
            "samples": tg.samples,
            "hours": tc.hours,
            "hours_p90": tc.hours_p90,
            "cost": tc.cost_usd,
            "cost_p90": tc.cost_p90_usd,
            "preempt": tc.preemptions,
            "tau": tc.checkpoint_interval_s,
        }
        for k, v in parts.items():
            cols.setdefault(k, []).append(v)
    return Table(**{k: np.concatenate(v) for k, v in cols.items()})  # type: ignore[arg-type]


CASES = [
    SearchOptions(markets=("on-demand",), objective="knee", mixed=False, max_nodes=16),
    SearchOptions(markets=("on-demand",), objective="cost", mixed=False, deadline_hours=40.0),
    SearchOptions(objective="time", mixed=False, budget_usd=400.0, max_nodes=8),
    SearchOptions(objective="knee", mixed=False, max_nodes=8, compression="fp16"),
]


@pytest.mark.parametrize("opts", CASES)
def test_pruned_table_gives_the_unpruned_choice(opts: SearchOptions) -> None:
    wl, cat = workload(), catalog()
    cands, notes = candidates(wl, cat, device_model(), opts)
    if opts.compression is not None:
        cands = [replace(c, compression=opts.compression) for c in cands]
    ck = costs.checkpoint_seconds(3.0 * wl.gradient_bytes, opts.overheads)
    grid = batch_grid(wl, opts)
    full = _unpruned(cands, wl, opts, ck)
    priced = price_candidates(cands, wl, opts, grid, ck)
    finite = np.isfinite(full.cost) & np.isfinite(full.hours)
    assert priced.considered == full.cost.size
    assert priced.feasible == int(within(full, finite, opts).sum())
    assert priced.table.cost.size < full.cost.size  # something was pruned
    # every row of the whole table's frontier (expected and p90) survives the pruning
    kept = {(int(c), float(h), float(x)) for c, h, x in zip(*_key(priced.table), strict=True)}
    for front in (
        pareto_front(full.hours[finite], full.cost[finite]),
        pareto_front(full.hours_p90[finite], full.cost_p90[finite]),
    ):
        rows = np.flatnonzero(finite)[front]
        for c, h, x in zip(*_key(full.take(rows)), strict=True):
            assert (int(c), float(h), float(x)) in kept
    # the same plans, frontier and choice (no Monte-Carlo: the closed form on both)
    try:
        a = choose(full, cands, wl, opts, notes, grid)
    except InfeasibleError as e:
        with pytest.raises(InfeasibleError) as b:
            choose(priced.table, cands, wl, opts, notes, grid)
        assert (b.value.message, b.value.hint) == (e.message, e.hint)
        return
    b = choose(priced.table, cands, wl, opts, notes, grid)
    assert b.chosen == a.chosen and b.plans == a.plans and b.frontier == a.frontier
    assert b.reason == a.reason


def _key(t: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return t.cand, t.hours, t.cost


def test_front_mask_is_pareto_front_per_row() -> None:
    """The 2-d frontier mask keeps, per row, the points ``pareto_front`` keeps (ties too)."""
    rng = np.random.default_rng(1)
    hours = np.round(rng.uniform(1, 5, (6, 40)), 1)  # rounded: many exact ties
    cost = np.round(rng.uniform(1, 5, (6, 40)), 1)
    finite = rng.random((6, 40)) > 0.2
    mask = front_mask(hours, cost, finite)
    for r in range(6):
        idx = np.flatnonzero(finite[r])
        want = set(idx[pareto_front(hours[r, idx], cost[r, idx])].tolist())
        assert set(np.flatnonzero(mask[r]).tolist()) == want
