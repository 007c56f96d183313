"""Search every configuration of the catalog and choose a plan (pure; numpy vectorised).

Dimensions: cloud, region/zone (the cheapest zone of each allowed region), instance type,
market, node count, global batch (B0 * 2^(i/2), or B0 alone without a GNS trajectory),
accumulation steps; then two-type mixes within a region. The global batch is split over the
workers by the runtime (per-worker batches may differ by one sample), so the step time is set by
``ceil(B / (k s))`` samples per worker per micro-step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import InfeasibleError, InputError
from kplan.core.precision import Precision, check_precision
from kplan.planner import (
    batchsched,
    compression,
    costs,
    efficiency,
    fit,
    fmt,
    perfmodel,
    spotplan,
)
from kplan.planner.catalog import Catalog, InstanceType, Offer
from kplan.planner.compression import StatCost
from kplan.planner.devices import DeviceModel
from kplan.planner.mix import MixCandidate, search_mixes
from kplan.planner.plan import (
    OBJECTIVES,
    BatchSchedule,
    Group,
    Objective,
    Plan,
    PlanRow,
    SchedulePhase,
    SpotTerms,
)
from kplan.planner.spot import RecoveryPolicy, SpotModel, SpotRisk
from kplan.planner.workload import InstancePrediction, Workload, for_instance

Array = NDArray[np.float64]
# Plans whose expected times differ by less than this fraction are tied, and a tie goes to the
# cheaper plan: "fastest" is the cheapest plan within 5% of the fastest time; the knee is found
# after merging frontier points within 5% of each other's time (the cheapest of each kept).
# 5% is below the step-time model's own error (its p90 is +20-60% over the expected value).
TIE_TOLERANCE = 0.05


@dataclass(frozen=True)
class SearchOptions:
    clouds: tuple[str, ...] = ()  # empty: all
    regions: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    markets: tuple[str, ...] = ("on-demand", "spot")
    max_nodes: int = 64
    min_nodes: int = 1  # --nodes N pins min_nodes = max_nodes = N; --nodes 2-8 a range
    instance_types: tuple[str, ...] = ()  # empty: all
    budget_usd: float | None = None
    deadline_hours: float | None = None
    objective: Objective = "cost"
    accum_steps: tuple[int, ...] = (1, 2, 4, 8)
    max_batch_multiple: float = 32.0  # largest global batch, as a multiple of B0
    max_global_batch: int | None = None  # replaces max_batch_multiple when given
    global_batch: int | None = None  # the one global batch to plan (pinned)
    fixed_global_batch: bool = False  # keep B0, with at least min_local_batch per GPU
    min_local_batch: int = 1  # smallest per-GPU (micro-)batch a configuration may use
    precision: Precision | None = None  # None: the profile's; else projected from it
    mixed: bool = True
    top: int = 10
    overheads: costs.Overheads = field(default_factory=costs.Overheads)
    # Spot: the trace-fitted model (None: the catalog's, the shipped one), the launcher's
    # recovery rules (on-demand fallback, capacity wait: None = the model's longest outage)
    # and the Monte-Carlo that prices the spot rows kplan shows.
    spot_model: SpotModel | None = None
    allow_on_demand: bool = False
    capacity_wait_s: float | None = None
    spot_runs: int = 1000
    seed: int = 0
    tie_tolerance: float = TIE_TOLERANCE  # relative time difference counted as a tie
    opt_in_zones: bool = False  # also AWS Local Zones and Wavelength Zones (opt-in per account)
    # Gradient compression (kplan/planner/compression.py): None = dense, and on multi-node
    # configurations also compression.DEFAULT_OPTIONS where one saves more than the tie
    # tolerance; an option (e.g. "powersgd:4", "none") pins it on every configuration.
    compression: str | None = None
    # Measured statistical costs (spec, samples multiplier, log sigma) that update an option's
    # prior (compression.stat_for), e.g. from a running job's loss curves.
    compression_stats: tuple[tuple[str, float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.budget_usd is not None and not self.budget_usd > 0:
            raise InputError(f"budget {self.budget_usd} must be > 0 USD", hint="e.g. --budget 500")
        if self.deadline_hours is not None and not self.deadline_hours > 0:
            raise InputError(
                f"deadline {self.deadline_hours} must be > 0 hours", hint="e.g. --deadline 24"
            )
        if not 1 <= self.max_nodes <= 1024:
            raise InputError(f"max nodes {self.max_nodes} must be in 1..1024", hint="e.g. 64")
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise InputError(
                f"nodes {self.min_nodes}-{self.max_nodes} is not a range of node counts",
                hint="e.g. --nodes 4 or --nodes 2-8 (low <= high, both >= 1)",
            )
        for name, b in (
            ("--global-batch", self.global_batch),
            ("--max-global-batch", self.max_global_batch),
        ):
            if b is not None and not 1 <= b <= 2**24:
                raise InputError(f"{name}={b} must be in 1..{2**24}", hint="samples, e.g. 1024")
        if not 1 <= self.min_local_batch <= 2**24:
            raise InputError(f"min local batch {self.min_local_batch} must be >= 1", hint="e.g. 8")
        if self.precision is not None:
            check_precision(self.precision)
        if self.objective not in OBJECTIVES:
            raise InputError(
                f"unknown objective {self.objective!r}", hint=f"use one of {', '.join(OBJECTIVES)}"
            )
        if self.top < 1:
            raise InputError(f"--top {self.top} must be >= 1", hint="e.g. --top 10")
        if self.capacity_wait_s is not None and not 0 <= self.capacity_wait_s <= 30 * 86400:
            raise InputError(
                f"capacity wait {self.capacity_wait_s} s must be in 0..30 days",
                hint="seconds, e.g. 3600",
            )
        if not 0 <= self.tie_tolerance <= 1:
            raise InputError(
                f"tie tolerance {self.tie_tolerance} must be in 0..1", hint="e.g. 0.05 (5%)"
            )
        if not 10 <= self.spot_runs <= 10**6:
            raise InputError(f"spot runs {self.spot_runs} must be in 10..1e6", hint="e.g. 2000")
        bad = [m for m in self.markets if m not in ("on-demand", "spot")]
        if bad or not self.markets:
            raise InputError(f"unknown market {bad}", hint="use spot or on-demand")
        if not self.accum_steps or min(self.accum_steps) < 1:
            raise InputError(f"accumulation steps {self.accum_steps} must be >= 1", hint="1")
        if self.max_batch_multiple < 1:
            raise InputError(
                f"max batch multiple {self.max_batch_multiple} must be >= 1", hint="e.g. 32"
            )
        if self.compression is not None:
            compression.parse(self.compression)
        if self.compression_stats:
            self._check_measured()

    def _check_measured(self) -> None:
        """Each measured cost is valid and of an option this search prices (else it would be
        silently unused)."""
        options = compression.DEFAULT_OPTIONS if self.compression is None else [self.compression]
        priced = [compression.parse(o).spec() for o in options]
        for spec, multiplier, log_sigma in self.compression_stats:
            StatCost(1.0, 0.1, "check").updated(multiplier, log_sigma)  # validates them
            if compression.parse(spec).spec() not in priced:
                raise InputError(
                    f"a measured cost for {spec}, which this search does not price "
                    f"(it prices {', '.join(priced)})",
                    hint=f"pin the option to price it: --compression {spec}",
                )


def default_objective(budget: float | None, deadline: float | None) -> Objective:
    """Cheapest within a deadline; fastest within a budget alone; else the frontier's knee."""
    if deadline is not None:
        return "cost"
    if budget is not None:
        return "time"
    return "knee"


