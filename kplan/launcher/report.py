"""``kplan report``: what a job was predicted to cost and take, and what it really did.

Built from the state database (job row, instances, events, ledger) and the runtime's metrics
(``<job>/metrics/*.jsonl`` in the job's storage). Every dollar comes from the ledger: the total
is the database's own sum (``StateDB.spend``, the number ``kplan status`` and the guard use), the
breakdowns are the ledger rows grouped by instance, market and zone. Predictions come from the
plan the job was launched from: a cloud plan (``kplan estimate``, or a search at launch) or a
local plan (``kplan launch --profile`` on this machine, ``kplan/app/local_plan.py``); ``None`` when
the job had none.
"""

from __future__ import annotations

import math
import shlex
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kplan.launcher.metrics_read import Metrics, read_metrics
from kplan.launcher.plainscript import not_measured_note
from kplan.launcher.state import (
    LEDGER_KINDS,
    EventRecord,
    InstanceRecord,
    JobRecord,
    LedgerRow,
    StateDB,
)
from kplan.launcher.storage import Storage

if TYPE_CHECKING:
    from kplan.planner.plan import Plan


@dataclass(frozen=True)
class InstanceSpend:
    instance: str
    node_rank: int
    type: str
    market: str
    zone: str
    usd_per_hour: float
    state: str
    reason: str | None
    start: float
    end: float
    billed_seconds: float
    usd: float
    closed: bool
    on_demand_usd_per_hour: float | None  # the catalog's on-demand price (None: not found)


@dataclass(frozen=True)
class Preemption:
    """A lost instance and what it cost: lost time (work redone plus the wait for the
    replacement) at the cluster's price, and the replacement's billed boot."""

    time: float
    kind: str  # "preempted" or "lost"
    node_rank: int | None
    instance: str | None
    reason: str | None
    work_lost_s: float | None  # since the last checkpoint (launcher's estimate from metrics)
    downtime_s: float | None  # loss seen -> replacement running
    cluster_usd_per_hour: float  # instances billed just before the loss
    lost_usd: float | None  # (work_lost_s + downtime_s) * cluster price
    replacement: str | None
    replacement_boot_s: float | None  # replacement requested -> job recovered
    replacement_boot_usd: float | None


@dataclass(frozen=True)
class Comparison:
    """A counterfactual cost; ``usd`` None with ``note`` saying why."""

    usd: float | None
    savings_usd: float | None  # usd - actual spend (positive: the job was cheaper)
    note: str
    hours: float | None = None
    usd_p90: float | None = None
    config: str | None = None


@dataclass(frozen=True)
class PlanInfo:
    """What the job was planned as, in words."""

    config: str  # e.g. "2 x g4dn.xlarge (spot, us-east-1a), global batch 256 (128 per worker)"
    profile: str | None
    work: str | None  # the work predicted for
    reason: str
    uncertainty: str
    notes: list[str]
    precision: str | None


@dataclass(frozen=True)
class JobReport:
    id: str
    status: str
    reason: str | None
    cloud: str
    region: str
    script: str | None
    command: str  # the training script and its arguments
    workers: int  # in all, at launch
    plan: PlanInfo | None
    created_at: float
    ended_at: float  # last status change (terminal jobs) or now
    budget_usd: float
    deadline_h: float | None
    actual_hours: float  # wall clock, created_at -> ended_at
    total_usd: float  # the ledger's sum (StateDB.spend)
    billed_seconds: float
    predicted_hours: float | None
    predicted_hours_p90: float | None
    predicted_cost_usd: float | None
    predicted_cost_p90_usd: float | None
    predicted_step_s: float | None
    predicted_step_p90_s: float | None
    predicted_steps: int | None
    predicted_train_s: float | None  # steps x step time
    predicted_train_p90_s: float | None
    predicted_start_s: float | None  # local plans: the assumed start (clouds: in the hours)
    actual_start_s: float | None  # job created -> rank 0's first step
    actual_train_s: float | None  # rank 0's first step -> its last
    instances: list[InstanceSpend]
    by_instance: dict[str, float]
    by_market: dict[str, float]
    by_zone: dict[str, float]
    cost_curve: list[tuple[float, float]]  # (unix time, cumulative USD), ends at total_usd
    preemptions: list[Preemption]
    on_demand: Comparison
    naive: Comparison
    metrics: Metrics
    # False: no step record at all (a plain script, or a job that never reached a step);
    # ``metrics.note`` says which, and the views show "not measured" instead of zeros
    measured: bool = True
    # spend by ledger kind (instance, disk, storage, egress: kplan/launcher/ledger.py)
    by_kind: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["metrics"]["local_batch"] = {
            str(k): v for k, v in doc["metrics"]["local_batch"].items()
        }
        return doc


