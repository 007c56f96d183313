"""Gradient compression priced by the planner (planner/compression.py) and chosen by the search.

Tables of numbers for the bytes and the sync model; the search keeps dense plans where
compression does not help and picks (and explains) an option where the all-reduce dominates.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.core import compression_spec as rc
from kplan.core.errors import InputError
from kplan.planner import compression as cp
from kplan.planner import perfmodel
from kplan.planner.search import SearchOptions, search
from tests import planner_fixtures as fx

P = 1e8  # fixture gradient bytes
SHAPES = ((5000, 5000),)  # 25M elements = 1e8 FP32 bytes
FOUR = ((2500, 2500),) * 4  # the same elements as four 25 MB parameters (a DDP bucket each)


def _traffic(spec: str, k: int, shapes: tuple[tuple[int, ...], ...] = SHAPES) -> cp.Traffic:
    return cp.traffic(cp.parse(spec), shapes, k, bandwidth_Bps=1e9, latency_s=5e-5)


@pytest.mark.parametrize("k", [2, 3, 4, 16])
def test_bytes_on_the_wire_per_option(k: int) -> None:
    ring = 2 * (k - 1) / k
    assert _traffic("none", k).bytes == pytest.approx(ring * P)
    assert _traffic("fp16", k).bytes == pytest.approx(ring * P / 2)
    # PowerSGD rank 4 on a 5000 x 5000 matrix: P (5000 x 4) and Q (5000 x 4) all-reduced
    assert _traffic("powersgd:4", k).bytes == pytest.approx(ring * 4 * (5000 + 5000) * 4)
    kk = math.ceil(0.01 * 25_000_000)
    assert _traffic("topk:0.01:ag", k).bytes == pytest.approx((k - 1) * 8 * kk)
    tree = math.ceil(math.log2(k))
    assert _traffic("topk:0.01:ar", k).bytes == pytest.approx(tree * 4 * kk + ring * 4 * kk)
    # hops: ring all-reduce 2(k-1), PowerSGD two of them, AG two all-gathers 2(k-1), AR tree
    # + ring
    assert _traffic("none", k).hops == 2 * (k - 1)
    assert _traffic("powersgd:4", k).hops == 4 * (k - 1)
    assert _traffic("topk:0.01:ag", k).hops == 2 * (k - 1)
    assert _traffic("topk:0.01:ar", k).hops == tree + 2 * (k - 1)


def test_powersgd_sends_vectors_dense_and_one_worker_sends_nothing() -> None:
    shapes = ((1000, 500), (1000,))
    t = cp.traffic(cp.parse("powersgd:2"), shapes, 2, 1e9, 0.0)
    assert t.bytes == pytest.approx(4 * ((1000 + 500) * 2 + 1000))
    assert cp.traffic(cp.parse("topk:0.1"), shapes, 1, 1e9, 0.0).bytes == 0.0


@pytest.mark.parametrize("k", [2, 4, 8, 32])
@pytest.mark.parametrize("gbps", [0.1, 1.0, 10.0, 100.0])
@pytest.mark.parametrize("lat", [1e-6, 5e-5, 1e-3])
def test_auto_takes_the_runtimes_choice(k: int, gbps: float, lat: float) -> None:
    bw = gbps * 1e9 / 8
    want = rc.topk_collective(25_000_000, 0.001, k, bw, lat).choice
    got = cp.traffic(cp.parse("topk:0.001:auto"), SHAPES, k, bw, lat)
    assert got.collective == want


def test_dense_is_perfmodel_exactly() -> None:
    p = perfmodel.with_bucket_floor(fx.params(two_node=0.3))
    nodes = np.array([1, 1, 2, 2, 4, 8], dtype=float)
    workers = nodes * 4
    workers[0] = 1
    sync, _ = cp.sync_time(p, cp.parse("none"), cp.assumed_shapes(P), nodes, workers)
    np.testing.assert_allclose(sync, perfmodel.sync_time(p, nodes, workers), rtol=1e-12)
    step = cp.step_time(p, cp.parse("none"), SHAPES, nodes, workers, 16, 1)
    np.testing.assert_allclose(step, perfmodel.step_time(p, nodes, workers, 16, 1))


def test_compressed_sync_scales_the_byte_term_only() -> None:
    p = fx.params(inter_alpha=0.01, inter_lat=0.0, two_node=0.0)
    sync, _ = cp.sync_time(p, cp.parse("fp16"), SHAPES, [4], [16])
    dense = float(perfmodel.sync_time(p, 4, 16))
    assert float(sync[0]) == pytest.approx(0.01 + (dense - 0.01) / 2)


def test_step_time_adds_the_codec_and_overlaps_like_dense() -> None:
    p = fx.params(gamma=1.0)  # no overlap: step = compute + sync + codec
    c = cp.parse("powersgd:4")
    sync, _ = cp.sync_time(p, c, SHAPES, [2], [8])
    step = cp.step_time(p, c, SHAPES, [2], [8], [16], 1, codec_s=0.123)
    tc = float(perfmodel.compute_time(p, 16))
    assert float(step[0]) == pytest.approx(tc + float(sync[0]) + 0.123)
    # with overlap the asynchronous rounds hide behind compute + codec alike: at gamma 10 the
    # step is within 2^0.1 of max(compute + codec, async rounds) + last (top-k AG: no blocking)
    q = fx.params(gamma=10.0)
    ag = cp.parse("topk:0.05:ag")
    over, _ = cp.sync_time(q, ag, SHAPES, [2], [8], part="overlapped")
    frac = min(1.0, q.bucket_bytes / q.gradient_bytes) if q.bucket_bytes else 0.0
    last = min(float(cp.sync_time(q, ag, SHAPES, [2], [8], frac, part="overlapped")[0][0]),
               float(over[0])) if frac else 0.0  # fmt: skip
    tcq = float(perfmodel.compute_time(q, 16))
    for codec in (0.0, 0.5 * float(over[0]), 3.0 * float(over[0])):
        got = float(cp.step_time(q, ag, SHAPES, [2], [8], [16], 1, codec_s=codec)[0])
        hidden = max(tcq + codec, float(over[0]) - last)
        assert hidden + last <= got <= 2**0.1 * hidden + last, codec
        assert got < tcq + codec + float(over[0]), codec  # not added in full
    one = cp.step_time(p, c, SHAPES, [1], [1], [16], 1, codec_s=0.123)
    assert float(one[0]) == pytest.approx(tc)  # one worker: nothing to compress


def test_codec_seconds_measured_or_prior() -> None:
    c = cp.parse("topk:0.01:ar")
    assert cp.codec_seconds(c, SHAPES, {"topk:0.01:ar": 0.5}) == 0.5
    assert cp.codec_seconds(c, SHAPES, {"topk": 0.25}) == 0.25
    assert cp.codec_seconds(c, SHAPES) == pytest.approx(25e6 * cp.CODEC_S_PER_ELEMENT["topk"])
    assert cp.codec_seconds(cp.parse("none"), SHAPES) == 0.0


def test_stat_cost_prior_and_update() -> None:
    assert cp.prior(cp.parse("fp16")).multiplier == 1.0
    assert cp.prior(cp.parse("powersgd:2")).multiplier == pytest.approx(1.05)
    assert cp.prior(cp.parse("topk:0.01")).multiplier == pytest.approx(1.06)
    prior = cp.StatCost(1.2, 0.1, "prior")
    both = prior.updated(1.0, 0.1)  # equal weights: the geometric mean, a tighter sigma
    assert both.multiplier == pytest.approx(math.sqrt(1.2))
    assert both.log_sigma == pytest.approx(0.1 / math.sqrt(2))
    sure = prior.updated(1.0, 1e-4)  # a precise measurement wins
    assert sure.multiplier == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(InputError, match="measured multiplier"):
        prior.updated(-1.0, 0.1)
    with pytest.raises(InputError, match="must be a number > 0"):
        cp.StatCost(0.0, 0.1, "x")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("zip", "not a compression"),
        ("topk:2", "ratio"),
        ("powersgd:0", "rank"),
        ("adaptive", "no fixed price"),
    ],
)
def test_bad_options_are_input_errors(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        cp.parse(text)
    with pytest.raises(InputError, match=match):
        SearchOptions(compression=text)


def test_assumed_shapes_hold_the_gradient() -> None:
    shapes = cp.assumed_shapes(1e9)
    assert sum(math.prod(s) for s in shapes) == 250_000_000
    assert shapes[0] == (cp.ASSUMED_SIDE, cp.ASSUMED_SIDE)
    assert cp.assumed_shapes(400) == ((10, 10),)


# --- the search ----------------------------------------------------------------------------


def _search(wl: object, **opts: object) -> object:
    base: dict[str, object] = {"markets": ("on-demand",), "mixed": False, "top": 50}
    base.update(opts)
    return search(wl, fx.catalog(), fx.device_model(), SearchOptions(**base))  # type: ignore[arg-type]


def test_single_node_rows_are_never_compressed_by_default() -> None:
    """Even where the intra-node all-reduce is slow, the default considers compression across
    nodes only: every one-node row stays dense (a pin applies it there too)."""
    wl = fx.workload(inter_beta=2.0, intra_beta=1.0)
    plan = _search(wl, max_nodes=4, top=200)
    rows = plan.plans  # type: ignore[attr-defined]
    assert any(r.nodes == 1 for r in rows) and any(r.compression != "none" for r in rows)
    assert all(r.compression == "none" for r in rows if r.nodes == 1)
    pinned = _search(wl, max_nodes=1, compression="fp16")
    assert {r.compression for r in pinned.plans} == {"fp16"}  # type: ignore[attr-defined]


def test_compute_bound_multinode_plans_stay_dense() -> None:
    """A gradient of 1 MB: the all-reduce is negligible, no option saves 5%, nothing changes."""
    wl = fx.workload(gradient_bytes=1e6, inter_beta=0.002, intra_beta=0.0002)
    a = _search(wl, min_nodes=2, max_nodes=4)
    b = _search(wl, min_nodes=2, max_nodes=4, compression="none")
    assert a.to_dict() == b.to_dict()  # type: ignore[attr-defined]


def test_communication_bound_plans_choose_compression_and_say_why() -> None:
    """4 nodes, the all-reduce (beta 2 s per unit ring) far above compute: compression wins."""
    wl = fx.workload(inter_beta=2.0, two_node=0.0)
    plan = _search(wl, min_nodes=4, max_nodes=4, objective="time", gpus=("T4",))
    chosen = plan.chosen  # type: ignore[attr-defined]
    assert chosen.compression in {cp.parse(o).spec() for o in cp.DEFAULT_OPTIONS}
    assert "less time than dense" in chosen.compression_why
    dense = _search(
        wl, min_nodes=4, max_nodes=4, objective="time", gpus=("T4",), compression="none"
    )
    assert chosen.hours < dense.chosen.hours * 0.95  # type: ignore[attr-defined]
    assert chosen.step_time_s < dense.chosen.step_time_s  # type: ignore[attr-defined]


def test_a_pinned_option_runs_on_every_row() -> None:
    wl = fx.workload(inter_beta=2.0)
    plan = _search(wl, min_nodes=2, max_nodes=4, compression="powersgd:2")
    assert {r.compression for r in plan.plans} == {"powersgd:2"}  # type: ignore[attr-defined]
    stat = cp.prior(cp.parse("powersgd:2")).multiplier
    r = plan.chosen  # type: ignore[attr-defined]
    base = fx.workload(inter_beta=2.0).samples_at_base
    assert r.samples >= base * stat * 0.999  # the statistical cost is in the samples


def test_estimate_cli_compression_flag() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["estimate", "--example", "bert-squad", "--compression", "zip"])
    assert bad.exit_code == 2
    assert "not a compression" in bad.output
    ok = runner.invoke(
        app,
        ["estimate", "--example", "bert-squad", "--gpu", "T4", "--nodes", "4", "--json",
         "--compression", "topk:0.01:ag", "--top", "2"],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output
    import json

    doc = json.loads(ok.output)
    assert doc["chosen"]["compression"] == "topk:0.01:ag"
    assert doc["chosen"]["compression_why"].startswith("topk:0.01:ag (AG)")


def test_estimate_cli_takes_a_measured_statistical_cost() -> None:
    """--compression-steps SPEC=MULT[/SIGMA] updates the option's prior by inverse variance: the
    samples, the time and the row's why carry it, and the assumptions say it was given."""
    import json

    runner = CliRunner()
    base = ["estimate", "--example", "bert-squad", "--instance-type", "g4dn.12xlarge",
            "--nodes", "4", "--global-batch", "256", "--no-mixed", "--json", "--top", "1",
            "--compression", "topk:0.01:ag"]  # fmt: skip
    docs = {}
    for extra in ([], ["--compression-steps", "topk:0.01:ag=1.5/0.05"]):
        out = runner.invoke(app, [*base, *extra])
        assert out.exit_code == 0, out.output
        docs[bool(extra)] = json.loads(out.output)
    prior, measured = docs[False]["chosen"], docs[True]["chosen"]
    wp, wm = 1 / cp.TOPK_PRIOR_SIGMA**2, 1 / 0.05**2  # the prior's (1.06) and the measurement's
    want = math.exp((wp * math.log(1.06) + wm * math.log(1.5)) / (wp + wm))
    assert f"x{want:.3g} steps (measured (1.5) + prior)" in measured["compression_why"]
    assert "x1.06 steps (prior (EF top-k))" in prior["compression_why"]
    # the same configuration, so the samples (and the time) scale by the multipliers' ratio
    where = ("instance_type", "market", "region", "global_batch", "accum_steps")
    assert [measured[k] for k in where] == [prior[k] for k in where]
    assert measured["samples"] / prior["samples"] == pytest.approx(want / 1.06, rel=1e-3)
    assert measured["hours"] > prior["hours"] * 1.2
    search = docs[True]["assumptions"]["search"]
    assert search["compression"] == "topk:0.01:ag"
    assert search["compression_steps"] == [["topk:0.01:ag", 1.5, 0.05]]
    assert docs[False]["assumptions"]["search"]["compression_steps"] == []
    # the default sigma, and a spec as written that parses to the priced one
    assert cp.parse_measured("topk:0.01:ag=1.2") == ("topk:0.01:ag", 1.2, cp.MEASURED_SIGMA)
    assert cp.parse_measured("FP16=1") == ("fp16", 1.0, cp.MEASURED_SIGMA)
    # shown in the table view's "searched" line
    text = runner.invoke(app, [a for a in base if a != "--json"]
                         + ["--compression-steps", "topk:0.01:ag=1.5/0.05"])  # fmt: skip
    assert text.exit_code == 0, text.output
    assert "measured at x1.5 dense's" in " ".join(text.output.split())


