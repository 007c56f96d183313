"""What ``kplan launch`` was asked for: the flags as one request, with small nested records for
the pins of a plan made now, GCP placement and what the nodes install."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class PlanPins:
    """Pins for a plan made now (as in kplan estimate; ``plan_nodes`` is estimate's --nodes)."""

    instance_types: tuple[str, ...] = ()
    plan_nodes: str | None = None  # "4" or "2-8"
    global_batch: int | None = None
    max_global_batch: int | None = None
    fixed_batch: bool = False


@dataclass(frozen=True)
class GcpPlacement:
    """GCP only: the instances' network, subnet, service account and public IP."""

    network: str | None = None
    subnet: str | None = None
    service_account: str | None = None
    external_ip: bool = True  # False gives the instances no public IP


@dataclass(frozen=True)
class NodeInstall:
    """Clouds only: what the nodes boot and how they install kplan's dependencies."""

    image: str | None = None
    pip_index_url: str | None = None
    install_deps: bool = True  # False when the image already has torch etc.


@dataclass(frozen=True)
class MoveRequest:
    """Clouds only: other regions the job may move to when its spot pool runs dry, the
    checkpoint's size (None: the plan's) and the copy's bandwidth (None: the default)."""

    regions: tuple[str, ...] = ()
    checkpoint_gb: float | None = None
    copy_gbps: float | None = None


@dataclass(frozen=True)
class LaunchRequest:
    script: Path
    budget_usd: float
    args: tuple[str, ...] = ()
    cloud: str | None = None  # None: the plan's cloud, else local
    deadline_h: float | None = None
    spot: bool | None = None  # None: both markets
    plan_file: Path | None = None
    profile: Path | None = None
    example_profile: str | None = None
    region: str | None = None
    # Several --cloud / --region: the places a plan made now chooses from (cli/launch_flags.py)
    clouds: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    storage_uri: str | None = None
    nodes: int = 1  # local only
    workers_per_node: int = 1  # local only
    allow_on_demand: bool = False
    check_interval_s: float | None = None
    max_restarts: int | None = None
    job_id: str | None = None
    adapt: bool = False
    explore: bool = False
    max_nodes: int | None = None
    policies: tuple[str, ...] = ()
    explore_trials: int | None = None
    replan_interval_s: float | None = None
    checkpoint_interval_s: float | None = None
    max_replacements: int | None = None  # None: the plan's (kplan/planner/spotplan.py), else 20
    capacity_wait_s: float | None = None  # None: the plan's, else 900 s
    lease_minutes: float | None = None  # the hard stop's lease (None: JobSpec's, 15 min)
    idle_minutes: float | None = None  # end the cluster when idle this long (None: never)
    moves: MoveRequest = field(default_factory=MoveRequest)  # --move-region and its inputs
    node_install: NodeInstall = field(default_factory=NodeInstall)
    gcp: GcpPlacement = field(default_factory=GcpPlacement)
    pins: PlanPins = field(default_factory=PlanPins)
    precision: str | None = None  # a pin for a plan made now; a local job trains in it
    # Gradient compression (core/compression_spec.py) and SelSync (runtime/selsync.py): what the
    # workers run; a plan made now is searched with the compression pinned
    compression: str | None = None
    sync_policy: str | None = None
    # The work to plan for (kplan estimate's --epochs / --dataset-size; default: the profile's)
    epochs: float | None = None
    dataset_size: int | None = None
    price_usd_per_hour: float | None = None  # local: this machine's price (None: free)
    # The training data for a plan made now (kplan estimate's --data-gb / --data-region)
    data_gb: float = 0.0
    data_region: str | None = None
