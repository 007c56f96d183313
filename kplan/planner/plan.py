"""The Plan: the chosen configuration, the best alternatives, the frontier and the reasons.

A plan is written as JSON (``Plan.to_dict``, schema ``PLAN_SCHEMA``) by ``kplan estimate --out``
and read back by ``Plan.from_dict`` (``kplan/planner/plan_schema.py``), the one validator every
reader (launch, simulate, report) goes through. Records are small and nested: a row's batch
schedule is one ``BatchSchedule``, its spot pricing and recovery rules one ``SpotTerms``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kplan.planner.spot import RecoveryPolicy

PLAN_SCHEMA = "kplan.plan/2.0"
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
        doc.pop("schedule")
        doc["batch_schedule"] = None
        if self.schedule is not None:
            sched = asdict(self.schedule)
            sched["phases"] = self.schedule.entries()
            doc["batch_schedule"] = sched
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
        from kplan.planner.plan_schema import plan_from_dict

        return plan_from_dict(doc, source)