def test_a_measured_cost_for_an_option_not_priced_is_refused() -> None:
    """It would be silently unused: the search prices only the pinned option or the defaults."""
    with pytest.raises(InputError, match="does not price"):
        SearchOptions(compression_stats=(("topk:0.05", 1.2, 0.1),))
    with pytest.raises(InputError, match="does not price"):
        SearchOptions(compression="fp16", compression_stats=(("powersgd:4", 1.1, 0.1),))
    SearchOptions(compression="topk:0.05", compression_stats=(("topk:0.05:auto", 1.2, 0.1),))


def test_why_says_more_time_when_an_option_loses() -> None:
    stat = cp.StatCost(3.0, 0.1, "measured")
    lose = cp.Priced("topk:0.01", 0.5, 1.0, 0.1, 0.5, 0.01, stat, "ag")  # 1.5x dense's time
    assert lose.why().endswith("50% more time than dense")
    win = cp.Priced("topk:0.01", 0.5, 1.0, 0.1, 0.5, 0.01, cp.StatCost(1.0, 0.1, "x"), "ag")
    assert win.why().endswith("50% less time than dense")


# --- the codec profiler (profiler/codec.py) ----------------------------------------------------


def test_codec_profiler_measures_each_option_on_the_shapes() -> None:
    from kplan.profiler.codec import codec_seconds, elements

    shapes = ((64, 32), (32,))
    assert elements(shapes) == 64 * 32 + 32
    assert codec_seconds("none", shapes) == 0.0
    for spec in ("fp16", "powersgd:2", "topk:0.1:ar", "topk:0.1:ag", "topk:0.1:auto"):
        s = codec_seconds(spec, shapes, repeats=2)
        assert math.isfinite(s) and s > 0, spec
    with pytest.raises(InputError, match="not a compression"):
        codec_seconds("zip", shapes)


