"""The Plan: the chosen configuration, the best alternatives, the frontier and the reasons.

A plan is written as JSON (``Plan.to_dict``, schema ``PLAN_SCHEMA``) by ``kplan estimate --out``
and read back by ``Plan.from_dict`` (``plan_from_dict``), the one validator every reader
(launch, simulate, report) goes through, on the field reader and migration of
``kplan/planner/plan_schema.py``. Records are small and nested: a row's batch schedule is one
``BatchSchedule``, its spot pricing and recovery rules one ``SpotTerms``.
``check_against_catalog`` checks a row's region, instance types and GPUs against a catalog.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kplan.core import flags
from kplan.core.errors import DataFileError, SchemaVersionError
from kplan.core.precision import PRECISIONS
from kplan.planner.catalog import Catalog
from kplan.planner.extra_costs import EGRESS_KINDS, ExtraCosts
from kplan.planner.plan_schema import (
    CLOUDS,
    GROUP_MARKETS,
    HINT,
    MAX_GPUS_PER_NODE,
    MAX_GROUPS,
    MAX_PHASES,
    MAX_ROWS,
    MAX_TEXT,
    OBJECTIVE_NAMES,
    PLAN_SCHEMA,
    ROW_MARKETS,
    TERM_KEYS,
    ZONE_TYPES,
    JsonObject,
    migrate_v1,
)
from kplan.planner.spot import RecoveryPolicy

__all__ = ["PLAN_SCHEMA", "BatchSchedule", "Group", "Plan", "PlanRow", "SpotTerms"]
Objective = Literal["cost", "time", "knee", "local"]
OBJECTIVES: tuple[Objective, ...] = ("cost", "time", "knee")


@dataclass(frozen=True)
class Group:
    """Identical instances in one zone and market, with their per-worker batch."""

    instance_type: str
    market: str
    zone: str
    nodes: int
    gpus_per_node: int
    gpu: str
    local_batch: int
    usd_per_hour: float  # per instance


@dataclass(frozen=True)
class SchedulePhase:
    """From base-batch progress ``progress`` (a fraction of the work) on, train at this batch."""

    progress: float
    global_batch: int


@dataclass(frozen=True)
class BatchSchedule:
    """A global-batch schedule on a row's cluster (kplan/planner/batchsched.py), set on the chosen
    row when it beats the best single batch by more than the tie tolerance: its phases for the
    runtime (KPLAN_BATCH_SCHEDULE), its expected hours and cost (the row's own fields stay the
    single batch's), their p90s (the step time's spread and the GNS forecast's over the phases;
    the latter alone in ``forecast_log_sigma``) and its saving."""

    phases: tuple[SchedulePhase, ...]
    hours: float
    cost_usd: float
    hours_p90: float
    cost_p90_usd: float
    forecast_log_sigma: float
    saving: float

    def entries(self) -> list[dict[str, float | int]]:
        """What the runtime takes (``KPLAN_BATCH_SCHEDULE``): ``{"progress", "global_batch"}``."""
        return [{"progress": p.progress, "global_batch": p.global_batch} for p in self.phases]


@dataclass(frozen=True)
class SpotTerms:
    """How a row's time and cost were computed, and for spot the recovery rules the launcher must
    run for them to hold (kplan/planner/spot.py), the chance a run fails anyway and the same
    cluster on demand for comparison. ``recovery`` is None where nothing was simulated."""

    basis: str = "closed form"
    fail_prob: float = 0.0
    model: str = ""  # the spot model row used (its source)
    on_demand_cost_usd: float | None = None
    on_demand_hours: float | None = None
    recovery: RecoveryPolicy | None = None

    @property
    def allow_on_demand(self) -> bool:
        return self.recovery is not None and self.recovery.allow_on_demand

    @property
    def simulated(self) -> bool:
        """Priced by the Monte-Carlo (else a closed form: its ``fail_prob`` is the share of runs
        in markets so busy that they never end)."""
        return self.basis.startswith("Monte-Carlo")


@dataclass(frozen=True)
class PlanRow:
    """One configuration with its predictions. Times in hours, money in USD."""

    cloud: str
    region: str
    zone: str
    instance_type: str  # "a+b" for a mixed plan
    market: str  # "spot", "on-demand" or "mixed"
    nodes: int
    workers: int
    local_batch: int  # of the first group; see ``groups`` for mixed plans
    accum_steps: int
    global_batch: int
    step_time_s: float
    step_time_p90_s: float
    steps: int
    samples: float
    statistical_efficiency: float
    throughput_samples_s: float
    hours: float
    hours_p90: float
    cost_usd: float
    cost_p90_usd: float
    usd_per_hour: float
    expected_preemptions: float
    checkpoint_interval_s: float
    groups: tuple[Group, ...]
    gpu: str
    precision: str = "fp32"  # fp32, tf32, bf16 or fp16 (kplan.core.precision)
    # Where each step-time term comes from (perfmodel.term_sources): compute, intra_sync and
    # inter_sync, each "measured", "transferred from <GPU>", "prior", ... or "none".
    terms: dict[str, str] = field(default_factory=dict)
    spot: SpotTerms = field(default_factory=SpotTerms)
    # "local-zone" / "wavelength-zone": an AWS zone the account must opt into (``zone`` names it)
    zone_type: str = "availability-zone"
    # The GNS forecast's log-space spread of the samples to train at this batch (0 where the
    # measured GNS covers training): the time and cost p90 add it to the step time's.
    forecast_log_sigma: float = 0.0
    schedule: BatchSchedule | None = None
    # Gradient compression the row runs (kplan/planner/compression.py; KPLAN_COMPRESSION) and why:
    # its all-reduce, codec and step multiplier against dense on the same configuration.
    compression: str = "none"
    compression_why: str = ""
    # Disks, checkpoint and data storage and the data's egress (kplan/planner/extra_costs.py), at
    # the expected hours; included in cost_usd (and, at the p90 hours, in cost_p90_usd).
    extras: ExtraCosts = field(default_factory=ExtraCosts)

    @property
    def predicted_hours(self) -> float:
        """What the job is predicted to take: its schedule's where it has one."""
        return self.schedule.hours if self.schedule else self.hours

    @property
    def predicted_cost_usd(self) -> float:
        return self.schedule.cost_usd if self.schedule else self.cost_usd

    @property
    def predicted_cost_p90_usd(self) -> float:
        return self.schedule.cost_p90_usd if self.schedule else self.cost_p90_usd

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)  # nested records become objects, tuples lists
        doc["groups"] = [asdict(g) for g in self.groups]
        doc["spot"]["recovery"] = None if self.spot.recovery is None else asdict(self.spot.recovery)
        rec = doc["spot"]["recovery"]
        for key in ("deadline_s", "notice_stop_s"):  # unset: the plan reads as it did before
            if rec is not None and rec[key] is None:
                del rec[key]
        doc.pop("schedule")
        doc["batch_schedule"] = None
        if self.schedule is not None:
            sched = asdict(self.schedule)
            sched["phases"] = self.schedule.entries()
            doc["batch_schedule"] = unbounded_as_null(sched)
        return unbounded_as_null(doc)


