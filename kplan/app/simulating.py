"""``kplan simulate`` as a library call: replay a plan against a spot trace.

The plan's chosen row (or ``--row N`` of its plans) gives the job: nodes, training seconds
(steps x step time), prices and the recovery rules it was priced with. The trace gives when the
cloud granted and preempted spot nodes. Each replay starts at a random time of the trace and
follows the launcher's rules (``spotsim.replay``; a start in a capacity outage moves to when
the pool has the plan's nodes again); the distribution of time and cost is set
against the plan's own prediction, both with and without the step-time error (a replay runs
the expected step time, so its fair comparison is the plan's spot-only prediction, made by the
same Monte-Carlo with the step time held at its expected value).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import DataFileError, InputError
from kplan.planner.catalog import Catalog
from kplan.planner.plan import Plan, unbounded_as_null
from kplan.planner.spot import RecoveryPolicy, SpotModel, SpotRisk
from kplan.planner.spottrace import SpotTrace

if TYPE_CHECKING:
    from kplan.planner.spotsim import ReplayOutcome

FORMATS = ("auto", "kplan", "bamboo", "gcp-counts")
EXAMPLE_TRACES = ("p3", "g4dn")  # shipped: kplan/planner/traces/<name>.csv (Bamboo, MIT)


@dataclass(frozen=True)
class Figures:
    """A run's mean and p90 time and cost (the plan's own, or a prediction's)."""

    hours: float
    hours_p90: float
    cost_usd: float
    cost_p90_usd: float


@dataclass(frozen=True)
class Spread(Figures):
    """The median (``hours``, ``cost_usd``) and p90 of one distribution of runs, never a p90
    below its central value, with the mean beside them; ``heavy_tail`` when rare long runs (a
    preemption of a short job) put a mean above its p90."""

    hours_mean: float
    cost_mean_usd: float
    heavy_tail: bool


@dataclass(frozen=True)
class SpotOnly(Spread):
    """The plan's Monte-Carlo with the step time held at its expected value."""

    losses: float
    fail_prob: float


@dataclass(frozen=True)
class Replayed(Spread):
    """The finished replays: their time and cost, and the shares above the predictions' p90."""

    losses: float
    above_plan_hours_p90: float
    above_plan_cost_p90: float
    above_spot_only_hours_p90: float | None = None  # with a spot-only prediction
    above_spot_only_cost_p90: float | None = None
    met_deadline: float | None = None  # share of replays that ended by the plan's deadline


@dataclass(frozen=True)
class MovePrice:
    """What moving from one pool to another costs, and how long the first must be dry first."""

    from_pool: str
    to_pool: str
    kind: str  # zone or inter-region
    usd_per_gb: float
    egress_usd: float
    copy_s: float
    # the dry spell's length after which the move pays when every node pays on demand (or
    # stalls without a fallback); None: never (on demand here no dearer than spot there)
    break_even_s: float | None


@dataclass(frozen=True)
class Moves:
    """The replays with moves against the same starts staying in the first pool (both over the
    replays that finished inside every trace)."""

    pools: tuple[str, ...]
    checkpoint_gb: float
    copy_gbps: float
    prices: tuple[MovePrice, ...]
    moves_mean: float  # moves per replay
    moved: float  # share of replays that moved at least once
    egress_usd_mean: float
    stay_hours: float  # median
    stay_cost_usd: float
    stay_hours_mean: float
    stay_cost_mean_usd: float
    stay_failed: int
    cost_vs_stay: float  # mean cost with moves / mean cost staying
    hours_vs_stay: float
    stay_met_deadline: float | None = None


@dataclass(frozen=True)
class Replay:
    """``kplan simulate``'s answer: the replays of a plan against a trace (``--json`` prints
    :meth:`to_dict`: the optional parts only where they apply)."""

    job: str
    trace: str
    trace_source: str
    trace_hours: float
    runs: int
    truncated: int  # replays that ran past the trace's end (left out)
    failed: int
    notes: tuple[str, ...]
    plan: Figures
    replayed: Replayed | None  # None: no replay finished inside the trace
    samples_hours: tuple[float, ...] | None = None  # each finished replay's, when asked
    samples_cost_usd: tuple[float, ...] | None = None
    spot_only: SpotOnly | None = None
    moves: Moves | None = None  # several pools: the moves, against staying in the first

    def to_dict(self) -> dict[str, Any]:
        doc = {f: getattr(self, f) for f in _REPLAY_KEYS}
        doc["notes"] = list(self.notes)
        doc["plan"] = unbounded_as_null(asdict(self.plan))
        if self.replayed is not None:
            doc["replayed"] = {k: v for k, v in asdict(self.replayed).items() if v is not None}
        if self.samples_hours is not None and self.samples_cost_usd is not None:
            doc["samples"] = {
                "hours": list(self.samples_hours),
                "cost_usd": list(self.samples_cost_usd),
            }
        if self.spot_only is not None:
            doc["spot_only"] = asdict(self.spot_only)
        if self.moves is not None:
            doc["moves"] = asdict(self.moves)
        return doc