@dataclass(frozen=True)
class Candidate:
    """The cheapest zone for one (cloud, region, instance type, market)."""

    offer: Offer
    inst: InstanceType
    pred: InstancePrediction
    preempt_per_hour: float
    billing_min_s: float
    billing_increment_s: float
    risk: SpotRisk | None = None  # the spot model's row (None: on demand)
    on_demand_usd_per_hour: float | None = None  # the same type's on-demand price in the region
    compression: str = (
        "none"  # the gradient compression its rows run (kplan/planner/compression.py)
    )
    compression_stat: StatCost | None = None  # its samples multiplier (None: dense)


@dataclass
class _Pool:
    """Evaluated configurations as parallel arrays (one entry per configuration)."""

    cand: list[NDArray[np.int64]] = field(default_factory=list)
    nodes: list[Array] = field(default_factory=list)
    batch: list[Array] = field(default_factory=list)
    local: list[Array] = field(default_factory=list)
    accum: list[Array] = field(default_factory=list)
    step: list[Array] = field(default_factory=list)
    sigma: list[Array] = field(default_factory=list)
    tc: list[costs.TimeCost] = field(default_factory=list)
    samples: list[Array] = field(default_factory=list)

    def cat(self, name: str) -> Array:
        parts = getattr(self, name)
        return np.concatenate(parts) if parts else np.zeros(0)


def candidates(
    workload: Workload, catalog: Catalog, dm: DeviceModel, opts: SearchOptions
) -> tuple[list[Candidate], list[str]]:
    """Filter the catalog and keep the cheapest zone per (cloud, region, type, market)."""
    notes: list[str] = []
    _check_filters(catalog, opts)
    gpus_wanted = {g.lower() for g in opts.gpus}
    types_wanted = {t.lower() for t in opts.instance_types}
    best: dict[tuple[str, str, str, str], Offer] = {}
    for o in catalog.offers:
        if o.opt_in and not opts.opt_in_zones:
            continue
        if opts.clouds and o.cloud not in opts.clouds:
            continue
        if opts.regions and o.region not in opts.regions:
            continue
        if o.market not in opts.markets:
            continue
        if types_wanted and o.instance_type.lower() not in types_wanted:
            continue
        inst = catalog.instances.get((o.cloud, o.instance_type))
        if inst is None or (gpus_wanted and inst.gpu.lower() not in gpus_wanted):
            continue
        key = (o.cloud, o.region, o.instance_type, o.market)
        if key not in best or o.usd_per_hour < best[key].usd_per_hour:
            best[key] = o
    preds: dict[tuple[str, str], InstancePrediction] = {}
    out: list[Candidate] = []
    model = opts.spot_model or (catalog.spot_model if "spot" in opts.markets else None)
    if model is None and "spot" in opts.markets:
        raise ValueError("a spot search needs a spot model: kplan.catalogs loads the catalog's")
    od_price: dict[tuple[str, str, str], float] = {
        (o.cloud, o.region, o.instance_type): o.usd_per_hour
        for o in sorted(catalog.offers, key=lambda o: -o.usd_per_hour)
        if o.market == "on-demand" and (opts.opt_in_zones or not o.opt_in)
    }
    for (cloud, _region, itype, market), offer in sorted(best.items()):
        inst = catalog.instances[(cloud, itype)]
        if (cloud, itype) not in preds:
            preds[(cloud, itype)] = for_instance(
                workload, inst, catalog.gpus[inst.gpu], dm, precision=opts.precision
            )
            if preds[(cloud, itype)].max_local_batch < 1:
                notes.append(f"{itype}: the job does not fit in {inst.gpu} memory")
        pred = preds[(cloud, itype)]
        if pred.max_local_batch < 1:
            continue
        risk = None
        if market == "spot" and model is not None:
            sr = catalog.spot_rate(cloud, itype)
            risk = spotplan.risk_for(model, cloud, itype, offer.region, sr.per_hour, sr.family)
        bill = catalog.billing[cloud]
        out.append(
            Candidate(
                offer,
                inst,
                pred,
                risk.rate_per_hour if risk is not None else 0.0,
                bill.minimum_s,
                bill.increment_s,
                risk,
                od_price.get((cloud, offer.region, itype)),
            )
        )
    return out, notes