def test_measured_statistical_costs_update_the_prior_and_the_choice() -> None:
    """A measured multiplier of 20 (twenty times the steps) outweighs the all-reduce it saves
    for top-k and PowerSGD alike here, and fp16's measured 1.0 keeps it: the search takes it."""
    wl = fx.workload(inter_beta=2.0, two_node=0.0)
    pins: dict[str, object] = {"min_nodes": 4, "max_nodes": 4, "gpus": ("T4",)}
    measured = (("topk:0.01:auto", 20.0, 0.01), ("powersgd:4", 20.0, 0.01), ("fp16", 1.0, 0.01))
    plan = _search(wl, objective="time", compression_stats=measured, **pins)
    chosen = plan.chosen  # type: ignore[attr-defined]
    assert chosen.compression == "fp16"
    assert "measured (1) + prior" in chosen.compression_why
    stat = cp.stat_for(cp.parse("topk:0.01"), measured)
    wp, wm = 1 / cp.TOPK_PRIOR_SIGMA**2, 1 / 0.01**2  # the prior's and the measurement's weights
    want = math.exp((wp * math.log(1.06) + wm * math.log(20.0)) / (wp + wm))
    assert stat.multiplier == pytest.approx(want)
    assert cp.stat_for(cp.parse("topk:0.1"), measured) == cp.prior(cp.parse("topk:0.1"))
    with pytest.raises(InputError, match="measured multiplier"):
        SearchOptions(compression_stats=(("fp16", -1.0, 0.1),))