P90_KEYS = ("hours_p90", "cost_p90_usd")


def unbounded_as_null(doc: dict[str, Any]) -> dict[str, Any]:
    """A p90 with no bound (runs in busy enough markets never end: ``spotplan``'s closed form)
    written as JSON's null; JSON has no infinity. ``_p90`` reads it back."""
    for key in P90_KEYS:
        if isinstance(doc.get(key), float) and math.isinf(doc[key]):
            doc[key] = None
    return doc


@dataclass(frozen=True)
class LocalMachine:
    """A local plan's machine (kplan/app/local_plan.py): what it ran on and what it assumed."""

    cpu: str
    cores: int
    gpus: tuple[str, ...]
    work: str  # the work predicted, in words
    start_s: float  # the job's start before its first step, assumed
    log_sigma: float  # the step time's log-space spread


@dataclass(frozen=True)
class Plan:
    chosen: PlanRow
    plans: tuple[PlanRow, ...]
    frontier: tuple[PlanRow, ...]
    objective: Objective
    reason: str
    considered: int
    feasible: int
    notes: tuple[str, ...] = field(default=())
    uncertainty: str = ""
    precision: str = "fp32"  # what every row runs in
    precision_basis: str = "measured"  # or "projected from the profile's fp32"
    tie_tolerance: float = 0.05  # times within this fraction are tied; a tie goes to the cheaper
    order: str = ""  # how ``plans`` is ordered, in words
    # Set where the plan is saved (kplan estimate --out, kplan launch): the profile it was made
    # from, the catalog version it was priced with ("local" for a local plan), what the estimate
    # assumed (informational JSON, shown by kplan estimate), the launch line that runs it, and a
    # local plan's machine.
    profile: str = ""
    catalog: str = ""
    assumptions: dict[str, Any] = field(default_factory=dict)  # JSON: rendered, never computed on
    next_command: str = ""
    local: LocalMachine | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": PLAN_SCHEMA,
            "objective": self.objective,
            "reason": self.reason,
            "uncertainty": self.uncertainty,
            "precision": self.precision,
            "precision_basis": self.precision_basis,
            "considered": self.considered,
            "feasible": self.feasible,
            "tie_tolerance": self.tie_tolerance,
            "order": self.order,
            "notes": list(self.notes),
            "chosen": self.chosen.to_dict(),
            "plans": [r.to_dict() for r in self.plans],
            "frontier": [r.to_dict() for r in self.frontier],
            "profile": self.profile,
            "catalog": self.catalog,
            "assumptions": self.assumptions,
            "next_command": self.next_command,
        }
        if self.local is not None:
            doc["local"] = {**asdict(self.local), "gpus": list(self.local.gpus)}
        return doc

    @classmethod
    def from_dict(cls, doc: object, source: str = "plan") -> Plan:
        """The plan in ``doc`` (a parsed plan file), every field checked; a plan of the previous
        schema (kplan.plan/1.x) is migrated. Bad input: ``DataFileError`` (one line, a hint)."""
        return plan_from_dict(doc, source)


