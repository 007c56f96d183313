"""A CPU profile's compute reaches a GPU through its operator graph (the op model) where it has
one, through the device model widened by CPU_TO_GPU_EXTRA_LOG_SIGMA where not; GPU profiles keep
the device model."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.app.planning import load_example
from kplan.catalogs.device_model import load_device_model
from kplan.catalogs.loader import shipped_catalog
from kplan.catalogs.op_model import load_op_model
from kplan.cli.main import app
from kplan.planner import perfmodel
from kplan.planner.devices import compute_scale
from kplan.planner.opmodel import device_from_gpu
from kplan.planner.opmodel_paths import batch_line
from kplan.planner.profile import Profile, profile_to_dict
from kplan.planner.workload import (
    CPU_TO_GPU_EXTRA_LOG_SIGMA,
    DEVICE_MODEL,
    compute_speed,
    for_instance,
    workload_from_profile,
)

OPS, DEVICES, CATALOG = load_op_model(), load_device_model(), shipped_catalog()
GPUS = CATALOG.gpus


def _cpu_profile(with_graph: bool = True) -> Profile:
    """The cifar10 example (its fit and traced graph) as if profiled on a CPU."""
    p = load_example("cifar10-resnet18")
    assert p.opgraph is not None
    rows = tuple(dataclasses.replace(m, gpu="cpu") for m in p.measurements)  # one device's rows
    return dataclasses.replace(
        p,
        gpu="cpu",
        measurements=rows,
        measured_fp32_tflops=1.0,
        measured_mem_bw_gbs=50.0,
        cloud="",
        instance_type="",
        opgraph=p.opgraph if with_graph else None,
    )


def _params(p: Profile) -> perfmodel.PerfParams:
    assert p.fit is not None
    return perfmodel.params_from_dict(p.fit)


@pytest.mark.parametrize("gpu", ["T4", "V100", "A100", "H100"])
def test_a_cpu_profile_with_a_graph_takes_the_op_model_factor(gpu: str) -> None:
    p = _cpu_profile()
    w = workload_from_profile(p, GPUS, params=_params(p), op_model=OPS)
    got = compute_speed(w, GPUS[gpu], DEVICES, "fp32")
    assert p.opgraph is not None
    step = OPS.step_time(p.opgraph, device_from_gpu(GPUS[gpu]))
    # the CPU's line moved by the two factors passes through the op model's time of the graph
    # at its own batch, and its intercept is the graph's launch floor (below that time)
    assert got.fixed_factor is not None
    a, b = w.params.compute_a * got.fixed_factor, w.params.compute_b * got.factor
    assert a + b * p.opgraph.local_batch == pytest.approx(step.seconds)
    assert 0 < a < step.seconds and b > 0
    assert got.log_sigma == pytest.approx(step.log_sigma)
    assert 0 < got.log_sigma < CPU_TO_GPU_EXTRA_LOG_SIGMA
    assert got.basis.startswith("op-graph")


def test_a_launch_bound_graph_still_grows_with_the_batch() -> None:
    """A tiny graph whose every kernel sits at its launch floor: the line's slope is at least
    the time to move the batch's bytes once (never 0: a zero slope divides by zero downstream)."""
    p = _cpu_profile()
    assert p.opgraph is not None
    tiny = dataclasses.replace(
        p.opgraph,
        ops=tuple(
            dataclasses.replace(o, flops=o.flops * 1e-7, bytes=o.bytes * 1e-7)
            for o in p.opgraph.ops
        ),
    )
    line = batch_line(OPS, tiny, GPUS["H100"], "fp32")
    moved = sum(o.bytes * o.count for o in tiny.ops if o.phase != "optimizer")
    assert line.per_sample_s * tiny.local_batch >= moved / (GPUS["H100"].mem_bw_gbs * 1e9) * 0.999
    assert line.per_sample_s > 0 and line.intercept_s > 0


def test_without_a_graph_the_device_model_and_its_extra_sigma_remain() -> None:
    p = _cpu_profile(with_graph=False)
    w = workload_from_profile(p, GPUS, params=_params(p), op_model=OPS)
    got = compute_speed(w, GPUS["A100"], DEVICES, "fp32")
    want = compute_scale(DEVICES, w.ref_gpu, GPUS["A100"])
    assert got.factor == want.factor
    assert got.log_sigma == math.hypot(want.log_sigma, CPU_TO_GPU_EXTRA_LOG_SIGMA)
    assert got.log_sigma > CPU_TO_GPU_EXTRA_LOG_SIGMA
    assert got.basis.startswith("device model from a CPU profile (no operator graph")


def test_what_the_op_model_cannot_time_falls_back_to_the_device_model() -> None:
    p = _cpu_profile()
    w = workload_from_profile(p, GPUS, params=_params(p), op_model=OPS)
    half = compute_speed(w, GPUS["A100"], DEVICES, "bf16")  # an fp32 graph, a 16-bit plan
    assert half.basis.startswith("device model") and "traced in fp32" in half.basis
    assert half.log_sigma > CPU_TO_GPU_EXTRA_LOG_SIGMA
    no_sms = dataclasses.replace(GPUS["A100"], sm_count=0)
    blind = compute_speed(w, no_sms, DEVICES, "fp32")
    assert blind.basis.startswith("device model") and "no SM count" in blind.basis


def test_a_gpu_profile_keeps_the_device_model() -> None:
    p = load_example("cifar10-resnet18")
    w = workload_from_profile(p, GPUS, params=_params(p), op_model=OPS)
    assert w.graph_timing is None  # the graph is kept for CPU profiles only
    inst = next(i for i in CATALOG.instances.values() if i.gpu == "A100")
    pred = for_instance(w, inst, GPUS["A100"], DEVICES)
    want = compute_scale(DEVICES, w.ref_gpu, GPUS["A100"])
    assert (pred.compute_factor, pred.compute_log_sigma) == (want.factor, abs(want.log_sigma))
    assert pred.compute_basis == DEVICE_MODEL


def test_for_instance_carries_the_op_graph_sigma_into_the_prediction() -> None:
    p = _cpu_profile()
    w = workload_from_profile(p, GPUS, params=_params(p), op_model=OPS)
    inst = next(i for i in CATALOG.instances.values() if i.gpu == "V100")
    pred = for_instance(w, inst, GPUS["V100"], DEVICES)
    got = compute_speed(w, GPUS["V100"], DEVICES, "fp32")
    assert (pred.compute_factor, pred.compute_log_sigma) == (got.factor, got.log_sigma)
    assert pred.params.log_sigma == pytest.approx(math.hypot(w.params.log_sigma, got.log_sigma))
    assert pred.compute_basis.startswith("op-graph")


def test_estimate_says_the_op_graph_basis(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(profile_to_dict(_cpu_profile())), "utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["estimate", "--profile", str(path), "--json", "--top", "3"])
    assert result.exit_code == 0, result.output
    basis = json.loads(result.output)["assumptions"]["compute_basis"]
    assert basis.startswith("op-graph") and "held-out sigma 0." in basis
    text = runner.invoke(app, ["estimate", "--profile", str(path), "--top", "3"])
    assert text.exit_code == 0, text.output
    assert "op-graph" in text.output
