from __future__ import annotations

import numpy as np
import pytest

from kplan.planner import costs, efficiency
from kplan.planner.profile import GnsPoint


def test_sample_factor_constant_gns_matches_closed_form() -> None:
    gns = (GnsPoint(0.0, 1000.0),)
    f = efficiency.sample_factor(gns, 100, [100, 1100, 2100], forecast=False)
    np.testing.assert_allclose(f, [1.0, 2100 / 1100, 3100 / 1100])


def test_growing_gns_makes_large_batches_cheaper_late() -> None:
    early = (GnsPoint(0.0, 100.0),)
    growing = (GnsPoint(0.0, 100.0), GnsPoint(1.0, 10000.0))
    held = efficiency.sample_factor(early, 100, 3200, forecast=False)
    assert efficiency.sample_factor(growing, 100, 3200) < held
    # The measured trajectory reaches the end: forecasting changes nothing.
    assert efficiency.sample_factor(growing, 100, 3200) == pytest.approx(
        efficiency.sample_factor(growing, 100, 3200, forecast=False), rel=0.01
    )


def test_one_point_is_forecast_to_grow_with_a_wide_band() -> None:
    one = (GnsPoint(0.0, 100.0),)
    mid, p90 = efficiency.sample_factor_band(one, 100, [100, 3200])
    assert mid[0] == pytest.approx(1.0) and p90[0] == pytest.approx(1.0)
    assert mid[1] < efficiency.sample_factor(one, 100, 3200, forecast=False)
    assert p90[1] > 1.3 * mid[1]  # one point: the growth is the prior's, uncertain
    sigma = efficiency.log_sigma(one, 100, [100, 3200])
    assert sigma[0] == 0.0 and sigma[1] > 0.2
    whole = (GnsPoint(0.0, 100.0), GnsPoint(1.0, 10000.0))
    assert efficiency.log_sigma(whole, 100, [3200])[0] == pytest.approx(0.0, abs=1e-9)


def test_no_gns_only_base_batch() -> None:
    f = efficiency.sample_factor((), 128, [128, 256])
    assert f[0] == 1.0 and np.isnan(f[1])


def test_on_demand_time_and_cost() -> None:
    o = costs.Overheads(provisioning_s=0.0, checkpoint_fixed_s=0.0)
    tc = costs.time_and_cost(
        train_seconds=3600.0,
        instances=2,
        usd_per_hour=3.0,
        preempt_per_hour=0.0,
        log_sigma=0.0,
        checkpoint_s=1.0,
        overheads=o,
    )
    # one checkpoint per 30 min adds 2 s
    assert float(tc.hours) == pytest.approx((3600 + 2) / 3600)
    assert float(tc.cost_usd) == pytest.approx(2 * 3.0 * (3600 + 2) / 3600)
    assert float(tc.preemptions) == 0.0
    assert float(tc.cost_p90_usd) == pytest.approx(float(tc.cost_usd))


def test_spot_preemptions_cost_time_and_p90_exceeds_mean() -> None:
    base = dict(
        train_seconds=36000.0, instances=4, usd_per_hour=1.0, log_sigma=0.1, checkpoint_s=10.0
    )
    od = costs.time_and_cost(preempt_per_hour=0.0, **base)  # type: ignore[arg-type]
    spot = costs.time_and_cost(preempt_per_hour=0.5, **base)  # type: ignore[arg-type]
    assert float(spot.hours) > float(od.hours)
    assert float(spot.preemptions) == pytest.approx(
        4 * 0.5 * float(spot.hours) - 4 * 0.5 * 240 / 3600, rel=0.01
    )
    assert float(spot.hours_p90) > float(spot.hours)
    assert float(spot.cost_p90_usd) > float(spot.cost_usd)


def test_hopeless_spot_is_infeasible() -> None:
    tc = costs.time_and_cost(
        train_seconds=1e6,
        instances=64,
        usd_per_hour=1.0,
        preempt_per_hour=2.0,
        log_sigma=0.0,
        checkpoint_s=600.0,
    )
    assert np.isnan(tc.cost_usd)


def test_billing_minimum_applies() -> None:
    o = costs.Overheads(provisioning_s=0.0)
    tc = costs.time_and_cost(
        train_seconds=5.0,
        instances=1,
        usd_per_hour=3600.0,
        preempt_per_hour=0.0,
        log_sigma=0.0,
        checkpoint_s=0.0,
        billing_min_s=60.0,
        overheads=o,
    )
    assert float(tc.cost_usd) == pytest.approx(60.0)


def test_forecast_note_says_when_the_samples_rest_on_a_forecast() -> None:
    note = efficiency.forecast_note((GnsPoint(0.0, 72.0),))
    assert note is not None and "measured once" in note and "80% band" in note
    whole = (GnsPoint(0.0, 100.0), GnsPoint(1.0, 10000.0))
    assert efficiency.forecast_note(whole) is None
    assert efficiency.forecast_note(()) is None