# --------------------------------------------------------------------------------- the schema


def plan_from_dict(doc: object, source: str = "plan") -> Plan:
    """The typed plan in ``doc``; a ``kplan.plan/1.x`` document is migrated first."""
    if not isinstance(doc, dict):
        raise DataFileError(f"{source}: not a kplan plan (not a JSON object)", hint=HINT)
    schema = doc.get("schema")
    if not isinstance(schema, str) or not schema.startswith("kplan.plan/"):
        raise DataFileError(
            f"{source}: not a kplan plan (schema {str(schema)[:40]!r})",
            hint="write one with kplan estimate ... --out plan.json",
        )
    major = schema.partition("/")[2].split(".")[0]
    if major == "1":
        doc = migrate_v1(doc, source)
    elif major != PLAN_SCHEMA.partition("/")[2].split(".")[0]:
        raise SchemaVersionError(
            f"{source}: plan schema {schema[:40]} is not supported",
            hint=f"this kplan reads {PLAN_SCHEMA} and kplan.plan/1.x; {HINT}",
        )
    d = JsonObject(doc, "", source)
    rows = {k: [_row(d.sub(f"{k}[{i}]", r)) for i, r in enumerate(d.items(k, MAX_ROWS))]
            for k in ("plans", "frontier")}  # fmt: skip
    notes = d.items("notes", MAX_ROWS, [])
    if not all(isinstance(n, str) and len(n) <= MAX_TEXT for n in notes):
        d.fail("notes are not a list of texts")
    assumptions = d.get("assumptions", {})
    if not isinstance(assumptions, dict):
        d.fail("assumptions are not a JSON object")
    local = doc.get("local")
    return Plan(
        chosen=_row(d.sub("chosen", d.get("chosen"))),
        plans=tuple(rows["plans"]),
        frontier=tuple(rows["frontier"]),
        objective=d.choice("objective", OBJECTIVE_NAMES),  # type: ignore[arg-type]
        reason=d.text("reason", ""),
        considered=d.integer("considered", 0, 2**62),
        feasible=d.integer("feasible", 0, 2**62),
        notes=tuple(notes),
        uncertainty=d.text("uncertainty", ""),
        precision=d.choice("precision", PRECISIONS, "fp32"),
        precision_basis=d.text("precision_basis", "measured"),
        tie_tolerance=d.number("tie_tolerance", 0.0, 1.0, default=0.05),
        order=d.text("order", ""),
        profile=d.text("profile", ""),
        catalog=d.text("catalog", ""),
        assumptions=assumptions,
        next_command=d.text("next_command", ""),
        local=None if local is None else _local(d.sub("local", local)),
    )


