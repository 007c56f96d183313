"""Spot plans priced by the trace-fitted model: closed form, Monte-Carlo rows, recovery rules."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kplan.app import planning
from kplan.planner import costs, spotplan, spotsim
from kplan.planner.search import SearchOptions
from kplan.planner.spot import Outage, SpotModel, SpotRisk, Weibull


def _model(
    shape: float = 0.7, scale_h: float = 1.2, co_loss: float = 0.3, family: str = "*"
) -> SpotModel:
    outage = Outage(prob=0.3, durations_h=(0.1, 0.3, 1.0, 2.0), region_prob=0.5)
    return SpotModel(
        tuple(
            SpotRisk(c, f, "*", Weibull(shape, scale_h), co_loss, outage, f"test {c}")
            for c in ("aws", "gcp")
            for f in dict.fromkeys(("*", family))
        )
    )


def test_closed_form_counts_shared_losses_once_and_prices_the_waits() -> None:
    base = dict(
        train_seconds=36_000.0,
        instances=4,
        usd_per_hour=1.0,
        preempt_per_hour=0.5,
        log_sigma=0.0,
        checkpoint_s=10.0,
    )
    apart = costs.time_and_cost(**base)  # type: ignore[arg-type]
    together = costs.time_and_cost(co_loss=1.0, **base)  # type: ignore[arg-type]
    # all four go together: one event per node lifetime, not four (events per hour of wall)
    boot_h = costs.Overheads().provisioning_s / 3600.0

    def per_hour(tc: costs.TimeCost) -> float:
        return float(tc.preemptions) / (float(tc.hours) - boot_h)

    assert per_hour(together) == pytest.approx(per_hour(apart) / 4, rel=1e-6)
    assert float(together.hours) < float(apart.hours)
    waits = costs.time_and_cost(outage_wait_s=600.0, **base)  # type: ignore[arg-type]
    assert float(waits.hours) > float(apart.hours)
    # the lost node is not billed while it waits: the cost grows less than 4 nodes x the wait
    extra_h = float(waits.hours) - float(apart.hours)
    assert float(waits.cost_usd) - float(apart.cost_usd) < 4 * extra_h * 1.0


def test_a_more_specific_catalog_rate_sets_the_mean_life_and_keeps_the_shape() -> None:
    risk = spotplan.risk_for(_model(), "aws", "p3.2xlarge", "us-east-1", 0.9, "p3")
    assert risk.lifetime.shape == 0.7
    assert risk.rate_per_hour == pytest.approx(0.9)
    assert "catalog" in risk.source
    # the catalog's cloud default does not override the model's own row
    same = spotplan.risk_for(_model(), "aws", "p3.2xlarge", "us-east-1", 0.9, "*")
    assert same == _model().lookup("aws", "p3.2xlarge", "us-east-1")


def test_spot_rows_are_priced_by_the_monte_carlo_with_limits_above_their_losses() -> None:
    prof = planning.load_example("imagenet-resnet50")
    opts = SearchOptions(spot_model=_model(), markets=("spot",), objective="knee", spot_runs=400)
    plan = planning.estimate(prof, opts).plan
    rows = (plan.chosen, *plan.plans, *plan.frontier)
    for r in rows:
        rec = r.spot.recovery
        assert rec is not None and r.spot.basis.startswith("Monte-Carlo"), r.spot.basis
        # acceptance: no plan's expected preemptions exceed its launcher's replacement limit
        lost_per_event = 1 + 0.3 * (r.nodes - 1)
        assert r.expected_preemptions * lost_per_event < rec.max_replacements
        assert r.hours_p90 >= r.hours and r.cost_p90_usd >= r.cost_usd
        assert rec.capacity_wait_s >= 2 * 2.0 * 3600  # twice the model's longest outage
    c = plan.chosen
    # the chosen row's numbers are the simulator's for the same inputs (same seed)
    risk = spotplan.risk_for(_model(), c.cloud, c.instance_type, c.region, rate=0.0)
    again = spotsim.simulate(
        work_s=c.steps * c.step_time_s,
        nodes=c.nodes,
        risks=[risk],
        policies=[replace(c.spot.recovery, max_replacements=10**9)],
        usd_per_hour=c.usd_per_hour / c.nodes,
        usd_per_hour_on_demand=c.usd_per_hour / c.nodes,
        log_sigma=math.log(c.step_time_p90_s / c.step_time_s) / costs.Z90,
        runs=400,
        seed=0,
    )
    # the search prices rows in batches (other random draws): the row shows the median, equal
    # within the Monte-Carlo's own standard error (a median's: 1.25 sd / sqrt(n)), both ways
    hours = again.samples.hours[0]
    se = 1.2533 * float(np.std(hours)) / math.sqrt(hours.size)
    assert abs(float(again.hours_median[0]) - c.hours) < 4 * math.sqrt(2) * se + 1e-9
    assert "Monte-Carlo" in plan.uncertainty


def test_a_spot_plan_worse_than_on_demand_says_so() -> None:
    """Every spot row carries the same cluster's on-demand time and cost; where on-demand is
    not dearer, the plan says so (and not otherwise)."""
    from kplan.planner.choose import spot_notes as _spot_notes

    prof = planning.load_example("cifar10-resnet18")
    opts = SearchOptions(
        spot_model=_model(scale_h=0.3, co_loss=0.0, family="g4dn"),
        markets=("spot",),
        instance_types=("g4dn.xlarge",),
        spot_runs=200,
    )
    c = planning.estimate(prof, opts).plan.chosen
    od_cost, od_hours = c.spot.on_demand_cost_usd, c.spot.on_demand_hours
    assert od_cost is not None and od_hours is not None
    assert od_hours < c.hours  # no preemptions, no waits
    assert not any("worse than on-demand" in n for n in _spot_notes(c))
    dear = replace(c, spot=replace(c.spot, on_demand_cost_usd=0.9 * c.cost_usd))
    assert any("worse than on-demand" in n for n in _spot_notes(dear))


def test_a_short_capacity_wait_fails_runs_and_the_plan_says_so() -> None:
    prof = planning.load_example("cifar10-resnet18")
    model = SpotModel(
        tuple(
            SpotRisk(
                c,
                "*",
                "*",
                Weibull(0.7, 0.5),
                0.0,
                Outage(prob=1.0, durations_h=(5.0,), region_prob=1.0),
                "test",
            )
            for c in ("aws", "gcp")
        )
    )
    opts = SearchOptions(
        spot_model=model,
        markets=("spot",),
        instance_types=("g4dn.xlarge",),
        capacity_wait_s=600.0,
        spot_runs=200,
    )
    plan = planning.estimate(prof, opts).plan
    assert plan.chosen.spot.fail_prob > 0.5
    assert any("fail" in n for n in plan.notes)
    fallback = planning.estimate(
        prof, SearchOptions(**{**opts.__dict__, "allow_on_demand": True})
    ).plan
    assert fallback.chosen.spot.fail_prob < 0.01 and fallback.chosen.spot.allow_on_demand


def test_the_launch_spec_carries_the_plans_recovery_rules(tmp_path: Path) -> None:
    from kplan.app.launching import LaunchRequest, PlanPins, build_spec

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    req = LaunchRequest(
        script=script,
        budget_usd=5000.0,
        cloud="aws",
        spot=True,
        example_profile="imagenet-resnet50",
        epochs=10,  # hours, not days: a run that ends in the busier markets (p90 bounded)
        pins=PlanPins(instance_types=("p3.2xlarge",), plan_nodes="2"),
        storage_uri="s3://bucket/kplan",
    )
    spec = build_spec(req)
    assert spec.plan is not None
    row, rec = spec.plan.chosen, spec.plan.chosen.spot.recovery
    assert row.market == "spot" and rec is not None
    assert spec.recovery.max_replacements == rec.max_replacements >= 20
    assert spec.recovery.capacity_wait_s == rec.capacity_wait_s >= 900
    policy = spec.recovery_policy()
    assert policy.max_replacements == spec.recovery.max_replacements
    override = build_spec(
        LaunchRequest(**{**req.__dict__, "max_replacements": 7, "capacity_wait_s": 60.0})
    )
    assert override.recovery.max_replacements == 7 and override.recovery.capacity_wait_s == 60.0


def test_pruning_keeps_every_rows_own_frontier() -> None:
    """The rows ranked after each Monte-Carlo round are each type's frontier: a plan found on
    the full table is still found (on-demand, where no Monte-Carlo changes anything)."""
    from kplan.planner import search as s

    prof = planning.load_example("imagenet-resnet50")
    est = planning.estimate(prof, SearchOptions(markets=("on-demand",), objective="knee"))
    assert est.plan.considered > 10 * len(est.plan.frontier)
    hours = np.array([r.hours for r in est.plan.frontier])
    assert np.all(np.diff(hours) >= 0)
    assert s.pareto_front(hours, np.array([r.cost_usd for r in est.plan.frontier])).size == len(
        hours
    )


def test_estimate_prints_the_recovery_rules_of_a_spot_plan() -> None:
    from typer.testing import CliRunner

    from kplan.cli.main import app

    args = ["estimate", "-e", "yolov3", "--spot", "-t", "p3.2xlarge", "--nodes", "2"]
    res = CliRunner().invoke(app, [*args, "--capacity-wait", "7200"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "spot: Monte-Carlo" in text and "waits up to 2.0 h" in text
    fallback = CliRunner().invoke(app, [*args, "--allow-on-demand", "--json"])
    assert fallback.exit_code == 0, fallback.output
    import json

    row = json.loads(fallback.output)["chosen"]
    assert row["spot"]["recovery"]["allow_on_demand"]
    on_demand = CliRunner().invoke(app, ["estimate", "-e", "yolov3", "--on-demand"])
    assert "spot: Monte-Carlo" not in " ".join(on_demand.output.split())