def _check_filters(catalog: Catalog, opts: SearchOptions) -> None:
    clouds = {o.cloud for o in catalog.offers}
    for c in opts.clouds:
        if c not in clouds:
            raise InputError(f"unknown cloud {c!r}", hint=f"use one of {', '.join(sorted(clouds))}")
    regions = {o.region for o in catalog.offers}
    for r in opts.regions:
        if r not in regions:
            raise InputError(
                f"unknown region {r!r}",
                hint=f"regions in the catalog: {', '.join(sorted(regions))}",
            )
    known = {g.lower(): g for g in catalog.gpus}
    for g in opts.gpus:
        if g.lower() not in known:
            raise InputError(
                f"unknown GPU {g!r}", hint=f"known GPUs: {', '.join(sorted(catalog.gpus))}"
            )
    types = sorted({t for (_c, t) in catalog.instances})
    folded = {t.lower() for t in types}
    for t in opts.instance_types:
        if t.lower() not in folded:
            import difflib

            close = difflib.get_close_matches(t, types, n=4, cutoff=0.5)
            if close:
                hint = f"did you mean {', '.join(close)}?"
            else:
                hint = f"e.g. {', '.join(types[:4])} (all: `kplan catalog list`)"
            raise InputError(f"unknown instance type {t!r}", hint=hint)


def batch_grid(workload: Workload, opts: SearchOptions) -> NDArray[np.int64]:
    """Global batches to try: the pinned one; B0 alone (--fixed-batch, or no GNS); else
    B0 * 2^(i/2) up to ``max_global_batch`` (default ``max_batch_multiple`` x B0)."""
    b0 = workload.base_batch
    if opts.global_batch is not None:
        return np.array([opts.global_batch], dtype=np.int64)
    if opts.fixed_global_batch or not workload.gns:
        return np.array([b0], dtype=np.int64)
    top = (
        opts.max_global_batch if opts.max_global_batch is not None else opts.max_batch_multiple * b0
    )
    if top < b0:
        return np.array([int(top)], dtype=np.int64)
    steps = math.floor(2 * math.log2(top / b0) + 1e-9) + 1
    grid = np.unique(np.round(b0 * 2.0 ** (np.arange(steps) / 2.0)).astype(np.int64))
    return grid[grid <= top]


@dataclass(frozen=True)
class _TypeGrid:
    """Every (nodes, accumulation, global batch) of one instance type, with step times."""

    nodes: Array
    accum: Array
    batch: Array
    local: Array
    step: Array
    samples: Array
    train_s: Array
    sigma: Array


def _type_grid(
    c: Candidate,
    workload: Workload,
    opts: SearchOptions,
    grid: NDArray[np.int64],
    factors: Array,
    work_sigma: Array,
) -> _TypeGrid | None:
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
    if c.compression != "none":
        # The option's step time and samples; unless pinned, only where it saves more than the
        # tie tolerance over dense on the same multi-node configuration.
        comp = compression.parse(c.compression)
        stat = c.compression_stat or compression.prior(comp)
        dense_s = steps * step
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
        samples = samples * stat.multiplier
        steps = np.ceil(samples / batch)
        sigma = np.hypot(sigma, stat.log_sigma)
        if opts.compression is None:
            keep = (nodes >= 2) & (steps * step < (1.0 - opts.tie_tolerance) * dense_s)
            if not keep.any():
                return None
            nodes, accum, batch, local, step, samples, steps, sigma = (
                a[keep] for a in (nodes, accum, batch, local, step, samples, steps, sigma)
            )
    return _TypeGrid(nodes, accum, batch, local, step, samples, steps * step, sigma)


def _evaluate_single(
    i: int,
    c: Candidate,
    tg: _TypeGrid,
    opts: SearchOptions,
    checkpoint_s: float,
    pool: _Pool,
) -> None:
    co_loss, wait = 0.0, 0.0
    if c.risk is not None:
        co_loss = c.risk.co_loss
        wait = spotplan.expected_wait_s(c.risk, opts.allow_on_demand, _capacity_wait(c.risk, opts))
    tc = costs.time_and_cost(
        train_seconds=tg.train_s,
        instances=tg.nodes,
        usd_per_hour=c.offer.usd_per_hour,
        preempt_per_hour=c.preempt_per_hour,
        log_sigma=tg.sigma,
        checkpoint_s=checkpoint_s,
        billing_min_s=c.billing_min_s,
        billing_increment_s=c.billing_increment_s,
        overheads=opts.overheads,
        co_loss=co_loss,
        outage_wait_s=wait,
    )
    pool.cand.append(np.full(tg.nodes.size, i, dtype=np.int64))
    for name in ("nodes", "batch", "local", "accum", "step", "sigma", "samples"):
        getattr(pool, name).append(getattr(tg, name))
    pool.tc.append(tc)


