"""Cross-device compute speed: planner/devices.py, catalogs/device_model.py and its fit script."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kplan.catalogs.device_model import load_device_model
from kplan.errors import CatalogError, DataFileError, SchemaVersionError
from kplan.planner.catalog import GpuSpec
from kplan.planner.devices import (
    DeviceModel,
    SpeedEstimate,
    compute_scale,
    compute_scales,
)
from scripts.fit_device_model import (
    FEATURES,
    Sample,
    as_model,
    data_root,
    fit_coefficients,
    fit_document,
    load_dataset,
    make_pairs,
    predict_held_out,
    spec_differences,
)

# Datasheet numbers (FP32 TFLOPS, GB/s) as the catalog carries them (NeuSight's device table).
T4 = GpuSpec("T4", 15.0, 8.141, 65.0, 320.0, "test")
A100 = GpuSpec("A100-80GB", 80.0, 19.492, 312.0, 1935.0, "test")
H100 = GpuSpec("H100", 80.0, 66.908, 989.0, 3430.0, "test")
V100 = GpuSpec("V100", 32.0, 14.029, 112.0, 900.0, "test")
L4 = GpuSpec("L4", 24.0, 31.334, 121.0, 300.0, "test")
ALL = (T4, A100, H100, V100, L4)


def doc(**changes: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "schema": "kplan.device-model/1.0",
        "features": ["log_fp32_tflops", "log_mem_bw_gbs"],
        "coefficients": {"log_fp32_tflops": -0.4, "log_mem_bw_gbs": -0.6},
        "intercept": 0.0,
        "log_sigma": 0.25,
        "fitted_on": ["Tesla_T4", "NVIDIA_L4"],
        "held_out_error": {"leave_one_gpu_out": {"train": {"mape": 0.2}}},
        "source": "test",
    }
    d.update(changes)
    return d


MODEL = DeviceModel.from_dict(doc())


# ------------------------------------------------------------------------------ from_dict


def test_from_dict_reads_a_valid_document_and_round_trips() -> None:
    assert MODEL.features == ("log_fp32_tflops", "log_mem_bw_gbs")
    assert MODEL.coefficients == (-0.4, -0.6)
    assert MODEL.log_sigma == 0.25
    assert MODEL.fitted_on == ("Tesla_T4", "NVIDIA_L4")
    assert DeviceModel.from_dict(MODEL.to_dict()) == MODEL


def test_from_dict_accepts_a_newer_minor_version_and_unknown_fields() -> None:
    assert DeviceModel.from_dict(doc(schema="kplan.device-model/1.7", extra=1)) == MODEL


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ([1, 2], "expected a JSON object, got list"),
        (doc(schema="kplan.profile/1.0"), "this is a 'kplan.profile' document"),
        (doc(schema=None), r"missing or malformed 'schema' field \(None\)"),
        (doc(features="log_fp32_tflops"), "'features' must be a list of names, got 'log_fp32"),
        (
            doc(
                features=["log_fp32_tflops", "log_l2_mb"],
                coefficients={"log_fp32_tflops": -0.4, "log_l2_mb": -0.6},
            ),
            r"unknown features \['log_l2_mb'\]",
        ),
        (doc(features=[], coefficients={}), "features is empty"),
        (doc(coefficients={"log_fp32_tflops": -0.4}), r"missing \['log_mem_bw_gbs'\], extra \[\]"),
        (doc(coefficients=[-0.4, -0.6]), r"'coefficients' must be an object, got \[-0.4, -0.6\]"),
        (
            doc(coefficients={"log_fp32_tflops": "fast", "log_mem_bw_gbs": -0.6}),
            "'coefficients.log_fp32_tflops' must be a number, got 'fast'",
        ),
        (
            doc(coefficients={"log_fp32_tflops": True, "log_mem_bw_gbs": -0.6}),
            "must be a number, got True",
        ),
        (doc(log_sigma=-0.1), r"log_sigma=-0.1 must be a number >= 0"),
        (doc(log_sigma=float("nan")), "'log_sigma' must be a number, got nan"),
        (doc(intercept=0.3), r"intercept=0.3 must be 0"),
        (doc(fitted_on="T4"), "'fitted_on' must be a list of GPU names, got 'T4'"),
        (doc(held_out_error=[0.2]), r"'held_out_error' must be an object, got \[0.2\]"),
        (doc(source=3), "'source' must be text, got 3"),
    ],
)
def test_from_dict_rejects_bad_documents_and_echoes_the_value(bad: Any, match: str) -> None:
    with pytest.raises(DataFileError, match=match):
        DeviceModel.from_dict(bad, source="m.json")


@pytest.mark.parametrize("field", ["features", "coefficients", "log_sigma", "intercept", "source"])
def test_from_dict_names_a_missing_field(field: str) -> None:
    d = doc()
    del d[field]
    with pytest.raises(DataFileError, match=f"m.json: missing field '{field}'"):
        DeviceModel.from_dict(d, source="m.json")


def test_from_dict_rejects_an_unknown_major_version() -> None:
    with pytest.raises(SchemaVersionError, match=r"schema version 2\.0 is not supported"):
        DeviceModel.from_dict(doc(schema="kplan.device-model/2.0"))


def test_direct_construction_validates() -> None:
    with pytest.raises(ValueError, match="2 coefficients for 1 features"):
        DeviceModel(("log_fp32_tflops",), (-0.4, -0.6), 0.2, (), "test")
    with pytest.raises(ValueError, match="duplicates"):
        DeviceModel(("log_fp32_tflops", "log_fp32_tflops"), (-0.4, -0.6), 0.2, (), "test")
    with pytest.raises(ValueError, match="coefficient log_fp32_tflops=inf must be finite"):
        DeviceModel(("log_fp32_tflops",), (math.inf,), 0.2, (), "test")


# ------------------------------------------------------------------------------ estimates


def test_a_faster_gpu_gives_a_factor_below_one_and_the_reverse_inverts_it() -> None:
    # H100 has more FP32 peak and more bandwidth than V100: its compute time is shorter.
    forward = compute_scale(MODEL, V100, H100)
    backward = compute_scale(MODEL, H100, V100)
    assert forward.factor < 1 < backward.factor
    assert forward.factor * backward.factor == pytest.approx(1.0)
    assert forward.log_sigma == backward.log_sigma == 0.25
    # t ~ F^-0.4 * BW^-0.6
    expected = (66.908 / 14.029) ** -0.4 * (3430 / 900) ** -0.6
    assert forward.factor == pytest.approx(expected)


def test_identity_gives_factor_one_and_no_uncertainty() -> None:
    assert compute_scale(MODEL, T4, T4) == SpeedEstimate(1.0, 0.0)
    # Another row of the same GPU (e.g. from another source) is still the same GPU.
    assert compute_scale(MODEL, T4, GpuSpec("T4", 16.0, 8.1, 65.0, 320.0, "other")).factor == 1.0


def test_factors_chain_across_three_gpus() -> None:
    via = compute_scale(MODEL, T4, L4).factor * compute_scale(MODEL, L4, H100).factor
    assert compute_scale(MODEL, T4, H100).factor == pytest.approx(via)


def test_compute_scales_matches_compute_scale() -> None:
    factors, sigmas = compute_scales(MODEL, V100, ALL)
    for gpu, f, s in zip(ALL, factors, sigmas, strict=True):
        one = compute_scale(MODEL, V100, gpu)
        assert f == pytest.approx(one.factor)
        assert s == one.log_sigma
    assert sigmas[3] == 0.0 and factors[3] == 1.0  # V100 itself
    empty_f, empty_s = compute_scales(MODEL, V100, [])
    assert empty_f.shape == empty_s.shape == (0,)


@pytest.mark.parametrize(("attr", "value"), [("fp32_tflops", 0.0), ("mem_bw_gbs", float("nan"))])
def test_a_gpu_spec_without_a_positive_value_is_a_catalog_error(attr: str, value: float) -> None:
    bad = GpuSpec(**{**T4.__dict__, "name": "broken", attr: value})
    with pytest.raises(
        CatalogError, match=f"GPU 'broken': {attr}={value!r} must be a positive number"
    ):
        compute_scale(MODEL, T4, bad)


def test_speed_estimate_validates_and_gives_quantiles() -> None:
    est = SpeedEstimate(0.5, 0.2)
    assert est.factor_at(0.0) == 0.5
    assert est.factor_at(1.2816) == pytest.approx(0.5 * math.exp(1.2816 * 0.2))
    with pytest.raises(ValueError, match=r"factor=0\.0"):
        SpeedEstimate(0.0, 0.1)
    with pytest.raises(ValueError, match="log_sigma=-1"):
        SpeedEstimate(1.0, -1)


# ------------------------------------------------------------------------------ shipped model


def test_shipped_model_loads_and_predicts_a_plausible_t4_to_a100_speedup() -> None:
    model = load_device_model()
    assert "Tesla_T4" in model.fitted_on
    est = compute_scale(model, T4, A100)
    # Plausible range: a roofline-bound job's speedup lies between the FP32 peak ratio and the
    # memory-bandwidth ratio of the datasheets (NVIDIA T4: 8.1 TFLOPS, 320 GB/s; A100 80GB PCIe:
    # 19.5 TFLOPS, 1935 GB/s), i.e. 2.4x to 6.0x. NeuSight's measured FP32 inference speedups
    # T4 -> A100-PCIe-40GB are 3.4x to 4.7x.
    assert 19.492 / 8.141 <= 1 / est.factor <= 1935 / 320
    assert 0.05 < est.log_sigma < 1.0


def test_load_device_model_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc()))
    assert load_device_model(path) == MODEL


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", r"m.json: not valid JSON \(line 1, column 2"),
        (json.dumps(doc(log_sigma="wide")), "m.json: 'log_sigma' must be a number, got 'wide'"),
        (json.dumps({"schema": "kplan.device-model/1.0"}), "m.json: missing field 'features'"),
    ],
)
def test_a_malformed_file_is_a_catalog_error(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(CatalogError, match=match) as info:
        load_device_model(path)
    assert "fit_device_model" in info.value.hint


def test_a_missing_file_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"cannot read device model .*nope\.json"):
        load_device_model(tmp_path / "nope.json")


def test_a_newer_major_version_file_is_a_schema_version_error(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc(schema="kplan.device-model/2.0")))
    with pytest.raises(SchemaVersionError):
        load_device_model(path)


# ------------------------------------------------------------------------------ fitting


def synthetic(a: float, b: float, noise: float, seed: int = 0) -> list[Sample]:
    """Workloads timed on every test GPU as t = w * F^-a * BW^-b * lognormal(noise)."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(40):
        work = rng.uniform(1e3, 1e5)
        for gpu in ALL:
            t = work * gpu.fp32_tflops**-a * gpu.mem_bw_gbs**-b * math.exp(noise * rng.normal())
            samples.append(Sample(gpu.name, f"w{i}", "train" if i % 2 else "inf", t))
    return samples


