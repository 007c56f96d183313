"""What to launch: the job's nodes, its money and time limits, and the monitor's settings.

A :class:`JobSpec` is built from a typed ``Plan`` (``kplan/app/launch_spec.py``:
``spec_from_plan``, its nodes from ``nodes_from_plan_row``) or for the local provider
(``local``), validated at construction (bad values are echoed in an ``InputError``), and stored
as JSON in the state database (its plan beside it, as ``Plan.to_dict()``).

Beyond where it runs, its nodes and its limits, a job's settings are a few small records: the
monitor's timing, the recovery rules, the batch, the workers' training settings, how nodes
install kplan, the GCP placement, the online adaptation and the plan's prediction. The flat
keyword form (:class:`JobOptions`: ``check_interval_s=``, ``global_batch=``, ...) is what the
callers and the job.json of earlier kplan versions use; :func:`nest` routes it to the records.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

from kplan.core.errors import InputError
from kplan.core.precision import check_precision
from kplan.core.text import clipped
from kplan.launcher.ledger import Costs
from kplan.launcher.move_spec import MoveRegion, Moves, ZoneOffer
from kplan.launcher.provider import Market
from kplan.launcher.wheel import check_index_url, check_node_install

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from kplan.planner.plan import Plan, PlanRow
    from kplan.planner.spot import RecoveryPolicy

_JOB_ID = re.compile(r"^[a-z][a-z0-9-]{2,40}$")  # a valid AWS tag value and GCP label value
CLOUDS = ("local", "aws", "gcp")
MIN_LEASE_S = 120.0  # a lease shorter than two node polls would end healthy nodes
# --idle-minutes below two monitor checks (30 s each) ends a training cluster between two step
# records: 1e-300 ended every job at the first check after its first step
MIN_IDLE_S = 60.0


def new_job_id(now: float | None = None) -> str:
    """``kp-<yymmdd>-<hhmmss>-<4 hex>`` in UTC: sortable, unique, a valid tag and label."""
    stamp = time.strftime("%y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"kp-{stamp}-{secrets.token_hex(2)}"


def place(cloud: str, region: str) -> str:
    """Where a job runs, in words: "this machine (local)" or "aws us-east-1"."""
    return "this machine (local)" if cloud == "local" else f"{cloud} {region}"


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise InputError(
            f"job id {clipped(job_id, 60)} is not valid",
            hint="3-41 characters: lowercase letters, digits and '-', starting with a letter",
        )
    return job_id


@dataclass(frozen=True)
class NodeSpec:
    """One worker group (one instance) of the job."""

    node_rank: int
    instance_type: str
    market: Market
    zone: str
    gpus: int  # workers on this node (torchrun --nproc-per-node)
    usd_per_hour: float

    def __post_init__(self) -> None:
        if self.node_rank < 0:
            raise InputError(f"node rank {self.node_rank} is negative", hint="ranks start at 0")
        if self.market not in ("spot", "on-demand"):
            raise InputError(f"market {self.market!r} is not spot or on-demand", hint="fix it")
        if self.gpus < 1:
            raise InputError(f"node {self.node_rank}: {self.gpus} workers", hint="use >= 1")
        if not (math.isfinite(self.usd_per_hour) and self.usd_per_hour >= 0):
            raise InputError(
                f"node {self.node_rank}: price {self.usd_per_hour!r} USD/h is not >= 0",
                hint="use the catalog price",
            )


def _positive(name: str, value: float, hint: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{name} {value!r} must be > 0", hint=hint)


def _at_least(name: str, value: float, hint: str = "seconds") -> None:
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"{name} {value!r} must be >= 0", hint=hint)


@dataclass(frozen=True)
class Timing:
    """The monitor's clock: how often it looks, and how long each stage may take."""

    check_interval_s: float = 30.0  # monitor tick
    grace_s: float = 120.0  # SIGTERM to workers -> checkpoint -> exit
    teardown_s: float = 120.0  # terminate request -> instance seen terminated
    provision_timeout_s: float = 900.0  # one pending instance: not running after this -> lost
    finish_grace_s: float = 120.0  # after the first node finished, wait this long for the rest
    rdzv_last_call_s: float = 30.0  # torchrun waits this long for more nodes after the minimum
    # The hard stop's lease (kplan/launcher/hardstop.py): a node whose lease the launcher has
    # not renewed for this long ends itself (--lease-minutes).
    lease_s: float = 900.0
    # --idle-minutes: the monitor ends a cluster whose workers wrote no step record for this
    # long (None: never), kplan/launcher/observe.py
    idle_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("check_interval_s", "provision_timeout_s", "rdzv_last_call_s"):
            _positive(name, getattr(self, name), "seconds")
        for name in ("grace_s", "teardown_s", "finish_grace_s"):
            _at_least(name, getattr(self, name))
        if self.idle_s is not None:
            _positive("--idle-minutes", self.idle_s / 60, "minutes, e.g. 30")
            if self.idle_s < MIN_IDLE_S:
                raise InputError(
                    f"--idle-minutes {self.idle_s / 60:g} is shorter than "
                    f"{MIN_IDLE_S / 60:g} min: the cluster would end between two step records",
                    hint="--idle-minutes must be at least 1, e.g. 30",
                )
        if not (math.isfinite(self.lease_s) and self.lease_s >= MIN_LEASE_S):
            raise InputError(
                f"lease {self.lease_s:g} s is shorter than {MIN_LEASE_S:g} s",
                hint="--lease-minutes must be at least 2",
            )

    @property
    def lease_period_s(self) -> float:
        """The lease the nodes hold: ``lease_s``, and never less than two monitor checks (a
        renewal is written at each check)."""
        return max(self.lease_s, 2 * self.check_interval_s)


