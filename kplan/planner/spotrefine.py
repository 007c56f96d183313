"""Spot rows priced by the Monte-Carlo (``spotplan.simulate_rows``), in rounds: the rows the
choice would show are priced, the closed-form estimates of the others are rescaled by what the
priced ones showed, and the choice is made again (``choose``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from kplan.planner import costs, extra_costs, spotplan
from kplan.planner.candidates import Candidate, capacity_wait
from kplan.planner.nanstat import nan_median
from kplan.planner.searchopts import SearchOptions
from kplan.planner.spot import RecoveryPolicy, SpotRisk
from kplan.planner.spotnotice import stop_before_s
from kplan.planner.table import Table

Array = NDArray[np.float64]


@dataclass(frozen=True)
class SpotView:
    """What the Monte-Carlo needs of one row: its risk, prices per node and billing."""

    risk: SpotRisk
    usd_per_hour: float
    on_demand_usd_per_hour: float | None
    billing_min_s: float
    billing_increment_s: float
    cloud: str = ""  # whose spot notice the nodes get (spotnotice.py)


def spot_view(
    i: int,
    t: Table,
    cands: list[Candidate],
    by_key: dict[tuple[str, str, str], Candidate],
) -> SpotView | None:
    """A single-type spot row, or a mix with a spot group (priced with its riskiest group's
    model for every node and the mean price per node: conservative). None: on demand."""
    if t.cand[i] >= 0:
        c = cands[int(t.cand[i])]
        if c.risk is None:
            return None
        return SpotView(
            c.risk,
            c.offer.usd_per_hour,
            c.on_demand_usd_per_hour,
            c.billing_min_s,
            c.billing_increment_s,
            c.offer.cloud,
        )
    mix = t.mixes[-1 - int(t.cand[i])]
    members = [by_key.get((g.instance_type, g.market, g.zone)) for g in mix.groups]
    risky = [c for c in members if c is not None and c.risk is not None]
    if not risky or None in members:
        return None
    worst = max(risky, key=lambda c: c.preempt_per_hour)
    assert worst.risk is not None
    nodes = sum(g.nodes for g in mix.groups)
    od = [c.on_demand_usd_per_hour for c in members if c is not None]
    return SpotView(
        replace(worst.risk, source=f"{worst.risk.source}; a mix: the riskier group's model"),
        sum(g.usd_per_hour * g.nodes for g in mix.groups) / nodes,
        None
        if any(x is None for x in od)
        else sum((x or 0.0) * g.nodes for x, g in zip(od, mix.groups, strict=True)) / nodes,
        worst.billing_min_s,
        worst.billing_increment_s,
        worst.offer.cloud,
    )


def refine_spot_rows(
    t: Table,
    rows: NDArray[np.int64],
    cands: list[Candidate],
    opts: SearchOptions,
    checkpoint_s: float,
) -> bool:
    """Price the spot rows among ``rows`` by Monte-Carlo (in place); False when every one of
    them was priced already."""
    views = _unpriced_views(t, rows, cands)
    if not views:
        return False
    todo = list(views)
    o = opts.overheads
    # with a deadline, the deadline-safe rule (kplan/planner/deadline.py) wherever the type
    # has an on-demand price to fall back to
    deadline_s = None if opts.deadline_hours is None else opts.deadline_hours * 3600.0
    policies = [
        RecoveryPolicy(
            restart_s=o.restart_s,
            provisioning_s=o.provisioning_s,
            checkpoint_interval_s=float(t.tau[i]),
            checkpoint_s=checkpoint_s,
            capacity_wait_s=capacity_wait(views[i].risk, opts),
            allow_on_demand=(opts.allow_on_demand or deadline_s is not None)
            and views[i].on_demand_usd_per_hour is not None,
            deadline_s=deadline_s if views[i].on_demand_usd_per_hour is not None else None,
            notice_stop_s=stop_before_s(views[i].cloud, float(t.step[i]), checkpoint_s),
        )
        for i in todo
    ]
    ix = np.array(todo, dtype=np.int64)
    vs = [views[i] for i in todo]
    od = np.array([v.on_demand_usd_per_hour or v.usd_per_hour for v in vs])
    bill_min = np.array([v.billing_min_s for v in vs])
    bill_inc = np.array([v.billing_increment_s for v in vs])
    work = np.ceil(t.samples[ix] / t.batch[ix]) * t.step[ix]
    priced = _priced(t, ix, vs, policies, work, od, bill_min, bill_inc, opts, checkpoint_s)
    od_tc = costs.time_and_cost(
        train_seconds=work,
        instances=t.nodes[ix],
        usd_per_hour=od,
        preempt_per_hour=0.0,
        log_sigma=t.sigma[ix],
        checkpoint_s=checkpoint_s,
        billing_min_s=bill_min,
        billing_increment_s=bill_inc,
        overheads=o,
    )
    # the region's disks, storage and egress, on the Monte-Carlo's hours as on the closed form's
    xs = extra_costs.rates_by_region(cands)
    regions = [region_of(t, i, cands) for i in todo]
    rate = np.array([xs[k].per_hour(t.nodes[i]) for k, i in zip(regions, todo, strict=True)])
    once = np.array([xs[k].egress_usd for k in regions])
    od_tc = extra_costs.add_to(od_tc, rate, once)
    for j, v in enumerate(vs):
        if v.on_demand_usd_per_hour is not None:
            priced[j] = replace(
                priced[j],
                on_demand_hours=float(od_tc.hours[j]),
                on_demand_cost_usd=float(od_tc.cost_usd[j]),
            )
    names = ("hours", "hours_p90", "cost", "cost_p90")
    closed = {n: getattr(t, n)[ix].copy() for n in names}
    for k, (i, r) in enumerate(zip(todo, priced, strict=True)):
        t.hours[i], t.hours_p90[i] = r.hours, r.hours_p90
        t.cost[i] = r.cost_usd + rate[k] * r.hours + once[k]
        t.cost_p90[i] = r.cost_p90_usd + rate[k] * r.hours_p90 + once[k]
        t.preempt[i] = r.losses
        t.spot[i] = r
    carry_ratios(t, ix, closed, _spot_rows(t, cands))
    return True


def _priced(
    t: Table,
    ix: NDArray[np.int64],
    vs: list[SpotView],
    policies: list[RecoveryPolicy],
    work: Array,
    od: Array,
    bill_min: Array,
    bill_inc: Array,
    opts: SearchOptions,
    checkpoint_s: float,
) -> list[spotplan.SpotPricing]:
    """The rows ``ix`` (``work``: their training seconds) priced by the Monte-Carlo, except a
    run of many loss events without a deadline (whose rule only the Monte-Carlo follows): in
    closed form, since the Monte-Carlo's work grows with them (``spotplan.MC_MAX_LOSSES``)."""
    many = (t.preempt[ix] > spotplan.MC_MAX_LOSSES) & np.array(
        [p.deadline_s is None for p in policies], dtype=bool
    )
    args = {
        "work_s": work,
        "nodes": t.nodes[ix],
        "usd_per_hour": np.array([v.usd_per_hour for v in vs]),
        "usd_per_hour_on_demand": od,
        "log_sigma": t.sigma[ix],
        "billing_min_s": bill_min,
        "billing_increment_s": bill_inc,
    }
    out: dict[int, spotplan.SpotPricing] = {}
    for in_closed_form in (False, True):
        sel = np.flatnonzero(many == in_closed_form)
        if sel.size == 0:
            continue
        part = {k: a[sel] for k, a in args.items()}
        risks, pols = [vs[k].risk for k in sel], [policies[k] for k in sel]
        rows = (
            spotplan.closed_form_rows(
                **part,
                risks=risks,
                policies=pols,
                checkpoint_s=checkpoint_s,
                overheads=opts.overheads,
            )
            if in_closed_form
            else spotplan.simulate_rows(
                **part,
                risks=risks,
                policies=pols,
                runs=opts.spot_runs,
                seed=opts.seed,
            )
        )
        out.update(zip(sel.tolist(), rows, strict=True))
    return [out[k] for k in range(len(vs))]