def test_rounds_waited_for_in_the_hook_are_not_overlapped() -> None:
    """PowerSGD's P round and AR-Topk's index broadcast block backward: their bytes and their
    hops in every bucket are added in full even with near-perfect overlap, and PowerSGD's (an
    all-reduce every worker joins) pays the workers' skew once a step; the broadcast waits for the
    designated worker alone (no skew); AG-Topk and fp16 have no such round (module notes)."""
    p = fx.params(gamma=10.0, inter_alpha=0.0, inter_lat=1e-3, bucket_bytes=25 * 2**20)
    nb = cp.buckets(p, SHAPES)
    assert nb == math.ceil(1e8 / (25 * 2**20)) == 4
    per_byte = p.inter_beta / P
    c = cp.parse("powersgd:4")
    block, _ = cp.sync_time(p, c, SHAPES, [2], [2], part="blocking")
    p_bytes = rc.ring_allreduce_bytes(4 * 5000 * 4, 2)  # P: 5000 x 4 FP32
    assert float(block[0]) == pytest.approx(per_byte * p_bytes + nb * 1e-3 * 2)
    whole, _ = cp.sync_time(p, c, SHAPES, [2], [2])
    over, _ = cp.sync_time(p, c, SHAPES, [2], [2], part="overlapped")
    assert float(whole[0]) == pytest.approx(float(block[0] + over[0]))
    tc = float(perfmodel.compute_time(p, 16))
    step = float(cp.step_time(p, c, SHAPES, [2], [2], [16], 1, codec_s=0.1)[0])
    assert step >= tc + float(block[0]) + 0.1
    for spec, waits in (("powersgd:4", True), ("topk:0.01:ar", False), ("topk:0.01:ag", False),
                        ("fp16", False)):  # fmt: skip
        o = cp.parse(spec)
        calm = cp.step_time(p, o, SHAPES, [2], [2], [16], 1, 0.1)
        skewed = cp.step_time(p, o, SHAPES, [2], [2], [16], 1, 0.1, skew_s=0.01)
        # once a step, not per bucket: the first barrier realigns the workers (module notes)
        assert float(skewed[0] - calm[0]) == pytest.approx(0.01 if waits else 0.0)
    one = cp.step_time(p, c, SHAPES, [1], [1], [16], 1, 0.1, skew_s=0.01)
    assert float(one[0]) == pytest.approx(tc)  # one worker: no rounds, no barrier
    ar = cp.parse("topk:0.01:ar")
    bcast, _ = cp.sync_time(p, ar, SHAPES, [2], [2], part="blocking")
    kk = math.ceil(0.01 * 25_000_000)
    assert float(bcast[0]) == pytest.approx(per_byte * 4 * kk + nb * 1e-3 * 1)