@dataclass(frozen=True)
class Recovery:
    """What the job survives: restarts, lost nodes, a region without capacity."""

    max_restarts: int = 10  # torchrun --max-restarts (worker failures; joins do not count)
    max_replacements: int = 20  # lost nodes replaced before the job fails (not returns to spot)
    # With no capacity for a lost node anywhere in the region (every zone, and on demand when
    # allowed), the job waits this long for capacity to return before it fails
    # (kplan/planner/spot.py RecoveryPolicy.capacity_wait_s).
    capacity_wait_s: float = 900.0
    # A node that fell back to on demand goes back to spot when spot capacity returns: a spot
    # launch is tried every this many seconds (None: at every monitor tick).
    spot_probe_interval_s: float | None = None
    checkpoint_interval_s: float | None = None  # None: the recovery policy's default

    def __post_init__(self) -> None:
        _at_least("capacity_wait_s", self.capacity_wait_s)
        if self.max_restarts < 0 or self.max_replacements < 0:
            raise InputError(
                f"max_restarts {self.max_restarts} / max_replacements {self.max_replacements} "
                "must be >= 0",
                hint="use 0 to disable",
            )
        if self.checkpoint_interval_s is not None:
            _positive("checkpoint interval", self.checkpoint_interval_s, "seconds")
        if self.spot_probe_interval_s is not None:
            _positive("spot probe interval", self.spot_probe_interval_s, "seconds")


