"""The operator-level time model: work formulas, the shipped fit, its sigma and its loader."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from kplan.catalogs.loader import shipped_catalog
from kplan.catalogs.op_model import SHIPPED, load_op_model
from kplan.core.errors import CatalogError, DataFileError, SchemaVersionError
from kplan.planner.opgraph import OpCall, OpGraph
from kplan.planner.opmodel import (
    CLASSES,
    OpDevice,
    OpModel,
    device_from_gpu,
    features,
    features_batch,
)
from kplan.planner.opwork import conv_out, conv_work, matmul_work, vector_work

MODEL = load_op_model()
GPUS = shipped_catalog().gpus


def dev(name: str) -> OpDevice:
    return device_from_gpu(GPUS[name])


def fp32(name: str) -> OpDevice:
    d = dev(name)
    return OpDevice(d.name, d.fp32_tflops, d.mem_bw_gbs, d.sm_count, {})


def mm(b: int, m: int, n: int, k: int, dtype: str = "fp32", count: int = 1) -> OpCall:
    size = 2 if dtype in ("fp16", "bf16") else 4
    return OpCall(
        "matmul",
        "aten.bmm",
        "forward",
        dtype,
        (b, m, n, k),
        *matmul_work((b, m, n, k), size),
        count,
    )


def graph(*calls: OpCall, precision: str = "fp32") -> OpGraph:
    return OpGraph(calls, local_batch=1, precision=precision, how="test")


@pytest.mark.parametrize(
    ("dims", "itemsize", "flops", "nbytes"),
    [
        ((1, 2, 3, 4), 4, 48.0, 4 * (2 * 4 + 4 * 3 + 2 * 3)),
        ((2, 2, 3, 4), 2, 96.0, 2 * 2 * (8 + 12 + 6)),
        ((1, 1024, 1024, 1024), 4, 2 * 1024**3, 4 * 3 * 1024**2),
    ],
)
def test_matmul_work(dims: tuple[int, ...], itemsize: int, flops: float, nbytes: float) -> None:
    assert matmul_work(dims, itemsize) == (flops, nbytes)


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "padding", "out"),
    [(224, 7, 2, 3, 112), (56, 3, 1, 1, 56), (56, 1, 2, 0, 28), (7, 3, 1, 0, 5), (1, 3, 1, 0, 1)],
)
def test_conv_out(size: int, kernel: int, stride: int, padding: int, out: int) -> None:
    assert conv_out(size, kernel, stride, padding) == out


def test_conv_work_is_its_implicit_gemm() -> None:
    flops, nbytes = conv_work((8, 64, 128, 3, 56, 1, 1))
    assert flops == 2 * (8 * 56 * 56) * 128 * (64 * 9)
    assert nbytes == 4 * (8 * 64 * 56 * 56 + 128 * 64 * 9 + 8 * 128 * 56 * 56)


@pytest.mark.parametrize(
    ("op", "flops", "nbytes"),
    [
        ("add", 100.0, 1200.0),
        ("addu", 100.0, 800.0),
        ("softmax", 500.0, 800.0),
        ("ln", 800.0, 800.0),
    ],
)
def test_vector_work(op: str, flops: float, nbytes: float) -> None:
    assert vector_work(op, (10, 10)) == (flops, nbytes)


def test_shipped_file_is_small_and_says_what_it_was_fitted_on() -> None:
    path = Path(__file__).resolve().parents[1] / "kplan" / "catalogs" / SHIPPED
    assert path.stat().st_size < 80_000
    doc = MODEL.doc
    assert doc["fitted_on"]["gpus"] == ["P4", "P100", "T4", "V100", "A100-40GB"]
    assert set(doc["held_out"]["leave_one_gpu_out"]) == set(CLASSES)


def test_shipped_sigmas_are_the_held_out_errors() -> None:
    """Each class's bias sigma is the RMS of its held-out GPUs' errors, as stored."""
    for cls in CLASSES:
        per_gpu = MODEL.doc["held_out"]["leave_one_gpu_out"][cls]
        assert len(per_gpu) == 5
        rms = math.sqrt(sum(v["bias_log_error"] ** 2 for v in per_gpu.values()) / len(per_gpu))
        assert MODEL.classes[cls].sigma_bias == pytest.approx(rms, abs=1e-3)


@pytest.mark.parametrize("gpu", ["T4", "V100", "A100", "L4", "H100"])
def test_large_fp32_matmul_runs_at_a_physical_share_of_peak(gpu: str) -> None:
    """A 4096^3 sgemm between 20% and 100% of the FP32 peak on every GPU."""
    d = fp32(gpu)
    sec = MODEL.call_seconds(
        "matmul", "mm", (1, 4096, 4096, 4096), *matmul_work((1, 4096, 4096, 4096)), d, "fp32"
    )
    share = 2 * 4096**3 / sec / (d.fp32_tflops * 1e12)
    assert 0.2 < share <= 1.0


def test_utilisation_stays_bounded_on_a_gpu_far_from_the_fitted_ones() -> None:
    """However far the specs sit from P4-A100 (here 1 PFLOPS FP32, 5000 SMs), the time is at
    least the roofline's over the class's bound: no extrapolation to faster than physics."""
    far = OpDevice("far", 1000.0, 50_000.0, 5000, {})
    for dims in ((1, 8192, 8192, 8192), (64, 128, 128, 64), (1, 7, 3, 5)):
        work = matmul_work(dims)
        sec = MODEL.call_seconds("matmul", "mm", dims, *work, far, "fp32")
        t_roof, _ = features("matmul", "mm", dims, *work, far, "fp32")
        assert sec >= t_roof / MODEL.classes["matmul"].u_max
        assert sec >= MODEL.classes["matmul"].floor_s


def test_tiny_kernels_cost_a_launch_floor() -> None:
    """A 1x1 add costs microseconds (the floor), far above its roofline time."""
    d = fp32("A100")
    sec = MODEL.call_seconds("elementwise", "add", (1, 1), *vector_work("add", (1, 1)), d, "fp32")
    t_roof, _ = features("elementwise", "add", (1, 1), *vector_work("add", (1, 1)), d, "fp32")
    assert 1e-6 < sec < 1e-4
    assert sec > 100 * t_roof


def test_step_time_sums_calls_times_count() -> None:
    d = fp32("V100")
    one = MODEL.step_time(graph(mm(1, 2048, 2048, 2048)), d).seconds
    three = MODEL.step_time(graph(mm(1, 2048, 2048, 2048, count=3)), d).seconds
    assert three == pytest.approx(3 * one)


def test_bigger_work_takes_longer_and_faster_gpus_take_less() -> None:
    g = graph(mm(16, 1024, 4096, 1024))
    assert (
        MODEL.step_time(graph(mm(32, 1024, 4096, 1024)), fp32("T4")).seconds
        > MODEL.step_time(g, fp32("T4")).seconds
    )
    t4, h100 = MODEL.step_time(g, fp32("T4")).seconds, MODEL.step_time(g, fp32("H100")).seconds
    assert h100 < t4 / 3


def test_ratio_is_one_on_the_same_gpu_and_inverts() -> None:
    g = graph(
        mm(8, 512, 512, 512),
        OpCall(
            "softmax",
            "softmax",
            "forward",
            "fp32",
            (4096, 512),
            *vector_work("softmax", (4096, 512)),
        ),
    )
    assert MODEL.ratio(g, fp32("V100"), fp32("V100")) == (1.0, 0.0)
    ab, s_ab = MODEL.ratio(g, fp32("V100"), fp32("A100"))
    ba, s_ba = MODEL.ratio(g, fp32("A100"), fp32("V100"))
    assert ab * ba == pytest.approx(1.0)
    assert s_ab == pytest.approx(s_ba) and s_ab > 0


def test_tensor_core_precisions_are_faster_and_widen_the_sigma() -> None:
    calls = (mm(1, 4096, 4096, 4096),)
    a100 = dev("A100")
    full = MODEL.step_time(graph(*calls, precision="fp32"), a100)
    tf32 = MODEL.step_time(graph(*calls, precision="tf32"), a100)
    half = MODEL.step_time(graph(mm(1, 4096, 4096, 4096, "fp16")), a100)
    assert tf32.seconds < full.seconds and half.seconds < full.seconds
    assert tf32.log_sigma > full.log_sigma and "tensor-core" in tf32.note
    assert full.note == ""
    # A T4 has no TF32 tensor cores: a tf32 step runs as fp32 there.
    t4 = dev("T4")
    assert MODEL.step_time(graph(*calls, precision="tf32"), t4).seconds == pytest.approx(
        MODEL.step_time(graph(*calls), t4).seconds
    )


def test_other_kinds_are_timed_as_memory_passes() -> None:
    d = fp32("A100")
    for kind, dims in (("embedding", (4096, 1024)), ("optimizer", (10**8,)), ("other", (10**6,))):
        call = OpCall(kind, "x", "forward", "fp32", dims, 0.0, 8.0 * math.prod(dims))
        cls, sec = MODEL.time_call(call, d)
        assert cls == "elementwise"
        assert call.bytes / (d.mem_bw_gbs * 1e9) < sec < 1.0
    att = OpCall("attention", "sdpa", "forward", "fp32", (32, 512, 512, 64), 1e9, 1e7)
    assert MODEL.time_call(att, d)[1] > 0


def test_attention_is_timed_by_the_pairs_it_computes() -> None:
    """A backward (twice the FLOPs) costs about twice a forward, a causal one about half."""
    d, dims = fp32("A100"), (64, 2048, 2048, 64)
    dense = 4.0 * 64 * 2048 * 2048 * 64

    def sec(flops: float, phase: str = "forward") -> float:
        return MODEL.time_call(OpCall("attention", "sdpa", phase, "fp32", dims, flops, 1e7), d)[1]

    assert sec(0.0) == pytest.approx(sec(dense))  # no count: one dense forward
    assert 1.8 < sec(2 * dense, "backward") / sec(dense) < 2.2
    assert 0.4 < sec(dense * (2049 / 4096)) / sec(dense) < 0.6


def test_p90_is_above_the_expected_value() -> None:
    step = MODEL.step_time(graph(mm(4, 1024, 1024, 1024)), fp32("L4"))
    assert step.p90 > step.seconds


def _doc() -> dict[str, object]:
    return json.loads(json.dumps(MODEL.doc))  # type: ignore[no-any-return]


def test_from_dict_refuses_other_schemas_and_bad_classes() -> None:
    doc = _doc()
    doc["schema"] = "kplan.op-model/1.0"
    with pytest.raises(SchemaVersionError):
        OpModel.from_dict(doc)
    doc = _doc()
    doc["classes"]["matmul"]["out_w"] = [1.0]  # type: ignore[index]
    with pytest.raises(DataFileError, match="matmul"):
        OpModel.from_dict(doc)
    doc = _doc()
    del doc["classes"]["conv"]  # type: ignore[attr-defined]
    with pytest.raises(DataFileError, match="conv"):
        OpModel.from_dict(doc)


def test_loader_names_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "op.json"
    bad.write_text("{not json")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_op_model(bad)
    with pytest.raises(CatalogError, match="cannot read"):
        load_op_model(tmp_path / "missing.json")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(MODEL.doc))
    again = load_op_model(good)
    for cls in CLASSES:
        assert (again.classes[cls].hidden_w == MODEL.classes[cls].hidden_w).all()


def test_device_needs_positive_specs() -> None:
    with pytest.raises(ValueError, match="sm_count"):
        OpDevice("x", 10.0, 100.0, 0, {})
    with pytest.raises(ValueError, match="mem_bw_gbs"):
        OpDevice("x", 10.0, 0.0, 10, {})


def test_step_times_over_several_gpus_match_one_at_a_time() -> None:
    g = graph(mm(8, 512, 512, 512), mm(1, 4096, 1024, 1024, count=4))
    devs = [fp32("T4"), dev("A100"), fp32("H100")]
    together = MODEL.step_times(g, devs)
    for got, d in zip(together, devs, strict=True):
        alone = MODEL.step_time(g, d)
        assert got.seconds == pytest.approx(alone.seconds, rel=1e-12)
        assert got.log_sigma == pytest.approx(alone.log_sigma, rel=1e-12)


def test_batched_features_are_the_scalar_ones() -> None:
    """``features_batch`` (the planner's path) gives ``features``'s numbers (the fitter's)."""
    calls: dict[str, list[tuple[str, tuple[int, ...], str]]] = {
        "matmul": [("bmm", (8, 512, 64, 512), "fp32"), ("mm", (1, 4096, 4096, 4096), "tf32")],
        "conv": [
            ("conv", (32, 64, 128, 3, 56, 1, 1), "fp32"),
            ("conv", (8, 3, 64, 7, 224, 2, 3), "fp16"),
        ],
        "softmax": [("softmax", (16384, 512), "fp32")],
        "norm": [("ln", (1024, 1024), "fp32")],
        "elementwise": [("gelu", (1024, 4096), "fp32"), ("aten.add", (1, 1), "fp16")],
    }
    devs = [dev("T4"), dev("A100"), dev("H100"), dev("L4")]
    for cls, rows in calls.items():
        pieces: list[tuple[str, str, tuple[int, ...], float, float, str, int]] = []
        for op, dims, prec in rows:
            size = 2 if prec == "fp16" else 4
            work = (
                matmul_work(dims, size)
                if cls == "matmul"
                else conv_work(dims, size)
                if cls == "conv"
                else vector_work(op, dims, size)
            )
            pieces.append((cls, op, dims, *work, prec, 1))
        t_roof, x = features_batch(cls, pieces, devs)
        for g, d in enumerate(devs):
            for i, (_, op, dims, flops, nbytes, prec, _) in enumerate(pieces):
                want_t, want_x = features(cls, op, dims, flops, nbytes, d, prec)
                assert t_roof[g, i] == pytest.approx(want_t, rel=1e-12)
                assert x[g, i] == pytest.approx(want_x, rel=1e-9, abs=1e-12)


# ---- the step sigma's calibration and the in-stream floor (issue 25, items 3 and 4) ----------


def test_shipped_model_states_a_held_out_sigma_per_path() -> None:
    """Both paths carry an FP32 sigma fitted on held-out steps of the eight labelled GPUs (the
    five fitted ones left out in turn, the three never fitted), and a large FP32 step states
    that sigma (its kernel spread averaged away)."""
    for path in ("outright", "ratio"):
        row = MODEL.doc["calibration"][path]["fp32"]
        assert MODEL.calibration[path]["fp32"] == row["sigma"]
        assert 0.02 < row["sigma"] < 0.7 and row["gpus"] == 8 and row["steps"] >= 70
    step = MODEL.step_time(graph(mm(64, 1024, 1024, 1024, count=400)), fp32("A100"))
    want = math.hypot(MODEL.calibration["outright"]["fp32"], step.spread)
    assert step.log_sigma == pytest.approx(want) and step.spread < 0.1


def test_a_precision_without_held_out_steps_takes_fp32s_sigma_and_says_so() -> None:
    s32, why32 = MODEL.path_sigma("outright", "fp32")
    s16, why16 = MODEL.path_sigma("outright", "fp16")
    assert s32 is not None and s16 == s32 and why32 == "" and "no held-out fp16 steps" in why16
    half = MODEL.step_time(graph(mm(1, 4096, 4096, 4096, "fp16"), precision="fp16"), dev("A100"))
    assert "no held-out fp16 steps" in half.note and half.log_sigma > s32


def test_a_schema_2_0_document_falls_back_to_the_kernel_biases() -> None:
    doc = _doc()
    doc["schema"] = "kplan.op-model/2.0"
    old = OpModel.from_dict(doc)  # a 2.0 document's calibration is not read
    assert old.calibration == {} and old.path_sigma("ratio", "fp32") == (None, "")
    g = graph(mm(64, 1024, 1024, 1024))
    step = old.step_time(g, fp32("A100"))
    bias = MODEL.classes["matmul"].sigma_bias
    assert step.log_sigma == pytest.approx(math.hypot(bias, step.spread))
    a, b = old.step_times(g, [fp32("V100"), fp32("A100")])
    assert old.ratio(g, fp32("V100"), fp32("A100"))[1] == pytest.approx(
        math.hypot(a.log_sigma, b.log_sigma)
    )


@pytest.mark.parametrize(
    "bad",
    [{"outright": {"fp32": {"sigma": -0.1}}}, {"sideways": {}}, {"ratio": {"fp32": {}}}],
)
def test_a_bad_calibration_is_refused(bad: object) -> None:
    doc = _doc()
    doc["calibration"] = bad
    with pytest.raises(DataFileError, match="bad op model"):
        OpModel.from_dict(doc)


def test_in_a_step_the_host_runs_ahead_of_the_device() -> None:
    """A phase lasts the longer of its device time and its host's dispatch time: tiny kernels
    alone cost their floors; queued with a long GEMM in the same phase they cost only their
    device time (the host dispatched them while the GEMM ran); in another phase they do not
    hide behind it."""
    d = fp32("A100")
    floor = MODEL.classes["elementwise"].floor_s
    tiny = OpCall("elementwise", "add", "forward", "fp32", (1, 8), *vector_work("add", (1, 8)))
    tiny = dataclasses.replace(tiny, count=100)
    big = mm(1, 8192, 8192, 8192)
    alone_tiny = MODEL.step_time(graph(tiny), d).seconds
    assert alone_tiny == pytest.approx(100 * floor)
    alone_big = MODEL.step_time(graph(big), d).seconds
    both = MODEL.step_time(graph(big, tiny), d)
    assert alone_big < both.seconds < alone_big + 0.1 * alone_tiny
    later = MODEL.step_time(graph(big, dataclasses.replace(tiny, phase="backward")), d)
    assert later.seconds == pytest.approx(alone_big + alone_tiny)
    assert sum(both.by_class.values()) == pytest.approx(both.seconds)


def test_one_call_alone_in_a_step_costs_its_work_or_its_floor() -> None:
    """Timed alone a kernel pays its floor on top of its work; alone in a step's queue it pays
    the larger of the two: a tiny kernel costs its floor, a long one its work."""
    d = fp32("A100")
    floor = MODEL.classes["elementwise"].floor_s
    tiny = OpCall("elementwise", "add", "forward", "fp32", (1, 8), *vector_work("add", (1, 8)))
    alone = MODEL.call_seconds("elementwise", "add", (1, 8), tiny.flops, tiny.bytes, d, "fp32")
    assert MODEL.time_call(tiny, d)[1] == pytest.approx(floor) and alone > floor
    big = mm(1, 8192, 8192, 8192)
    alone = MODEL.call_seconds("matmul", "mm", big.dims, big.flops, big.bytes, d, "fp32")
    queued = MODEL.time_call(big, d)[1]
    assert queued == pytest.approx(alone - MODEL.classes["matmul"].floor_s)


def test_robust_sigma_is_a_quantile_with_each_gpu_weighing_the_same() -> None:
    from scripts.fit_op_model import robust_sigma

    # Four GPUs off by 0.1, 0.2, 0.3 (one step each) and 0.4 (ten steps), each GPU a quarter
    # of the weight at its middle: the 68% quantile lies between the third GPU's 0.3 (at
    # 0.625) and the fourth's first step (at 0.7625), not at the GPU with ten steps.
    resid = [(0.1, 0.0, "a"), (-0.2, 0.0, "b"), (0.3, 0.0, "c")] + [(-0.4, 0.0, "d")] * 10
    assert robust_sigma(resid) == pytest.approx(0.3 + 0.1 * (0.6827 - 0.625) / 0.1375)
    # A residual inside its own kernel spread asks for no extra sigma.
    assert robust_sigma([(0.05, 0.1, "a"), (0.2, 0.0, "b")]) == pytest.approx(0.2 * 0.4327 / 0.5)
    assert robust_sigma([(0.05, 0.1, "a")] * 3) == pytest.approx(1e-3)
