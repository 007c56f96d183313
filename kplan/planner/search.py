"""Search every configuration of the catalog and choose a plan (pure; numpy vectorised).

Dimensions: cloud, region/zone (the cheapest zone of each allowed region), instance type,
market, node count, global batch (B0 * 2^(i/2), or B0 alone without a GNS trajectory),
accumulation steps; then two-type mixes within a region. The global batch is split over the
workers by the runtime (per-worker batches may differ by one sample), so the step time is set by
``ceil(B / (k s))`` samples per worker per micro-step.

The steps, each in its own module: the candidates (``candidates``), every configuration priced
in closed form and pruned to each candidate's own frontier (``pricing``), two-type mixes
(``mix``), the choice with the shown spot rows priced by Monte-Carlo (``choose``,
``spotrefine``), then the chosen row's batch schedule (``batchsched``) and precision.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import InfeasibleError
from kplan.core.precision import Precision
from kplan.planner import bounds
from kplan.planner.candidates import Candidate, batch_grid, candidates, with_compression
from kplan.planner.catalog import Catalog
from kplan.planner.devices import DeviceModel
from kplan.planner.frontier import cheapest_of_fastest, knee_index, merge_near_times, pareto_front
from kplan.planner.plan import BatchSchedule, Plan, PlanRow, SchedulePhase
from kplan.planner.searchopts import TIE_TOLERANCE, SearchOptions, default_objective
from kplan.planner.workload import Workload

if TYPE_CHECKING:
    from kplan.planner.mix import MixCandidate
    from kplan.planner.table import Table

__all__ = [
    "TIE_TOLERANCE",
    "Candidate",
    "SearchOptions",
    "batch_grid",
    "cheapest_of_fastest",
    "default_objective",
    "knee_index",
    "merge_near_times",
    "pareto_front",
    "plan_precision",
    "search",
]


def search(workload: Workload, catalog: Catalog, dm: DeviceModel, opts: SearchOptions) -> Plan:
    """Evaluate every configuration and choose one by the objective, within budget/deadline."""
    cands, notes = candidates(workload, catalog, dm, opts)
    cands = with_compression(cands, opts)
    if not cands:
        hint = "relax --cloud/--region/--gpu, or check `kplan catalog list`"
        if not opts.opt_in_zones and any(o.opt_in for o in catalog.offers):
            hint += "; --opt-in-zones adds AWS Local and Wavelength Zones"
        raise InfeasibleError(
            "no instance type matches the filters and fits the job in GPU memory", hint=hint
        )
    grid = batch_grid(workload, opts)
    floor = bounds.floor(cands, workload, opts, grid)
    refused = bounds.refusal(floor, opts)
    if refused is not None:  # a deadline or budget no configuration can meet: before pricing
        raise InfeasibleError(*refused)
    # Imported here: a request refused above answers without loading the pricing and choice.
    from kplan.planner import costs
    from kplan.planner.choose import choose
    from kplan.planner.mix import search_mixes
    from kplan.planner.pricing import price_candidates
    from kplan.planner.spotrefine import refine_spot_rows

    checkpoint_s = costs.checkpoint_seconds(3.0 * workload.gradient_bytes, opts.overheads)
    priced = price_candidates(cands, workload, opts, grid, checkpoint_s)
    if priced.considered == 0:
        raise InfeasibleError(*_explain_empty(cands, workload, opts, grid))
    table, considered, feasible = priced.table, priced.considered, priced.feasible
    if opts.mixed:
        best = table.best_per_candidate()  # mixes are priced dense: dense members only
        best = {i: v for i, v in best.items() if cands[i].compression == "none"}
        mixes = search_mixes(cands, best, workload, opts, grid, checkpoint_s)
        mixes = [m for m in mixes if mix_allowed(m, opts)]
        table, n_mix, ok_mix = _with_mixes(table, mixes, opts)
        considered, feasible = considered + n_mix, feasible + ok_mix

    def refine(rows: NDArray[np.int64]) -> bool:
        done = refine_spot_rows(table, rows, cands, opts, checkpoint_s)
        # the rescaled estimates stay above what any configuration can reach (bounds.py)
        bounds.hold(table.hours_p90, floor.hours_p90)
        bounds.hold(table.cost_p90, floor.cost_p90_usd)
        return done

    plan = choose(table, cands, workload, opts, notes, grid, refine)
    plan = replace(plan, considered=considered, feasible=feasible)
    plan = _with_schedule(plan, cands, workload, opts, grid, checkpoint_s)
    return _with_precision(plan, workload, opts)


def _with_mixes(
    table: Table, mixes: list[MixCandidate], opts: SearchOptions
) -> tuple[Table, int, int]:
    """The table with the mixes' finite rows (each mix is its own frontier); the mixes counted,
    and those within the budget and deadline."""
    from kplan.planner.table import within

    full = table.with_mixes(mixes)
    n = len(table.cost)
    finite = np.isfinite(full.cost) & np.isfinite(full.hours)
    finite[:n] = True  # the single-type rows kept are finite
    ok = int(within(full, finite, opts)[n:].sum())
    return full.take(np.flatnonzero(finite)), len(mixes), ok


def _with_schedule(
    plan: Plan,
    cands: list[Candidate],
    workload: Workload,
    opts: SearchOptions,
    grid: NDArray[np.int64],
    checkpoint_s: float,
) -> Plan:
    """The chosen row with a global-batch schedule on its cluster (kplan/planner/batchsched.py) when
    one beats its best single batch by more than the tie tolerance (single-type rows only)."""
    from kplan.planner import batchsched, costs, extra_costs, spotplan
    from kplan.planner.candidates import capacity_wait

    r = plan.chosen
    match = [
        c
        for c in cands
        if len(r.groups) == 1
        and (c.offer.cloud, c.offer.region, c.offer.zone) == (r.cloud, r.region, r.zone)
        and (c.offer.instance_type, c.offer.market) == (r.instance_type, r.market)
        and c.compression == r.compression == "none"  # batchsched prices dense steps
    ]
    if not match or not workload.gns or len(grid) < 2:
        return plan
    c = match[0]
    co_loss, wait = 0.0, 0.0
    if c.risk is not None:
        co_loss = c.risk.co_loss
        wait = spotplan.expected_wait_s(c.risk, opts.allow_on_demand, capacity_wait(c.risk, opts))

    notice = r.spot.recovery.notice_stop_s if r.spot.recovery is not None else None

    def price(train_s: float, log_sigma: float) -> batchsched.Priced:
        tc = costs.time_and_cost(
            train_seconds=train_s,
            instances=r.nodes,
            usd_per_hour=c.offer.usd_per_hour,
            preempt_per_hour=c.preempt_per_hour,
            log_sigma=log_sigma,
            checkpoint_s=checkpoint_s,
            billing_min_s=c.billing_min_s,
            billing_increment_s=c.billing_increment_s,
            overheads=opts.overheads,
            co_loss=co_loss,
            outage_wait_s=wait,
            notice_stop_s=notice,
        )
        tc = extra_costs.add_to(tc, c.extras.per_hour(r.nodes), c.extras.egress_usd)
        return float(tc.hours), float(tc.cost_usd), float(tc.hours_p90), float(tc.cost_p90_usd)

    step_sigma = math.log(max(r.step_time_p90_s / r.step_time_s, 1.0)) / costs.Z90
    sched = batchsched.plan_schedule(
        gns=workload.gns,
        base_batch=workload.base_batch,
        samples_at_base=workload.samples_at_base,
        grid=[int(b) for b in grid],
        params=c.pred.params,
        nodes=r.nodes,
        workers=r.workers,
        accum_steps=r.accum_steps,
        max_local_batch=c.pred.max_local_batch,
        min_local_batch=opts.min_local_batch,
        price=price,
        objective=opts.objective,
        tie_tolerance=opts.tie_tolerance,
        step_log_sigma=step_sigma,
    )
    if sched is None or not all(
        math.isfinite(x) for x in (sched.hours, sched.cost_usd, sched.hours_p90, sched.cost_p90_usd)
    ):
        return plan
    # The row's time and cost model (maybe the Monte-Carlo's) scaled by the closed form's
    # ratios, the p90s by the ratio of the closed form's p90s (each with its own spread).
    chosen = replace(
        r,
        schedule=BatchSchedule(
            phases=tuple(SchedulePhase(p.start, p.global_batch) for p in sched.phases),
            hours=r.hours * sched.hours / sched.single_hours,
            cost_usd=r.cost_usd * sched.cost_usd / sched.single_cost_usd,
            hours_p90=r.hours_p90 * sched.hours_p90 / sched.single_hours_p90,
            cost_p90_usd=r.cost_p90_usd * sched.cost_p90_usd / sched.single_cost_p90_usd,
            forecast_log_sigma=sched.log_sigma,
            saving=sched.saving,
        ),
    )
    rows = tuple(chosen if row is r else row for row in plan.plans)
    return replace(plan, chosen=chosen, plans=rows)


def mix_allowed(m: MixCandidate, opts: SearchOptions) -> bool:
    """With pinned instance types, a mix pairs two different pinned types (a spot + on-demand
    mix of one type would read as "a+a"); node counts stay within the pinned range."""
    if not opts.min_nodes <= m.nodes <= opts.max_nodes:
        return False
    if opts.instance_types:
        return len({g.instance_type for g in m.groups}) == len(m.groups)
    return True


def plan_precision(workload: Workload, opts: SearchOptions) -> tuple[Precision, Precision]:
    """(the plan's precision, the profile's precision)."""
    measured = workload.precision
    return (opts.precision or measured), measured


def _with_precision(plan: Plan, workload: Workload, opts: SearchOptions) -> Plan:
    prec, measured = plan_precision(workload, opts)
    basis = "measured" if prec == measured else f"projected from the profile's {measured}"

    def tag(r: PlanRow) -> PlanRow:
        return replace(r, precision=prec)

    chosen = tag(plan.chosen)
    rows = tuple(chosen if r is plan.chosen else tag(r) for r in plan.plans)
    uncertainty = plan.uncertainty
    if prec != measured:
        uncertainty += f"; the step time is projected from {measured} to {prec} (wider p90)"
    return replace(
        plan,
        chosen=chosen,
        plans=rows,
        frontier=tuple(tag(r) for r in plan.frontier),
        precision=prec,
        precision_basis=basis,
        uncertainty=uncertainty,
    )


def _explain_empty(
    cands: list[Candidate], workload: Workload, opts: SearchOptions, grid: NDArray[np.int64]
) -> tuple[str, str]:
    """Why no (nodes, batch) of any candidate type is possible: the pins, in words."""
    c = cands[0]
    gpus_lo = opts.min_nodes * c.inst.gpu_count
    b_hi = int(grid.max())
    b_lo = int(grid.min())
    fit = max(x.pred.max_local_batch for x in cands)
    nodes = (
        f"{opts.min_nodes}"
        if opts.min_nodes == opts.max_nodes
        else f"{opts.min_nodes}-{opts.max_nodes}"
    )
    if b_hi < gpus_lo * min(opts.min_local_batch, b_hi):
        per = f" x {opts.min_local_batch} samples each" if opts.min_local_batch > 1 else ""
        return (
            f"global batch {b_hi} is too small for {nodes} x {c.inst.name} ({gpus_lo} GPUs{per})",
            "pin fewer --nodes, or a larger --global-batch / --max-global-batch",
        )
    max_acc = max(opts.accum_steps)
    big = opts.max_nodes * max(x.inst.gpu_count for x in cands) * max_acc * fit
    if b_lo > big:
        return (
            f"global batch {b_lo} does not fit: at most {fit} samples per GPU fit in memory "
            f"on {nodes} nodes with up to {max_acc} accumulation steps",
            "pin more --nodes or a smaller --global-batch",
        )
    return (
        f"no configuration of {nodes} nodes and global batch {b_lo}"
        + (f"-{b_hi}" if b_hi != b_lo else "")
        + " is possible on the pinned instance types",
        "relax --nodes, --global-batch or --instance-type",
    )
