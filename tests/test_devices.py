"""Cross-device compute speed (device model 2.x): planner/devices.py, the shipped file, the fit
script, the precision mapping, and perfmodel.transfer's split of fixed and device work."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kplan.catalogs.device_model import load_device_model
from kplan.catalogs.loader import load_catalog
from kplan.core.errors import CatalogError, DataFileError, InputError, SchemaVersionError
from kplan.planner import perfmodel
from kplan.planner.catalog import GpuSpec, InstanceType
from kplan.planner.devices import (
    DeviceModel,
    SpeedEstimate,
    compute_scale,
    compute_scales,
    effective_precision,
    peak_tflops,
    spec_distance,
)
from kplan.planner.workload import for_instance
from scripts.fit_device_model import (
    DLE,
    NEUSIGHT,
    Pair,
    Prediction,
    Sample,
    _extra_sigma,
    as_model,
    data_root,
    fit_sigma,
    held_out,
    load_dataset,
    log_factors,
    predict,
    sigma_of,
    sigma_residuals,
    superlinear_rows,
    with_fixed_fractions,
    with_precision_ratios,
)
from tests.planner_fixtures import params, workload

CAT = load_catalog().gpus
T4, V100, A100, H100, L4 = (CAT[n] for n in ("T4", "V100", "A100", "H100", "L4"))
ALL = (T4, V100, A100, H100, L4)


def doc(**changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema": "kplan.device-model/2.0",
        "compute_weight": {"fp32": 0.03, "tf32": 0.08, "bf16": 0.001, "fp16": 0.001},
        "memory_weight": {"fp32": 1.0, "tf32": 1.0, "bf16": 1.2, "fp16": 1.2},
        "sigma": {
            "cross_gpu": {
                "full": {"base": 0.15, "per_distance": 0.05},
                "mixed": {"base": 0.2, "per_distance": 0.03},
            },
            "cross_precision": {"full": 0.37, "mixed": 0.37},
        },
        "fitted_on": ["Tesla_T4", "NVIDIA_L4"],
        "held_out_error": {},
        "source": "test",
    }
    d.update(changes)
    return d


MODEL = DeviceModel.from_dict(doc())


def test_from_dict_round_trips_and_accepts_a_newer_minor_version() -> None:
    again = DeviceModel.from_dict(json.loads(json.dumps(MODEL.to_dict())))
    assert again == MODEL
    assert DeviceModel.from_dict(doc(schema="kplan.device-model/2.7", extra=1)) == MODEL


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (doc(compute_weight={"fp32": 1.0}), "compute_weight.tf32"),
        (doc(memory_weight={"fp32": 1, "tf32": 1, "bf16": 1, "fp16": -1}), "fp16"),
        (doc(compute_weight=[1, 2]), "compute_weight"),
        (doc(fitted_on="T4"), "fitted_on"),
        (doc(sigma={"cross_gpu": {"full": {"base": -1, "per_distance": 0}}}), "base"),
        (doc(sigma={"cross_precision": {"half": 0.1}}), "half"),
        (doc(sigma=3), "sigma"),
        (doc(sigma={"cross_gpu_projection": {"full": -0.1}}), "cross_gpu_projection"),
        (doc(fixed_exponent=-0.5), "fixed_exponent"),
        (doc(fixed_exponent="1"), "fixed_exponent"),
        (doc(workload_exponent=-1), "workload_exponent"),
        (doc(cuda_core_weight={"fp16": -0.1}), "cuda_core_weight"),
        (doc(cuda_core_weight={"half": 0.1}), "half"),
        (doc(cuda_core_weight=[0.1]), "cuda_core_weight"),
        ([1], "JSON object"),
        (doc(schema="nope"), "schema"),
    ],
)
def test_from_dict_rejects_bad_documents(bad: Any, match: str) -> None:
    with pytest.raises(DataFileError, match=match):
        DeviceModel.from_dict(bad)


def test_a_1x_document_is_refused_with_a_hint_and_a_3x_is_a_schema_error() -> None:
    with pytest.raises(DataFileError, match="old device model") as err:
        DeviceModel.from_dict({"schema": "kplan.device-model/1.0", "features": []})
    assert "fit_device_model" in err.value.hint
    with pytest.raises(SchemaVersionError):
        DeviceModel.from_dict(doc(schema="kplan.device-model/3.0"))


# ---------------------------------------------------------------------------- the mapping


def test_identity_gives_factor_one_and_no_uncertainty() -> None:
    for g in ALL:
        for p in ("fp32", "tf32", "bf16", "fp16"):
            est = compute_scale(MODEL, g, g, src_precision=p, dst_precision=p)
            assert est == SpeedEstimate(1.0, 0.0)


def test_reverse_inverts_and_factors_chain() -> None:
    for p in ("fp32", "tf32", "fp16"):

        def scale(a: GpuSpec, b: GpuSpec, p: str = p) -> SpeedEstimate:
            return compute_scale(MODEL, a, b, src_precision=p, dst_precision=p)

        fwd, back = scale(V100, H100), scale(H100, V100)
        assert fwd.factor * back.factor == pytest.approx(1.0)
        assert fwd.log_sigma == pytest.approx(back.log_sigma)
        via = scale(T4, L4).factor * scale(L4, H100).factor
        assert scale(T4, H100).factor == pytest.approx(via)


def test_precision_peaks_are_mapped_right() -> None:
    # V100 and T4 have no TF32/BF16 tensor cores: tf32 runs as fp32.
    assert effective_precision(V100, "tf32") == "fp32"
    assert peak_tflops(V100, "tf32") == V100.fp32_tflops
    assert compute_scale(MODEL, V100, V100, src_precision="fp32", dst_precision="tf32") == (
        SpeedEstimate(1.0, 0.0)
    )
    assert effective_precision(T4, "bf16") == "fp32"
    # ... but bf16 there is emulated at an unmeasured speed: a projection, with its sigma.
    emulated = compute_scale(MODEL, V100, V100, src_precision="fp32", dst_precision="bf16")
    assert emulated.factor == 1.0 and emulated.log_sigma > 0
    # fp16 on T4 uses its tensor peak (65), not the FP32 CUDA cores (8.1).
    assert peak_tflops(T4, "fp16") == 65.0
    assert peak_tflops(A100, "tf32") == 156.0 and peak_tflops(A100, "bf16") == 312.0
    assert peak_tflops(H100, "fp32") == H100.fp32_tflops
    # The shipped catalog carries the tensor peaks for every Ampere+ GPU, none for older ones.
    for g in CAT.values():
        assert (g.tf32_tflops is None) == (g.name in ("T4", "V100", "V100-32GB")), g.name
        assert g.sm_count and g.sm_count > 0


def test_mixed_precision_on_a_tensor_core_gpu_is_predicted_faster_than_fp32() -> None:
    dm = load_device_model()
    for g in (T4, V100, A100, H100):
        est = compute_scale(dm, g, g, src_precision="fp32", dst_precision="fp16")
        assert est.factor < 1.0 and est.log_sigma > 0  # a projection carries its sigma


def test_t4_to_l4_memory_bound_is_not_faster_than_bandwidth_allows() -> None:
    dm = load_device_model()
    bw_ratio = T4.mem_bw_gbs / L4.mem_bw_gbs  # time ratio of a purely memory-bound job: > 1
    memory_bound = DeviceModel.from_dict(
        doc(compute_weight={"fp32": 1e-9, "tf32": 1e-9, "bf16": 1e-9, "fp16": 1e-9})
    )
    f = compute_scale(memory_bound, T4, L4, src_precision="fp16", dst_precision="fp16").factor
    assert f >= bw_ratio * 0.999
    f = compute_scale(memory_bound, T4, L4).factor
    assert f == pytest.approx(bw_ratio, rel=1e-3)
    # Whatever the shares, the factor lies between the smallest and the largest of the ratios
    # of the peaks the terms run at (the precision's, FP32 CUDA cores) and of bandwidths.
    for model in (dm, MODEL):
        for p in ("fp32", "fp16"):
            f = compute_scale(model, T4, L4, src_precision=p, dst_precision=p).factor
            ratios = (
                peak_tflops(T4, p) / peak_tflops(L4, p),
                T4.fp32_tflops / L4.fp32_tflops,
                bw_ratio,
            )
            assert min(ratios) <= f <= max(ratios)


def test_sigma_grows_with_distance_and_adds_the_precision_projection() -> None:
    near = compute_scale(MODEL, A100, CAT["A100-80GB"]).log_sigma
    far = compute_scale(MODEL, T4, H100).log_sigma
    assert 0 < near < far
    both = compute_scale(MODEL, T4, H100, src_precision="fp32", dst_precision="fp16")
    gpu_only = compute_scale(MODEL, T4, H100, src_precision="fp16", dst_precision="fp16")
    assert both.log_sigma == pytest.approx(math.hypot(gpu_only.log_sigma, 0.37), rel=0.2)


def test_a_cross_gpu_change_of_unit_has_its_own_precision_term() -> None:
    """FP32 on a V100 -> TF32 on an A100 adds ``cross_gpu_projection``; on one GPU, or across
    families, ``cross_precision``; a 2.0 document without the table falls back to the latter."""
    tables = doc()["sigma"] | {"cross_gpu_projection": {"full": 0.25}}
    dm = DeviceModel.from_dict(doc(sigma=tables))
    g = 0.15 + 0.05 * spec_distance(V100, A100, "fp32", "tf32")
    est = compute_scale(dm, V100, A100, src_precision="fp32", dst_precision="tf32")
    assert est.log_sigma == pytest.approx(math.hypot(g, 0.25))
    old = compute_scale(MODEL, V100, A100, src_precision="fp32", dst_precision="tf32")
    assert old.log_sigma == pytest.approx(math.hypot(g, 0.37))
    same = compute_scale(dm, A100, A100, src_precision="fp32", dst_precision="tf32")
    assert same.log_sigma == pytest.approx(0.37)
    across = compute_scale(dm, V100, A100, src_precision="fp32", dst_precision="fp16")
    g16 = 0.2 + 0.03 * spec_distance(V100, A100, "fp32", "fp16")
    assert across.log_sigma == pytest.approx(math.hypot(g16, 0.37))
    plain = compute_scale(dm, V100, A100)  # fp32 on both: no precision term
    assert plain.log_sigma == pytest.approx(0.15 + 0.05 * spec_distance(V100, A100, "fp32", "fp32"))


def test_the_benchmarks_sigma_is_the_planners() -> None:
    tables = doc()["sigma"] | {"cross_gpu_projection": {"full": 0.25}}
    dm = DeviceModel.from_dict(doc(sigma=tables))
    for src, dst, ps, pd in (
        (V100, A100, "fp32", "tf32"),
        (T4, H100, "fp16", "fp16"),
        (A100, A100, "tf32", "fp32"),
        (T4, L4, "fp32", "fp32"),
    ):
        pair = Pair(
            Sample(src.name, "m", "j", ps, 8.0, 1.0), Sample(dst.name, "m", "j", pd, 8.0, 1.0)
        )
        pred = Prediction(pair, "f", 0.0, 0.0, 0.0, spec_distance(src, dst, ps, pd), src, dst)
        expect = compute_scale(dm, src, dst, src_precision=ps, dst_precision=pd).log_sigma
        assert sigma_of(tables, pred) == pytest.approx(expect)


def test_extra_sigma_solves_for_the_term_added_in_quadrature() -> None:
    rng = np.random.default_rng(0)
    g = rng.uniform(0.1, 0.3, 20000)
    r = np.abs(rng.normal(0.0, np.sqrt(g**2 + 0.2**2)))
    assert _extra_sigma(r, g) == pytest.approx(0.2, abs=0.01)
    assert _extra_sigma(np.abs(rng.normal(0.0, g)) * 0.5, g) == 0.0


def test_compute_scales_matches_compute_scale() -> None:
    factors, sigmas = compute_scales(MODEL, V100, ALL, dst_precision="tf32", src_precision="tf32")
    for g, f, s in zip(ALL, factors, sigmas, strict=True):
        one = compute_scale(MODEL, V100, g, src_precision="tf32", dst_precision="tf32")
        assert (f, s) == pytest.approx((one.factor, one.log_sigma))
    assert compute_scales(MODEL, V100, [])[0].shape == (0,)


def test_a_gpu_without_a_positive_peak_is_a_catalog_error() -> None:
    bad = GpuSpec("X", 16.0, 0.0, 65.0, 320.0, "test")
    with pytest.raises(CatalogError, match="fp32_tflops"):
        compute_scale(MODEL, T4, bad)


def test_cuda_core_work_of_a_mixed_precision_step_follows_the_fp32_peak() -> None:
    """A100 40 GB -> 80 GB: the same cores, 31% more bandwidth. A mixed-precision step with
    work on the FP32 CUDA cores gains less than the bandwidth ratio; fp32 and tf32 (no such
    term) are unchanged; a 2.0 document (none) reads with the term 0."""
    a80 = CAT["A100-80GB"]
    mem = {"fp32": 1.0, "tf32": 1.0, "bf16": 1.0, "fp16": 1.0}
    tiny = {p: 1e-9 for p in mem}
    bw_only = DeviceModel.from_dict(doc(compute_weight=tiny, memory_weight=mem))
    assert bw_only.cuda_core_weight == {"fp32": 0.0, "tf32": 0.0, "bf16": 0.0, "fp16": 0.0}
    split = DeviceModel.from_dict(
        doc(compute_weight=tiny, memory_weight=mem, cuda_core_weight={"fp16": 0.002})
    )
    assert DeviceModel.from_dict(json.loads(json.dumps(split.to_dict()))) == split
    bw_ratio = A100.mem_bw_gbs / a80.mem_bw_gbs
    f_bw = compute_scale(bw_only, A100, a80, src_precision="fp16", dst_precision="fp16").factor
    f = compute_scale(split, A100, a80, src_precision="fp16", dst_precision="fp16").factor
    assert f_bw == pytest.approx(bw_ratio, rel=1e-3)
    # T ~ c / P_fp32 + m / BW: both GPUs have 19.5 TFLOPS FP32, so the factor is exactly this.
    c, p32 = 0.002, A100.fp32_tflops
    expect = (c / p32 + 1 / a80.mem_bw_gbs) / (c / p32 + 1 / A100.mem_bw_gbs)
    assert f == pytest.approx(expect, rel=1e-6) and bw_ratio < f < 1.0
    for p in ("fp32", "tf32"):
        assert compute_scale(split, V100, a80, src_precision=p, dst_precision=p).factor == (
            compute_scale(bw_only, V100, a80, src_precision=p, dst_precision=p).factor
        )


def test_utilisation_makes_a_big_gpu_less_useful_at_a_small_batch() -> None:
    occ = DeviceModel.from_dict(doc(batch_half=8.0))
    small = compute_scale(occ, T4, H100, batch=1).factor
    large = compute_scale(occ, T4, H100, batch=1024).factor
    assert small > large  # less speed-up at batch 1
    assert compute_scale(occ, T4, H100).factor == compute_scale(MODEL, T4, H100).factor


def test_a_fixed_share_of_the_step_moves_less_than_the_device_part() -> None:
    fixed = DeviceModel.from_dict(doc(fixed_exponent=0.5))
    assert DeviceModel.from_dict(json.loads(json.dumps(fixed.to_dict()))) == fixed
    assert MODEL.fixed_exponent == 1.0  # a document without it: no fixed-part effect
    whole = compute_scale(fixed, T4, H100).factor
    assert whole < 1
    assert compute_scale(fixed, T4, H100, fixed_fraction=0.0).factor == whole
    assert compute_scale(fixed, T4, H100, fixed_fraction=1.0).factor == pytest.approx(whole**0.5)
    half = compute_scale(fixed, T4, H100, fixed_fraction=0.5).factor
    assert half == pytest.approx(0.5 * whole + 0.5 * whole**0.5)
    assert compute_scale(MODEL, T4, H100, fixed_fraction=0.5).factor == pytest.approx(
        compute_scale(MODEL, T4, H100).factor
    )
    assert compute_scale(fixed, T4, T4, fixed_fraction=0.5) == SpeedEstimate(1.0, 0.0)
    with pytest.raises(ValueError, match="fixed_fraction"):
        compute_scale(fixed, T4, H100, fixed_fraction=1.5)


def test_fixed_fraction_comes_from_the_same_gpus_rows_at_other_batches() -> None:
    def s(gpu: str, batch: float, ms: float, prec: str = "fp32") -> Sample:
        job = f"dle:pt:d:m:b{batch:g}:n1:img/s"
        return Sample(gpu, "dle:pt:d", job, prec, batch, ms)

    rows = [s("T4", b, 10.0 + 5.0 * b) for b in (1, 2, 4)]
    rows += [s("H100", 2, 3.0), s("T4", 8, 1.0, "fp16")]  # one batch only: nothing to fit
    out = with_fixed_fractions(rows)
    assert [r.fixed for r in out[:3]] == pytest.approx([10 / 15, 10 / 20, 10 / 30])
    assert out[3].fixed is None and out[4].fixed is None
    ns = [Sample("T4", "neusight:m", f"m-train-512-{b}", "fp32", b, 2.0 + b) for b in (2, 8)]
    assert [r.fixed for r in with_fixed_fractions(ns)] == pytest.approx([0.5, 0.2])


def test_a_workloads_own_precision_speed_up_sets_its_compute_share() -> None:
    wl = DeviceModel.from_dict(doc(workload_exponent=1.0))
    assert MODEL.workload_exponent == 0.0  # off in a document without it
    assert DeviceModel.from_dict(json.loads(json.dumps(wl.to_dict()))) == wl
    # The share that reproduces the measured fp16/fp32 ratio on the source GPU.
    for s in (0.2, 1.0, 5.0):
        ratio = wl.device_time(V100, "fp16", s) / wl.device_time(V100, "fp32", s)
        assert wl.workload_scale(V100, "fp32", "fp16", ratio) == pytest.approx(s)
    plain = compute_scale(wl, V100, A100, src_precision="fp32", dst_precision="tf32").factor

    def factor(ratio: float, model: DeviceModel = wl, dst: GpuSpec = A100) -> float:
        return compute_scale(
            model,
            V100,
            dst,
            src_precision="fp32",
            dst_precision="tf32",
            precision_ratio=("fp16", ratio),
        ).factor

    # Gains a lot from tensor cores on V100 (compute-bound): more from TF32 on an A100 too.
    assert factor(0.2) < plain < factor(0.9)
    assert factor(0.2, MODEL) == pytest.approx(plain)  # exponent 0: one share per precision
    assert factor(0.2, dst=V100) == 1.0  # same GPU and precision: nothing to project
    same_gpu = compute_scale(wl, V100, V100, dst_precision="fp16", precision_ratio=("fp16", 0.2))
    assert same_gpu == compute_scale(wl, V100, V100, dst_precision="fp16")
    # From a mixed-precision profile (fitted memory-bound) no share is read.
    assert wl.workload_scale(V100, "fp16", "fp32", 3.0) == 1.0


def test_precision_ratio_comes_from_the_same_gpu_in_the_other_precision_family() -> None:
    def s(gpu: str, prec: str, batch: float, ms: float) -> Sample:
        return Sample(gpu, "dle:pt:d", f"dle:pt:d:m:b{batch:g}:n1:img/s", prec, batch, ms)

    rows = [s("V100", "fp32", 64, 64.0), s("V100", "fp16", 128, 32.0), s("A100", "tf32", 64, 8.0)]
    out = with_precision_ratios(rows)
    assert out[0].alt is not None and out[1].alt is not None
    assert out[0].alt[0] == "fp16"
    assert out[0].alt[1] == pytest.approx(0.25)  # per sample: 0.25 ms against 1 ms
    assert out[1].alt[0] == "fp32"
    assert out[1].alt[1] == pytest.approx(4.0)
    assert out[2].alt is None  # the A100 has no mixed-precision row: V100's are not used


def test_the_vectorised_fit_matches_the_planner_path() -> None:
    specs = {"T4": T4, "V100": V100, "A100": A100, "H100": H100}
    theta = np.log([0.03, 0.08, 0.001, 1.2, 4.0, 0.5, 2.0, 0.004])
    model = as_model(theta)
    assert model.cuda_core_weight["fp16"] == pytest.approx(0.004)

    def sm(gpu: str, prec: str, batch: float, fixed: float | None, alt: Any) -> Sample:
        return Sample(gpu, "m", "j", prec, batch, 1.0, fixed, alt)

    pairs = [
        Pair(sm("V100", "fp32", 8, 0.3, ("fp16", 0.4)), sm("A100", "tf32", 8, None, None)),
        Pair(sm("A100", "tf32", 8, None, ("fp16", 0.5)), sm("H100", "fp32", 8, None, None)),
        Pair(sm("T4", "fp16", 4, 0.1, ("fp32", 3.0)), sm("H100", "bf16", 4, None, None)),
        Pair(sm("V100", "fp32", 8, 0.2, ("fp16", 0.4)), sm("V100", "fp16", 8, None, None)),
        Pair(sm("T4", "fp32", 2, None, ("fp16", 5.0)), sm("A100", "fp32", 2, None, None)),
    ]
    got = log_factors(pairs, specs)(theta)
    assert got == pytest.approx([predict(model, p, specs) for p in pairs])


# ---------------------------------------------------------------------------- the planner


def test_transfer_scales_only_the_device_part() -> None:
    p = params()
    q = perfmodel.transfer(p, compute_factor=0.5)
    assert q.compute_a == p.compute_a  # host, launch, data loading: not the GPU's
    assert q.compute_b == pytest.approx(p.compute_b * 0.5)
    assert perfmodel.transfer(p, compute_factor=0.5, fixed_factor=0.9).compute_a == pytest.approx(
        p.compute_a * 0.9
    )


def test_for_instance_takes_a_precision_defaulting_to_the_profiles() -> None:
    w = workload()
    assert w.precision == "fp32"
    dm = load_device_model()
    inst = InstanceType("aws", "g4dn.xlarge", "T4", 1, 4, 16.0, 25.0, "none", 0.0, "test")
    own = for_instance(w, inst, w.ref_gpu, dm)
    assert (own.compute_factor, own.compute_log_sigma) == (1.0, 0.0)
    assert own.params.compute_b == w.params.compute_b
    same = for_instance(w, inst, w.ref_gpu, dm, precision="fp32")
    assert same.compute_factor == 1.0
    other = for_instance(w, inst, w.ref_gpu, dm, precision="amp")
    assert other.compute_factor < 1.0 and other.compute_log_sigma > 0.0
    # the fixed per-step part moves less than the device part (factor**fixed_exponent)
    gamma = dm.fixed_exponent
    assert other.params.compute_a == pytest.approx(w.params.compute_a * other.compute_factor**gamma)
    assert other.params.compute_a > w.params.compute_a * other.compute_factor


# ---------------------------------------------------------------------------- shipped file


def test_shipped_model_loads_and_is_sane() -> None:
    dm = load_device_model()
    assert dm.to_dict()["schema"] == "kplan.device-model/2.1"
    held = dm.held_out_error
    assert held["leave_one_gpu_out"]["all"]["kplan"]["n_pairs"] > 1000
    assert dm.sigma and set(dm.sigma["cross_gpu"]) == {"full", "mixed"}


def test_load_device_model_from_a_path_and_bad_files(tmp_path: Path) -> None:
    good = tmp_path / "dm.json"
    good.write_text(json.dumps(doc()))
    assert load_device_model(good) == MODEL
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_device_model(bad)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": "kplan.device-model/1.0"}))
    with pytest.raises(CatalogError, match="old device model"):
        load_device_model(old)


SHARED = data_root() / "gpu"
HAVE_DATA = (SHARED / NEUSIGHT.name).is_dir() and (data_root() / DLE).is_file()


def test_fit_path_matches_the_planner_path() -> None:
    a = Sample("T4", "m", "j", "fp32", 8.0, 10.0)
    b = Sample("H100", "m", "j", "fp32", 8.0, 2.0)
    theta = np.log([0.03, 0.08, 0.001, 1.2, 4.0])
    model = as_model(theta)
    specs = {"T4": T4, "H100": H100}
    expect = math.log(compute_scale(model, T4, H100, batch=8.0).factor)
    assert predict(model, Pair(a, b), specs) == pytest.approx(expect)


def test_a_one_gpu_figure_that_its_own_table_contradicts_is_dropped() -> None:
    def row(n: int, tput: float, precision: str = "fp32", batch: str = "") -> dict[str, str]:
        return {
            "model_dir": "d",
            "model": "m",
            "system": "DGX-1 (8x V100 32GB)",
            "precision": precision,
            "batch_per_gpu": batch,
            "throughput_unit": "img/s",
            "container": "c",
            "num_gpus": str(n),
            "throughput": str(tput),
        }

    rows = [
        row(1, 36.0),  # 8 GPUs at 641 img/s: 80/GPU, 2.2x the one-GPU figure
        row(8, 641.0),
        row(1, 83.0, "amp"),  # ordinary sub-linear scaling: kept
        row(8, 616.0, "amp"),
        row(1, 50.0, batch="64"),  # another table (batch): not compared with the first
        row(8, 400.0, batch="64"),
    ]
    assert superlinear_rows(rows) == {0}


@pytest.mark.skipif(not HAVE_DATA, reason="shared GPU data (../shared/data/gpu) not present")
def test_shipped_sigmas_are_the_held_out_ones() -> None:
    data = load_dataset()
    logo = [p for p in held_out(data, "gpu") if p.pair.cross_gpu]
    lomo = held_out(data, "model")
    shipped = load_device_model().sigma
    assert _refit_matches(fit_sigma(sigma_residuals(data)), shipped)  # one-precision profiles
    # not from the two-precision path's smaller errors
    assert not _refit_matches(fit_sigma(logo + lomo), shipped)


@pytest.mark.skipif(not HAVE_DATA, reason="shared GPU data (../shared/data/gpu) not present")
def test_shipped_file_is_what_the_fit_script_writes() -> None:
    from scripts.fit_device_model import fit_document

    shipped = copy.deepcopy(load_device_model().to_dict())
    assert _refit_matches(json.loads(json.dumps(fit_document(load_dataset()))), shipped)


def _refit_matches(refit: Any, shipped: Any) -> bool:
    """``refit`` is ``shipped`` written again: the same keys, texts and structure, and every
    number within 0.001 (the file rounds to 4 decimals): numpy and scipy releases (unpinned, a
    fresh install takes the newest) move the fits and their held-out errors by up to 0.0005
    (numpy 2.4.6 / scipy 1.17.1 against the versions that wrote the file). A real change of the
    fit or the data moves them by more."""
    if isinstance(refit, dict) and isinstance(shipped, dict):
        return refit.keys() == shipped.keys() and all(
            _refit_matches(refit[k], shipped[k]) for k in refit
        )
    if isinstance(refit, list) and isinstance(shipped, list):
        return len(refit) == len(shipped) and all(
            _refit_matches(a, b) for a, b in zip(refit, shipped, strict=True)
        )
    numbers = (int, float)
    if isinstance(refit, numbers) and isinstance(shipped, numbers):
        if isinstance(refit, bool) or isinstance(shipped, bool):
            return refit is shipped
        return math.isclose(refit, shipped, rel_tol=1e-6, abs_tol=1e-3)
    return bool(refit == shipped)


def test_gpu_catalog_reads_the_optional_tensor_columns(tmp_path: Path) -> None:
    from tests.test_catalog_loader import write_catalog

    # An older gpus.csv without the columns still loads: tf32/bf16 then run as FP32.
    old = load_catalog(write_catalog(tmp_path / "old")).gpus["A100"]
    assert (old.tf32_tflops, old.bf16_tflops, old.sm_count) == (None, None, None)
    assert peak_tflops(old, "tf32") == old.fp32_tflops
    gpus = (
        "name,memory_gb,fp32_tflops,fp16_tflops,mem_bw_gbs,tf32_tflops,bf16_tflops,sm_count,source\n"
        "T4,16,8.141,65,320,,,40,datasheet\n"
        "A100,40,19.492,312,1555,156,312,108,datasheet\n"
    )
    new = load_catalog(write_catalog(tmp_path / "new", gpus_csv=gpus)).gpus
    assert (new["A100"].tf32_tflops, new["A100"].sm_count) == (156.0, 108)
    assert new["T4"].tf32_tflops is None and peak_tflops(new["A100"], "tf32") == 156.0
    bad = load_catalog(write_catalog(tmp_path / "bad", gpus_csv=gpus.replace(",156,", ",-1,")))
    assert "A100" not in bad.gpus and "tf32_tflops" in bad.notes[0]


def test_for_instance_moves_the_fixed_part_of_a_gpu_profile_less() -> None:
    import dataclasses

    dm = load_device_model()
    inst = InstanceType("aws", "p3.2xlarge", "V100", 1, 8, 61.0, 10.0, "none", 0.0, "test")
    w = workload()
    gpu = for_instance(w, inst, V100, dm)
    # what compute_scale(..., fixed_fraction=) does for the whole step, term by term: the
    # planner predicts what bench/device_model.py measures
    assert 0.0 <= dm.fixed_exponent < 1.0
    assert gpu.params.compute_a == pytest.approx(
        w.params.compute_a * gpu.compute_factor**dm.fixed_exponent
    )
    batch = 64
    whole = float(perfmodel.compute_time(w.params, [batch])[0])
    share = w.params.compute_a / whole
    ref = compute_scale(dm, w.ref_gpu, V100, fixed_fraction=share).factor
    assert float(perfmodel.compute_time(gpu.params, [batch])[0]) == pytest.approx(
        whole * ref, rel=1e-9
    )
    assert gpu.params.compute_b == pytest.approx(w.params.compute_b * gpu.compute_factor)
    cpu_ref = GpuSpec("cpu", 0.0, 1.0, 1.0, 50.0, "measured")
    on_cpu = dataclasses.replace(w, ref_gpu=cpu_ref, ref_is_cpu=True)
    moved = for_instance(on_cpu, inst, V100, dm)
    assert moved.params.compute_a == pytest.approx(w.params.compute_a * moved.compute_factor)


def _profiles() -> tuple[Any, Any]:
    """The imagenet example (T4, fp32) and the same job in fp16, 2.5x faster per sample."""
    import dataclasses

    from kplan.app.planning import load_example

    fp32 = load_example("imagenet-resnet50")
    fp16 = dataclasses.replace(
        fp32,
        precision="fp16",
        measurements=tuple(
            dataclasses.replace(m, step_time=m.step_time / 2.5) if m.workers == 1 else m
            for m in fp32.measurements
        ),
    )
    return fp32, fp16


def test_a_second_profile_in_the_other_precision_gives_the_measured_speed_up() -> None:
    import dataclasses

    from kplan.planner.workload import precision_ratio, workload_from_profile

    fp32, fp16 = _profiles()
    other, ratio = precision_ratio(fp32, fp16)
    assert other == "fp16" and ratio == pytest.approx(0.4)
    back = precision_ratio(fp16, fp32)
    assert back[0] == "fp32" and back[1] == pytest.approx(2.5)
    got = workload_from_profile(fp32, CAT, other=fp16).precision_ratio
    assert got is not None and got[0] == "fp16" and got[1] == pytest.approx(0.4)
    assert workload_from_profile(fp32, CAT).precision_ratio is None
    with pytest.raises(InputError, match="same GPU"):
        precision_ratio(fp32, dataclasses.replace(fp16, gpu="V100"))
    with pytest.raises(InputError, match="nothing to learn"):
        precision_ratio(fp32, dataclasses.replace(fp16, precision="tf32"))
    for field, value in (("name", "other-job"), ("gradient_bytes", 1.0), ("dataset_size", 7)):
        with pytest.raises(InputError, match="not of one job"):
            precision_ratio(fp32, dataclasses.replace(fp16, **{field: value}))
    multi = tuple(m for m in fp16.measurements if m.workers > 1)
    with pytest.raises(InputError, match="no one-GPU measurement"):
        precision_ratio(fp32, dataclasses.replace(fp16, measurements=multi))


def test_for_instance_uses_the_measured_precision_ratio_across_gpus_only() -> None:
    from kplan.planner.workload import workload_from_profile

    dm = load_device_model()
    assert dm.workload_exponent > 0
    fp32, fp16 = _profiles()
    one = workload_from_profile(fp32, CAT)
    two = workload_from_profile(fp32, CAT, other=fp16)
    a100 = InstanceType("aws", "p4d.24xlarge", "A100", 8, 96, 1152.0, 400.0, "nvlink", 600.0, "t")
    for prec in ("fp32", "tf32"):
        got = for_instance(two, a100, A100, dm, precision=prec).compute_factor
        expect = compute_scale(
            dm, T4, A100, src_precision="fp32", dst_precision=prec, precision_ratio=("fp16", 0.4)
        ).factor
        assert got == pytest.approx(expect)
        assert got != pytest.approx(
            for_instance(one, a100, A100, dm, precision=prec).compute_factor
        )
    # On the profiled GPU a ratio changes nothing: the profile is the measurement.
    t4 = InstanceType("aws", "g4dn.xlarge", "T4", 1, 4, 16.0, 25.0, "none", 0.0, "t")
    assert for_instance(two, t4, T4, dm).compute_factor == 1.0


def test_pick_source_prefers_the_profile_in_the_asked_precision() -> None:
    from kplan.planner.workload import pick_source

    fp32, fp16 = _profiles()
    assert pick_source([fp32, fp16], None) == (fp32, fp16)
    assert pick_source([fp32, fp16], "fp16") == (fp16, fp32)
    assert pick_source([fp32, fp16], "bf16") == (fp16, fp32)  # the same family
    assert pick_source([fp16, fp32], "tf32") == (fp32, fp16)
    assert pick_source([fp32], "fp16") == (fp32, None)
    with pytest.raises(InputError, match="3 profiles"):
        pick_source([fp32, fp16, fp32], None)


def test_kplan_estimate_takes_two_profiles_of_one_job(tmp_path: Path) -> None:
    """`kplan estimate --profile fp32.json --profile fp16.json`: the profile in the asked
    precision is planned from; on another GPU its fp32 plan uses the measured speed-up."""
    import dataclasses

    from typer.testing import CliRunner

    from kplan.cli.main import app
    from kplan.planner.profile import profile_to_dict

    fp32, fp16 = _profiles()
    paths = []
    v100_rows = tuple(dataclasses.replace(m, gpu="V100") for m in fp16.measurements)
    v100 = dataclasses.replace(fp16, gpu="V100", measurements=v100_rows, instance_type=None)
    for prof in (fp32, fp16, v100):
        path = tmp_path / f"{prof.precision}-{prof.gpu}.json"
        path.write_text(json.dumps(profile_to_dict(prof)))
        paths.append(str(path))
    runner = CliRunner()

    def plan(*args: str) -> dict[str, Any]:
        base = ["estimate", "--json", "--gpu", "A100", "--nodes", "1", "--top", "1"]
        result = runner.invoke(app, [*base, *args])
        assert result.exit_code == 0, result.output
        out: dict[str, Any] = json.loads(result.output)
        return out

    one = plan("--profile", paths[0], "--precision", "tf32")
    two = plan("--profile", paths[0], "--profile", paths[1], "--precision", "tf32")
    assert two["precision"] == "tf32" and "fp32" in two["precision_basis"]
    assert two["chosen"]["step_time_s"] != one["chosen"]["step_time_s"]
    measured = plan("--profile", paths[0], "--profile", paths[1], "--precision", "fp16")
    assert "projected" not in measured["precision_basis"]
    assert "projected" in plan("--profile", paths[0], "--precision", "fp16")["precision_basis"]
    bad = runner.invoke(app, ["estimate", "--profile", paths[0], "--profile", paths[2]])
    assert bad.exit_code == 2 and "same GPU" in bad.output and "Traceback" not in bad.output
