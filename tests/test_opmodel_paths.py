"""Which path moves a profiled step to a GPU: measured, op-graph ratio, device model, outright."""

from __future__ import annotations

import dataclasses

import pytest

from kplan.catalogs.device_model import load_device_model
from kplan.catalogs.loader import shipped_catalog
from kplan.catalogs.op_model import load_op_model
from kplan.planner.devices import compute_scale
from kplan.planner.opgraph import OpCall, OpGraph
from kplan.planner.opmodel_paths import speed_from_graph
from kplan.planner.opwork import matmul_work, vector_work

OPS, DEVICES, GPUS = load_op_model(), load_device_model(), shipped_catalog().gpus


def _graph(precision: str = "fp32") -> OpGraph:
    dims = (8, 1024, 1024, 1024)
    calls = (
        OpCall("matmul", "aten.bmm", "forward", "fp32", dims, *matmul_work(dims), 24),
        OpCall("norm", "ln", "forward", "fp32", (8192, 1024), *vector_work("ln", (8192, 1024)), 48),
    )
    return OpGraph(calls, local_batch=8, precision=precision, how="test")


def test_same_gpu_is_the_measurement() -> None:
    got = speed_from_graph(OPS, DEVICES, _graph(), GPUS["V100"], GPUS["V100"])
    assert (got.path, got.factor, got.log_sigma) == ("measured", 1.0, 0.0)


def test_without_a_graph_the_device_model_answers() -> None:
    got = speed_from_graph(OPS, DEVICES, None, GPUS["V100"], GPUS["A100"])
    want = compute_scale(DEVICES, GPUS["V100"], GPUS["A100"])
    assert got.path == "device model" and got.note == "no operator graph"
    assert (got.factor, got.log_sigma) == (want.factor, want.log_sigma)


@pytest.mark.parametrize(("src", "dst"), [("V100", "A100"), ("T4", "H100"), ("H100", "L4")])
def test_across_gpus_the_smaller_held_out_sigma_wins(src: str, dst: str) -> None:
    got = speed_from_graph(OPS, DEVICES, _graph(), GPUS[src], GPUS[dst])
    device = compute_scale(DEVICES, GPUS[src], GPUS[dst])
    assert got.path in ("op-graph ratio", "device model")
    assert got.log_sigma <= device.log_sigma
    assert "larger" in got.note
    back = speed_from_graph(OPS, DEVICES, _graph(), GPUS[dst], GPUS[src])
    if got.path == back.path == "op-graph ratio":
        assert got.factor * back.factor == pytest.approx(1.0)


def test_a_cpu_profile_is_predicted_outright_with_a_sigma_below_the_old_one() -> None:
    for name in ("T4", "V100", "A100", "L4", "H100"):
        got = speed_from_graph(OPS, DEVICES, _graph(), None, GPUS[name])
        assert got.path == "op-graph outright" and got.factor == 0.0
        assert 0 < got.seconds < 10 and 0 < got.log_sigma < 0.7
        assert got.note.startswith(f"sigma {got.log_sigma:.2f} (calibrated on ")


def test_a_tf32_plan_times_an_fp32_graph_on_tensor_cores() -> None:
    fp32 = speed_from_graph(OPS, DEVICES, _graph(), None, GPUS["A100"])
    tf32 = speed_from_graph(OPS, DEVICES, _graph(), None, GPUS["A100"], dst_precision="tf32")
    assert tf32.seconds < fp32.seconds
    assert "traced in fp32, timed in tf32" in tf32.note


def test_a_cpu_profile_without_a_graph_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPU time"):
        speed_from_graph(OPS, DEVICES, None, None, GPUS["T4"])


def test_a_less_certain_device_model_hands_over_to_the_graph_ratio() -> None:
    wide = dataclasses.replace(
        DEVICES, sigma={"cross_gpu": {"full": {"base": 2.0, "per_distance": 0.0}}}
    )
    got = speed_from_graph(OPS, wide, _graph(), GPUS["V100"], GPUS["A100"])
    back = speed_from_graph(OPS, wide, _graph(), GPUS["A100"], GPUS["V100"])
    assert got.path == back.path == "op-graph ratio"
    assert got.note.endswith("device model's 2.00 is larger")
    assert f"sigma {got.log_sigma:.2f} (calibrated on" in got.note
    assert got.factor * back.factor == pytest.approx(1.0)
    assert 0.2 < got.factor < 1.0  # an A100 is faster than a V100 on a large FP32 matmul
