"""Choosing a plan from the priced table: rank by the objective within the budget and deadline,
price the rows that would be shown by Monte-Carlo and rank again, then build the Plan."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import InfeasibleError
from kplan.planner import bounds, efficiency, fmt
from kplan.planner.candidates import Candidate
from kplan.planner.frontier import cheapest_of_fastest, knee_index, merge_near_times, pareto_front
from kplan.planner.plan import Plan, PlanRow
from kplan.planner.planrows import plan_row, reason_text, uncertainty_text
from kplan.planner.searchopts import SearchOptions
from kplan.planner.table import Table, within
from kplan.planner.workload import Workload

Array = NDArray[np.float64]
SAME_TIME = 0.01  # relative: frontier times closer than this are the same time


def choose(
    t: Table,
    cands: list[Candidate],
    workload: Workload,
    opts: SearchOptions,
    notes: list[str],
    grid: NDArray[np.int64],
    refine: Callable[[NDArray[np.int64]], bool] | None = None,
) -> Plan:
    finite = np.isfinite(t.cost) & np.isfinite(t.hours)
    if not finite.any():
        raise InfeasibleError(
            "no configuration is feasible (spot preemptions too frequent?)",
            hint="try --on-demand or fewer --max-nodes",
        )
    # The closed form ranks everything; the rows that would be shown are then priced by the
    # Monte-Carlo, and the choice is made again until every shown row is priced that way.
    rounds = 12
    for attempt in range(rounds):
        ranked = rank(t, finite, opts)
        if ranked is None:
            # the Monte-Carlo prices of the best rows may still fit: price them, look again
            near = np.flatnonzero(finite)
            best = near[np.lexsort((t.cost_p90[near], t.hours_p90[near]))][: 2 * opts.top]
            cheap = near[np.lexsort((t.hours_p90[near], t.cost_p90[near]))][: 2 * opts.top]
            if refine is not None and refine(np.concatenate([best, cheap])):
                continue
            break
        ok, front, order = ranked
        shown = np.concatenate([front, distinct_first(order, t, cands, opts.top)])
        if refine is None or attempt == rounds - 1 or not refine(shown):
            break
    if ranked is None:
        raise InfeasibleError(*infeasible_message(t, finite, opts))
    rows = top_distinct(order, t, cands, workload, opts.top)
    chosen = rows[0]
    frontier = tuple(plan_row(int(i), t, cands, workload) for i in front)
    all_notes = list(notes)
    if opts.global_batch is not None and not workload.gns:
        all_notes.append(
            "the profile has no gradient noise scale: the samples to train at the pinned global "
            f"batch {opts.global_batch} are taken as those at {workload.base_batch}"
        )
    elif not workload.gns:
        all_notes.append(
            "the profile has no gradient noise scale: the global batch is kept at "
            f"{workload.base_batch}"
        )
    elif chosen.global_batch != workload.base_batch and (
        note := efficiency.forecast_note(workload.gns)
    ):
        all_notes.append(note)
    all_notes.extend(spot_notes(chosen))
    if chosen.nodes > t_max_nodes(cands):
        all_notes.append(
            f"the chosen plan runs {chosen.nodes} nodes; the profile measured at most "
            f"{t_max_nodes(cands)}: the prediction extrapolates (uncertainty widened)"
        )
    return Plan(
        chosen=chosen,
        plans=tuple(rows),
        frontier=frontier,
        objective=opts.objective,
        reason=reason_text(chosen, frontier, opts, len(grid)),
        considered=len(t.cost),
        feasible=int(ok.sum()),
        notes=tuple(all_notes),
        uncertainty=uncertainty_text(chosen, workload),
        tie_tolerance=opts.tie_tolerance,
        order=order_text(opts),
    )


def t_max_nodes(cands: list[Candidate]) -> int:
    return max(c.pred.params.max_nodes_measured for c in cands)


def knee_score(h: Array, c: Array) -> Array:
    """Lower is nearer the knee: log(time x cost)."""
    out: Array = np.log(h) + np.log(c)
    return out


def rank(
    t: Table, finite: NDArray[np.bool_], opts: SearchOptions
) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.int64]] | None:
    """(rows within the budget and deadline, their frontier, their objective order)."""
    ok = within(t, finite, opts)
    if not ok.any():
        return None
    idx = np.flatnonzero(ok)
    front = idx[pareto_front(t.hours[idx], t.cost[idx])]
    # times within 1% are one time, the cheaper stays: below any step-time model's resolution
    # (fit.MIN_LOG_SIGMA, 5%), and a spot row's median run is its clean run (one instance in two
    # regions then differs by Monte-Carlo noise alone)
    front = front[merge_near_times(t.hours[front], SAME_TIME)]
    tol = opts.tie_tolerance
    if opts.objective == "cost":
        order = idx[np.lexsort((t.hours[idx], t.cost[idx]))]
    elif opts.objective == "time":
        head, rest = cheapest_of_fastest(t.hours[idx], t.cost[idx], tol)
        order = idx[np.concatenate([head, rest])]
    else:
        merged = front[merge_near_times(t.hours[front], tol)]
        knee = merged[knee_index(t.hours[merged], t.cost[merged])]
        score = knee_score(t.hours[idx], t.cost[idx])
        order = np.concatenate([[knee], idx[np.argsort(score, kind="stable")]])
    return ok, front, order


def row_key(i: int, t: Table, cands: list[Candidate]) -> tuple[str, str, str]:
    if t.cand[i] >= 0:
        o = cands[int(t.cand[i])].offer
        return (o.cloud, o.instance_type, o.market)
    mix = t.mixes[-1 - int(t.cand[i])]
    return (mix.cloud, "+".join(g.instance_type for g in mix.groups), "mixed")


def distinct_first(
    order: NDArray[np.int64], t: Table, cands: list[Candidate], n: int
) -> NDArray[np.int64]:
    """The first row of each (cloud, type, market) in ``order``, up to ``n`` of them."""
    seen: set[tuple[str, str, str]] = set()
    out: list[int] = []
    for i in order:
        k = row_key(int(i), t, cands)
        if k not in seen:
            seen.add(k)
            out.append(int(i))
            if len(out) >= n:
                break
    return np.array(out, dtype=np.int64)


def top_distinct(
    order: NDArray[np.int64], t: Table, cands: list[Candidate], workload: Workload, top: int
) -> list[PlanRow]:
    """The best configuration of each (cloud, instance type(s), market), in objective order."""
    seen: set[tuple[str, str, str]] = set()
    rows: list[PlanRow] = []
    for i in order:
        key = shown_key(int(i), t, cands)
        if key in seen:
            continue
        seen.add(key)
        rows.append(plan_row(int(i), t, cands, workload))
        if len(rows) >= top:
            break
    return rows


def shown_key(i: int, t: Table, cands: list[Candidate]) -> tuple[str, str, str]:
    """(cloud, instance type(s), market) of the row ``plan_row`` would build (a mix of one
    market shows that market), without building it."""
    if t.cand[i] >= 0:
        return row_key(i, t, cands)
    mix = t.mixes[-1 - int(t.cand[i])]
    markets = {g.market for g in mix.groups}
    market = markets.pop() if len(markets) == 1 else "mixed"
    return (mix.cloud, "+".join(g.instance_type for g in mix.groups), market)


def spot_notes(r: PlanRow) -> list[str]:
    """Say when a spot plan is no better than the same cluster on demand, or may fail."""
    out = []
    od, od_hours = r.spot.on_demand_cost_usd, r.spot.on_demand_hours
    if r.market == "spot" and od is not None and od_hours is not None and od <= r.cost_usd:
        out.append(
            f"spot is worse than on-demand here: {r.expected_preemptions:.1f} expected loss "
            f"events and capacity waits make it {fmt.money(r.cost_usd)} / "
            f"{fmt.duration(r.hours)} against {fmt.money(od)} / "
            f"{fmt.duration(od_hours)} on demand (use --on-demand)"
        )
    wait_s = r.spot.recovery.capacity_wait_s if r.spot.recovery else 900.0
    if r.spot.fail_prob >= 0.01 and not r.spot.simulated:
        out.append(
            f"{r.spot.fail_prob:.0%} of runs would not end (in a market that much busier than "
            "the median, losses come so fast that under a fifth of the time trains: the "
            "launcher's replacement limit stops them); fewer nodes, on demand, or a shorter job"
        )
    elif r.spot.fail_prob >= 0.01:
        out.append(
            f"{r.spot.fail_prob:.0%} of simulated runs fail (no spot capacity in the region for "
            f"longer than {wait_s / 3600:.1f} h); allow on-demand fallback or a "
            "longer capacity wait"
        )
    return out


def infeasible_message(t: Table, finite: NDArray[np.bool_], o: SearchOptions) -> tuple[str, str]:
    cheapest = float(np.min(t.cost_p90[finite]))
    fastest = float(np.min(t.hours_p90[finite]))
    return bounds.no_plan(o, cheapest, fastest, at_least=False)


def order_text(o: SearchOptions) -> str:
    """How the plans are ordered, in one line."""
    tol = fmt.percent(o.tie_tolerance)
    if o.objective == "cost":
        return "cheapest first (expected cost)"
    if o.objective == "time":
        return f"fastest first; times within {tol} of the fastest tie and go cheapest first"
    return "knee first, then by time x cost (smallest first)"
