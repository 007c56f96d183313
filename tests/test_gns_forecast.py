"""The GNS trajectory forecast and the steps to a target (kplan/planner/gnsforecast.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import gns_forecast as bench
from kplan.planner import gnsforecast
from kplan.planner.gnsforecast import GnsPrior, factor_samples, fit_prior, forecast, steps_to_target
from kplan.planner.profile import GnsPoint
from scripts.traces import data_root

needs_traces = pytest.mark.skipif(
    not (data_root() / "traces" / "pollux" / "t4").is_dir(),
    reason="the Pollux traces (../shared/data) are not here",
)


def power_law(progress: np.ndarray, *, a: float = 100.0, b: float = 1.3, noise: float = 0.0,
              seed: int = 0) -> list[GnsPoint]:  # fmt: skip
    rng = np.random.default_rng(seed)
    scale = a * (progress / 0.01) ** b * np.exp(rng.normal(0.0, noise, len(progress)))
    return [GnsPoint(float(p), float(s)) for p, s in zip(progress, scale, strict=True)]


def test_recovers_a_synthetic_power_law() -> None:
    pts = power_law(np.linspace(0.01, 0.2, 20), noise=0.1)
    fc = forecast(pts)
    assert fc.slope == pytest.approx(1.3, abs=0.1)
    truth = 100.0 * 100.0**1.3
    assert float(fc.median([1.0])[0]) == pytest.approx(truth, rel=0.25)
    lo, hi = (float(fc.quantile([1.0], q)[0]) for q in (0.1, 0.9))
    assert lo < truth < hi


def test_posterior_narrows_with_more_points() -> None:
    prior = GnsPrior(slope_mean=1.0, slope_sd=0.7, noise_sd=0.5, slope_drift_sd=0.0)
    few = forecast(power_law(np.array([0.05, 0.1])), prior)
    many = forecast(power_law(np.linspace(0.01, 0.1, 30)), prior)
    assert many.slope_sd < few.slope_sd < prior.slope_sd
    # With one point the slope is the prior's, as wide (no drift: the data set no slope).
    one = forecast([GnsPoint(0.0, 72.0)], gnsforecast.PRIOR)
    assert one.slope == pytest.approx(gnsforecast.PRIOR.slope_mean)
    assert one.slope_sd == pytest.approx(gnsforecast.PRIOR.slope_sd, rel=1e-6)
    # Many points set the slope: the drift then widens it toward slope_drift_sd.
    drift = GnsPrior(slope_mean=1.0, slope_sd=0.7, noise_sd=0.5, slope_drift_sd=0.4)
    assert forecast(power_law(np.linspace(0.01, 0.1, 30)), drift).slope_sd > 0.35
    assert one.now == gnsforecast.PROGRESS_FLOOR and float(one.median([0.0])[0]) == 72.0


@pytest.mark.parametrize("where", [0, 5, 18, 19])
def test_a_plateau_spike_hardly_moves_the_forecast(where: int) -> None:
    pts = power_law(np.linspace(0.01, 0.2, 20), noise=0.05)
    calm = float(forecast(pts).median([1.0])[0])
    spiked = list(pts)
    for jump in (1000.0, 0.001):
        spiked[where] = GnsPoint(pts[where].progress, pts[where].noise_scale * jump)
        swung = float(forecast(spiked).median([1.0])[0])
        # A 1000x jump in one point (655 -> 1.3M on a real run) moves the forecast's end <25%.
        assert swung / calm == pytest.approx(1.0, abs=0.25)
    spiked[where] = GnsPoint(pts[where].progress, pts[where].noise_scale * 1000.0)
    # The measured part clips the spike to CLIP_SD noise sds of the median of its five points.
    lo = min(max(0, where - 2), len(pts) - 5)
    near = max(pts[j].noise_scale for j in range(lo, lo + 5) if j != where)
    bound = near * math.exp(gnsforecast.CLIP_SD * gnsforecast.PRIOR.noise_sd)
    assert float(forecast(spiked).median([pts[where].progress])[0]) <= bound


def test_constant_gns_reduces_to_the_closed_form() -> None:
    flat = GnsPrior(slope_mean=0.0, slope_sd=1e-9, noise_sd=1e-9, slope_drift_sd=0.0)
    bn, b0 = 1000.0, 100.0
    batches = np.array([100.0, 1100.0, 2100.0])
    mid, p90 = steps_to_target([GnsPoint(0.0, bn)], b0, batches, base_steps=5000.0, prior=flat)
    np.testing.assert_allclose(mid, 5000.0 * b0 / batches * (bn + batches) / (bn + b0), rtol=1e-6)
    np.testing.assert_allclose(p90, mid, rtol=1e-6)
    # A trajectory measured to the end needs no forecast: the plain integral of the points.
    whole = [GnsPoint(0.0, 100.0), GnsPoint(1.0, 10_000.0)]
    f = factor_samples(whole, b0, [3200.0])
    grid = np.linspace(0.0, 1.0, 2001)
    line = 100.0 + 9900.0 * grid
    expect = float(np.trapezoid((line + 3200.0) / (line + b0), grid))
    np.testing.assert_allclose(f[:, 0], expect, rtol=5e-3)  # trapezoid on 129 points


def test_one_point_forecasts_growth_and_says_how_unsure() -> None:
    b0, batch = 128.0, 4096.0
    one = [GnsPoint(0.0, 72.0)]
    mid, p90 = steps_to_target(one, b0, [batch], base_steps=39_000.0)
    held = 39_000.0 * b0 / batch * (72.0 + batch) / (72.0 + b0)
    assert mid[0] < 0.5 * held  # the noise scale grows: large batches waste less than held
    assert p90[0] > 1.3 * mid[0]  # one point: a wide band
    # Part of the way: only the rest of training counts.
    late, _ = steps_to_target(one, b0, [batch], base_steps=39_000.0, start=0.5)
    assert late[0] < 0.5 * mid[0]


def test_fit_prior_recovers_the_slopes_of_synthetic_curves() -> None:
    grid = np.linspace(0.01, 1.0, 60)
    curves = [power_law(grid, b=b, noise=0.2, seed=i) for i, b in enumerate([1.0, 1.5, 2.0])]
    prior = fit_prior(curves, ["a", "b", "c"])
    assert prior.slope_mean == pytest.approx(1.5, abs=0.1)
    assert prior.slope_sd == pytest.approx(math.sqrt(2 / 3) * 0.5, abs=0.1)
    assert prior.noise_sd == pytest.approx(0.2, abs=0.06)
    assert prior.slope_drift_sd < 0.5  # straight lines: the early slope is the late one


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="no positive GNS point"):
        forecast([GnsPoint(0.5, 0.0)])
    with pytest.raises(ValueError, match="progress span"):
        factor_samples([GnsPoint(0.0, 10.0)], 8, [16], start=0.5, end=0.5)
    with pytest.raises(ValueError, match="slope_sd"):
        GnsPrior(slope_mean=1.0, slope_sd=0.0, noise_sd=0.5, slope_drift_sd=0.1)
    assert gnsforecast._z(0.9) == pytest.approx(1.2815516, abs=1e-6)
    assert gnsforecast._z(0.01) == pytest.approx(-2.3263479, abs=1e-6)


@needs_traces
def test_bench_quick_runs_on_one_model(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "cifar10" in out and "own forecast" in out
    assert [r.batch for r in rows] == [256, 512, 1024, 2048, 4096]
    # The forecast from a job's own first 10% beats holding the GNS on every batch of cifar10.
    for r in rows:
        assert abs(r.own / r.measured - 1) <= 0.2
        assert abs(r.own / r.measured - 1) <= abs(r.own_const / r.measured - 1)


def test_a_plan_from_one_gns_point_carries_the_forecasts_spread_in_its_time_p90() -> None:
    # The same job with its whole measured GNS trajectory and with only its first point: the
    # step time's p90 is the same, the time's p90 (from one point) also holds the forecast's.
    import dataclasses

    from kplan.app import planning
    from kplan.planner.search import SearchOptions

    prof = planning.load_example("cifar10-resnet18")
    opts = SearchOptions(
        markets=("on-demand",), instance_types=("g4dn.xlarge",), global_batch=512, top=1
    )
    full = planning.estimate(prof, opts).plan
    one = planning.estimate(dataclasses.replace(prof, gns=prof.gns[:1]), opts).plan
    a, b = full.chosen, one.chosen
    assert a.forecast_log_sigma == 0.0 and b.forecast_log_sigma > 0.0
    assert b.step_time_p90_s / b.step_time_s == pytest.approx(a.step_time_p90_s / a.step_time_s)
    step_sigma = math.log(b.step_time_p90_s / b.step_time_s) / 1.2815515655446004
    expected = math.exp(1.2815515655446004 * math.hypot(step_sigma, b.forecast_log_sigma))
    assert b.hours_p90 / b.hours == pytest.approx(expected, rel=0.02)
    assert "GNS forecast" in one.uncertainty and "GNS forecast" not in full.uncertainty
    assert any("measured once" in n for n in one.notes)


def test_using_prior_swaps_the_default_prior_and_the_planners_cached_forecasts() -> None:
    from kplan.planner.efficiency import sample_factor

    one = [GnsPoint(0.01, 100.0)]
    flat = GnsPrior(slope_mean=0.0, slope_sd=0.01, noise_sd=0.5, slope_drift_sd=0.0)
    shipped = float(sample_factor(one, 32, [1024])[0])
    with gnsforecast.using_prior(flat):
        assert gnsforecast.prior_in_use() is flat
        assert forecast(one).slope == pytest.approx(0.0, abs=1e-6)
        held = float(sample_factor(one, 32, [1024])[0])  # not the cached shipped-prior value
    assert gnsforecast.prior_in_use() is gnsforecast.PRIOR
    assert held > 1.5 * shipped  # no growth: a large batch needs more samples
    assert float(sample_factor(one, 32, [1024])[0]) == pytest.approx(shipped)
