"""Small hand-made catalogs, device models and workloads for planner tests."""

from __future__ import annotations

from kplan.catalogs.spot_model_file import shipped_spot_model
from kplan.planner.catalog import Billing, Catalog, GpuSpec, InstanceType, Offer, SpotRate
from kplan.planner.devices import DeviceModel
from kplan.planner.perfmodel import PerfParams
from kplan.planner.profile import GnsPoint
from kplan.planner.workload import Workload

T4 = GpuSpec("T4", 16.0, 8.1, 65.0, 320.0, "test")
A100 = GpuSpec("A100", 40.0, 19.5, 312.0, 1555.0, "test")


def catalog(spot_rate: float = 0.5) -> Catalog:
    inst = {
        ("aws", "g4dn.12xlarge"): InstanceType(
            "aws", "g4dn.12xlarge", "T4", 4, 48, 192.0, 50.0, "pcie", 100.0, "test"
        ),
        ("aws", "g4dn.xlarge"): InstanceType(
            "aws", "g4dn.xlarge", "T4", 1, 4, 16.0, 25.0, "none", 0.0, "test"
        ),
        ("aws", "p4d.24xlarge"): InstanceType(
            "aws", "p4d.24xlarge", "A100", 8, 96, 1152.0, 400.0, "nvlink", 2400.0, "test"
        ),
    }
    offers = (
        Offer("aws", "g4dn.12xlarge", "us-east-1", "us-east-1a", "on-demand", 3.912, "test"),
        Offer("aws", "g4dn.12xlarge", "us-east-1", "us-east-1a", "spot", 1.5, "test"),
        Offer("aws", "g4dn.12xlarge", "us-east-1", "us-east-1b", "spot", 1.2, "test"),
        Offer("aws", "g4dn.xlarge", "us-east-1", "us-east-1a", "on-demand", 0.526, "test"),
        Offer("aws", "g4dn.xlarge", "us-east-1", "us-east-1a", "spot", 0.22, "test"),
        Offer("aws", "p4d.24xlarge", "us-west-2", "us-west-2a", "on-demand", 32.77, "test"),
        Offer("aws", "p4d.24xlarge", "us-west-2", "us-west-2a", "spot", 12.0, "test"),
    )
    return Catalog(
        gpus={"T4": T4, "A100": A100},
        instances=inst,
        offers=offers,
        spot_rates=(
            SpotRate("aws", "*", spot_rate, "test"),
            SpotRate("aws", "g4dn", spot_rate, "test"),
        ),
        billing={"aws": Billing("aws", 60.0, 1.0, "test")},
        version="test",
        spot_model=shipped_spot_model(),
    )


def device_model() -> DeviceModel:
    # A roofline halfway between compute- and memory-bound on a T4, sigma 0.2 across GPUs.
    weights = {p: 8.141 / 320.0 for p in ("fp32", "tf32", "bf16", "fp16")}
    return DeviceModel(
        compute_weight=weights,
        memory_weight=dict.fromkeys(weights, 1.0),
        fitted_on=("T4", "A100"),
        source="test",
        sigma={
            "cross_gpu": {
                "full": {"base": 0.2, "per_distance": 0.0},
                "mixed": {"base": 0.2, "per_distance": 0.0},
            },
            "cross_precision": {"full": 0.3, "mixed": 0.3},
        },
    )


def params(**changes: float) -> PerfParams:
    base = dict(
        compute_a=0.05,
        compute_b=0.004,
        gamma=2.5,
        intra_alpha=0.001,
        intra_beta=0.02,
        intra_lat=1e-5,
        inter_alpha=0.01,
        inter_beta=0.2,
        inter_lat=5e-5,
        two_node=0.0,
        log_sigma=0.08,
        gradient_bytes=1e8,
        intra_gbps=100.0,
        inter_gbps=50.0,
        gpu="T4",
        gpus_per_node=4,
        max_nodes_measured=4,
        max_workers_measured=16,
        inter_measured=True,
    )
    base.update(changes)
    return PerfParams(**base)  # type: ignore[arg-type]


def workload(gns: bool = True, **changes: float) -> Workload:
    return Workload(
        name="test",
        params=params(**changes),
        ref_gpu=T4,
        base_batch=128,
        samples_at_base=50_000 * 30,
        gns=(GnsPoint(0.0, 200.0), GnsPoint(1.0, 4000.0)) if gns else (),
        gradient_bytes=1e8,
        max_local_batch_ref=256,
        static_memory_gb=None,
        per_sample_memory_gb=None,
        ref_is_cpu=False,
    )