def _local(d: JsonObject) -> LocalMachine:
    gpus = d.items("gpus", 1024, [])
    if not all(isinstance(g, str) for g in gpus):
        d.fail(f"{d.name('gpus')} is not a list of names")
    return LocalMachine(
        cpu=d.text("cpu", ""),
        cores=d.integer("cores", 1, 2**20, 1),
        gpus=tuple(gpus),
        work=d.text("work", ""),
        start_s=d.number("start_s", 0.0, flags.MAX_SECONDS, default=0.0),
        log_sigma=d.number("log_sigma", 0.0, 100.0, default=0.0),
    )


def _row(d: JsonObject) -> PlanRow:
    cloud = d.choice("cloud", CLOUDS)
    groups = d.items("groups", MAX_GROUPS)
    if not groups:
        d.fail(f"{d.name('groups')} is empty: a row has 1 to {MAX_GROUPS} groups")
    typed = tuple(_group(d.sub(f"groups[{i}]", g)) for i, g in enumerate(groups))
    nodes = d.integer("nodes", 1, flags.MAX_NODES)
    if nodes != sum(g.nodes for g in typed):
        d.fail(f"{d.name('nodes')} {nodes} is not the sum of its groups' nodes")
    workers = d.integer("workers", 1, flags.MAX_NODES * MAX_GPUS_PER_NODE)
    if workers != sum(g.nodes * g.gpus_per_node for g in typed):
        d.fail(f"{d.name('workers')} {workers} is not its groups' nodes x GPUs")
    batch = d.integer("global_batch", 1, flags.MAX_BATCH)
    if batch < workers:
        d.fail(f"{d.name('global_batch')} {batch} is below its {workers} workers (one each)")
    step = d.number("step_time_s", 0.0, flags.MAX_SECONDS, open_low=True)
    hours = d.number("hours", 0.0, flags.MAX_HOURS, open_low=True)
    cost = d.number("cost_usd", 0.0, flags.MAX_USD)
    spot = _spot(d.sub("spot", d.get("spot", {})))
    closed = spot.recovery is None  # no Monte-Carlo: the closed form's p90 >= its mean
    market = d.choice("market", ROW_MARKETS)
    if market != "mixed" and any(g.market != market for g in typed):
        d.fail(f"{d.name('market')} {market!r} is not its groups' market")
    return PlanRow(
        cloud=cloud,
        region=d.word("region"),
        zone=d.word("zone"),
        instance_type=d.word("instance_type"),
        market=market,
        nodes=nodes,
        workers=workers,
        local_batch=d.integer("local_batch", 1, flags.MAX_BATCH),
        accum_steps=d.integer("accum_steps", 1, flags.MAX_BATCH),
        global_batch=batch,
        step_time_s=step,
        step_time_p90_s=_p90(d, "step_time_p90_s", step, flags.MAX_SECONDS),
        steps=d.integer("steps", 1, flags.MAX_SAMPLES),
        samples=d.number("samples", 0.0, flags.MAX_SAMPLES, open_low=True),
        statistical_efficiency=d.number("statistical_efficiency", 0.0, 1.0, open_low=True),
        throughput_samples_s=d.number("throughput_samples_s", 0.0, 1e15, open_low=True),
        hours=hours,
        hours_p90=_p90(d, "hours_p90", hours, flags.MAX_HOURS, closed),
        cost_usd=cost,
        cost_p90_usd=_p90(d, "cost_p90_usd", cost, flags.MAX_USD, closed),
        usd_per_hour=d.number("usd_per_hour", 0.0, flags.MAX_USD),
        expected_preemptions=d.number("expected_preemptions", 0.0, 1e9),
        checkpoint_interval_s=d.number("checkpoint_interval_s", 0.0, flags.MAX_SECONDS),
        groups=typed,
        gpu=d.text("gpu", empty=False),
        precision=d.choice("precision", PRECISIONS, "fp32"),
        terms=_terms(d),
        spot=spot,
        zone_type=d.choice("zone_type", ZONE_TYPES, "availability-zone"),
        forecast_log_sigma=d.number("forecast_log_sigma", 0.0, 100.0, default=0.0),
        schedule=_schedule(d, batch),
        compression=d.word("compression", "none"),
        compression_why=d.text("compression_why", ""),
        extras=_extras(d.sub("extras", d.get("extras", {}))),
    )


