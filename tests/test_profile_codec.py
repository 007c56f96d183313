"""Profiled gradient shapes and codec times (issue 14, item 2): ``kplan profile`` records them,
the profile validates them, the planner prices compression with them (else the priors)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.core.errors import DataFileError
from kplan.planner import compression as cp
from kplan.planner.plan import Plan, PlanRow
from kplan.planner.profile import CodecTimes, profile_from_dict, profile_to_dict
from kplan.planner.search import SearchOptions, search
from kplan.planner.workload import Workload, for_instance, workload_from_profile
from kplan.profiler.codec import measure_options
from tests import planner_fixtures as fx

SMALL = ["--max-local-batch", "4", "--warmup-steps", "1", "--steps", "2", "--gns-steps", "4"]
TOPK = "topk:0.01:ag"


@pytest.mark.slow
def test_profile_records_the_shapes_and_codec_times(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = CliRunner().invoke(
        app,
        ["profile", "--example", "mlp-regression", "--workers", "2", *SMALL, "--out", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(out.read_text())
    # The MLP 32 -> 256 -> 256 -> 1: its weights and biases, in parameters() order.
    assert doc["model"]["gradient_shapes"] == [
        [[256, 32], 1], [[256], 2], [[256, 256], 1], [[1, 256], 1], [[1], 1],
    ]  # fmt: skip
    codec = doc["codec_seconds"]
    # auto is timed as each of its collectives
    want = {v.spec() for o in cp.DEFAULT_OPTIONS for v in cp.variants(cp.parse(o))}
    assert set(codec["options"]) == want and "topk:0.01:ar" in want
    assert all(math.isfinite(s) and 0 < s < 10 for s in codec["options"].values())
    assert codec["device"] == "cpu" and "median of 3" in codec["how"]
    profile = profile_from_dict(doc, source=str(out))
    shapes = profile.shapes()
    assert shapes is not None and 4 * sum(math.prod(s) for s in shapes) == profile.gradient_bytes
    assert profile.codec is not None and "codec fp16" in profile.provenance
    assert profile_to_dict(profile)["codec_seconds"] == codec
    # forward's share of the compute: the sweep timed its backward passes apart
    share = doc["model"]["forward_share"]
    assert 0.02 <= share <= 0.98 and profile.forward_share == share
    assert f"forward and input {share:.0%} of the compute" in profile.provenance
    assert f"forward       {share:.0%} of the compute" in result.stdout  # the summary says it


def test_measure_options_is_bounded_and_says_what_it_skipped() -> None:
    shapes = ((64, 32), (32,))
    got, skipped = measure_options(shapes, ("fp16", "powersgd:2", "topk:0.1"), budget_s=0.0)
    assert list(got) == ["fp16"] and got["fp16"] > 0
    assert skipped == (
        "powersgd:2, topk:0.1:ar, topk:0.1:ag not measured: the 0 s budget was spent"
    )
    got, skipped = measure_options(shapes, ("fp16",), max_elements=100)
    assert got == {} and "2080 gradient elements is more than 100" in skipped


# --- the profile file -------------------------------------------------------------------------


def _doc(**top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "kplan.profile/1.1",
        "name": "t",
        "device": {"gpu": "T4", "gpus_per_node": 4},
        "model": {"gradient_bytes": 4 * (64 * 32 + 32)},
        "batch": {"base_global_batch": 64, "max_local_batch": 64},
        "work": {"dataset_size": 1000, "epochs": 1},
        "measurements": [{"nodes": 1, "workers": 1, "local_batch": 8, "step_time": 0.1}],
    }
    doc.update(top)
    return doc


def test_old_profiles_have_neither_field_and_write_back_without_them() -> None:
    p = profile_from_dict(_doc())
    assert p.gradient_shapes is None and p.codec is None and p.shapes() is None
    out = profile_to_dict(p)
    assert "gradient_shapes" not in out["model"] and "codec_seconds" not in out


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (1.0, "'model.forward_share' must be below 1"),
        (0, "'model.forward_share' must be > 0"),
        (-0.2, "'model.forward_share' must be > 0"),
        ("a third", "'model.forward_share' must be a number"),
        (True, "'model.forward_share' must be a number"),
    ],
)
def test_forward_share_is_a_fraction(value: Any, match: str) -> None:
    doc = _doc()
    doc["model"]["forward_share"] = value
    with pytest.raises(DataFileError, match=match):
        profile_from_dict(doc)


def test_forward_share_round_trips_and_reaches_the_workload() -> None:
    doc = _doc()
    assert profile_from_dict(doc).forward_share is None
    doc["model"]["forward_share"] = 0.42
    p = profile_from_dict(doc)
    assert p.forward_share == 0.42 and profile_from_dict(profile_to_dict(p)) == p
    assert profile_to_dict(p)["model"]["forward_share"] == 0.42
    assert workload_from_profile(p, fx.catalog().gpus).forward_share == 0.42


def test_fields_round_trip_with_canonical_specs() -> None:
    doc = _doc(codec_seconds={"options": {"topk:0.01": 0.5, "fp16": 0.0}, "device": "cuda"})
    doc["model"]["gradient_shapes"] = [[[64, 32], 1], [[32], 1]]
    p = profile_from_dict(doc)
    assert p.shapes() == ((64, 32), (32,))
    assert p.codec == CodecTimes((("topk:0.01:auto", 0.5), ("fp16", 0.0)), "cuda", "")
    assert profile_from_dict(profile_to_dict(p)) == p


@pytest.mark.parametrize(
    ("shapes", "codec", "match"),
    [
        ("abc", None, "'model.gradient_shapes' must be a list"),
        ([], None, "'model.gradient_shapes' must be a list"),
        ([[[64, 32]]], None, r"gradient_shapes\[0\]' must be a \[shape, count\] pair"),
        ([[[64, -32], 1]], None, r"gradient_shapes\[0\]\[0\]' must be > 0"),
        ([[[64, 32], 1.5]], None, r"gradient_shapes\[0\]\[1\]' must be an integer"),
        ([[[1] * 9, 1]], None, "9 dimensions"),
        ([[[64, 32], 5]], None, "does not match model.gradient_bytes"),
        (None, [1], "'codec_seconds.options' must be an object"),
        (None, {"options": {}}, "'codec_seconds.options' must be an object"),
        (None, {"options": {"zip": 1.0}}, "not a compression"),
        (None, {"options": {"fp16": -1}}, "must be >= 0"),
        (None, {"options": {"fp16": "fast"}}, "must be a number"),
        (None, {"options": {"fp16": 1}, "how": 3}, "'codec_seconds.how' must be a string"),
    ],
)
def test_malformed_fields_are_one_line_file_errors(shapes: Any, codec: Any, match: str) -> None:
    doc = _doc() if codec is None else _doc(codec_seconds=codec)
    if shapes is not None:
        doc["model"]["gradient_shapes"] = shapes
    with pytest.raises(DataFileError, match=match) as err:
        profile_from_dict(doc)
    assert "\n" not in err.value.message and err.value.hint


# --- the planner ------------------------------------------------------------------------------


def _plan(wl: Workload, spec: str, gpu: str = "T4") -> Plan:
    opts = SearchOptions(
        markets=("on-demand",), mixed=False, top=50, min_nodes=4, max_nodes=4, gpus=(gpu,),
        compression=spec,
    )  # fmt: skip
    return search(wl, fx.catalog(), fx.device_model(), opts)


def _rows(plan: Plan) -> dict[tuple[str, int, int, int], PlanRow]:
    return {(r.instance_type, r.nodes, r.global_batch, r.accum_steps): r for r in plan.plans}


def _measured(wl: Workload, seconds: float, spec: str = TOPK) -> Workload:
    return replace(wl, codec=CodecTimes(((spec, seconds),), "cuda", "test"))


@pytest.mark.parametrize("gpu", ["T4", "A100"])
def test_measured_codec_time_adds_to_the_step_scaled_by_memory_bandwidth(gpu: str) -> None:
    """Without overlap (gamma 1), doubling the measured codec seconds adds them (x the
    memory-bandwidth ratio of the profiled T4 to the target GPU: the codec is memory-bound, not
    the compute time's FLOP-based factor) to every compressed row's step; with overlap, less
    (the asynchronous rounds hide behind it as behind backward); the why says measured."""
    # one global batch: the same rows in both
    wl = fx.workload(gns=False, inter_beta=2.0, gamma=1.0)
    hidden = fx.workload(gns=False, inter_beta=2.0)  # gamma 2.5
    inst = next(i for i in fx.catalog().instances.values() if i.gpu == gpu and i.gpu_count > 1)
    gpus = fx.catalog().gpus
    pred = for_instance(wl, inst, gpus[gpu], fx.device_model())
    factor = pred.codec_factor
    assert factor == pytest.approx(gpus["T4"].mem_bw_gbs / gpus[gpu].mem_bw_gbs)
    assert (factor == 1.0) == (gpu == "T4")
    assert (factor != pytest.approx(pred.compute_factor)) == (gpu != "T4")
    one, two = (
        _rows(_plan(_measured(wl, 0.3), TOPK, gpu)),
        _rows(_plan(_measured(wl, 0.6), TOPK, gpu)),
    )
    common = one.keys() & two.keys()
    assert common
    for key in common:
        r = one[key]
        assert two[key].step_time_s - r.step_time_s == pytest.approx(0.3 * factor, rel=1e-9)
        assert "codec measured on cuda" in r.compression_why
        assert ("device factor" in r.compression_why) == (gpu != "T4")
    one, two = (
        _rows(_plan(_measured(hidden, 0.3), TOPK, gpu)),
        _rows(_plan(_measured(hidden, 0.6), TOPK, gpu)),
    )
    for key in one.keys() & two.keys():
        assert 0 < two[key].step_time_s - one[key].step_time_s < 0.3 * factor


def test_auto_is_priced_as_the_faster_collective_with_its_own_codec() -> None:
    """topk:R:auto's row takes the faster of AR's and AG's steps, each with its codec (the
    why names the collective); a profile that timed only ``auto`` (before 2026-11-27, as AG)
    prices both with that time."""
    wl = fx.workload(gns=False, inter_beta=2.0, gamma=1.0)  # no overlap: the codec adds in full
    auto = "topk:0.01:auto"

    def rows(spec: str, codec: dict[str, float]) -> dict[tuple[str, int, int, int], PlanRow]:
        measured = replace(wl, codec=CodecTimes(tuple(codec.items()), "cuda", "test"))
        return _rows(_plan(measured, spec))

    chosen = set()
    for codec in ({"topk:0.01:ar": 0.05, "topk:0.01:ag": 0.4},
                  {"topk:0.01:ar": 0.4, "topk:0.01:ag": 0.05}):  # fmt: skip
        got, ar, ag = rows(auto, codec), rows("topk:0.01:ar", codec), rows("topk:0.01:ag", codec)
        assert got.keys() and got.keys() <= ar.keys() & ag.keys()
        for key, r in got.items():
            faster = min((ar[key], "ar"), (ag[key], "ag"), key=lambda x: x[0].step_time_s)
            assert r.step_time_s == pytest.approx(faster[0].step_time_s, rel=1e-12)
            assert r.compression_why.startswith(f"{auto} ({faster[1].upper()})")
            chosen.add(faster[1])
    assert chosen == {"ar", "ag"}  # each codec setting makes the other collective the faster
    old = rows(auto, {auto: 0.05})
    assert old and all("codec measured" in r.compression_why for r in old.values())


def test_old_profiles_plan_with_the_assumed_shapes_and_the_prior() -> None:
    """No profiled fields: the step is the prior's (square matrices, per-element codec), as
    before; a codec time measured for another option leaves this one on its prior."""
    wl = fx.workload(inter_beta=2.0)
    plan = _plan(wl, TOPK)
    other = _plan(_measured(wl, 5.0, "fp16"), TOPK)
    assert plan.to_dict() == other.to_dict()
    comp, shapes = cp.parse(TOPK), cp.assumed_shapes(1e8)
    cat = fx.catalog()
    for r in plan.plans:
        inst = cat.instances[("aws", r.instance_type)]
        p = for_instance(wl, inst, cat.gpus[inst.gpu], fx.device_model()).params
        want = cp.step_time(
            p, comp, shapes, [r.nodes], [r.workers], [r.local_batch], r.accum_steps,
            cp.codec_seconds(comp, shapes),
        )  # fmt: skip
        assert r.step_time_s == pytest.approx(float(want[0]), rel=1e-9)
        assert "(codec prior)" in r.compression_why


def test_profiled_shapes_replace_the_assumed_squares() -> None:
    """PowerSGD sends vectors dense: the same 1e8 bytes as one long vector compress nothing,
    so its rows are slower than with the assumed 4096-wide matrices."""
    wl = fx.workload(gns=False, inter_beta=2.0)
    vector = replace(wl, gradient_shapes=((25_000_000,),))
    squares = _rows(_plan(wl, "powersgd:4"))
    flat = _rows(_plan(vector, "powersgd:4"))
    common = squares.keys() & flat.keys()
    assert common
    assert all(flat[k].step_time_s > squares[k].step_time_s * 1.5 for k in common)