def test_ar_topk_exposes_only_the_last_buckets_broadcast() -> None:
    """The designated worker sends a bucket's indices and goes on while they travel: of
    AR-Topk's broadcast only the last bucket's share of the bytes is exposed (every bucket's
    latencies still are), the rest joins the overlapped rounds; PowerSGD's P round, a barrier,
    stays exposed in full (module notes)."""
    p = fx.params(gamma=10.0, inter_alpha=0.0, inter_lat=1e-3, bucket_bytes=25 * 2**20)
    nb, per_byte = cp.buckets(p, FOUR), p.inter_beta / P
    frac = cp.bucket_shares(FOUR, 25 * 2**20)[-1]
    assert frac == pytest.approx(0.25)  # four 25 MB parameters, a bucket each
    ar = cp.parse("topk:0.05:ar")
    whole, _ = cp.sync_time(p, ar, FOUR, [2], [2], part="blocking")
    exposed, hidden = cp.blocking_time(p, ar, FOUR, [2], [2])
    kk = math.ceil(0.05 * 25_000_000)
    assert float(exposed[0]) == pytest.approx(per_byte * 4 * kk * frac + nb * 1e-3)
    assert float(exposed[0] + hidden[0]) == pytest.approx(float(whole[0]))
    assert float(hidden[0]) > 0.5 * float(whole[0])
    ps = cp.parse("powersgd:4")
    full, _ = cp.sync_time(p, ps, FOUR, [2], [2], part="blocking", skew_s=0.01)
    e2, h2 = cp.blocking_time(p, ps, FOUR, [2], [2], skew_s=0.01)
    assert float(e2[0]) == pytest.approx(float(full[0])) and float(h2[0]) == 0.0
    # a long compute hides the earlier buckets' broadcast: the step is compute + codec + the
    # last bucket's share of the rounds + the exposed broadcast (the pipeline)
    tc = float(perfmodel.compute_time(p, 16))
    step = float(cp.step_time(p, ar, FOUR, [2], [2], [16], 1, codec_s=1.0)[0])
    over, _ = cp.sync_time(p, ar, FOUR, [2], [2], part="overlapped")
    last_share = cp.bucket_shares(FOUR, 25 * 2**20)[-1]
    wire = float(over[0] + hidden[0])
    assert step == pytest.approx(tc + 1.0 + wire * last_share + float(exposed[0]), rel=1e-6)
    assert step < tc + 1.0 + wire * last_share + float(whole[0]) - 0.9 * float(hidden[0])