def _extras(d: JsonObject) -> ExtraCosts:
    """A row's extra costs; a plan saved before schema 2.1 has none: zeros."""

    def usd(key: str) -> float:
        return d.number(key, 0.0, flags.MAX_USD, default=0.0)

    def gb(key: str) -> float:
        return d.number(key, 0.0, 1e9, default=0.0)

    return ExtraCosts(
        disk_usd=usd("disk_usd"),
        checkpoint_usd=usd("checkpoint_usd"),
        data_usd=usd("data_usd"),
        egress_usd=usd("egress_usd"),
        disk_gb=gb("disk_gb"),
        checkpoint_gb=gb("checkpoint_gb"),
        checkpoints_kept=d.integer("checkpoints_kept", 0, 10**6, 0),
        data_gb=gb("data_gb"),
        data_region=d.text("data_region", ""),
        egress=d.choice("egress", EGRESS_KINDS, "none"),
        source=d.text("source", ""),
        move_usd=usd("move_usd"),
        move_copy_s=d.number("move_copy_s", 0.0, 1e12, default=0.0),
    )


def _p90(d: JsonObject, key: str, value: float, high: float, ordered: bool = True) -> float:
    """A p90 in (0, high]; ``ordered``: at least its expected value (a closed form's p90; a
    Monte-Carlo's mean may lie above its p90 when a few runs wait very long). null: no bound
    (``unbounded_as_null``)."""
    if key in d.doc and d.doc[key] is None:
        return math.inf
    p90 = d.number(key, 0.0, high, open_low=value > 0)
    if ordered and p90 < value * (1 - 1e-9):
        d.fail(f"{d.name(key)} {p90:g} is below its expected value {value:g}")
    return p90


def _group(d: JsonObject) -> Group:
    return Group(
        instance_type=d.word("instance_type"),
        market=d.choice("market", GROUP_MARKETS),
        zone=d.word("zone"),
        nodes=d.integer("nodes", 1, flags.MAX_NODES),
        gpus_per_node=d.integer("gpus_per_node", 1, MAX_GPUS_PER_NODE),
        gpu=d.text("gpu", empty=False),
        local_batch=d.integer("local_batch", 1, flags.MAX_BATCH),
        usd_per_hour=d.number("usd_per_hour", 0.0, flags.MAX_USD),
    )


def _terms(d: JsonObject) -> dict[str, str]:
    terms = d.get("terms", {})
    if not (
        isinstance(terms, dict)
        and len(terms) <= TERM_KEYS
        and all(isinstance(k, str) and isinstance(v, str) for k, v in terms.items())
    ):
        d.fail(f"{d.name('terms')} is not an object of texts")
    return dict(terms)


def _spot(d: JsonObject) -> SpotTerms:
    rec = d.get("recovery", None)
    return SpotTerms(
        basis=d.text("basis", "closed form"),
        fail_prob=d.number("fail_prob", 0.0, 1.0, default=0.0),
        model=d.text("model", ""),
        on_demand_cost_usd=d.optional_number("on_demand_cost_usd", 0.0, flags.MAX_USD),
        on_demand_hours=d.optional_number("on_demand_hours", 0.0, flags.MAX_HOURS),
        recovery=None if rec is None else _recovery(d.sub("recovery", rec)),
    )


