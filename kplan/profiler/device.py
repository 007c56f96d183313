"""Facts about this machine's device, measured on the spot.

``fp32_tflops`` is achieved (not peak) dense fp32 matmul throughput; ``mem_bw_gbs`` is achieved
device-memory bandwidth from a large tensor copy (bytes read plus bytes written per second).
The planner uses both to place an uncatalogued device among the catalogued ones.
"""

from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# CUDA device names -> catalog GPU names (the catalog follows SkyPilot's accelerator names).
# Order matters: the first pattern that matches wins.
_GPU_NAMES: tuple[tuple[str, str], ...] = (
    (r"GH200", "GH200"),
    (r"H200", "H200"),
    (r"H100.*NVL", "H100-NVL"),
    (r"H100", "H100"),
    (r"B200", "B200"),
    (r"A100.*80\s*GB", "A100-80GB"),
    (r"A100", "A100"),
    (r"A10G", "A10G"),
    (r"\bA10\b", "A10"),
    (r"L40S", "L40S"),
    (r"\bL40\b", "L40"),
    (r"\bL4\b", "L4"),
    (r"V100.*32\s*GB", "V100-32GB"),
    (r"V100", "V100"),
    (r"\bT4\b", "T4"),
    (r"P100", "P100"),
    (r"\bP4\b", "P4"),
    (r"K80", "K80"),
)


def gpu_catalog_name(cuda_name: str) -> str:
    """The catalog name of a CUDA device ("NVIDIA H100 80GB HBM3" -> "H100").

    An unknown device keeps its own name without the vendor words, so the profile still says
    what it was ("NVIDIA GeForce RTX 4090" -> "RTX 4090").
    """
    for pattern, name in _GPU_NAMES:
        if re.search(pattern, cuda_name, flags=re.IGNORECASE):
            return name
    short = re.sub(r"\b(NVIDIA|Tesla|GeForce|Quadro)\b", "", cuda_name)
    return " ".join(short.split()) or cuda_name


@dataclass(frozen=True)
class DeviceFacts:
    gpu: str  # catalog name, or "cpu"
    description: str  # what the device calls itself
    fp32_tflops: float
    mem_bw_gbs: float
    memory_gb: float | None  # device memory (None on CPU)
    count: int  # CUDA devices visible (0 on CPU)
    # The slowest repeat over the fastest, the larger of the two benchmarks (the best repeat is
    # what is kept): near 1 on a quiet device; several times on a busy, shared machine.
    spread: float = 1.0


def _best_time(
    fn: Callable[[], Any], sync: Callable[[], None], repeats: int
) -> tuple[float, float]:
    """(fastest, slowest) of ``repeats`` timed runs after one warm-up run."""
    fn()  # warm up: allocation, kernel selection, thread pool start
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times), max(times)


def _time_matmul(
    torch: Any, dev: Any, n: int, sync: Callable[[], None], repeats: int
) -> tuple[float, float]:
    a = torch.randn(n, n, device=dev, dtype=torch.float32)
    b = torch.randn(n, n, device=dev, dtype=torch.float32)
    out = torch.empty(n, n, device=dev, dtype=torch.float32)
    # Keep TF32 off: the number wanted is fp32 throughput.
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _best_time(lambda: torch.mm(a, b, out=out), sync, repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _time_copy(
    torch: Any, dev: Any, numel: int, sync: Callable[[], None], repeats: int
) -> tuple[float, float]:
    src = torch.ones(numel, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    return _best_time(lambda: dst.copy_(src), sync, repeats)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu ({line.partition(':')[2].strip()})"
    except OSError:
        pass
    return f"cpu ({platform.processor() or platform.machine()})"


def measure_device(device: str = "auto", quick: bool = False) -> DeviceFacts:
    """Benchmark the device: fp32 matmul TFLOP/s and copy bandwidth in GB/s.

    ``device`` is "auto" (CUDA if available), "cuda" or "cpu". ``quick`` uses smaller sizes.
    """
    import torch

    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        dev = torch.device("cuda")
        name = torch.cuda.get_device_name(dev)
        n, copy_mb, repeats = (4096, 256, 5) if quick else (8192, 1024, 10)
        memory_gb: float | None = torch.cuda.get_device_properties(dev).total_memory / 1e9

        def sync() -> None:
            torch.cuda.synchronize(dev)
    else:
        dev = torch.device("cpu")
        name = _cpu_name()
        n, copy_mb, repeats = (512, 32, 3) if quick else (1024, 128, 3)
        memory_gb = None

        def sync() -> None:
            return None

    numel = copy_mb * 2**20 // 4
    matmul_s, matmul_worst = _time_matmul(torch, dev, n, sync, repeats)
    copy_s, copy_worst = _time_copy(torch, dev, numel, sync, repeats)
    if use_cuda:
        torch.cuda.empty_cache()
    return DeviceFacts(
        gpu=gpu_catalog_name(name) if use_cuda else "cpu",
        description=name,
        fp32_tflops=2.0 * n**3 / matmul_s / 1e12,
        mem_bw_gbs=2.0 * numel * 4 / copy_s / 1e9,  # one read and one write per element
        memory_gb=memory_gb,
        count=torch.cuda.device_count() if use_cuda else 0,
        spread=max(matmul_worst / matmul_s, copy_worst / copy_s),
    )
