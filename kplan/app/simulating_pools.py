"""``kplan simulate`` over several pools: the plan replayed with moves between zones or regions
(``kplan/planner/spotmove.py`` states the move rule), set against staying in the first pool.

Each ``--trace NAME=FILE`` is one pool: ``NAME`` a region or a zone of the plan's cloud where the
catalog sells the plan's instance type, ``FILE`` its trace. The traces share one clock (time 0
is the same instant in each). The job starts in the first pool, which must be in the plan's
region, at its prices (the plan's); another pool's prices are the catalog's cheapest offers of
the plan's types there (in the zone, if ``NAME`` is one). A move copies the plan's checkpoint
(``extras.checkpoint_gb``, or ``--checkpoint-gb``) at ``--copy-gbps``, priced at the source
region's inter-region egress (``storage_prices.csv``); between zones of one region it copies
nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from kplan.app.simulating import (
    MAX_REPLAY_WORK,
    MAX_RUNS,
    Job,
    MovePrice,
    Moves,
    Replay,
    distribution,
)
from kplan.core.errors import InputError
from kplan.planner.catalog import Catalog
from kplan.planner.plan import Plan, PlanRow
from kplan.planner.spotmove import MoveTerms, Pool, break_even_s, move_cost
from kplan.planner.spottrace import SpotTrace

MAX_POOLS = 8
POOL_HINT = "name each pool by a region or zone of the plan's cloud, e.g. --trace us-east-1=a.csv"


def split_spec(spec: str) -> tuple[str | None, Path]:
    """``NAME=FILE`` -> (NAME, FILE); a plain path -> (None, path). A file whose own name has
    an ``=`` is that file unless ``FILE`` exists too: then the spec means two things."""
    name, sep, rest = spec.partition("=")
    if not (sep and name and "/" not in name and rest):
        return None, Path(spec)
    if Path(spec).is_file():
        if Path(rest).exists():
            raise InputError(
                f"--trace {spec!r} is both the file {spec!r} and pool {name!r} of file {rest!r}",
                hint=f"write ./{spec} for the file, or {name}=./{rest} for the pool",
            )
        return None, Path(spec)
    return name, Path(rest)


def _offers(catalog: Catalog, r: PlanRow, name: str) -> list[Any]:
    types = {g.instance_type for g in r.groups}
    return [
        o
        for o in catalog.offers
        if o.cloud == r.cloud and o.instance_type in types and name in (o.region, o.zone)
    ]


def _pool_usd(offers: list[Any], r: PlanRow, market: str, name: str) -> float:
    """Per node: each group's cheapest offer in ``market``, weighed by its nodes."""
    total = 0.0
    for g in r.groups:
        priced = [
            o.usd_per_hour
            for o in offers
            if o.instance_type == g.instance_type and o.market == market
        ]
        if not priced:
            raise InputError(
                f"pool {name!r}: the catalog has no {market} price for {g.instance_type} there",
                hint=POOL_HINT,
            )
        total += min(priced) * g.nodes
    return total / r.nodes


def build_pools(
    r: PlanRow, catalog: Catalog, job: Job, traces: list[tuple[str, SpotTrace]]
) -> list[Pool]:
    """The pools of ``--trace NAME=FILE`` (the module docstring), checked."""
    names = [n for n, _ in traces]
    if len(set(names)) != len(names):
        raise InputError(f"a pool is named twice in {', '.join(names)}", hint=POOL_HINT)
    if len(traces) > MAX_POOLS:
        raise InputError(f"{len(traces)} pools; at most {MAX_POOLS}", hint="give fewer --trace")
    pools: list[Pool] = []
    for k, (name, trace) in enumerate(traces):
        _check_zones(name, trace, {o.zone for o in catalog.offers if o.region == name})
        offers = _offers(catalog, r, name)
        if not offers:
            raise InputError(
                f"unknown pool {name!r}: no region or zone of that name sells "
                f"{r.instance_type} on {r.cloud} in the catalog {catalog.version}",
                hint=POOL_HINT + " (kplan catalog list)",
            )
        region = offers[0].region
        if (r.cloud, region) not in catalog.storage:
            raise InputError(
                f"pool {name!r}: the catalog has no egress price for {r.cloud}:{region}",
                hint="add the region to storage_prices.csv, or replay another pool",
            )
        if k == 0 and region != r.region:
            raise InputError(
                f"the first --trace is where the job starts: pool {name!r} is in {region}, "
                f"the plan runs in {r.region}",
                hint=f"give a pool of {r.region} first, e.g. --trace {r.region}=FILE",
            )
        if k == 0:
            spot, od = job.usd_per_hour, job.usd_per_hour_on_demand
        else:
            spot = _pool_usd(offers, r, "spot", name)
            od = _pool_usd(offers, r, "on-demand", name)
        pools.append(Pool(name, region, trace, spot, od))
    _check_nested(pools)
    return pools