NaivePlanner = Callable[[JobRecord], Comparison]


def build_report(
    db: StateDB,
    job: JobRecord,
    now: float,
    *,
    storage: Storage | None = None,
    storage_note: str = "",
    on_demand_price: Callable[[InstanceRecord], float | None] | None = None,
    naive: NaivePlanner | None = None,
) -> JobReport:
    """The report of ``job``. ``storage`` holds its metrics (None: ``storage_note`` says why);
    ``on_demand_price`` looks up an instance's catalog on-demand price; ``naive`` plans the
    naive alternative (None: not available)."""
    instances = db.instances(job.id)
    ledger = db.ledger(job.id)
    events = db.events(job.id)
    total = db.spend(job.id)
    by_id = {i.id: i for i in instances}
    lookup = on_demand_price or (lambda _inst: None)
    spends = [
        _instance_spend(row, by_id.get(row.instance), lookup)
        for row in ledger
        if row.kind == "instance"
    ]
    plan = stored_plan(job.plan)
    chosen = plan.chosen if plan is not None else None
    metrics = read_metrics(storage, job.id) if storage is not None else Metrics(storage_note)
    script = job.spec.get("script")
    measured = metrics.first_step_time is not None or metrics.steps > 0
    if not measured and storage is not None:  # unreachable storage: its note says so
        note = not_measured_note(script if isinstance(script, str) else None, metrics.note)
        metrics = replace(metrics, note=note)
    end = job.updated_at if job.terminal else now
    step = chosen.step_time_s if chosen else None
    step_p90 = chosen.step_time_p90_s if chosen else None
    steps = chosen.steps if chosen else None
    first, last = metrics.first_step_time, metrics.last_step_time
    local = plan.local if plan is not None else None
    return JobReport(
        id=job.id,
        status=job.status,
        reason=job.reason,
        cloud=job.cloud,
        region=job.region,
        script=script if isinstance(script, str) else None,
        command=_command(job.spec),
        workers=sum(int(n.get("gpus", 1)) for n in job.spec.get("nodes") or ()),
        plan=plan_info(plan),
        created_at=job.created_at,
        ended_at=end,
        budget_usd=job.budget_usd,
        deadline_h=job.deadline_h,
        actual_hours=max(end - job.created_at, 0.0) / 3600.0,
        total_usd=total,
        billed_seconds=math.fsum(r.billed_seconds for r in ledger if r.kind == "instance"),
        predicted_hours=job.predicted_hours,
        predicted_hours_p90=chosen.hours_p90 if chosen else None,
        predicted_cost_usd=job.predicted_cost_usd,
        predicted_cost_p90_usd=job.predicted_cost_p90_usd,
        predicted_step_s=step,
        predicted_step_p90_s=step_p90,
        predicted_steps=steps,
        predicted_train_s=None if step is None or steps is None else step * steps,
        predicted_train_p90_s=None if step_p90 is None or steps is None else step_p90 * steps,
        predicted_start_s=local.start_s if local else None,
        actual_start_s=None if first is None else max(first - job.created_at, 0.0),
        actual_train_s=None if first is None or last is None else last - first,
        instances=spends,
        by_instance=_group(spends, lambda s: s.instance),
        by_market=_group(spends, lambda s: s.market),
        by_zone=_group(spends, lambda s: s.zone),
        cost_curve=cost_curve(ledger),
        preemptions=preemptions(events, instances),
        on_demand=on_demand_comparison(job, spends, total),
        naive=_naive_savings(job, naive(job) if naive is not None else no_naive(job), total),
        metrics=metrics,
        measured=measured,
        by_kind=spend_by_kind(ledger),
    )