def test_compressed_steps_are_a_pipeline_of_ddp_buckets() -> None:
    """With DDP's buckets known, a compressed step is forward, then each bucket's backward and
    codec on the worker and its rounds on the link in launch order (module notes): no overlap
    exponent; comm-bound, the step is forward + the first bucket's work + all the rounds;
    compute-bound, compute + codec + the last bucket's rounds; in one bucket, nothing
    overlaps."""
    shares = cp.bucket_shares([(1000, 1000), (500, 1000), (10,)], 4 * 1_000_000)
    assert shares == pytest.approx([0.5e6 / 1.50001e6 + 10 / 1.50001e6, 1e6 / 1.50001e6])
    tc, codec = 0.3, 0.06
    f1, f2 = shares
    slow = float(cp.pipeline(tc, codec, 10.0, shares))
    assert slow == pytest.approx(tc / 3 + (2 * tc / 3 + codec) * f1 + 10.0)
    fast = float(cp.pipeline(tc, codec, 0.01, shares))
    assert fast == pytest.approx(tc + codec + 0.01 * f2)
    assert float(cp.pipeline(tc, codec, 1.0, [1.0])) == pytest.approx(tc + codec + 1.0)
    p = fx.params(inter_alpha=0.0, inter_lat=1e-4, bucket_bytes=25 * 2**20)
    o = cp.parse("topk:0.01:ag")
    steps = [
        float(
            cp.step_time(perfmodel.replace_fields(p, gamma=g), o, SHAPES, [2], [2], [16], 1, 0.1)[0]
        )
        for g in (1.0, 3.0, 10.0)
    ]
    assert steps[0] == pytest.approx(steps[1]) == pytest.approx(steps[2])


