"""The op model's fit on the shared NeuSight data: reproducible, read right, calibrated.

Needs the shared data folder ($KPLAN_SHARED_DATA, else ../shared/data beside the repository);
skipped without it (and the refits without torch). Slow (reads ~250k kernel timings, refits).
"""

from __future__ import annotations

import math

import pytest

from kplan.catalogs.op_model import load_op_model
from kplan.planner.opmodel import CLASSES, OpModel
from kplan.planner.opwork import matmul_work, vector_work
from scripts import neusight_data as nd

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (nd.root() / "kernels").is_dir(), reason="NeuSight data not found (KPLAN_SHARED_DATA)"
    ),
]

# Stated tolerance of a refit against the shipped file (other numpy/scipy/sklearn versions):
# 1% on a call's time, 0.005 on a sigma.
TIME_RTOL = 0.01
SIGMA_ATOL = 0.005


def test_refit_reproduces_the_shipped_model() -> None:
    pytest.importorskip("torch", reason="the fit runs in torch (the `torch` extra)")
    from scripts.fit_op_model import build_document

    shipped, refit = load_op_model(), OpModel.from_dict(build_document())
    calls: list[tuple[str, str, tuple[int, ...]]] = [
        ("matmul", "bmm", (b, m, n, k))
        for b, m, n, k in ((1, 1024, 4096, 1024), (32, 512, 64, 512))
    ]
    calls += [("softmax", "softmax", (16384, 512)), ("norm", "ln", (1024, 1024))]
    calls += [("elementwise", "gelu", (1024, 4096)), ("elementwise", "add", (1, 1024))]
    for gpu in (*nd.TRAIN_GPUS, *nd.TEST_GPUS):
        d = nd.device(gpu)
        for cls, op, dims in calls:
            work = matmul_work(dims) if cls == "matmul" else vector_work(op, dims)
            a = shipped.call_seconds(cls, op, dims, *work, d, "fp32")
            b = refit.call_seconds(cls, op, dims, *work, d, "fp32")
            assert b == pytest.approx(a, rel=TIME_RTOL), (gpu, cls, dims)
    for cls in CLASSES:
        assert refit.classes[cls].sigma_bias == pytest.approx(
            shipped.classes[cls].sigma_bias, abs=SIGMA_ATOL
        )
    assert refit.tensor_offset == pytest.approx(shipped.tensor_offset, abs=0.01)
    for path in ("outright", "ratio"):
        assert refit.calibration[path]["fp32"] == pytest.approx(
            shipped.calibration[path]["fp32"], abs=SIGMA_ATOL
        )


def test_reader_repeats_the_traced_layer() -> None:
    """BERT-Large, 2 x 512 tokens: 24 layers of 6 linears forward, ~2.2 TFLOP a step."""
    g = nd.read_opgraph(nd.root() / "opgraph" / "bert_large-train-512-2.csv", 24)
    linears_fw = sum(o.count for o in g.ops if o.op == "linear" and o.phase == "forward")
    assert linears_fw == 24 * 6 + 4  # the layers, the pooler, the head's transform and decoders
    # 6 N D for N = 335M weights in the layers and the head, D = 1024 tokens (plus attention)
    assert 2.0e12 < g.total("flops") < 2.4e12
    one, two = (
        nd.read_opgraph(nd.root() / "opgraph" / "bert_large-train-512-2.csv", n) for n in (1, 2)
    )
    layer = two.total("flops") - one.total("flops")
    assert g.total("flops") - one.total("flops") == pytest.approx(23 * layer)
    assert 70e9 < layer < 90e9  # 12 d^2 x 6 x 1024 tokens + attention, d = 1024


def test_leave_one_gpu_out_is_calibrated_as_documented() -> None:
    """The benchmark's state (docs/benchmarks.md): over every labelled GPU, held out (each
    GPU's sigma fitted on the other seven GPUs' held-out residuals), at least half of the
    measured steps fall within +-1 sigma and at least 85% at or below the p90 on the outright
    path (74% and 97% on 2026-11-29), and the ratio path meets the goal (67% and 90%)."""
    pytest.importorskip("torch", reason="the fit runs in torch (the `torch` extra)")
    from bench.opgraph_neusight import run

    moved: list[dict[str, object]] = []
    rows = run(moved)
    assert len(rows) == 70
    inside = sum(bool(r["in_1sigma"]) for r in rows) / len(rows)
    below = sum(bool(r["below_p90"]) for r in rows) / len(rows)
    mean_err = sum(abs(float(str(r["error"]))) for r in rows) / len(rows)
    assert inside >= 0.5 and below >= 0.85
    assert mean_err < 0.14  # 11.7% on 2026-11-29 (12.2% with the per-kernel max floor)
    assert all(math.isfinite(float(str(r["sigma"]))) for r in rows)
    inside = sum(bool(r["in_1sigma"]) for r in moved) / len(moved)
    below = sum(bool(r["below_p90"]) for r in moved) / len(moved)
    assert 0.6 <= inside <= 0.76 and 0.85 <= below <= 0.95
