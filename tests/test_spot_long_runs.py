"""A spot row of many loss events per run is priced in closed form (spotplan.MC_MAX_LOSSES): the
Monte-Carlo's work grows with a run's events, the closed form's does not, and over that many
events the two agree."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from kplan.app import planning
from kplan.planner import costs, spotplan
from kplan.planner.costs import Overheads
from kplan.planner.search import SearchOptions
from kplan.planner.spot import Outage, RecoveryPolicy, SpotRisk, Weibull


def _risk() -> SpotRisk:
    return SpotRisk(
        "aws", "*", "*", Weibull(1.0, 1.7), 0.2, Outage(0.3, (0.1, 0.3, 0.6), 0.5), "test row",
        rate_sigma=0.5, period_sigma=0.3,
    )  # fmt: skip


def _rows(work_h: float, nodes: int) -> dict[str, Any]:
    pol = RecoveryPolicy(
        restart_s=300.0,
        provisioning_s=240.0,
        checkpoint_interval_s=600.0,
        checkpoint_s=10.0,
        capacity_wait_s=3600.0,
        allow_on_demand=True,
    )
    return {
        "work_s": np.array([work_h * 3600.0]),
        "nodes": np.array([float(nodes)]),
        "risks": [_risk()],
        "policies": [pol],
        "usd_per_hour": np.array([1.0]),
        "usd_per_hour_on_demand": np.array([3.0]),
        "log_sigma": np.array([0.05]),
        "billing_min_s": np.array([60.0]),
        "billing_increment_s": np.array([1.0]),
    }


def test_the_closed_form_agrees_with_the_monte_carlo_over_many_events() -> None:
    args = _rows(work_h=60.0, nodes=2)  # about 80 loss events a run: past the bound
    (closed,) = spotplan.closed_form_rows(**args, checkpoint_s=10.0, overheads=Overheads())
    (sim,) = spotplan.simulate_rows(**args, runs=400, seed=1)
    assert closed.losses > spotplan.MC_MAX_LOSSES
    assert closed.losses == pytest.approx(sim.losses, rel=0.15)
    for a, b in [
        (closed.hours, sim.hours),
        (closed.cost_usd, sim.cost_usd),
        (closed.hours_p90, sim.hours_p90),
        (closed.cost_p90_usd, sim.cost_p90_usd),
    ]:
        assert a == pytest.approx(b, rel=0.12)
    assert closed.hours_p90 > closed.hours and closed.cost_p90_usd > closed.cost_usd
    assert closed.runs == 0 and closed.basis.startswith("closed form: ")
    # the replacement limit still sits above the runs' losses (the launcher's crash-loop stop)
    assert closed.policy.max_replacements > sim.lost_nodes_p99


def test_the_p90_carries_the_rate_spread_between_runs() -> None:
    args = _rows(work_h=60.0, nodes=2)
    wide = spotplan.closed_form_rows(**args, checkpoint_s=10.0, overheads=Overheads())
    flat_risk = [replace(_risk(), rate_sigma=0.0, period_sigma=0.0, source="flat")]
    flat = spotplan.closed_form_rows(
        **{**args, "risks": flat_risk},
        checkpoint_s=10.0,
        overheads=Overheads(),
    )
    assert wide[0].hours == pytest.approx(flat[0].hours)
    assert wide[0].hours_p90 > flat[0].hours_p90 * 1.05


def test_a_long_job_is_priced_in_closed_form_and_a_short_one_by_monte_carlo() -> None:
    profile = planning.load_example("cifar10-resnet18")
    long = planning.estimate(profile, SearchOptions(), dataset_size=1_000_000_000).plan
    spot = [r for r in long.plans if r.market == "spot"]
    assert spot and all(r.spot.basis.startswith("closed form: ") for r in spot)
    assert all(r.hours_p90 >= r.hours and r.cost_p90_usd >= r.cost_usd for r in spot)
    short = planning.estimate(profile, SearchOptions()).plan
    shown = [r for r in short.plans if r.market == "spot"]
    assert shown and all(r.spot.basis.startswith("Monte-Carlo, ") for r in shown)


def test_the_closed_form_counts_the_notices_checkpoint_as_the_monte_carlo_does() -> None:
    """A row across MC_MAX_LOSSES keeps its price: with the spot notice's checkpoint 60 s
    before each loss both engines save the same share of the time and cost."""
    args = _rows(work_h=60.0, nodes=2)
    # the planner's rows checkpoint at the closed form's own (Young's) interval
    tau = costs.time_and_cost(
        train_seconds=60 * 3600.0,
        instances=2,
        usd_per_hour=1.0,
        preempt_per_hour=_risk().rate_per_hour,
        log_sigma=0.0,
        checkpoint_s=10.0,
        co_loss=_risk().co_loss,
    ).checkpoint_interval_s
    pol = replace(args["policies"][0], checkpoint_interval_s=float(tau))
    args = {**args, "policies": [pol]}
    notice = {**args, "policies": [replace(pol, notice_stop_s=60.0)]}
    kw: dict[str, Any] = {"checkpoint_s": 10.0, "overheads": Overheads()}
    (closed,), (closed_n,) = (spotplan.closed_form_rows(**a, **kw) for a in (args, notice))
    (sim,), (sim_n,) = (spotplan.simulate_rows(**a, runs=400, seed=1) for a in (args, notice))
    assert closed_n.hours < closed.hours and sim_n.hours < sim.hours
    for a, b in [(closed_n.hours, sim_n.hours), (closed_n.cost_usd, sim_n.cost_usd)]:
        assert a == pytest.approx(b, rel=0.12)
    # the same run-by-run streams: the Monte-Carlo's saving is exact to its own noise
    assert closed_n.hours / closed.hours == pytest.approx(sim_n.hours / sim.hours, abs=0.02)
    assert closed_n.cost_usd / closed.cost_usd == pytest.approx(
        sim_n.cost_usd / sim.cost_usd, abs=0.02
    )


def test_the_expected_loss_of_progress_with_and_without_the_notice() -> None:
    from kplan.planner.costs import expected_lost_s

    assert expected_lost_s(600.0) == pytest.approx(300.0)
    assert expected_lost_s(600.0, np.inf) == pytest.approx(300.0)
    # min(u, 60) for u uniform on [0, 600]: 60 - 3600 / 1200
    assert expected_lost_s(600.0, 60.0) == pytest.approx(57.0)
    assert expected_lost_s(600.0, 900.0) == pytest.approx(300.0)  # a stop before the checkpoint
    u = np.random.default_rng(0).uniform(0.0, 600.0, 200_000)
    assert float(expected_lost_s(600.0, 150.0)) == pytest.approx(
        np.minimum(u, 150.0).mean(), rel=0.01
    )


def test_the_closed_form_waits_for_capacity_as_the_monte_carlo_does() -> None:
    """Without the fallback a loss in an outage waits for capacity. The cluster is not exposed
    to losses that cost time while it waits (it does not train): the closed form counted losses
    over the waits too, and its time grew faster than the Monte-Carlo's as the waits did."""
    args = _rows(work_h=40.0, nodes=4)
    args["policies"] = [replace(args["policies"][0], allow_on_demand=False, capacity_wait_s=4e4)]
    busy = replace(_risk(), outage=Outage(0.6, (0.3, 0.6, 1.2), 1.0), rate_sigma=0.0)
    args["risks"] = [replace(busy, period_sigma=0.0)]
    (closed,) = spotplan.closed_form_rows(**args, checkpoint_s=10.0, overheads=Overheads())
    (sim,) = spotplan.simulate_rows(**args, runs=400, seed=2)
    assert closed.losses > spotplan.MC_MAX_LOSSES
    assert closed.hours == pytest.approx(sim.hours, rel=0.08)  # 81.3 h against 83.4 (was 195)
    assert closed.cost_usd == pytest.approx(sim.cost_usd, rel=0.08)
    assert closed.hours_p90 == pytest.approx(sim.hours_p90, rel=0.12)
    # loss events during the waits (survivors) count at the whole cluster's rate: a few too
    # many, so the replacement limit errs above the runs' lost nodes
    assert sim.losses <= closed.losses <= 1.3 * sim.losses
    assert closed.policy.max_replacements > sim.lost_nodes_p99


def test_feasible_says_where_the_closed_form_is_finite() -> None:
    """``costs.feasible`` (the count of configurations the search drops unpriced) agrees with
    ``costs.time_and_cost`` on a grid of node counts, rates, co-losses and notice stops."""
    rng = np.random.default_rng(3)
    n = rng.integers(1, 65, 4000).astype(float)
    rate = rng.uniform(0.0, 6.0, 4000)
    co = rng.uniform(0.0, 1.0, 4000)
    stop = np.where(rng.random(4000) < 0.5, np.inf, rng.uniform(10.0, 120.0, 4000))
    kw: dict[str, Any] = dict(instances=n, preempt_per_hour=rate, co_loss=co, checkpoint_s=20.0)
    tc = costs.time_and_cost(
        **kw, train_seconds=3600.0, usd_per_hour=2.0, log_sigma=0.1, notice_stop_s=stop,
        outage_wait_s=600.0,
    )  # fmt: skip
    ok = costs.feasible(**kw, notice_stop_s=stop)
    assert 0.2 < ok.mean() < 0.9  # both sides of the line
    np.testing.assert_array_equal(ok, np.isfinite(tc.hours) & np.isfinite(tc.cost_usd))
