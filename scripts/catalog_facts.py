"""Published facts that ``scripts/build_catalogs.py`` writes into the catalog, each with its source.

Only what the shared data folder lacks is here: GPU specs NeuSight does not give, the GPU links
of each instance family, AWS types missing from the skypilot subset or from moto's copy of
describe-instance-types, GCP machine shapes and network bandwidths, the N1 host rates, and the
billing rules. Numbers are facts from the pages named; nothing here is copied prose.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuFact:
    """One GPU. FP32 and bandwidth come from the NeuSight device config ``neusight`` unless
    given, so that the device-speed model fitted on NeuSight sees the same features."""

    name: str
    memory_gb: float
    fp16_tflops: float  # dense FP16/BF16 tensor-core peak
    source: str
    neusight: str = ""
    fp32_tflops: float = 0.0
    mem_bw_gbs: float = 0.0


# Dense TF32 and BF16 tensor-core peaks (TFLOPS; 0 = no such tensor cores: tf32/bf16 run as FP32)
# and SM counts, for the device model's precision mapping (kplan.planner.devices.peak_tflops).
# Datasheets quote sparse peaks for Ampere and later; these are the dense halves.
TENSOR_SPECS: dict[str, tuple[float, float, int, str]] = {
    "T4": (0, 0, 40, "Turing: no TF32/BF16; 40 SMs (NeuSight Num_Sm)"),
    "V100": (0, 0, 80, "Volta: no TF32/BF16; 80 SMs"),
    "V100-32GB": (0, 0, 80, "Volta: no TF32/BF16; 80 SMs"),
    "A10G": (35, 70, 80, "A10G: TF32 half its FP16 tensor peak (Ampere GA102); 80 SMs"),
    "L4": (60, 121, 58, "NVIDIA L4 datasheet: TF32 120 / BF16 242 with sparsity; 58 SMs"),
    "L40S": (183, 362, 142, "NVIDIA L40S datasheet: TF32 366 / BF16 733 with sparsity; 142 SMs"),
    "A100": (156, 312, 108, "NVIDIA A100 datasheet: TF32 156, BF16 312 dense; 108 SMs"),
    "A100-80GB": (156, 312, 108, "NVIDIA A100 datasheet: TF32 156, BF16 312 dense; 108 SMs"),
    "H100": (494.7, 989.4, 132, "NVIDIA H100 SXM datasheet: TF32 989 / BF16 1,979 sparse; 132 SMs"),
    "H200": (494.7, 989.4, 132, "NVIDIA H200 SXM datasheet: TF32 989 / BF16 1,979 sparse; 132 SMs"),
    "B200": (1100, 2250, 148, "NVIDIA HGX B200: TF32 2.2 / BF16 4.5 PFLOPS sparse; 148 SMs"),
}

GPUS = (
    GpuFact("T4", 16, 65, "NVIDIA T4 datasheet: 16 GB; 65 TFLOPS FP16 tensor", "Tesla_T4"),
    GpuFact(
        "V100",
        16,
        125,
        "NVIDIA V100 datasheet, SXM2 16 GB: 15.7 TFLOPS FP32, 125 TFLOPS tensor, 900 GB/s "
        "(NeuSight has only the PCIe part)",
        fp32_tflops=15.7,
        mem_bw_gbs=900,
    ),
    GpuFact(
        "V100-32GB",
        32,
        125,
        "NVIDIA V100 datasheet, SXM2 32 GB: 15.7 TFLOPS FP32, 125 TFLOPS tensor, 900 GB/s",
        fp32_tflops=15.7,
        mem_bw_gbs=900,
    ),
    GpuFact(
        "A10G",
        24,
        70,
        "AWS A10G (g5): 24 GB GDDR6, 600 GB/s, 35 TFLOPS FP32, 70 TFLOPS FP16 tensor "
        "(baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference)",
        fp32_tflops=35.0,
        mem_bw_gbs=600,
    ),
    GpuFact(
        "L4",
        24,
        121,
        "NVIDIA L4 datasheet: 24 GB; 242 TFLOPS FP16 tensor with sparsity (121 dense)",
        "NVIDIA_L4",
    ),
    GpuFact(
        "L40S",
        48,
        362,
        "NVIDIA L40S datasheet: 48 GB, 864 GB/s, 91.6 TFLOPS FP32, 733 TFLOPS FP16 tensor with "
        "sparsity (362 dense)",
        fp32_tflops=91.6,
        mem_bw_gbs=864,
    ),
    GpuFact(
        "A100",
        40,
        312,
        "NVIDIA A100 datasheet: 40 GB; 312 TFLOPS FP16 tensor",
        "NVIDIA_A100-SXM4-40GB",
    ),
    GpuFact(
        "A100-80GB",
        80,
        312,
        "NVIDIA A100 datasheet, SXM4 80 GB: 2,039 GB/s (NeuSight's PCIe part: 1,935); 312 "
        "TFLOPS FP16 tensor; FP32 as NeuSight (same SMs and clock)",
        "NVIDIA_A100_80GB_PCIe",
        mem_bw_gbs=2039,
    ),
    GpuFact(
        "H100",
        80,
        989.4,
        "NVIDIA H100 SXM datasheet: 80 GB; 1,979 TFLOPS FP16 tensor with sparsity (989.4 dense)",
        "NVIDIA_H100_80GB_HBM3",
    ),
    GpuFact(
        "H200",
        141,
        989.4,
        "NVIDIA H200 SXM datasheet: 141 GB, 4.8 TB/s, 67 TFLOPS FP32, 1,979 TFLOPS FP16 tensor "
        "with sparsity",
        fp32_tflops=67.0,
        mem_bw_gbs=4800,
    ),
    GpuFact(
        "B200",
        180,
        2250,
        "NVIDIA HGX B200 (1,000 W) per GPU: 180 GB HBM3e, 8 TB/s, 80 TFLOPS FP32, 4.5 PFLOPS "
        "FP16 tensor with sparsity (via glennklockwood.com/garden/processors/B200)",
        fp32_tflops=80.0,
        mem_bw_gbs=8000,
    ),
)

# Links between the GPUs of one instance: per GPU and direction, Gbit/s -> (kind, source).
LINKS = {
    100: ("pcie", "PCIe gen3 x16: 15.75 GB/s raw per direction, ~100 Gbit/s usable"),
    200: ("pcie", "PCIe gen4 x16: 31.5 GB/s raw per direction, ~200 Gbit/s usable"),
    1200: ("nvlink", "NVLink 2 (V100): 6 links x 25 GB/s = 150 GB/s per direction"),
    2400: ("nvlink", "NVLink 3 (A100): 12 links x 25 GB/s = 300 GB/s per direction"),
    3600: ("nvlink", "NVLink 4 (H100/H200): 18 links x 25 GB/s = 450 GB/s per direction"),
    7200: ("nvlink", "NVLink 5 (B200): 900 GB/s per direction"),
}
# fmt: off
LINK_BY_GPU = {"T4": 100, "A10G": 200, "L4": 200, "L40S": 200, "V100": 1200, "V100-32GB": 1200,
               "A100": 2400, "A100-80GB": 2400, "H100": 3600, "H200": 3600, "B200": 7200}
# fmt: on

# ---- AWS ---------------------------------------------------------------------------------------

AWS_LIST_REGIONS = ("us-east-1", "us-east-2", "us-west-2")  # the same list price in these three
AWS_LIST_SRC = (
    "AWS on-demand list price, Linux, us-east-1/us-east-2/us-west-2 "
    "(aws.amazon.com/ec2/pricing/on-demand)"
)
# Types the skypilot subset lacks: on-demand list price in AWS_LIST_REGIONS, and the subset type
# whose spot discount in a zone estimates the spot price there.
AWS_EXTRA = {
    "g4dn.12xlarge": (3.912, "g4dn.xlarge"),
    "g5.48xlarge": (16.288, "g5.12xlarge"),
    "g6.12xlarge": (4.6016, "g6.xlarge"),
    "p3.2xlarge": (3.06, "p3.8xlarge"),
    "p3.16xlarge": (24.48, "p3.8xlarge"),
}
# p3 sizes absent from moto's describe-instance-types: GPUs, vCPUs, GiB, NetworkPerformance.
AWS_P3_SRC = "aws.amazon.com/ec2/instance-types/p3 (absent from moto's copy)"
AWS_P3 = {
    "p3.2xlarge": (1, 8, 61.0, "Up to 10 Gigabit"),
    "p3.8xlarge": (4, 32, 244.0, "10 Gigabit"),
    "p3.16xlarge": (8, 64, 488.0, "25 Gigabit"),
}
# "Up to N Gigabit" means a baseline with bursts of 5 to 60 minutes (AWS "instance network
# bandwidth" docs): the catalog uses the published baseline; without one, N times this.
UP_TO_BASELINE = 0.25  # g5.xlarge and g6.xlarge: baseline 2.5 of "up to 10"

# ---- GCP ---------------------------------------------------------------------------------------

GCP_DOC = "cloud.google.com/compute/docs/accelerator-optimized-machines"
GCP_NET_DOC = "cloud.google.com/compute/docs/gpus/gpu-network-bandwidth"
# Family of GPU-bundled types -> (accelerator row name in the skypilot subset, catalog GPU).
GCP_BUNDLED = {
    "a2-highgpu": ("A100", "A100"),
    "a2-megagpu": ("A100", "A100"),
    "a2-ultragpu": ("A100-80GB", "A100-80GB"),
    "a3-highgpu": ("H100", "H100"),
    "a3-megagpu": ("H100-MEGA", "H100"),
    "a3-ultragpu": ("H200", "H200"),
    "a4-highgpu": ("B200", "B200"),
}
# fmt: off
GCP_NETWORK = {  # maximum egress bandwidth, Gbit/s (GCP_NET_DOC)
    "a2-highgpu-1g": 24, "a2-highgpu-2g": 32, "a2-highgpu-4g": 50, "a2-highgpu-8g": 100,
    "a2-megagpu-16g": 100, "a2-ultragpu-1g": 24, "a2-ultragpu-2g": 32, "a2-ultragpu-4g": 50,
    "a2-ultragpu-8g": 100, "a3-highgpu-1g": 25, "a3-highgpu-2g": 50, "a3-highgpu-4g": 100,
    "a3-highgpu-8g": 1000, "a3-megagpu-8g": 1800, "a3-ultragpu-8g": 3600, "a4-highgpu-8g": 3600,
    "g2-standard-4": 10, "g2-standard-8": 16, "g2-standard-12": 16, "g2-standard-16": 32,
    "g2-standard-24": 32, "g2-standard-32": 32, "g2-standard-48": 50, "g2-standard-96": 100,
}
G2 = {  # vCPUs, GB, L4 count (GCP_DOC)
    "g2-standard-4": (4, 16, 1), "g2-standard-8": (8, 32, 1), "g2-standard-12": (12, 48, 1),
    "g2-standard-16": (16, 64, 1), "g2-standard-24": (24, 96, 2), "g2-standard-32": (32, 128, 1),
    "g2-standard-48": (48, 192, 4), "g2-standard-96": (96, 384, 8),
}
# N1 hosts for attached T4/V100: a few standard shapes per GPU count (GCP allows up to 48 or 96
# vCPUs with T4, up to 12 per V100).
N1_SHAPES = {("T4", 1): (4, 8), ("T4", 2): (8, 16), ("T4", 4): (16, 32), ("V100", 1): (8,),
             ("V100", 2): (16,), ("V100", 4): (32,), ("V100", 8): (64,)}
# n1-standard price per vCPU (with its 3.75 GB), USD/h, (on-demand, spot): the n1-standard-2 price
# / 2 in Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml @0166a59 (generated
# 2025-03-06, Apache-2.0), i.e. $0.031611/vCPU + $0.004237/GB on demand in us-central1.
N1_RATES = {
    "us-central1": (0.04749975, 0.0130025), "us-east1": (0.04749975, 0.0130025),
    "us-east4": (0.05349625, 0.01076375), "us-east5": (0.04749975, 0.01),
    "us-south1": (0.056049705, 0.0118), "us-west1": (0.04749975, 0.0130025),
    "us-west2": (0.05705375, 0.0152975), "us-west3": (0.05705375, 0.0165275),
    "us-west4": (0.05349625, 0.0112025),
}
# fmt: on
N1_SRC = "Cyclenerd pricing.yml @0166a59 (2025-03-06) n1-standard rate"
N1_NET_SRC = (
    "GCP network-bandwidth docs: N1 egress 2 Gbit/s per vCPU, at most 32 (the up to 100 Gbit/s "
    "of T4/V100 VMs needs gVNIC and is not assumed)"
)

BILLING = (
    (
        "aws",
        60,
        1,
        "AWS EC2 Linux on-demand and spot: per-second billing, 60 s minimum "
        "(aws.amazon.com/ec2/pricing)",
    ),
    (
        "gcp",
        60,
        1,
        "GCP Compute Engine: vCPUs, GPUs and memory billed 1 minute minimum, then per second "
        "(cloud.google.com/compute/vm-instance-pricing)",
    ),
)