def _check_nested(pools: list[Pool]) -> None:
    """A region's pool holds its zones' capacity: a zone of it as another pool would count the
    same nodes twice (and moving between them would be no move)."""
    regions = {p.name for p in pools if p.name == p.region}
    for p in pools:
        if p.name != p.region and p.region in regions:
            raise InputError(
                f"pool {p.name!r} is a zone of pool {p.region!r}: the region's trace already "
                "holds its zones",
                hint="replay either the region or its zones, each zone as its own pool",
            )


def _check_zones(name: str, trace: SpotTrace, zones_of_name: set[str]) -> None:
    """A trace whose zone column names a zone that is not its pool (the pool's name, a zone
    of the region of that name in the catalog, or a name that starts with it) is refused."""
    wrong = sorted(
        {
            z
            for z in trace.zones
            if z and z != name and z not in zones_of_name and not z.startswith(name)
        }
    )
    if wrong:
        raise InputError(
            f"pool {name!r}: its trace {trace.name} is of zone {wrong[0]}",
            hint=f"name the pool by the trace's zone, e.g. --trace {wrong[0]}=FILE",
        )


def move_prices(pools: list[Pool], terms: MoveTerms, nodes: int) -> tuple[MovePrice, ...]:
    out = []
    for a in pools:
        for b in pools:
            if a is b:
                continue
            c = move_cost(terms, a, b)
            t = break_even_s(c, nodes, a.usd_per_hour_on_demand, b.usd_per_hour)
            out.append(
                MovePrice(
                    a.name,
                    b.name,
                    c.kind,
                    c.usd_per_gb,
                    c.egress_usd,
                    c.copy_s,
                    t if np.isfinite(t) else None,
                )
            )
    return tuple(out)


def replay_pools_plan(
    job: Job, pools: list[Pool], terms: MoveTerms, *, runs: int, seed: int
) -> Replay:
    """Replay ``job`` from ``runs`` random starts with moves allowed, and from the same starts
    in the first pool alone; the first's distribution with :class:`Moves` beside it."""
    from kplan.planner.spotmove import replay_pools

    if not 1 <= runs <= MAX_RUNS:
        raise InputError(f"--runs {runs} must be in 1..{MAX_RUNS}", hint="e.g. --runs 500")
    per_run = 0
    for p in pools:
        events = len(p.trace.times_s)
        alive = int(np.cumsum(p.trace.kinds.astype(np.int64)).max()) if events else 0
        per_run += alive + events // 100 + 1
    if 2 * runs * per_run > MAX_REPLAY_WORK:
        raise InputError(
            f"--runs {runs} over {len(pools)} pools is more replay work than the bound "
            f"({MAX_REPLAY_WORK:,})",
            hint=f"use --runs {max(MAX_REPLAY_WORK // (2 * per_run), 1)} or fewer",
        )
    end = min(p.trace.end_s for p in pools)
    horizon = job.horizon_s
    if end <= 0 or horizon >= end:
        raise InputError(
            f"the traces share {end / 3600:.1f} h; a replay of the plan needs "
            f"{horizon / 3600:.1f} h of them (1.5 x its p90 time, or 3 x its median where the "
            "p90 has no bound)",
            hint="replay longer traces, or a shorter job (kplan estimate --epochs)",
        )
    home = pools[0].trace
    rng = np.random.default_rng(seed)
    starts = [home.first_with(job.nodes, float(t)) for t in rng.uniform(0.0, end - horizon, runs)]
    moved = replay_pools(
        pools,
        starts,
        nodes=job.nodes,
        work_s=job.work_s,
        policy=job.policy,
        terms=terms,
        billing_min_s=job.billing_min_s,
        billing_increment_s=job.billing_increment_s,
    )
    stay = job.replay_on(home, starts, seed)
    keep = [i for i in range(runs) if not (moved[i].truncated or stay[i].truncated)]
    trace = SpotTrace(
        name=" + ".join(p.name for p in pools),
        source="; ".join(f"{p.name}: {p.trace.name}" for p in pools),
        times_s=np.zeros(0),
        kinds=np.zeros(0, dtype=np.int8),
        nodes=(),
        end_s=end,
    )
    out, _, _ = distribution(job, trace, [moved[i] for i in keep], samples=False)
    out = replace(out, runs=runs, truncated=runs - len(keep))
    return replace(
        out, moves=_moves(job, pools, terms, [moved[i] for i in keep], [stay[i] for i in keep])
    )