def spend_by_kind(ledger: Sequence[LedgerRow]) -> dict[str, float]:
    """USD by ledger kind, instances first, then disk, storage, egress where the job has them."""
    out = {"instance": 0.0}
    for kind in LEDGER_KINDS:
        rows = [r.usd for r in ledger if r.kind == kind]
        if rows:
            out[kind] = math.fsum(rows)
    return out


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _command(spec: dict[str, Any]) -> str:
    script = spec.get("script")
    if not isinstance(script, str):
        return "?"
    args = [str(a) for a in spec.get("args") or ()]
    return shlex.join(["python", script, *args])


def stored_plan(doc: object) -> Plan | None:
    """The plan stored with a job, typed (``Plan.from_dict``; None: none, or one this kplan
    cannot read: the report then shows no prediction)."""
    from kplan.core.errors import KplanError
    from kplan.planner.plan import Plan

    if doc is None:
        return None
    try:
        return Plan.from_dict(doc, "the job's plan")
    except KplanError:
        return None


def plan_info(plan: Plan | None) -> PlanInfo | None:
    """The plan stored with a job, in words (None: no plan)."""
    if plan is None:
        return None
    row = plan.chosen
    parts = [
        f"{g.nodes} x {g.instance_type} ({g.market}, {g.zone}, {g.gpus_per_node} x {g.gpu})"
        for g in row.groups
    ]
    batch = f"global batch {row.global_batch}, {row.local_batch} per worker"
    if row.accum_steps > 1:
        batch += f" x {row.accum_steps} accumulation steps"
    work = plan.local.work if plan.local is not None else None
    if work is None:
        work = f"{row.samples:,.0f} samples at batch {row.global_batch}"
    return PlanInfo(
        config=" + ".join(parts) + f"; {batch}",
        profile=plan.profile or None,
        work=work,
        reason=plan.reason,
        uncertainty=plan.uncertainty,
        notes=list(plan.notes),
        precision=row.precision,
    )


def _instance_spend(
    row: LedgerRow, inst: InstanceRecord | None, price: Callable[[InstanceRecord], float | None]
) -> InstanceSpend:
    return InstanceSpend(
        instance=row.instance,
        node_rank=inst.node_rank if inst else -1,
        type=inst.type if inst else "?",
        market=inst.market if inst else "?",
        zone=inst.zone if inst else "?",
        usd_per_hour=inst.price if inst else 0.0,
        state=inst.state if inst else "?",
        reason=inst.reason if inst else None,
        start=row.start,
        end=row.end,
        billed_seconds=row.billed_seconds,
        usd=row.usd,
        closed=row.closed,
        on_demand_usd_per_hour=price(inst) if inst else None,
    )


def _group(
    spends: Sequence[InstanceSpend], key: Callable[[InstanceSpend], str]
) -> dict[str, float]:
    parts: dict[str, list[float]] = defaultdict(list)
    for s in spends:
        parts[key(s)].append(s.usd)
    return {k: math.fsum(v) for k, v in sorted(parts.items())}


def cost_curve(ledger: Sequence[LedgerRow]) -> list[tuple[float, float]]:
    """Cumulative USD at every row boundary, each row's dollars spread evenly over
    [start, end]; the last point is the ledger's total."""
    if not ledger:
        return []
    times = sorted({r.start for r in ledger} | {r.end for r in ledger})

    def at(t: float) -> float:
        parts = []
        for r in ledger:
            span = r.end - r.start
            share = 1.0 if span <= 0 or t >= r.end else max(t - r.start, 0.0) / span
            parts.append(r.usd * share)
        return math.fsum(parts)

    return [(t, at(t)) for t in times]