def search(workload: Workload, catalog: Catalog, dm: DeviceModel, opts: SearchOptions) -> Plan:
    """Evaluate every configuration and choose one by the objective, within budget/deadline."""
    cands, notes = candidates(workload, catalog, dm, opts)
    pinned = opts.compression is not None and opts.compression != "none"
    if pinned or (opts.compression is None and opts.max_nodes >= 2):
        # pinned: every candidate runs it; else dense first, then each default option's
        specs = [opts.compression] if pinned else list(compression.DEFAULT_OPTIONS)
        comps = [compression.parse(str(o)) for o in specs]
        stats = [compression.stat_for(cc, opts.compression_stats) for cc in comps]
        variants = [
            replace(c, compression=cc.spec(), compression_stat=st)
            for cc, st in zip(comps, stats, strict=True)
            for c in cands
        ]
        cands = variants if pinned else [*cands, *variants]
    if not cands:
        hint = "relax --cloud/--region/--gpu, or check `kplan catalog list`"
        if not opts.opt_in_zones and any(o.opt_in for o in catalog.offers):
            hint += "; --opt-in-zones adds AWS Local and Wavelength Zones"
        raise InfeasibleError(
            "no instance type matches the filters and fits the job in GPU memory", hint=hint
        )
    grid = batch_grid(workload, opts)
    checkpoint_s = costs.checkpoint_seconds(3.0 * workload.gradient_bytes, opts.overheads)
    factors = efficiency.sample_factor(workload.gns, workload.base_batch, grid)
    # The GNS forecast's spread of the samples to train, per global batch: it widens the time
    # and cost p90 (in quadrature with the step time's), not the step time's own.
    work_sigma = efficiency.log_sigma(workload.gns, workload.base_batch, grid)
    if opts.global_batch is not None and not workload.gns:
        factors = np.ones_like(factors)  # pinned batch, no GNS: same samples as at B0 (noted)
    pool = _Pool()
    grids: dict[tuple[str, str, str], _TypeGrid | None] = {}
    for i, c in enumerate(cands):
        key = (c.offer.cloud, c.offer.instance_type, c.compression)
        if key not in grids:
            grids[key] = _type_grid(c, workload, opts, grid, factors, work_sigma)
        tg = grids[key]
        if tg is not None:
            _evaluate_single(i, c, tg, opts, checkpoint_s, pool)
    singles = _Table.from_pool(pool)
    if singles.cost.size == 0:
        raise InfeasibleError(*_explain_empty(cands, workload, opts, grid))
    mixes: list[MixCandidate] = []
    if opts.mixed:
        best = singles.best_per_candidate()  # mixes are priced dense: dense members only
        best = {i: v for i, v in best.items() if cands[i].compression == "none"}
        mixes = search_mixes(cands, best, workload, opts, grid, checkpoint_s)
        mixes = [m for m in mixes if _mix_allowed(m, opts)]
    full = singles.with_mixes(mixes)
    # Only a row on its own type's time/cost frontier (expected or p90) can be chosen or
    # shown; the rest are counted but not ranked again after each Monte-Carlo round.
    table = full.take(_own_fronts(full))

    def refine(rows: NDArray[np.int64]) -> bool:
        return _refine(table, rows, cands, opts, checkpoint_s)

    plan = _choose(table, cands, workload, opts, notes, grid, refine)
    plan = replace(plan, considered=len(full.cost), feasible=_feasible(full, opts))
    plan = _with_schedule(plan, cands, workload, opts, grid, checkpoint_s)
    return _with_precision(plan, workload, opts)


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
        wait = spotplan.expected_wait_s(c.risk, opts.allow_on_demand, _capacity_wait(c.risk, opts))

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
        )
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


def _spot_notes(r: PlanRow) -> list[str]:
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
    if r.spot.fail_prob >= 0.01:
        out.append(
            f"{r.spot.fail_prob:.0%} of simulated runs fail (no spot capacity in the region for "
            f"longer than {wait_s / 3600:.1f} h); allow on-demand fallback or a "
            "longer capacity wait"
        )
    return out


def _own_fronts(t: _Table) -> NDArray[np.int64]:
    """Rows on their own candidate's frontier of (hours, cost) or (p90 hours, p90 cost)."""
    finite = np.flatnonzero(np.isfinite(t.cost) & np.isfinite(t.hours))
    keep: list[NDArray[np.int64]] = []
    order = finite[np.argsort(t.cand[finite], kind="stable")]
    bounds = np.flatnonzero(np.diff(t.cand[order])) + 1
    for group in np.split(order, bounds):
        if group.size == 0:
            continue
        keep.append(group[pareto_front(t.hours[group], t.cost[group])])
        keep.append(group[pareto_front(t.hours_p90[group], t.cost_p90[group])])
    if not keep:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate(keep))


def _feasible(t: _Table, opts: SearchOptions) -> int:
    """Configurations within the budget and deadline (closed form for the unpriced ones)."""
    return int(_within(t, np.isfinite(t.cost) & np.isfinite(t.hours), opts).sum())


def _within(t: _Table, finite: NDArray[np.bool_], opts: SearchOptions) -> NDArray[np.bool_]:
    """The ``finite`` rows whose p90 cost and time fit the budget and deadline."""
    ok = finite.copy()
    if opts.budget_usd is not None:
        ok &= t.cost_p90 <= opts.budget_usd
    if opts.deadline_hours is not None:
        ok &= t.hours_p90 <= opts.deadline_hours
    return ok


def _capacity_wait(risk: SpotRisk, opts: SearchOptions) -> float:
    if opts.capacity_wait_s is not None:
        return opts.capacity_wait_s
    return spotplan.default_capacity_wait_s(risk)


@dataclass(frozen=True)
class _SpotView:
    """What the Monte-Carlo needs of one row: its risk, prices per node and billing."""

    risk: SpotRisk
    usd_per_hour: float
    on_demand_usd_per_hour: float | None
    billing_min_s: float
    billing_increment_s: float