_REPLAY_KEYS = ("job", "trace", "trace_source", "trace_hours", "runs", "truncated", "failed")


def example_trace(name: str) -> SpotTrace:
    """A shipped trace: the Bamboo EC2 p3 or g4dn spot autoscaling group (11 h each)."""
    from importlib import resources

    from kplan.catalogs.spot_traces import read_trace

    if name not in EXAMPLE_TRACES:
        raise InputError(
            f"unknown example trace {name!r}", hint=f"use one of {', '.join(EXAMPLE_TRACES)}"
        )
    ref = resources.files("kplan.planner").joinpath("traces", f"{name}.csv")
    with resources.as_file(ref) as path:
        return read_trace(path)


MAX_RUNS = 100_000
# A replay sorts the nodes alive at its start (Python) and makes a few vectorised passes over
# the trace: its work is about (nodes alive at once + events / 100) per run. Runs x that is at
# most 5,000,000 (a few CPU seconds; the shared traces: 80 nodes, 1,116 events at most).
MAX_REPLAY_WORK = 5_000_000


def load_trace(path: Path, fmt: str = "auto") -> SpotTrace:
    """A trace in kplan's format, a Bamboo autoscaling-group CSV or GCP running-VM counts."""
    from kplan.catalogs import spot_traces

    if fmt not in FORMATS:
        raise InputError(f"unknown trace format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = _sniff(path)
    if fmt == "bamboo":
        return spot_traces.from_bamboo_csv(path)
    if fmt == "gcp-counts":
        return spot_traces.from_gcp_counts(path)
    return spot_traces.read_trace(path)


def _sniff(path: Path) -> str:
    from kplan.core.files import read_user_text

    head = read_user_text(path, "spot trace")[:4096]
    lines = [ln.strip() for ln in head.splitlines() if ln.strip() and not ln.startswith("#")]
    first = lines[0] if lines else ""
    if first.replace(" ", "").startswith("time_s,"):
        return "kplan"
    parts = [p.strip() for p in first.split(",")]
    if len(parts) == 3 and parts[1] in ("add", "remove"):
        return "bamboo"
    if len(parts) == 3 and "-" in parts[0] and ":" in parts[1]:
        return "gcp-counts"
    raise DataFileError(
        f"{path}: not a spot trace kplan knows (first line {first[:60]!r})",
        hint="see docs/spot_traces.md for the format, or give --format",
    )


@dataclass(frozen=True)
class Job:
    """What the replay needs of a plan row."""

    label: str
    nodes: int
    work_s: float
    usd_per_hour: float  # per node (the mean over a mix's groups)
    usd_per_hour_on_demand: float
    policy: RecoveryPolicy
    hours: float
    hours_p90: float
    cost_usd: float
    cost_p90_usd: float
    log_sigma: float
    billing_min_s: float
    billing_increment_s: float
    notes: tuple[str, ...]

    @property
    def horizon_s(self) -> float:
        """How much of a trace a replay may need after its start: 1.5 x the p90 time; where the
        p90 has no bound (runs in busy enough markets never end), 3 x the median: the replays
        that reach the trace's end are counted as truncated."""
        span = self.hours_p90 if math.isfinite(self.hours_p90) else 2.0 * self.hours
        return span * 3600.0 * 1.5

    def replay_on(self, trace: SpotTrace, starts: list[float], seed: int) -> list[ReplayOutcome]:
        """This job replayed with the launcher's rules from each of ``starts`` on ``trace``."""
        from kplan.planner import spotsim

        return spotsim.replay_many(
            trace,
            starts,
            nodes=self.nodes,
            work_s=self.work_s,
            policy=self.policy,
            usd_per_hour=self.usd_per_hour,
            usd_per_hour_on_demand=self.usd_per_hour_on_demand,
            billing_min_s=self.billing_min_s,
            billing_increment_s=self.billing_increment_s,
            seed=seed,
        )


def job_from_plan(plan: Plan, row: int | None = None, catalog: Catalog | None = None) -> Job:
    """The chosen row (or ``plans[row]``) as a job to replay, checked against the plan's catalog
    (``kplan/app/plan_files.py``: the one the plan was priced with, else the user's)."""
    from kplan.app.plan_files import checked_row, plan_catalog
    from kplan.planner.costs import Z90

    catalog = catalog or plan_catalog(plan)
    r = checked_row(plan, "the plan", row, catalog)
    if r.market == "on-demand":
        raise InputError(
            "the plan runs on demand: there are no preemptions to replay",
            hint="plan with --spot (kplan estimate --spot --out plan.json)",
        )
    notes: list[str] = []
    policy = r.spot.recovery
    if policy is None:
        policy = RecoveryPolicy(checkpoint_interval_s=r.checkpoint_interval_s or 1800.0)
        notes.append(
            "the plan predates recovery rules: replayed with the launcher's defaults "
            f"(checkpoint every {policy.checkpoint_interval_s:.0f} s)"
        )
    step, step90 = r.step_time_s, r.step_time_p90_s
    sigma = math.log(step90 / step) / Z90 if step90 > step else 0.0
    # the work's spread: the step time's and the GNS forecast's, as the search priced it
    sigma = math.hypot(sigma, r.forecast_log_sigma)
    total = 0.0
    for g in r.groups:
        offers = [
            o.usd_per_hour
            for o in catalog.offers
            if o.cloud == r.cloud
            and o.region == r.region
            and o.instance_type == g.instance_type
            and o.market == "on-demand"
        ]
        total += (min(offers) if offers else g.usd_per_hour) * g.nodes
    bill = catalog.billing.get(r.cloud)
    return Job(
        label=f"{r.nodes} x {r.instance_type} ({r.market}, {r.region})",
        nodes=r.nodes,
        work_s=r.steps * step,
        usd_per_hour=r.usd_per_hour / r.nodes,
        usd_per_hour_on_demand=total / r.nodes,
        policy=policy,
        hours=r.hours,
        hours_p90=r.hours_p90,
        cost_usd=r.cost_usd,
        cost_p90_usd=r.cost_p90_usd,
        log_sigma=sigma,
        billing_min_s=bill.minimum_s if bill else 60.0,
        billing_increment_s=bill.increment_s if bill else 1.0,
        notes=tuple(notes),
    )


def spot_only_prediction(job: Job, risk: SpotRisk, *, runs: int, seed: int) -> SpotOnly:
    """The plan's Monte-Carlo with the step time held at its expected value."""
    from kplan.planner import spotsim

    res = spotsim.simulate(
        work_s=job.work_s,
        nodes=job.nodes,
        risks=[risk],
        policies=[job.policy],
        usd_per_hour=job.usd_per_hour,
        usd_per_hour_on_demand=job.usd_per_hour_on_demand,
        log_sigma=0.0,
        runs=runs,
        seed=seed,
        billing_min_s=job.billing_min_s,
        billing_increment_s=job.billing_increment_s,
    )
    return SpotOnly(
        **asdict(central_and_p90(res.samples.hours[0], res.samples.cost_usd[0])),
        losses=float(res.losses_mean[0]),
        fail_prob=float(res.fail_prob[0]),
    )


def central_and_p90(hours: NDArray[np.float64], cost: NDArray[np.float64]) -> Spread:
    """The :class:`Spread` of one distribution of runs."""
    hours_p90, cost_p90 = float(np.quantile(hours, 0.9)), float(np.quantile(cost, 0.9))
    hours_mean, cost_mean = float(hours.mean()), float(cost.mean())
    return Spread(
        hours=float(np.median(hours)),
        hours_p90=hours_p90,
        cost_usd=float(np.median(cost)),
        cost_p90_usd=cost_p90,
        hours_mean=hours_mean,
        cost_mean_usd=cost_mean,
        heavy_tail=hours_mean > hours_p90 or cost_mean > cost_p90,
    )


def replay_plan(
    job: Job,
    trace: SpotTrace,
    *,
    runs: int,
    seed: int,
    risk: SpotRisk | None = None,
    samples: bool = False,
) -> Replay:
    """Replay ``job`` from ``runs`` random starts of ``trace``; the distribution against the
    plan (and, given the plan's ``risk``, against its spot-only prediction)."""

    if not 1 <= runs <= MAX_RUNS:
        raise InputError(f"--runs {runs} must be in 1..{MAX_RUNS}", hint="e.g. --runs 500")
    events = len(trace.times_s)
    alive = int(np.cumsum(trace.kinds.astype(np.int64)).max()) if events else 0
    per_run = alive + events // 100 + 1
    if runs * per_run > MAX_REPLAY_WORK:
        raise InputError(
            f"--runs {runs} on a trace of {events:,} events with up to {alive:,} nodes alive "
            f"at once is more replay work than the bound ({MAX_REPLAY_WORK:,})",
            hint=f"use --runs {max(MAX_REPLAY_WORK // per_run, 1)} or fewer, or a shorter trace",
        )
    horizon = job.horizon_s
    if trace.end_s <= 0 or horizon >= trace.end_s:
        raise InputError(
            f"the trace spans {trace.end_s / 3600:.1f} h; a replay of the plan needs "
            f"{horizon / 3600:.1f} h of it (1.5 x its p90 time, or 3 x its median where the p90 "
            "has no bound)",
            hint="replay a longer trace, or a shorter job (kplan estimate --epochs)",
        )
    rng = np.random.default_rng(seed)
    starts = [
        trace.first_with(job.nodes, float(t))  # a replay starts when its nodes can be had
        for t in rng.uniform(0.0, trace.end_s - horizon, size=runs)
    ]
    outs = job.replay_on(trace, starts, seed)
    out, hours, cost = distribution(job, trace, outs, samples)
    if risk is None:
        return out
    pred = spot_only_prediction(job, risk, runs=max(runs, 1000), seed=seed)
    rep = out.replayed
    if rep is not None:
        rep = replace(
            rep,
            above_spot_only_hours_p90=float(np.mean(hours > pred.hours_p90)),
            above_spot_only_cost_p90=float(np.mean(cost > pred.cost_p90_usd)),
        )
    return replace(out, replayed=rep, spot_only=pred)


def distribution(
    job: Job, trace: SpotTrace, outs: list[Any], samples: bool
) -> tuple[Replay, NDArray[np.float64], NDArray[np.float64]]:
    """The replays' time and cost against the plan's, and the finished replays' hours and
    costs."""
    kept = [o for o in outs if not o.truncated]
    hours = np.array([o.hours for o in kept])
    cost = np.array([o.cost_usd for o in kept])
    losses = np.array([o.losses for o in kept], dtype=float)
    replayed = None
    if kept:
        replayed = Replayed(
            **asdict(central_and_p90(hours, cost)),
            losses=float(losses.mean()),
            above_plan_hours_p90=float(np.mean(hours > job.hours_p90)),
            above_plan_cost_p90=float(np.mean(cost > job.cost_p90_usd)),
            met_deadline=None
            if job.policy.deadline_s is None
            else float(np.mean(hours * 3600.0 <= job.policy.deadline_s + 1e-6)),
        )
    out = Replay(
        job=job.label,
        trace=trace.name,
        trace_source=trace.source,
        trace_hours=trace.end_s / 3600.0,
        runs=len(outs),
        truncated=len(outs) - len(kept),
        failed=int(sum(o.failed for o in kept)),
        notes=tuple(job.notes),
        plan=Figures(job.hours, job.hours_p90, job.cost_usd, job.cost_p90_usd),
        replayed=replayed,
        samples_hours=tuple(hours.tolist()) if samples else None,
        samples_cost_usd=tuple(cost.tolist()) if samples else None,
    )
    return out, hours, cost


def plan_risk(
    plan: Plan, row: int | None, model: SpotModel | None = None, catalog: Catalog | None = None
) -> SpotRisk:
    """The spot model row the plan was priced with: as the search takes it (the catalog's spot
    rate where it is more specific than the model's row), and for a mix its riskier group's."""
    from kplan.app.plan_files import plan_catalog
    from kplan.catalogs.spot_model_file import load_spot_model
    from kplan.planner.plan import row_at
    from kplan.planner.spotplan import risk_for

    r, _ = row_at(plan, row, "the plan")
    m = model or load_spot_model()
    catalog = catalog or plan_catalog(plan)
    risks = []
    for g in r.groups:
        try:
            sr = catalog.spot_rate(r.cloud, g.instance_type)
        except KeyError:
            raise DataFileError(
                f"the plan's cloud {r.cloud!r} has no spot rate for {g.instance_type} in the "
                f"catalog {catalog.version}",
                hint="re-create the plan with kplan estimate --out",
            ) from None
        risks.append(risk_for(m, r.cloud, g.instance_type, r.region, sr.per_hour, sr.family))
    return max(risks, key=lambda x: x.rate_per_hour)
