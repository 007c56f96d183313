"""Catalog types: plain, validated data that the planner searches.

Loading and validating files is done by ``kplan.catalogs``; the planner only sees these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kplan.planner.spot import SpotModel

Cloud = Literal["aws", "gcp"]
Market = Literal["on-demand", "spot"]
CLOUDS: tuple[Cloud, ...] = ("aws", "gcp")
MARKETS: tuple[Market, ...] = ("on-demand", "spot")
# What kind of zone an offer is in (the EC2 API's ``ZoneType``). Local Zones and Wavelength
# Zones must be opted into per account and have few instances: searched only when asked.
ZoneType = Literal["availability-zone", "local-zone", "wavelength-zone"]
ZONE_TYPES: tuple[ZoneType, ...] = ("availability-zone", "local-zone", "wavelength-zone")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's published specs."""

    name: str  # canonical short name, e.g. "T4", "A100-80GB", "H100"
    memory_gb: float
    fp32_tflops: float  # dense FP32 (non-tensor-core) peak
    fp16_tflops: float  # dense FP16/BF16 tensor-core peak
    mem_bw_gbs: float  # HBM/GDDR bandwidth, GB/s
    source: str
    # Optional (gpus.csv columns may be empty): dense TF32 / BF16 tensor-core peaks (None: the
    # GPU has no such tensor cores, so tf32 and bf16 run as FP32) and the SM count.
    tf32_tflops: float | None = None
    bf16_tflops: float | None = None
    sm_count: int | None = None


@dataclass(frozen=True)
class InstanceType:
    """One VM type: its GPUs, host and network."""

    cloud: Cloud
    name: str  # e.g. "g4dn.12xlarge", "a2-highgpu-8g", "n1-standard-8+4xT4"
    gpu: str  # GpuSpec.name
    gpu_count: int
    vcpus: int
    memory_gb: float
    network_gbps: float  # NIC bandwidth to other instances
    interconnect: Literal["nvlink", "pcie", "none"]  # between the GPUs of one instance
    interconnect_gbps: float  # per-GPU intra-node all-reduce bandwidth, Gbit/s
    source: str


# How NCCL crosses nodes on an instance type's NIC: "rdma" (AWS's Elastic Fabric Adapter with the
# aws-ofi-nccl plugin, or GPUDirect RDMA over RoCE) or "tcp" (NCCL's socket transport on a plain
# NIC). Sources: AWS EC2 user guide, "Elastic Fabric Adapter: supported instance types" and "Get
# started with EFA and NCCL" (p3dn 1 x 100, p4d/p4de 4 x 100, p5/p5e/p5en 32 x 100 or 16 x 200
# Gbit/s EFA, p6 EFAv4: the bandwidth the catalog records is EFA's); Google Cloud, "GPU machine
# types" (A3 Ultra and A4: GPUDirect RDMA over RoCE). Smaller AWS types (g4dn.12xlarge
# included: the Pollux traces measured it over TCP) reach other nodes over TCP unless an EFA
# interface and the plugin are set up; GCP's gVNIC is TCP, and A3 High/Mega's GPUDirect-TCPX(O)
# is counted as TCP (no measurement of it in the shared data). fit.PRIOR_*_BY_FABRIC.
RDMA_TYPES: tuple[tuple[str, str], ...] = (
    ("aws", "p3dn"),
    ("aws", "p4d"),
    ("aws", "p4de"),
    ("aws", "p5"),
    ("aws", "p5e"),
    ("aws", "p5en"),
    ("aws", "p6"),
    ("gcp", "a3-ultragpu"),
    ("gcp", "a4-highgpu"),
)


def nic_fabric(inst: InstanceType) -> Literal["rdma", "tcp"]:
    """The fabric NCCL uses between two nodes of this instance type (see RDMA_TYPES)."""
    family = inst.name.split(".")[0] if inst.cloud == "aws" else inst.name.rsplit("-", 1)[0]
    if inst.cloud == "aws":
        family = family.split("-")[0]  # p6-b200 -> p6
    return "rdma" if (inst.cloud, family) in RDMA_TYPES else "tcp"


@dataclass(frozen=True)
class Offer:
    """A price for one instance type in one zone and market."""

    cloud: Cloud
    instance_type: str
    region: str
    zone: str
    market: Market
    usd_per_hour: float
    source: str
    zone_type: ZoneType = "availability-zone"  # zones.csv, else from the zone id (catalogs.zones)

    @property
    def opt_in(self) -> bool:
        """A zone an account must opt into (AWS Local Zone or Wavelength Zone)."""
        return self.zone_type != "availability-zone"


@dataclass(frozen=True)
class SpotRate:
    """Expected spot preemptions per instance-hour for instance types matching a prefix."""

    cloud: Cloud
    family: str  # instance-type prefix, e.g. "g4dn", "p3", "a2"; "*" is the cloud's default
    per_hour: float
    source: str


@dataclass(frozen=True)
class Billing:
    """A cloud's billing rule: a minimum charge, then per-increment rounding."""

    cloud: Cloud
    minimum_s: float
    increment_s: float
    source: str

    def billed_seconds(self, seconds: float) -> float:
        """Seconds charged for an instance that ran ``seconds``."""
        if seconds <= 0:
            return 0.0
        billed = max(seconds, self.minimum_s)
        steps = -(-billed // self.increment_s)  # ceil
        return float(steps * self.increment_s)


@dataclass(frozen=True)
class StoragePrice:
    """A region's storage and data-transfer list prices (``storage_prices.csv``): object storage
    and block disk (AWS gp3, GCP pd-balanced) per GB-month, egress per GB to another region of
    the same cloud, to the internet and to another cloud."""

    cloud: Cloud
    region: str
    object_usd_gb_month: float
    disk_usd_gb_month: float
    egress_region_usd_gb: float
    egress_internet_usd_gb: float
    egress_cloud_usd_gb: float
    source: str
    as_of: str  # ISO date the prices were read


@dataclass(frozen=True)
class Catalog:
    """Everything the search needs, validated."""

    gpus: dict[str, GpuSpec]
    instances: dict[tuple[str, str], InstanceType]  # keyed by (cloud, name)
    offers: tuple[Offer, ...]
    spot_rates: tuple[SpotRate, ...]
    billing: dict[str, Billing]
    version: str  # e.g. "shipped-2026.11" or "user-2026-11-20"
    notes: tuple[str, ...] = field(default=())  # rows skipped during validation, with reasons
    spot_model: SpotModel | None = None  # the fitted spot model (kplan.catalogs loads it)
    # storage and egress list prices by (cloud, region): kplan/planner/extra_costs.py
    storage: dict[tuple[str, str], StoragePrice] = field(default_factory=dict)

    def spot_rate(self, cloud: str, instance_type: str) -> SpotRate:
        """The most specific spot rate for an instance type (longest matching prefix)."""
        matches = [
            r
            for r in self.spot_rates
            if r.cloud == cloud and (r.family == "*" or instance_type.startswith(r.family))
        ]
        if not matches:
            raise KeyError(f"no spot rate for {cloud}:{instance_type}")
        return max(matches, key=lambda r: -1 if r.family == "*" else len(r.family))
