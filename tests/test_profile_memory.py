"""What sets a profile's largest per-GPU batch, and the warnings a profile prints.

A sweep that stopped at ``--max-local-batch`` is not a memory limit: the planner must not treat
it as one where memory was measured (CUDA's allocator peak, or on a CPU the tensors autograd
saves for backward), and the profile says which it was.
"""

from __future__ import annotations

import pytest
import torch

from kplan.catalogs.loader import load_catalog
from kplan.core.errors import DataFileError
from kplan.planner.profile import profile_from_dict, profile_to_dict
from kplan.planner.workload import max_local_batch, workload_from_profile
from kplan.profiler.analyze import (
    ALLOCATOR_BLOCK_BYTES,
    analyze,
    fit_quality,
)
from kplan.profiler.device import DeviceFacts
from kplan.profiler.records import MemoryEvent, ModelEvent, OomEvent, StepRecord
from kplan.profiler.summary import warnings
from kplan.runtime.profile_steps import SavedBytes

GB = 1e9


def _steps(sizes: list[int], per_sample: float = 1e-3, fixed: float = 0.01) -> list[StepRecord]:
    out = []
    step = 0
    for b in sizes:
        for i in range(3):  # one warm-up step, two timed
            t = fixed + per_sample * b
            out.append(StepRecord(step, 0, 1, b, t, 0.0, t, None, "sweep", warmup=i == 0))
            step += 1
    return out


def _records(sizes: list[int], memory: dict[int, int], total: int | None) -> list[object]:
    mem = [MemoryEvent(b, peak, total, 0) for b, peak in memory.items()]
    return [*_steps(sizes), ModelEvent(4000, 1000), *mem]


def test_a_sweep_without_memory_is_limited_by_the_sweep() -> None:
    a = analyze(_records([1, 2, 4], {}, None), warmup=1, steps_per_batch=2)  # type: ignore[arg-type]
    assert (a.max_local_batch, a.max_local_limit, a.memory_fit) == (4, "sweep", None)
    lines = warnings(a, None)
    assert any("largest swept, not a memory limit" in w and "--max-local-batch" in w for w in lines)


def test_an_oom_sets_the_limit() -> None:
    records = [*_records([1, 2, 4], {}, None), OomEvent(8)]
    a = analyze(records, warmup=1, steps_per_batch=2)  # type: ignore[arg-type]
    assert (a.max_local_batch, a.max_local_limit) == (4, "oom")
    assert not any("largest swept" in w for w in warnings(a, None))


def test_a_memory_line_reaching_the_device_memory_lifts_the_sweep_ceiling() -> None:
    # 1 GB static + 10 MB per sample on a 16 GB device: 0.9 * 16 GB fits (14.4 - 1) / 0.01 = 1340.
    memory = {b: int(1e9 + 1e7 * b) for b in (1, 2, 4)}
    a = analyze(_records([1, 2, 4], memory, int(16e9)), warmup=1, steps_per_batch=2)  # type: ignore[arg-type]
    assert a.max_local_limit == "memory"
    assert a.max_local_batch == pytest.approx(1340, abs=1)


def test_a_peak_that_does_not_grow_is_bounded_by_what_the_allocator_resolves() -> None:
    # A tiny model: the peak is flat (even shrinks by noise) over the sweep. The old rule (slope
    # <= 0: keep the sweep's 64) capped a 24 GB GPU at batch 64; the measurement can only say
    # the growth is below one allocator block over the swept range.
    memory = {1: 500_000_000, 16: 500_000_000, 64: 499_000_000}
    a = analyze(_records([1, 16, 64], memory, int(24e9)), warmup=1, steps_per_batch=2)  # type: ignore[arg-type]
    assert a.memory_fit is not None
    assert a.memory_fit.slope == pytest.approx(ALLOCATOR_BLOCK_BYTES / 63)
    assert a.max_local_limit == "memory" and a.max_local_batch > 10_000