SPECS = {g.name: g for g in ALL}


def test_fit_recovers_known_blend_exponents_from_noisy_synthetic_data() -> None:
    pairs = make_pairs(synthetic(0.3, 0.7, noise=0.05), ordered=False)
    assert len(pairs) == 40 * 10  # 5 GPUs: 10 unordered pairs per workload
    coef = fit_coefficients(spec_differences(pairs, SPECS), pairs.log_ratio, sum_to_one=True)
    np.testing.assert_allclose(coef, [-0.3, -0.7], atol=0.02)


def test_free_fit_recovers_exponents_that_do_not_sum_to_one() -> None:
    pairs = make_pairs(synthetic(0.25, 0.9, noise=0.02, seed=1), ordered=False)
    coef = fit_coefficients(spec_differences(pairs, SPECS), pairs.log_ratio, sum_to_one=False)
    np.testing.assert_allclose(coef, [-0.25, -0.9], atol=0.02)


def test_held_out_prediction_of_noiseless_data_is_exact() -> None:
    samples = synthetic(0.45, 0.55, noise=0.0)
    result = predict_held_out(samples, samples, SPECS, ["H100"], fit_coefficients)
    assert set(result.pairs.src) | set(result.pairs.dst) == set(SPECS)
    assert all("H100" in (s, d) for s, d in zip(result.pairs.src, result.pairs.dst, strict=True))
    assert len(result.pairs) == 40 * 8  # H100 with 4 others, both directions
    np.testing.assert_allclose(result.residual, 0.0, atol=1e-9)
    np.testing.assert_allclose(result.coefficients, [-0.45, -0.55], atol=1e-9)