def _recovery(d: JsonObject) -> RecoveryPolicy:
    base = RecoveryPolicy()
    return RecoveryPolicy(
        restart_s=d.number("restart_s", 0.0, flags.MAX_SECONDS, default=base.restart_s),
        provisioning_s=d.number(
            "provisioning_s", 0.0, flags.MAX_SECONDS, default=base.provisioning_s
        ),
        checkpoint_interval_s=d.number(
            "checkpoint_interval_s",
            0.0,
            flags.MAX_SECONDS,
            open_low=True,
            default=base.checkpoint_interval_s,
        ),
        checkpoint_s=d.number("checkpoint_s", 0.0, flags.MAX_SECONDS, default=base.checkpoint_s),
        max_replacements=d.integer("max_replacements", 0, 10**6, base.max_replacements),
        capacity_wait_s=d.number(
            "capacity_wait_s", 0.0, flags.MAX_SECONDS, default=base.capacity_wait_s
        ),
        allow_on_demand=d.boolean("allow_on_demand", base.allow_on_demand),
        zone_failover=d.boolean("zone_failover", base.zone_failover),
        deadline_s=d.optional_number("deadline_s", 0.0, flags.MAX_SECONDS),
        notice_stop_s=d.optional_number("notice_stop_s", 0.0, flags.MAX_SECONDS),
    )


def _schedule(d: JsonObject, single_batch: int) -> BatchSchedule | None:
    raw = d.get("batch_schedule", None)
    if raw is None:
        return None
    s = d.sub("batch_schedule", raw)
    phases = s.items("phases", MAX_PHASES)
    if not phases:
        s.fail(f"{s.name('phases')} is empty")
    typed: list[SchedulePhase] = []
    for i, ph in enumerate(phases):
        p = s.sub(f"phases[{i}]", ph)
        at = p.number("progress", 0.0, 1.0)
        if typed and at <= typed[-1].progress:
            p.fail(f"{p.name('progress')} {at:g} does not follow the phase before")
        typed.append(SchedulePhase(at, p.integer("global_batch", 1, flags.MAX_BATCH)))
    if typed[0].progress != 0.0:
        s.fail(f"{s.name('phases')} do not start at progress 0")
    hours = s.number("hours", 0.0, flags.MAX_HOURS, open_low=True)
    cost = s.number("cost_usd", 0.0, flags.MAX_USD)
    return BatchSchedule(
        phases=tuple(typed),
        hours=hours,
        cost_usd=cost,
        hours_p90=_p90(s, "hours_p90", hours, flags.MAX_HOURS, ordered=False),
        cost_p90_usd=_p90(s, "cost_p90_usd", cost, flags.MAX_USD, ordered=False),
        forecast_log_sigma=s.number("forecast_log_sigma", 0.0, 100.0, default=0.0),
        saving=s.number("saving", -1.0, 1.0, default=0.0),
    )


# ---------------------------------------------------------------------------- the catalog


def check_against_catalog(row: PlanRow, catalog: Catalog, source: str, where: str) -> None:
    """The row's cloud, region and instance types are ``catalog``'s, each group within its
    type's GPUs (a local row names this machine: nothing to check)."""
    if row.cloud == "local":
        return
    hint = f"plan again with this catalog (kplan estimate ... --out), or {HINT}"
    prefix = f"{source}: the plan's {where}"
    regions = {o.region for o in catalog.offers if o.cloud == row.cloud}
    if row.region not in regions:
        raise DataFileError(
            f"{prefix}.region {row.region[:40]!r} is not a region of {row.cloud} in catalog "
            f"{catalog.version}",
            hint=hint,
        )
    for i, g in enumerate(row.groups):
        inst = catalog.instances.get((row.cloud, g.instance_type))
        if inst is None:
            raise DataFileError(
                f"{prefix}.groups[{i}].instance_type {g.instance_type[:40]!r} is not a type "
                f"of {row.cloud} in catalog {catalog.version}",
                hint=hint,
            )
        if g.gpus_per_node > inst.gpu_count:
            raise DataFileError(
                f"{prefix}.groups[{i}].gpus_per_node {g.gpus_per_node} is more than "
                f"{g.instance_type}'s {inst.gpu_count} GPUs",
                hint=hint,
            )


def row_at(plan: Plan, index: int | None, source: str) -> tuple[PlanRow, str]:
    """``plans[index]`` (or the chosen row) and its name for messages."""
    if index is None:
        return plan.chosen, "chosen"
    if not 0 <= index < len(plan.plans):
        from kplan.core.errors import InputError

        raise InputError(
            f"{source}: the plan has no row {index}",
            hint=f"--row takes 0..{max(len(plan.plans) - 1, 0)}; {HINT}",
        )
    return plan.plans[index], f"plans[{index}]"
