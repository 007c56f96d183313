"""What ``kplan estimate`` asks the search: filters, limits, objective, spot and compression
options (validated on construction: one line and a hint on bad input)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kplan.core.errors import InputError
from kplan.core.precision import Precision, check_precision
from kplan.planner import compression, costs
from kplan.planner.compression import StatCost
from kplan.planner.extra_costs import DataSpec
from kplan.planner.plan import OBJECTIVES, Objective
from kplan.planner.spot import SpotModel

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
    # The training data: its size and region, for its storage and egress (extra_costs.py)
    data: DataSpec = field(default_factory=DataSpec)

    def __post_init__(self) -> None:
        if self.budget_usd is not None and not self.budget_usd > 0:
            raise InputError(f"budget {self.budget_usd} must be > 0 USD", hint="e.g. --budget 500")
        if self.deadline_hours is not None and not self.deadline_hours > 0:
            raise InputError(
                f"deadline {self.deadline_hours} must be > 0 hours", hint="e.g. --deadline 24"
            )
        if not (math.isfinite(self.data.gb) and self.data.gb >= 0):
            raise InputError(
                f"data size {self.data.gb} GB must be a finite number >= 0",
                hint="e.g. --data-gb 50",
            )
        if self.data.region is not None and self.data.gb == 0:  # else silently unused
            raise InputError(
                f"--data-region {self.data.region} prices the data's storage and egress, and "
                "there is none: --data-gb is 0",
                hint="give the data's size, e.g. --data-gb 150",
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
        spot_only = [
            f
            for f, on in (
                ("--allow-on-demand", self.allow_on_demand),
                ("--capacity-wait", self.capacity_wait_s is not None),
            )
            if on
        ]
        if spot_only and "spot" not in self.markets:  # else silently unused
            raise InputError(
                f"{' and '.join(spot_only)} {'price' if len(spot_only) > 1 else 'prices'} spot "
                "plans, and --on-demand plans none",
                hint=f"drop --on-demand, or {' and '.join(spot_only)}",
            )
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
