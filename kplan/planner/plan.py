"""The Plan: the chosen configuration, the best alternatives, the frontier and the reasons."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

PLAN_SCHEMA = "kplan.plan/1.0"
Objective = Literal["cost", "time", "knee"]
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
    # Spot: how the time and cost were computed, and the recovery rules the launcher must run
    # for them to hold (kplan/planner/spot.py): its replacement limit, how long it waits for
    # capacity, whether it may fall back to on-demand; the chance a run fails anyway.
    time_cost_basis: str = "closed form"
    fail_prob: float = 0.0
    max_replacements: int = 20
    capacity_wait_s: float = 900.0
    allow_on_demand: bool = False
    spot_model: str = ""  # the spot model row used (its source)
    on_demand_cost_usd: float | None = None  # a spot row's cluster on demand, for comparison
    on_demand_hours: float | None = None
    recovery: dict[str, Any] = field(default_factory=dict)  # the whole RecoveryPolicy priced
    # "local-zone" / "wavelength-zone": an AWS zone the account must opt into (``zone`` names it)
    zone_type: str = "availability-zone"
    # The GNS forecast's log-space spread of the samples to train at this batch (0 where the
    # measured GNS covers training): the time and cost p90 add it to the step time's.
    forecast_log_sigma: float = 0.0
    # A global-batch schedule on this cluster (kplan/planner/batchsched.py), set on the chosen row
    # when it beats the best single batch by more than the tie tolerance: phases
    # [{"progress": p, "global_batch": B}, ...] for the runtime (KPLAN_BATCH_SCHEDULE), and its
    # expected hours and cost (the row's own fields stay the single batch's), their p90s (the
    # step time's spread and the GNS forecast's over the schedule's phases; the latter alone in
    # batch_schedule_forecast_log_sigma) and its saving.
    batch_schedule: list[dict[str, float | int]] | None = None
    batch_schedule_hours: float | None = None
    batch_schedule_cost_usd: float | None = None
    batch_schedule_hours_p90: float | None = None
    batch_schedule_cost_p90_usd: float | None = None
    batch_schedule_forecast_log_sigma: float | None = None
    batch_schedule_saving: float | None = None
    # Gradient compression the row runs (kplan/planner/compression.py; KPLAN_COMPRESSION) and why:
    # its all-reduce, codec and step multiplier against dense on the same configuration.
    compression: str = "none"
    compression_why: str = ""

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["groups"] = [asdict(g) for g in self.groups]
        return doc


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

    def to_dict(self) -> dict[str, Any]:
        return {
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
        }