def test_fit_coefficients_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"need x of shape \(n, 2\)"):
        fit_coefficients(np.zeros((3, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="at least 2 pairs to fit, got 1"):
        fit_coefficients(np.zeros((1, 2)), np.zeros(1))


def test_as_model_is_a_valid_planner_model() -> None:
    model = as_model(np.array([-0.5, -0.5]))
    assert model.features == FEATURES
    assert compute_scale(model, T4, A100).factor == pytest.approx(
        (19.492 / 8.141 * 1935 / 320) ** -0.5
    )


NEUSIGHT = data_root() / "gpu" / "neusight-asplos25"


@pytest.mark.slow
@pytest.mark.skipif(not NEUSIGHT.is_dir(), reason="shared NeuSight data not present")
def test_shipped_model_is_what_the_fit_script_produces() -> None:
    shipped = json.loads(
        (Path(__file__).parents[1] / "catalogs" / "data" / "device_model.json").read_text()
    )
    refit = fit_document(load_dataset())
    assert refit["coefficients"] == pytest.approx(shipped["coefficients"])
    assert refit["log_sigma"] == pytest.approx(shipped["log_sigma"])
    assert refit["held_out_error"] == shipped["held_out_error"]
    # And the document's held-out error is what a reader of the planner sees.
    assert copy.deepcopy(load_device_model().held_out_error) == shipped["held_out_error"]


def test_for_instance_takes_a_precision_defaulting_to_the_profiles() -> None:
    from kplan.planner.catalog import InstanceType
    from kplan.planner.workload import for_instance
    from tests.planner_fixtures import workload

    w = workload()
    assert w.precision == "fp32"
    inst = InstanceType("aws", "g4dn.xlarge", "T4", 1, 4, 16.0, 25.0, "none", 0.0, "test")
    own = for_instance(w, inst, w.ref_gpu, MODEL)
    assert (own.compute_factor, own.compute_log_sigma) == (1.0, 0.0)
    same = for_instance(w, inst, w.ref_gpu, MODEL, precision="fp32")
    assert same.compute_factor == 1.0
    other = for_instance(w, inst, w.ref_gpu, MODEL, precision="fp16")
    assert other.compute_log_sigma > 0.0  # a projection to another precision is uncertain
