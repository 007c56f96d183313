"""The provider contract: a few fixed verbs over typed dataclasses (one module per cloud).

Providers: ``local`` (worker groups as local processes), ``aws`` (boto3 EC2) and ``gcp``
(google-cloud-compute), listed in ``kplan/launcher/providers/__init__.py``. Nothing above a provider
sees a cloud SDK exception: providers translate them to ``CloudError`` (retrying only named
transient codes with backoff). Every resource a provider creates carries the job's tag
(``TAG_JOB`` = job id), so ``query_instances`` and ``cleanup`` find leftovers even when the
local state database is gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Market = Literal["spot", "on-demand"]
InstanceState = Literal["pending", "running", "stopping", "terminated", "preempted"]
INSTANCE_STATES: tuple[InstanceState, ...] = (
    "pending",
    "running",
    "stopping",
    "terminated",
    "preempted",
)
TAG_JOB = "kplan-job"  # tag/label key carrying the job id on every resource
TAG_NODE = "kplan-node"  # node rank of the worker group on this instance
TAG_MANAGED = "kplan-managed"  # always "true": what `kplan down --all` looks for
CONTROLLER_RANK = -1  # the node rank of a job's controller instance (launcher/controller_node.py)


@dataclass(frozen=True)
class ClusterSpec:
    """Job-wide settings a provider needs before creating instances."""

    job_id: str
    cloud: str
    region: str
    ports: tuple[int, int] = (29400, 29600)  # rendezvous + NCCL/gloo port range, opened to itself
    ssh_cidr: str | None = None  # open SSH only when asked, and only from this CIDR
    placement_group: bool = False  # multi-node: cluster placement (AWS) / compact policy (GCP)
    storage_uri: str | None = None  # s3://bucket/prefix or gs://bucket/prefix (code, checkpoints)
    # Where the instances sit and as whom they run (GCP; None: the provider's configuration).
    network: str | None = None  # VPC network name or path
    subnet: str | None = None  # subnetwork name (in the region) or path
    service_account: str | None = None  # email of the instances' service account
    external_ip: bool = True  # False: no public IP (the subnet needs Cloud NAT / Private Access)


@dataclass(frozen=True)
class InstanceSpec:
    """One instance to create: a worker group of ``gpu_count`` workers."""

    job_id: str
    name: str  # unique within the job, e.g. "<job>-n0-r1" (node 0, replacement 1)
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: Market
    node_rank: int
    user_data: str  # bootstrap script (cloud-init / startup-script / local command line)
    image: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # the runtime's environment (no secrets)
    tags: Mapping[str, str] = field(default_factory=dict)  # extra tags; TAG_* always added
    # The hard stop (kplan/launcher/hardstop.py): the most seconds this instance may run, from
    # the budget and the deadline (None: no cap). GCP: maxRunDuration, deleted at the end; AWS:
    # the bootstrap's shutdown timer, terminated on power-off.
    max_run_s: int | None = None


@dataclass(frozen=True)
class Instance:
    """What exists, as the provider sees it now."""

    id: str
    job_id: str
    name: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: Market
    state: InstanceState
    node_rank: int
    private_ip: str | None = None
    public_ip: str | None = None
    launched_at: float | None = None  # epoch seconds, as reported by the provider
    reason: str | None = None  # why it stopped, e.g. "spot interruption"

    @property
    def alive(self) -> bool:
        return self.state in ("pending", "running")


class Provider(Protocol):
    """The verbs every provider implements. All are idempotent where that makes sense."""

    name: str

    def prepare(self, cluster: ClusterSpec) -> None:
        """Create job-wide resources (security group / firewall rule, placement group)."""

    def run_instances(self, cluster: ClusterSpec, specs: Sequence[InstanceSpec]) -> list[Instance]:
        """Request the instances; returns them as created (state pending or running)."""

    def wait_instances(self, ids: Sequence[str], timeout_s: float) -> list[Instance]:
        """Block until every instance runs (or failed); CloudError on timeout."""

    def query_instances(self, job_id: str) -> list[Instance]:
        """Every instance carrying the job's tag, whatever its state (found by tag, not by DB)."""

    def terminate_instances(self, ids: Sequence[str]) -> None:
        """Terminate; terminating a terminated or unknown instance is not an error."""

    def cleanup(self, cluster: ClusterSpec) -> None:
        """Delete the job-wide resources ``prepare`` made (after the instances are gone)."""