def region_of(t: Table, i: int, cands: list[Candidate]) -> tuple[str, str]:
    """The (cloud, region) of table row ``i``: its candidate's, or its mix's."""
    if t.cand[i] >= 0:
        o = cands[int(t.cand[i])].offer
        return (o.cloud, o.region)
    m = t.mixes[-1 - int(t.cand[i])]
    return (m.cloud, m.region)


def _spot_rows(t: Table, cands: list[Candidate]) -> NDArray[np.bool_]:
    """The spot rows: a single type with a spot model, or a mix with a spot group (without the
    mixes, each round would bring the next optimistic closed-form mix into view: many rounds)."""
    flags = np.array([c.risk is not None for c in cands] + [False])
    mix_spot = np.array([any(g.market == "spot" for g in m.groups) for m in t.mixes] + [False])
    spot: NDArray[np.bool_] = np.where(
        t.cand >= 0,
        flags[np.clip(t.cand, 0, len(cands))],
        mix_spot[np.clip(-1 - t.cand, 0, len(t.mixes))],
    )
    return spot


def _unpriced_views(
    t: Table, rows: NDArray[np.int64], cands: list[Candidate]
) -> dict[int, SpotView]:
    """The spot rows among ``rows`` the Monte-Carlo has not priced yet, with what it needs."""
    views: dict[int, SpotView] = {}
    # a mix's groups, found by (type, market, zone) among the candidates
    by_key: dict[tuple[str, str, str], Candidate] = {
        (c.offer.instance_type, c.offer.market, c.offer.zone): c for c in cands
    }
    for i in dict.fromkeys(rows.tolist()):
        if int(i) not in t.spot:
            v = spot_view(int(i), t, cands, by_key)
            if v is not None:
                views[int(i)] = v
    return views


def carry_ratios(
    t: Table, ix: NDArray[np.int64], closed: dict[str, Array], is_spot: NDArray[np.bool_]
) -> None:
    """Scale the estimates of the spot rows not priced yet by the median ratio of the rows just
    priced to their estimates (the same candidate's where it has some, else all of them), so
    that the next ranking starts near the Monte-Carlo values (the closed form misses early-life
    preemptions, outage tails and node ages). Each ratio is to the current estimate, so a later
    round corrects further rather than compounding."""
    priced = np.zeros(len(t.cost), dtype=bool)
    priced[list(t.spot)] = True
    ratios: dict[str, Array] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for name, before in closed.items():
            ratios[name] = getattr(t, name)[ix] / before
    done: list[int] = []
    for c in sorted(set(t.cand[ix].tolist())):  # distinct (np.unique imports numpy.ma)
        mine = t.cand[ix] == c
        rows = np.flatnonzero((t.cand == c) & ~priced)
        done.append(int(c))
        for name, r in ratios.items():
            k = float(nan_median(r[mine])) if np.isfinite(r[mine]).any() else math.nan
            if rows.size and math.isfinite(k) and k > 0:
                getattr(t, name)[rows] *= k
    others = ~priced & ~np.isin(t.cand, done) & is_spot
    if others.any():
        for name, r in ratios.items():
            k = float(nan_median(r)) if np.isfinite(r).any() else math.nan
            if math.isfinite(k) and k > 0:
                getattr(t, name)[others] *= k