def test_the_profiled_forward_share_is_what_no_round_overlaps() -> None:
    """The profile's measured forward share replaces the assumed third: comm-bound, the step is
    forward + the first bucket's work + the rounds; a larger share leaves less backward for the
    rounds to hide behind, so the step grows, in the planner's search too."""
    shares = cp.bucket_shares([(1000, 1000)] * 25, 25 * 2**20)
    assert len(shares) > 2
    tc, codec = 0.3, 0.06
    for f in (0.1, 0.5, 0.9):
        slow = float(cp.pipeline(tc, codec, 10.0, shares, f))
        assert slow == pytest.approx(f * tc + ((1 - f) * tc + codec) * shares[0] + 10.0)
    # compute-bound: compute + codec + the last bucket's rounds, whatever the share
    fast = [float(cp.pipeline(tc, codec, 0.01, shares, f)) for f in (0.1, 0.9)]
    assert fast == pytest.approx([tc + codec + 0.01 * shares[-1]] * 2)
    p = fx.params(inter_alpha=0.0, inter_lat=1e-4, bucket_bytes=25 * 2**20)
    o = cp.parse("topk:0.05:ag")
    grads = [(1000, 1000)] * 25

    def step(share: float | None) -> float:
        return float(cp.step_time(p, o, grads, [2], [8], [64], 1, 0.05, forward_share=share)[0])

    assert step(None) == pytest.approx(step(cp.FORWARD_SHARE))
    assert step(0.1) < step(0.5) < step(0.9)
    wl = replace(fx.workload(inter_beta=2.0), gradient_shapes=tuple(grads))
    wl = replace(wl, params=replace(wl.params, bucket_bytes=25 * 2**20))

    def chosen_step(share: float) -> float:
        plan = _search(
            replace(wl, forward_share=share), min_nodes=2, max_nodes=2, gpus=("T4",),
            compression="topk:0.05:ag", objective="time",
        )  # fmt: skip
        r = plan.chosen  # type: ignore[attr-defined]
        assert r.compression == "topk:0.05:ag"
        return float(r.step_time_s)

    assert chosen_step(0.1) < chosen_step(0.9)


def test_every_bucket_pays_its_rounds_latency() -> None:
    """A compressed option runs its rounds in each DDP bucket: hops x latency x buckets
    (dense keeps perfmodel's own latency term)."""
    lat = 1e-3
    p = fx.params(inter_alpha=0.0, inter_beta=1e-12, inter_lat=lat, bucket_bytes=25 * 2**20)
    nb = cp.buckets(p, SHAPES)
    for spec, hops in (("fp16", 2), ("powersgd:4", 4), ("topk:0.01:ag", 2), ("topk:0.01:ar", 3)):
        sync, _ = cp.sync_time(p, cp.parse(spec), SHAPES, [2], [2])
        assert float(sync[0]) == pytest.approx(hops * lat * nb, rel=1e-6)
    assert cp.buckets(fx.params(), SHAPES) == 1  # no bucket size: one round per step