def test_fit_quality_flags_a_noisy_sweep_and_not_a_flat_one() -> None:
    a = analyze(_records([1, 2, 4], {}, None), warmup=1, steps_per_batch=2)  # type: ignore[arg-type]
    assert fit_quality(a.sizes, a.compute_fit) < 1e-9  # exact line
    noisy = [*_steps([1, 2, 4, 8]), ModelEvent(4000, 1000)]
    # Make the batch-4 steps three times slower than the line: a busy machine.
    noisy = [
        StepRecord(
            s.step, 0, 1, 4, 3 * s.compute_time, 0.0, 3 * s.step_time, None, "sweep", s.warmup
        )
        if isinstance(s, StepRecord) and s.local_batch == 4
        else s
        for s in noisy
    ]
    b = analyze(noisy, warmup=1, steps_per_batch=2)  # type: ignore[arg-type]
    assert fit_quality(b.sizes, b.compute_fit) > 0.1
    assert any("misses the swept step times" in w for w in warnings(b, None))


def test_an_unstable_device_benchmark_is_a_warning() -> None:
    a = analyze(_records([1, 2, 4], {}, None), warmup=1, steps_per_batch=2)  # type: ignore[arg-type]
    quiet = DeviceFacts("cpu", "cpu", 1.0, 10.0, None, 0, spread=1.2)
    busy = DeviceFacts("cpu", "cpu", 1.0, 10.0, None, 0, spread=6.0)
    assert not any("benchmark" in w for w in warnings(a, quiet))
    assert any("varied 6.0x" in w for w in warnings(a, busy))


def test_saved_bytes_grow_with_the_batch_by_the_activations() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved(batch: int) -> int:
        probe = SavedBytes(params)
        x = torch.randn(batch, 32)
        with torch.autograd.graph.saved_tensors_hooks(probe.pack, probe.unpack):
            loss = model(x).square().mean()
        loss.backward()
        return probe.total

    # Per sample, fp32: the input (kept by the first Linear), ReLU's output (kept by ReLU and
    # by the second Linear: one storage, counted once), the output (kept by square). The first
    # Linear's output is transient: nothing saves it.
    per_sample = (saved(64) - saved(32)) / 32
    assert per_sample == 4 * (32 + 256 + 1)
    assert saved(8) < 8 * per_sample + 1024  # no parameter counted


def test_a_cpu_profile_with_measured_activations_plans_past_its_sweep() -> None:
    doc = _cpu_profile_doc()
    catalog = load_catalog()
    gpu = catalog.gpus["A10G"]
    measured = profile_from_dict(doc)
    w = workload_from_profile(measured, catalog.gpus)
    # 24 GB A10G, 8 MB of state, 100 kB per sample: ~216,000 samples, far past the sweep's 64.
    assert max_local_batch(w, gpu) > 100_000
    unmeasured = profile_from_dict({**doc, "memory": {}})
    assert max_local_batch(workload_from_profile(unmeasured, catalog.gpus), gpu) == 64


def _cpu_profile_doc() -> dict[str, object]:
    return {
        "schema": "kplan.profile/1.1",
        "name": "tiny-mlp",
        "device": {"gpu": "cpu", "gpus_per_node": 1, "fp32_tflops": 0.1, "mem_bw_gbs": 10.0},
        "model": {"gradient_bytes": 2_000_000},
        "batch": {"base_global_batch": 256, "max_local_batch": 64, "max_local_limit": "sweep"},
        "memory": {"static_gb": 0.008, "per_sample_gb": 0.0001},
        "work": {"dataset_size": 100_000, "epochs": 1},
        "measurements": [
            {"nodes": 1, "workers": 1, "local_batch": b, "step_time": 0.01 + 1e-4 * b}
            for b in (1, 8, 64)
        ],
    }


def test_the_limit_round_trips_and_a_bad_one_is_refused() -> None:
    doc = _cpu_profile_doc()
    p = profile_from_dict(doc)
    assert p.max_local_limit == "sweep"
    assert profile_to_dict(p)["batch"]["max_local_limit"] == "sweep"
    with pytest.raises(DataFileError, match="max_local_limit"):
        profile_from_dict({**doc, "batch": {**doc["batch"], "max_local_limit": "x"}})  # type: ignore[dict-item]