def _spot_view(
    i: int,
    t: _Table,
    cands: list[Candidate],
    by_key: dict[tuple[str, str, str], Candidate],
) -> _SpotView | None:
    """A single-type spot row, or a mix with a spot group (priced with its riskiest group's
    model for every node and the mean price per node: conservative). None: on demand."""
    if t.cand[i] >= 0:
        c = cands[int(t.cand[i])]
        if c.risk is None:
            return None
        return _SpotView(
            c.risk,
            c.offer.usd_per_hour,
            c.on_demand_usd_per_hour,
            c.billing_min_s,
            c.billing_increment_s,
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
    return _SpotView(
        replace(worst.risk, source=f"{worst.risk.source}; a mix: the riskier group's model"),
        sum(g.usd_per_hour * g.nodes for g in mix.groups) / nodes,
        None
        if any(x is None for x in od)
        else sum((x or 0.0) * g.nodes for x, g in zip(od, mix.groups, strict=True)) / nodes,
        worst.billing_min_s,
        worst.billing_increment_s,
    )


def _refine(
    t: _Table,
    rows: NDArray[np.int64],
    cands: list[Candidate],
    opts: SearchOptions,
    checkpoint_s: float,
) -> bool:
    """Price the spot rows among ``rows`` by Monte-Carlo (in place); False when every one of
    them was priced already."""
    views: dict[int, _SpotView] = {}
    # a mix's groups, found by (type, market, zone) among the candidates
    by_key: dict[tuple[str, str, str], Candidate] = {
        (c.offer.instance_type, c.offer.market, c.offer.zone): c for c in cands
    }
    for i in dict.fromkeys(rows.tolist()):
        if int(i) not in t.spot:
            v = _spot_view(int(i), t, cands, by_key)
            if v is not None:
                views[int(i)] = v
    if not views:
        return False
    todo = list(views)
    o = opts.overheads
    policies = [
        RecoveryPolicy(
            restart_s=o.restart_s,
            provisioning_s=o.provisioning_s,
            checkpoint_interval_s=float(t.tau[i]),
            checkpoint_s=checkpoint_s,
            capacity_wait_s=_capacity_wait(views[i].risk, opts),
            allow_on_demand=opts.allow_on_demand and views[i].on_demand_usd_per_hour is not None,
        )
        for i in todo
    ]
    ix = np.array(todo, dtype=np.int64)
    vs = [views[i] for i in todo]
    price = np.array([v.usd_per_hour for v in vs])
    od = np.array([v.on_demand_usd_per_hour or v.usd_per_hour for v in vs])
    bill_min = np.array([v.billing_min_s for v in vs])
    bill_inc = np.array([v.billing_increment_s for v in vs])
    work = np.ceil(t.samples[ix] / t.batch[ix]) * t.step[ix]
    priced = spotplan.simulate_rows(
        work_s=work,
        nodes=t.nodes[ix],
        risks=[v.risk for v in vs],
        policies=policies,
        usd_per_hour=price,
        usd_per_hour_on_demand=od,
        log_sigma=t.sigma[ix],
        billing_min_s=bill_min,
        billing_increment_s=bill_inc,
        runs=opts.spot_runs,
        seed=opts.seed,
    )
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
    for j, v in enumerate(vs):
        if v.on_demand_usd_per_hour is not None:
            priced[j] = replace(
                priced[j],
                on_demand_hours=float(od_tc.hours[j]),
                on_demand_cost_usd=float(od_tc.cost_usd[j]),
            )
    names = ("hours", "hours_p90", "cost", "cost_p90")
    closed = {n: getattr(t, n)[ix].copy() for n in names}
    for i, r in zip(todo, priced, strict=True):
        t.hours[i], t.hours_p90[i] = r.hours, r.hours_p90
        t.cost[i], t.cost_p90[i] = r.cost_usd, r.cost_p90_usd
        t.preempt[i] = r.losses
        t.spot[i] = r
    # spot rows: a single type with a spot model, or a mix with a spot group (without the mixes,
    # each round would bring the next optimistic closed-form mix into view: many rounds)
    flags = np.array([c.risk is not None for c in cands] + [False])
    mix_spot = np.array([any(g.market == "spot" for g in m.groups) for m in t.mixes] + [False])
    is_spot = np.where(
        t.cand >= 0,
        flags[np.clip(t.cand, 0, len(cands))],
        mix_spot[np.clip(-1 - t.cand, 0, len(t.mixes))],
    )
    _carry_ratios(t, ix, closed, is_spot)
    return True


def _carry_ratios(
    t: _Table, ix: NDArray[np.int64], closed: dict[str, Array], is_spot: NDArray[np.bool_]
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
    for c in np.unique(t.cand[ix]):
        mine = t.cand[ix] == c
        rows = np.flatnonzero((t.cand == c) & ~priced)
        done.append(int(c))
        for name, r in ratios.items():
            k = float(np.nanmedian(r[mine])) if np.isfinite(r[mine]).any() else math.nan
            if rows.size and math.isfinite(k) and k > 0:
                getattr(t, name)[rows] *= k
    others = ~priced & ~np.isin(t.cand, done) & is_spot
    if others.any():
        for name, r in ratios.items():
            k = float(np.nanmedian(r)) if np.isfinite(r).any() else math.nan
            if math.isfinite(k) and k > 0:
                getattr(t, name)[others] *= k


def _mix_allowed(m: MixCandidate, opts: SearchOptions) -> bool:
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


@dataclass(frozen=True)
class _Table:
    cand: NDArray[np.int64]  # candidate index; -1 - j for mix j
    nodes: Array
    batch: Array
    local: Array
    accum: Array
    step: Array
    sigma: Array
    samples: Array
    hours: Array
    hours_p90: Array
    cost: Array
    cost_p90: Array
    preempt: Array
    tau: Array
    mixes: tuple[MixCandidate, ...] = ()
    spot: dict[int, spotplan.SpotPricing] = field(default_factory=dict)  # Monte-Carlo rows

    @staticmethod
    def from_pool(pool: _Pool) -> _Table:
        def tc(name: str) -> Array:
            return np.concatenate([getattr(t, name) for t in pool.tc]) if pool.tc else np.zeros(0)

        cand = np.concatenate(pool.cand) if pool.cand else np.zeros(0, dtype=np.int64)
        return _Table(
            cand,
            pool.cat("nodes"),
            pool.cat("batch"),
            pool.cat("local"),
            pool.cat("accum"),
            pool.cat("step"),
            pool.cat("sigma"),
            pool.cat("samples"),
            tc("hours"),
            tc("hours_p90"),
            tc("cost_usd"),
            tc("cost_p90_usd"),
            tc("preemptions"),
            tc("checkpoint_interval_s"),
        )

    def take(self, rows: NDArray[np.int64]) -> _Table:
        arrays = {
            f: getattr(self, f)[rows]
            for f in self.__dataclass_fields__
            if f not in ("mixes", "spot")
        }
        return _Table(**arrays, mixes=self.mixes)

    def best_per_candidate(self) -> dict[int, float]:
        """Cheapest expected cost reached by each single-type candidate."""
        finite = np.isfinite(self.cost) & (self.cand >= 0)
        if not finite.any():
            return {}
        best = np.full(int(self.cand[finite].max()) + 1, np.inf)
        np.minimum.at(best, self.cand[finite], self.cost[finite])
        return {i: float(c) for i, c in enumerate(best) if np.isfinite(c)}

    def with_mixes(self, mixes: list[MixCandidate]) -> _Table:
        if not mixes:
            return self
        m = mixes
        extra = {
            "cand": np.array([-1 - j for j in range(len(m))], dtype=np.int64),
            "nodes": np.array([x.nodes for x in m], dtype=float),
            "batch": np.array([x.global_batch for x in m], dtype=float),
            "local": np.array([x.local_batches[0] for x in m], dtype=float),
            "accum": np.array([x.accum for x in m], dtype=float),
            "step": np.array([x.step_time for x in m]),
            "sigma": np.array([x.log_sigma for x in m]),
            "samples": np.array([x.samples for x in m]),
            "hours": np.array([x.tc.hours for x in m]),
            "hours_p90": np.array([x.tc.hours_p90 for x in m]),
            "cost": np.array([x.tc.cost_usd for x in m]),
            "cost_p90": np.array([x.tc.cost_p90_usd for x in m]),
            "preempt": np.array([x.tc.preemptions for x in m]),
            "tau": np.array([x.tc.checkpoint_interval_s for x in m]),
        }
        fields_: dict[str, Any] = {
            k: np.concatenate([getattr(self, k), v]) for k, v in extra.items()
        }
        return _Table(**fields_, mixes=tuple(m), spot=dict(self.spot))


def pareto_front(hours: Array, cost: Array) -> NDArray[np.int64]:
    """Indices of the non-dominated points (less time or less cost), fastest first."""
    if len(hours) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((cost, hours))
    sorted_cost = cost[order]
    best_before = np.concatenate([[np.inf], np.minimum.accumulate(sorted_cost)[:-1]])
    front: NDArray[np.int64] = order[sorted_cost < best_before].astype(np.int64)
    return front


def merge_near_times(hours: Array, tol: float) -> NDArray[np.int64]:
    """Positions kept from a frontier (fastest first, cost falling) after merging points whose
    time is within ``tol`` of their group's fastest: the last, i.e. the cheapest, of each group."""
    keep: list[int] = []
    i, n = 0, len(hours)
    while i < n:
        j = i
        while j + 1 < n and hours[j + 1] <= hours[i] * (1.0 + tol):
            j += 1
        keep.append(j)
        i = j + 1
    return np.array(keep, dtype=np.int64)


def cheapest_of_fastest(
    hours: Array, cost: Array, tol: float
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(the rows within ``tol`` of the fastest time, cheapest first; the others, fastest first)."""
    order = np.lexsort((cost, hours))
    tied = hours[order] <= hours[order[0]] * (1.0 + tol)
    head = order[tied]
    head = head[np.argsort(cost[head], kind="stable")]
    return head.astype(np.int64), order[~tied].astype(np.int64)


def knee_index(hours: Array, cost: Array) -> int:
    """The frontier point with the smallest time x cost: going faster from it costs more than
    one percent of money for each percent of time saved, and going cheaper loses more time
    than it saves money. It depends on neither unit nor the frontier's ends (a knee measured
    against the chord between the ends moved to a plan ten times dearer when one slow, cheap
    end left the frontier). Ties go to the cheaper point."""
    score = np.log(hours) + np.log(cost)
    best = np.flatnonzero(score <= score.min() + 1e-9)
    return int(best[np.argmin(cost[best])])


def _choose(
    t: _Table,
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
        ranked = _rank(t, finite, opts)
        if ranked is None:
            # the Monte-Carlo prices of the best rows may still fit: price them, look again
            near = np.flatnonzero(finite)
            best = near[np.lexsort((t.cost_p90[near], t.hours_p90[near]))][: 2 * opts.top]
            cheap = near[np.lexsort((t.hours_p90[near], t.cost_p90[near]))][: 2 * opts.top]
            if refine is not None and refine(np.concatenate([best, cheap])):
                continue
            break
        ok, front, order = ranked
        shown = np.concatenate([front, _distinct_first(order, t, cands, opts.top)])
        if refine is None or attempt == rounds - 1 or not refine(shown):
            break
    if ranked is None:
        raise InfeasibleError(*_infeasible_message(t, finite, opts))
    rows = _top_distinct(order, t, cands, workload, opts.top)
    chosen = rows[0]
    frontier = tuple(_row(int(i), t, cands, workload) for i in front)
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
    all_notes.extend(_spot_notes(chosen))
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
        reason=_reason(chosen, frontier, opts, len(grid)),
        considered=len(t.cost),
        feasible=int(ok.sum()),
        notes=tuple(all_notes),
        uncertainty=_uncertainty(chosen, workload),
        tie_tolerance=opts.tie_tolerance,
        order=order_text(opts),
    )


def t_max_nodes(cands: list[Candidate]) -> int:
    return max(c.pred.params.max_nodes_measured for c in cands)


def _knee_score(h: Array, c: Array) -> Array:
    """Lower is nearer the knee: log(time x cost)."""
    out: Array = np.log(h) + np.log(c)
    return out


def _rank(
    t: _Table, finite: NDArray[np.bool_], opts: SearchOptions
) -> tuple[NDArray[np.bool_], NDArray[np.int64], NDArray[np.int64]] | None:
    """(rows within the budget and deadline, their frontier, their objective order)."""
    ok = _within(t, finite, opts)
    if not ok.any():
        return None
    idx = np.flatnonzero(ok)
    front = idx[pareto_front(t.hours[idx], t.cost[idx])]
    tol = opts.tie_tolerance
    if opts.objective == "cost":
        order = idx[np.lexsort((t.hours[idx], t.cost[idx]))]
    elif opts.objective == "time":
        head, rest = cheapest_of_fastest(t.hours[idx], t.cost[idx], tol)
        order = idx[np.concatenate([head, rest])]
    else:
        merged = front[merge_near_times(t.hours[front], tol)]
        knee = merged[knee_index(t.hours[merged], t.cost[merged])]
        score = _knee_score(t.hours[idx], t.cost[idx])
        order = np.concatenate([[knee], idx[np.argsort(score, kind="stable")]])
    return ok, front, order


def _key(i: int, t: _Table, cands: list[Candidate]) -> tuple[str, str, str]:
    if t.cand[i] >= 0:
        o = cands[int(t.cand[i])].offer
        return (o.cloud, o.instance_type, o.market)
    mix = t.mixes[-1 - int(t.cand[i])]
    return (mix.cloud, "+".join(g.instance_type for g in mix.groups), "mixed")


def _distinct_first(
    order: NDArray[np.int64], t: _Table, cands: list[Candidate], n: int
) -> NDArray[np.int64]:
    """The first row of each (cloud, type, market) in ``order``, up to ``n`` of them."""
    seen: set[tuple[str, str, str]] = set()
    out: list[int] = []
    for i in order:
        k = _key(int(i), t, cands)
        if k not in seen:
            seen.add(k)
            out.append(int(i))
            if len(out) >= n:
                break
    return np.array(out, dtype=np.int64)


def _top_distinct(
    order: NDArray[np.int64], t: _Table, cands: list[Candidate], workload: Workload, top: int
) -> list[PlanRow]:
    """The best configuration of each (cloud, instance type(s), market), in objective order."""
    seen: set[tuple[str, str, str]] = set()
    rows: list[PlanRow] = []
    for i in order:
        row = _row(int(i), t, cands, workload)
        key = (row.cloud, row.instance_type, row.market)
        if key in seen:
            continue
        seen.add(key)
        rows.append(row)
        if len(rows) >= top:
            break
    return rows


def _row(i: int, t: _Table, cands: list[Candidate], workload: Workload) -> PlanRow:
    step = float(t.step[i])
    batch = int(t.batch[i])
    # t.sigma is the time's: the step time's and the GNS forecast's (of this batch) together
    forecast = float(efficiency.log_sigma(workload.gns, workload.base_batch, [batch])[0])
    sigma = math.sqrt(max(float(t.sigma[i]) ** 2 - forecast**2, 0.0))
    samples = float(t.samples[i])
    eff = workload.samples_at_base / samples if samples > 0 else 0.0
    if t.cand[i] >= 0:
        c = cands[int(t.cand[i])]
        nodes = int(t.nodes[i])
        groups: tuple[Group, ...] = (
            Group(
                c.offer.instance_type,
                c.offer.market,
                c.offer.zone,
                nodes,
                c.inst.gpu_count,
                c.inst.gpu,
                int(t.local[i]),
                c.offer.usd_per_hour,
            ),
        )
        cloud: str = c.offer.cloud
        region, zone = c.offer.region, c.offer.zone
        zone_type: str = c.offer.zone_type
        market: str = c.offer.market
        itype, gpu = c.offer.instance_type, c.inst.gpu
        price = c.offer.usd_per_hour * nodes
        workers = nodes * c.inst.gpu_count
    else:
        mix = t.mixes[-1 - int(t.cand[i])]
        groups = mix.groups
        cloud, region, zone = mix.cloud, mix.region, groups[0].zone
        zone_type = "availability-zone"
        types = {c.offer.zone: c.offer.zone_type for c in cands if c.offer.cloud == cloud}
        opt_in = [g.zone for g in groups if types.get(g.zone, "availability-zone") != zone_type]
        zone = opt_in[0] if opt_in else zone  # a mix shows its opt-in zone, if it has one
        zone_type = types[zone] if opt_in else zone_type
        itype = "+".join(g.instance_type for g in groups)
        markets = {g.market for g in groups}
        market = markets.pop() if len(markets) == 1 else "mixed"
        gpu = "+".join(dict.fromkeys(g.gpu for g in groups))
        price = sum(g.usd_per_hour * g.nodes for g in groups)
        nodes = sum(g.nodes for g in groups)
        workers = sum(g.nodes * g.gpus_per_node for g in groups)
    return PlanRow(
        cloud=cloud,
        region=region,
        zone=zone,
        instance_type=itype,
        market=market,
        nodes=nodes,
        workers=workers,
        local_batch=int(groups[0].local_batch),
        accum_steps=int(t.accum[i]),
        global_batch=batch,
        step_time_s=step,
        step_time_p90_s=step * math.exp(costs.Z90 * sigma),
        steps=math.ceil(samples / batch),
        samples=samples,
        statistical_efficiency=min(1.0, eff),
        throughput_samples_s=batch / step,
        hours=float(t.hours[i]),
        hours_p90=float(t.hours_p90[i]),
        cost_usd=float(t.cost[i]),
        cost_p90_usd=float(t.cost_p90[i]),
        usd_per_hour=price,
        expected_preemptions=float(t.preempt[i]),
        checkpoint_interval_s=float(t.tau[i]),
        groups=groups,
        gpu=gpu,
        zone_type=zone_type,
        forecast_log_sigma=forecast,
        terms=perfmodel.term_sources(workload.params, gpu=gpu, nodes=nodes, workers=workers),
        spot=_spot_terms(t.spot.get(i), market),
        **_compression_fields(cands[int(t.cand[i])] if t.cand[i] >= 0 else None, t, i, workload),
    )


def _compression_fields(
    c: Candidate | None, t: _Table, i: int, workload: Workload
) -> dict[str, Any]:
    """The row's compression and why (its price against dense on the same configuration)."""
    if c is None or c.compression == "none":
        return {}
    p = c.pred.params
    nodes = int(t.nodes[i])
    comp = compression.parse(c.compression)
    inputs = compression.variant_inputs(
        comp, workload, p.gradient_bytes or workload.gradient_bytes, c.pred.codec_factor
    )
    options = [
        compression.price(
            p,
            cc,
            shapes,
            nodes,
            nodes * c.inst.gpu_count,
            int(t.local[i]),
            int(t.accum[i]),
            stat=c.compression_stat,
            codec_s=codec,
            forward_share=workload.forward_share,
        )
        for cc, shapes, codec in inputs
    ]
    # auto: the faster of AR and AG, as in the grid
    priced = replace(min(options, key=lambda o: o.step_s), compression=comp.spec())
    return {"compression": c.compression, "compression_why": priced.why()}


def _spot_terms(s: spotplan.SpotPricing | None, market: str) -> SpotTerms:
    if s is None:
        return SpotTerms("closed form" if market != "on-demand" else "on demand: no preemptions")
    return SpotTerms(
        basis=f"Monte-Carlo, {s.runs} runs of the spot model",
        fail_prob=s.fail_prob,
        model=s.source,
        on_demand_cost_usd=s.on_demand_cost_usd,
        on_demand_hours=s.on_demand_hours,
        recovery=s.policy,
    )


def _infeasible_message(t: _Table, finite: NDArray[np.bool_], o: SearchOptions) -> tuple[str, str]:
    cheapest = float(np.min(t.cost_p90[finite]))
    fastest = float(np.min(t.hours_p90[finite]))
    parts = []
    if o.budget_usd is not None:
        parts.append(f"budget {fmt.money(o.budget_usd)}")
    if o.deadline_hours is not None:
        parts.append(f"deadline {o.deadline_hours:g} h")
    hint = (
        f"the cheapest plan costs {fmt.money(cheapest)} (p90) and the fastest takes "
        f"{fmt.duration(fastest)} (p90); raise --budget or --deadline"
    )
    if o.budget_usd is not None and o.deadline_hours is not None:
        hint += ", or drop one of them"
    return f"no plan meets the {' and '.join(parts)}", hint


def order_text(o: SearchOptions) -> str:
    """How the plans are ordered, in one line."""
    tol = fmt.percent(o.tie_tolerance)
    if o.objective == "cost":
        return "cheapest first (expected cost)"
    if o.objective == "time":
        return f"fastest first; times within {tol} of the fastest tie and go cheapest first"
    return "knee first, then by time x cost (smallest first)"


def where(r: PlanRow) -> str:
    """The region, and the zone when it is an opt-in one (AWS Local or Wavelength Zone)."""
    if r.zone_type == "local-zone":
        return f"{r.region}, Local Zone {r.zone}"
    if r.zone_type == "wavelength-zone":
        return f"{r.region}, Wavelength Zone {r.zone}"
    return r.region


def _reason(chosen: PlanRow, frontier: tuple[PlanRow, ...], o: SearchOptions, nb: int) -> str:
    what = (
        f"{chosen.nodes} x {chosen.instance_type} ({chosen.market}, {where(chosen)}), "
        f"global batch {chosen.global_batch}"
    )
    tol = fmt.percent(o.tie_tolerance)
    limits = []
    if o.budget_usd is not None:
        limits.append(f"p90 cost within {fmt.money(o.budget_usd)}")
    if o.deadline_hours is not None:
        limits.append(f"p90 time within {o.deadline_hours:g} h")
    within = f" with {' and '.join(limits)}" if limits else ""
    if o.objective == "cost":
        head = f"cheapest plan{within}"
    elif o.objective == "time":
        head = f"fastest plan{within} (within {tol} of the fastest time; the cheapest of those)"
    else:
        head = (
            f"knee of the time/cost frontier{within} (the smallest time x cost: a faster plan "
            f"costs more in % than it saves in time; times within {tol} of each other merged, "
            "the cheapest of those)"
        )
    fast = min(frontier, key=lambda r: r.hours)
    cheap = min(frontier, key=lambda r: r.cost_usd)
    tail = ""
    if chosen is not fast and fast.hours < chosen.hours:
        a, b = fmt.durations([fast.hours, chosen.hours])
        tail = (
            f"; the fastest plan takes {a} (this one {b}) for {fmt.money(fast.cost_usd)} "
            f"({fast.cost_usd / max(chosen.cost_usd, 1e-9):.1f}x the cost)"
        )
    elif cheap.cost_usd < chosen.cost_usd:
        tail = f"; the cheapest takes {fmt.duration(cheap.hours)} for {fmt.money(cheap.cost_usd)}"
    return f"{head}: {what}{tail}"


def _uncertainty(chosen: PlanRow, workload: Workload) -> str:
    spread = chosen.step_time_p90_s / chosen.step_time_s - 1.0
    basis = "fit residuals"
    if chosen.gpu != workload.ref_gpu.name:
        basis += f", device model ({workload.ref_gpu.name} -> {chosen.gpu})"
    work = ""
    if chosen.forecast_log_sigma > 0.005:
        extra = math.exp(costs.Z90 * chosen.forecast_log_sigma) - 1.0
        work = (
            f"; the samples to train at batch {chosen.global_batch} rest on the GNS forecast "
            f"(its p90 alone is +{extra:.0%}), which the time and cost p90 include"
        )
    return (
        f"step time p90 is +{spread:.0%} over the expected value ({basis}){work}; for spot "
        "plans the p90 time and cost come from a Monte-Carlo of the trace-fitted preemption "
        "model (lifetimes, nodes lost together, capacity outages) with the launcher's recovery "
        "rules"
    )