@dataclass(frozen=True)
class Batch:
    """The plan's batch: global, accumulation, the local cap, and its schedule."""

    global_batch: int | None = None
    accum_steps: int | None = None
    max_local_batch: int | None = None
    # The plan's global-batch schedule, as KPLAN_BATCH_SCHEDULE's JSON (runtime/batch_schedule.py)
    schedule: str | None = None

    def __post_init__(self) -> None:
        for name in ("global_batch", "accum_steps", "max_local_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"{name} {value} must be >= 1", hint="or leave it unset")
        if self.schedule is not None:
            from kplan.runtime.batch_schedule import parse

            parse(self.schedule, "the plan's batch schedule")


@dataclass(frozen=True)
class Training:
    """How the workers train: precision, gradient compression, sync policy, runtime policies."""

    precision: str = "fp32"  # what the workers train in (KPLAN_PRECISION; the plan's precision)
    # Communication-efficient training (core/compression_spec.py, runtime/selsync.py): the plan's
    # choice, as KPLAN_COMPRESSION / KPLAN_SYNC_POLICY; the defaults leave the script's own.
    compression: str = "none"
    sync_policy: str = "every"
    policies: tuple[str, ...] = ()  # runtime policies (KPLAN_POLICIES)
    rdzv_port: int = 29400

    def __post_init__(self) -> None:
        from kplan.core.compression_spec import parse_compression
        from kplan.runtime.selsync import parse_sync_policy

        check_precision(self.precision, "precision")
        parse_compression(self.compression, "the plan's compression")
        parse_sync_policy(self.sync_policy, "the plan's sync_policy")
        if not 1 <= self.rdzv_port <= 65535:
            raise InputError(f"rendezvous port {self.rdzv_port} out of range", hint="1-65535")


@dataclass(frozen=True)
class NodeInstall:
    """How nodes get kplan (kplan/launcher/wheel.py): the wheel of the launcher's own kplan,
    shipped through the bucket; its dependencies from the node's index, pinned, or the image."""

    image: str | None = None
    wheel: str | None = None  # the wheel file on the launcher's machine
    wheel_sha256: str | None = None
    requirements: tuple[str, ...] = ()  # pip requirements installed with it (pinned)
    pip_index_url: str | None = None  # pip --index-url on the nodes (None: the node's default)
    install_deps: bool = True  # False: the image has the dependencies (pip install --no-deps)
    python: str = "python3"  # interpreter on the node (local: the launcher's own)

    def __post_init__(self) -> None:
        check_node_install(self.wheel, self.wheel_sha256, self.requirements)
        if self.pip_index_url is not None:
            check_index_url(self.pip_index_url)


@dataclass(frozen=True)
class Placement:
    """GCP placement and identity (ClusterSpec): None/True keep the provider's configuration."""

    network: str | None = None
    subnet: str | None = None
    service_account: str | None = None
    external_ip: bool = True


@dataclass(frozen=True)
class Adaptation:
    """Online adaptation (kplan/launcher/adapt.py)."""

    enabled: bool = False  # re-plan from the refitted model and resize (--adapt)
    explore: bool = False  # short trials chosen by Bayesian optimisation first (--explore)
    max_nodes: int | None = None  # largest node count a resize may reach (None: the plan's)
    replan_interval_s: float = 60.0
    replan_margin: float = 0.1  # hysteresis: switch only when better by more than this
    restart_s: float | None = None  # a restart's cost in seconds (None: a default, then measured)
    explore_trials: int = 6
    explore_overhead: float = 0.1  # trials stop at this fraction of the predicted time left

    def __post_init__(self) -> None:
        _positive("replan interval", self.replan_interval_s, "seconds")
        if not (0.0 <= self.replan_margin < 10.0):
            raise InputError(f"replan margin {self.replan_margin!r} must be in [0, 10)", "e.g. 0.1")
        if self.restart_s is not None:
            _at_least("restart cost", self.restart_s)
        if self.explore_trials < 1:
            raise InputError(f"--explore-trials {self.explore_trials} must be >= 1", hint="e.g. 6")
        if not (0.0 < self.explore_overhead <= 1.0):
            raise InputError(
                f"--explore-overhead {self.explore_overhead!r} must be in (0, 1]",
                hint="a fraction of the predicted time left, e.g. 0.1",
            )


@dataclass(frozen=True)
class Prediction:
    """What the plan predicted for the job, and where its prices differ from the catalog's."""

    hours: float | None = None
    cost_usd: float | None = None
    cost_p90_usd: float | None = None
    price_notes: tuple[str, ...] = ()


# The settings records of a job: JobSpec's field name -> the record's class.
GROUPS: dict[str, type] = {
    "timing": Timing,
    "recovery": Recovery,
    "batch": Batch,
    "training": Training,
    "install": NodeInstall,
    "placement": Placement,
    "adaptation": Adaptation,
    "predicted": Prediction,
    "costs": Costs,  # disks, storage and egress (kplan/launcher/ledger.py)
    "moves": Moves,  # the regions a job may move to (kplan/launcher/move_spec.py)
}
# Flat option names whose record field is named otherwise (every other flat name is its field's).
_RENAMED = {
    "batch_schedule": "schedule",
    "kplan_wheel": "wheel",
    "kplan_wheel_sha256": "wheel_sha256",
    "node_requirements": "requirements",
    "adapt": "enabled",
    "predicted_hours": "hours",
    "predicted_cost_usd": "cost_usd",
    "predicted_cost_p90_usd": "cost_p90_usd",
    "move_regions": "regions",
}
_TUPLES = {"policies", "requirements", "price_notes"}


def _flat_names() -> dict[str, tuple[str, str]]:
    by_field = {v: k for k, v in _RENAMED.items()}
    return {
        by_field.get(f.name, f.name): (group, f.name)
        for group, cls in GROUPS.items()
        for f in fields(cls)
    }


FLAT = _flat_names()  # flat option name -> (JobSpec's record field, the record's field)


class JobOptions(TypedDict, total=False):
    """A job's settings in the flat keyword form (``JobSpec.build``, ``JobSpec.local``; the
    job.json of kplan before the nested records): each goes to its record by :data:`FLAT`."""

    storage_uri: str | None
    deadline_h: float | None
    allow_on_demand: bool
    offers: tuple[ZoneOffer, ...]
    plan: Plan | None
    check_interval_s: float
    grace_s: float
    teardown_s: float
    provision_timeout_s: float
    finish_grace_s: float
    rdzv_last_call_s: float
    lease_s: float
    idle_s: float | None
    max_restarts: int
    max_replacements: int
    capacity_wait_s: float
    spot_probe_interval_s: float | None
    checkpoint_interval_s: float | None
    global_batch: int | None
    accum_steps: int | None
    max_local_batch: int | None
    batch_schedule: str | None
    precision: str
    compression: str
    sync_policy: str
    policies: tuple[str, ...]
    rdzv_port: int
    image: str | None
    kplan_wheel: str | None
    kplan_wheel_sha256: str | None
    node_requirements: tuple[str, ...]
    pip_index_url: str | None
    install_deps: bool
    python: str
    network: str | None
    subnet: str | None
    service_account: str | None
    external_ip: bool
    adapt: bool
    explore: bool
    max_nodes: int | None
    replan_interval_s: float
    replan_margin: float
    restart_s: float | None
    explore_trials: int
    explore_overhead: float
    price_notes: tuple[str, ...]
    predicted_hours: float | None
    predicted_cost_usd: float | None
    predicted_cost_p90_usd: float | None
    disk_usd_node_h: float
    storage_usd_h: float
    egress_usd: float
    move_regions: tuple[MoveRegion, ...]
    checkpoint_gb: float
    copy_gbps: float


def nest(flat: Mapping[str, object], strict: bool = True) -> dict[str, object]:
    """``flat`` options as JobSpec keyword arguments: each settings option inside its record
    (the rest of the records at their defaults). ``strict``: an unknown name is a TypeError
    (a caller's typo); otherwise it is skipped (a job.json field this kplan no longer has)."""
    top = {f.name for f in fields(JobSpec)} - set(GROUPS)
    out: dict[str, object] = {}
    parts: dict[str, dict[str, object]] = {group: {} for group in GROUPS}
    for name, value in flat.items():
        if name in FLAT:
            group, key = FLAT[name]
            parts[group][key] = tuple(cast("Iterable[str]", value)) if key in _TUPLES else value
        elif name in top:
            out[name] = value
        elif strict:
            raise TypeError(f"JobSpec has no option {name!r}")
    for group, cls in GROUPS.items():
        out[group] = cls(**parts[group])
    return out


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    cloud: str
    region: str
    script: str  # path of the training script (local: run in place; clouds: packed)
    nodes: tuple[NodeSpec, ...]
    budget_usd: float
    args: tuple[str, ...] = ()
    deadline_h: float | None = None
    allow_on_demand: bool = False
    offers: tuple[ZoneOffer, ...] = ()  # where replacements may go (the region's zones)
    storage_uri: str | None = None  # where code, status and logs go (None: the cloud's default)
    timing: Timing = Timing()
    recovery: Recovery = Recovery()
    batch: Batch = Batch()
    training: Training = Training()
    install: NodeInstall = NodeInstall()
    placement: Placement = Placement()
    adaptation: Adaptation = Adaptation()
    predicted: Prediction = Prediction()
    costs: Costs = field(default_factory=Costs)
    moves: Moves = field(default_factory=Moves)
    plan: Plan | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        if self.cloud not in CLOUDS:
            raise InputError(f"unknown cloud {self.cloud!r}", hint=f"one of: {', '.join(CLOUDS)}")
        if not self.nodes:
            raise InputError("the job has no nodes", hint="a plan needs at least one node")
        ranks = [n.node_rank for n in self.nodes]
        if ranks != list(range(len(ranks))):
            raise InputError(f"node ranks {ranks} are not 0..{len(ranks) - 1}", hint="fix the plan")
        if not (math.isfinite(self.budget_usd) and self.budget_usd >= 0):
            raise InputError(f"--budget {self.budget_usd!r} must be >= 0", hint="USD, e.g. 20")
        if self.deadline_h is not None:
            _positive("--deadline", self.deadline_h, "hours, e.g. 12")
        max_nodes = self.adaptation.max_nodes
        if max_nodes is not None and max_nodes < len(self.nodes):
            raise InputError(
                f"--max-nodes {max_nodes} is below the job's {len(self.nodes)} node(s)",
                hint="give at least the number of nodes the job starts with",
            )

    @classmethod
    def build(
        cls,
        job_id: str,
        cloud: str,
        region: str,
        script: str,
        nodes: tuple[NodeSpec, ...],
        budget_usd: float,
        args: tuple[str, ...] = (),
        **options: Unpack[JobOptions],
    ) -> JobSpec:
        """A job from its settings in the flat keyword form (:class:`JobOptions`)."""
        values = nest(options)
        return cls(job_id, cloud, region, script, nodes, budget_usd, tuple(args), **values)  # type: ignore[arg-type]

    @property
    def horizon_s(self) -> float:
        """From one guard check to the instances being gone if the next check stops the job."""
        t = self.timing
        return t.check_interval_s + t.grace_s + t.teardown_s

    @property
    def restart_estimate_s(self) -> float:
        """What a checkpointed restart costs before one was measured: local processes start in
        seconds, cloud instances boot and install in minutes."""
        if self.adaptation.restart_s is not None:
            return self.adaptation.restart_s
        return 15.0 if self.cloud == "local" else 300.0

    @property
    def workers(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def usd_per_hour(self) -> float:
        return sum(n.usd_per_hour for n in self.nodes)

    def recovery_policy(self) -> RecoveryPolicy:
        """The recovery rules this job runs with, as the planner's simulator takes them
        (``kplan/planner/spot.py``); ``checkpoint_interval_s`` unset: the policy's default."""
        from kplan.planner.spot import RecoveryPolicy

        policy = RecoveryPolicy()
        zones = {o.zone for o in self.offers if o.market == "spot"}
        rec = self.recovery
        return RecoveryPolicy(
            restart_s=self.restart_estimate_s,
            provisioning_s=policy.provisioning_s,
            checkpoint_interval_s=rec.checkpoint_interval_s or policy.checkpoint_interval_s,
            checkpoint_s=policy.checkpoint_s,
            max_replacements=rec.max_replacements,
            capacity_wait_s=rec.capacity_wait_s,
            allow_on_demand=self.allow_on_demand,
            zone_failover=len(zones) > 1,
        )

    def candidates(self, node: NodeSpec) -> list[NodeSpec]:
        """Where to put a replacement for ``node``: its own zone and market first, then the
        region's other zones (cheapest first), then on-demand if ``allow_on_demand``."""
        out = [node]
        offers = [o for o in self.offers if o.instance_type == node.instance_type]
        markets: list[Market] = [node.market]
        if self.allow_on_demand and node.market == "spot":
            markets.append("on-demand")
        for market in markets:
            for o in sorted(offers, key=lambda o: (o.zone != node.zone, o.usd_per_hour, o.zone)):
                cand = replace(node, zone=o.zone, market=market, usd_per_hour=o.usd_per_hour)
                if o.market == market and cand not in out:
                    out.append(cand)
        return out

    def to_dict(self) -> dict[str, object]:
        """The job.json form: the settings records nested by name, the plan apart."""
        doc = asdict(self)
        doc.pop("plan")
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], plan: Plan | None = None) -> JobSpec:
        """A job from its job.json form, nested (``to_dict``) or the flat form of kplan before
        the settings records; a field this kplan does not know is skipped."""
        flat: dict[str, object] = {}
        for group in GROUPS:
            part = doc.get(group)
            if isinstance(part, dict):
                by_field = {key: name for name, (g, key) in FLAT.items() if g == group}
                flat.update({by_field[k]: v for k, v in part.items() if k in by_field})
        flat.update({k: v for k, v in doc.items() if k not in GROUPS})  # the flat form
        flat["nodes"] = tuple(NodeSpec(**n) for n in doc["nodes"])
        flat["args"] = tuple(doc.get("args", ()))
        flat["offers"] = tuple(ZoneOffer(**o) for o in doc.get("offers", ()))
        flat["plan"] = plan
        return cls(**nest(flat, strict=False))  # type: ignore[arg-type]

    @classmethod
    def local(
        cls,
        script: str,
        args: tuple[str, ...] = (),
        *,
        nodes: int = 1,
        workers_per_node: int = 1,
        budget_usd: float = 0.0,
        job_id: str | None = None,
        **options: Unpack[JobOptions],
    ) -> JobSpec:
        """A job on the local provider: ``nodes`` worker groups on this machine, free."""
        if nodes < 1 or workers_per_node < 1:
            raise InputError(
                f"--nodes {nodes} / --workers-per-node {workers_per_node} must be >= 1",
                hint="e.g. --nodes 2 --workers-per-node 1",
            )
        options.setdefault("check_interval_s", LOCAL_CHECK_INTERVAL_S)
        options.setdefault("grace_s", 30.0)
        options.setdefault("teardown_s", 40.0)
        options.setdefault("finish_grace_s", 30.0)
        options.setdefault("rdzv_last_call_s", 5.0)
        specs = tuple(
            NodeSpec(r, "local", "on-demand", "local", workers_per_node, 0.0) for r in range(nodes)
        )
        return cls.build(
            job_id or new_job_id(), "local", "local", script, specs, budget_usd, args, **options
        )


# A local job's monitor tick (JobSpec.local): the launcher sees the head node running, and every
# node finished, at its next tick (the local plan predicts both waits from it).
LOCAL_CHECK_INTERVAL_S = 2.0


def nodes_from_plan_row(row: PlanRow) -> tuple[NodeSpec, ...]:
    """The nodes of a plan row: its groups in order, ranks 0..n-1."""
    nodes: list[NodeSpec] = []
    for g in row.groups:
        market: Market = "spot" if g.market == "spot" else "on-demand"
        for _ in range(g.nodes):
            nodes.append(
                NodeSpec(
                    len(nodes), g.instance_type, market, g.zone, g.gpus_per_node, g.usd_per_hour
                )
            )
    return tuple(nodes)