def preemptions(
    events: Sequence[EventRecord], instances: Sequence[InstanceRecord]
) -> list[Preemption]:
    """Each ``preempted``/``lost`` event, matched with the node's next ``recovered`` event and
    the replacement instance (the node's next launch)."""
    out = []
    for i, ev in enumerate(events):
        if ev.kind not in ("preempted", "lost"):
            continue
        data = ev.data or {}
        rank = data.get("node_rank")
        rec = next(
            (
                e
                for e in events[i + 1 :]
                if e.kind == "recovered" and (e.data or {}).get("node_rank") == rank
            ),
            None,
        )
        rdata = rec.data or {} if rec else {}
        work = _num(rdata.get("work_lost_s"))
        down = _num(rdata.get("downtime_s"))
        cluster = math.fsum(
            x.price
            for x in instances
            if x.launched_at <= ev.time and (x.ended_at is None or x.ended_at >= ev.time)
        )
        lost_s = None if work is None and down is None else (work or 0.0) + (down or 0.0)
        repl = next(
            (x for x in instances if x.node_rank == rank and x.launched_at >= ev.time - 1e-9
             and x.id != data.get("instance")),
            None,
        )  # fmt: skip
        boot_s = max(rec.time - repl.launched_at, 0.0) if rec and repl else None
        out.append(
            Preemption(
                time=ev.time,
                kind=ev.kind,
                node_rank=rank if isinstance(rank, int) else None,
                instance=data.get("instance"),
                reason=data.get("reason"),
                work_lost_s=work,
                downtime_s=down,
                cluster_usd_per_hour=cluster,
                lost_usd=None if lost_s is None else lost_s * cluster / 3600.0,
                replacement=repl.id if repl else None,
                replacement_boot_s=boot_s,
                replacement_boot_usd=(
                    boot_s * repl.price / 3600.0 if boot_s is not None and repl else None
                ),
            )
        )
    return out


def on_demand_comparison(
    job: JobRecord, spends: Sequence[InstanceSpend], total: float
) -> Comparison:
    """The same instances for the same billed seconds at the catalog's on-demand price."""
    if job.cloud == "local":
        return Comparison(None, None, "n/a: local instances have no on-demand price")
    missing = sorted({s.type for s in spends if s.on_demand_usd_per_hour is None})
    if missing:
        return Comparison(
            None, None, f"n/a: no on-demand price in the catalog for {', '.join(missing)}"
        )
    usd = math.fsum(s.billed_seconds * (s.on_demand_usd_per_hour or 0.0) / 3600.0 for s in spends)
    usd += total - math.fsum(s.usd for s in spends)  # disks, storage, egress: the same on demand
    return Comparison(
        usd,
        usd - total,
        "same instances, same billed seconds, at the catalog's on-demand price (disks, storage "
        "and egress as billed)",
    )


def _naive_savings(job: JobRecord, naive: Comparison, total: float) -> Comparison:
    if naive.usd is None:
        return naive
    if job.status != "succeeded":
        note = f"{naive.note}; no savings: the job {job.status} before the end of training"
        return replace(naive, note=note)
    return replace(naive, savings_usd=naive.usd - total)


def no_naive(job: JobRecord) -> Comparison:
    """Why the naive plan of ``job`` cannot be priced (no plan, or no profile to plan from)."""
    if job.plan is None:
        return Comparison(None, None, "n/a: the job had no plan (no profile to plan from)")
    return Comparison(None, None, "n/a: the job's profile is not available (give --profile)")


def catalog_on_demand() -> Callable[[InstanceRecord], float | None]:
    """An instance's on-demand price in the shipped catalog: its zone, else the cheapest zone
    of its region (None when the catalog has neither)."""
    from kplan.catalogs import load_catalog

    prices: dict[tuple[str, str, str, str], float] = {}
    for o in load_catalog().offers:
        if o.market == "on-demand":
            prices[(o.cloud, o.region, o.instance_type, o.zone)] = o.usd_per_hour
            key = (o.cloud, o.region, o.instance_type, "*")
            prices[key] = min(prices.get(key, math.inf), o.usd_per_hour)

    def price(inst: InstanceRecord) -> float | None:
        exact = prices.get((inst.cloud, inst.region, inst.type, inst.zone))
        return exact if exact is not None else prices.get((inst.cloud, inst.region, inst.type, "*"))

    return price