def _moves(
    job: Job, pools: list[Pool], terms: MoveTerms, moved: list[Any], stay: list[Any]
) -> Moves:
    n = max(len(moved), 1)
    hours = np.array([o.hours for o in stay]) if stay else np.array([np.nan])
    cost = np.array([o.cost_usd for o in stay]) if stay else np.array([np.nan])
    m_cost = float(np.mean([o.cost_usd for o in moved])) if moved else float("nan")
    m_hours = float(np.mean([o.hours for o in moved])) if moved else float("nan")
    deadline = job.policy.deadline_s
    return Moves(
        pools=tuple(p.name for p in pools),
        checkpoint_gb=terms.checkpoint_gb,
        copy_gbps=terms.copy_gbps,
        prices=move_prices(pools, terms, job.nodes),
        moves_mean=sum(len(o.moves) for o in moved) / n,
        moved=sum(bool(o.moves) for o in moved) / n,
        egress_usd_mean=sum(o.egress_usd for o in moved) / n,
        stay_hours=float(np.median(hours)),
        stay_cost_usd=float(np.median(cost)),
        stay_hours_mean=float(hours.mean()),
        stay_cost_mean_usd=float(cost.mean()),
        stay_failed=int(sum(o.failed for o in stay)),
        cost_vs_stay=m_cost / float(cost.mean()),
        hours_vs_stay=m_hours / float(hours.mean()),
        stay_met_deadline=None
        if deadline is None
        else float(np.mean(hours * 3600.0 <= deadline + 1e-6)),
    )


def simulate_pools(
    plan: Plan,
    row: int | None,
    catalog: Catalog,
    specs: list[tuple[str | None, Path]],
    *,
    fmt: str,
    runs: int,
    seed: int,
    checkpoint_gb: float | None,
    copy_gbps: float,
) -> Replay:
    """``kplan simulate --trace NAME=FILE ...``: the plan's row replayed over the pools."""
    from kplan.app.plan_files import checked_row
    from kplan.app.simulating import job_from_plan, load_trace

    unnamed = [str(p) for name, p in specs if name is None]
    if unnamed:
        raise InputError(
            f"--trace {unnamed[0]} has no pool name: with several traces, name each one",
            hint=POOL_HINT,
        )
    job = job_from_plan(plan, row, catalog)
    r = checked_row(plan, "the plan", row, catalog)
    traces = [(str(name), load_trace(path, fmt)) for name, path in specs]
    pools = build_pools(r, catalog, job, traces)
    notes: list[str] = []
    gb = checkpoint_gb
    if gb is None:
        gb = r.extras.checkpoint_gb
        if gb <= 0:
            notes.append("the plan states no checkpoint size: moves copy 0 GB (--checkpoint-gb)")
    terms = MoveTerms(r.cloud, gb, copy_gbps, catalog.storage)
    out = replay_pools_plan(job, pools, terms, runs=runs, seed=seed)
    return replace(out, notes=(*out.notes, *notes))
