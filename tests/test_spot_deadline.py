"""Deadline-safe spot (issue 27 item 1): the rule of kplan/planner/deadline.py, followed the same
way by the Monte-Carlo and the trace replay, meets the deadline whatever the market does; and
the pooled model of an unseen market (kplan/planner/spotpool.py) widens the band."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kplan.planner import deadline, spotsim
from kplan.planner.plan import Plan
from kplan.planner.spot import Outage, RecoveryPolicy, SpotRisk, Weibull
from kplan.planner.spotpool import between, components, pool_markets, predict
from kplan.planner.spottrace import synthetic_trace
from tests import spot_fixtures
from tests.spot_fixtures import BOTH, play, replays, trace

# restart 300 s, boot 240 s, a 10 s checkpoint every 1800 s: undisturbed, WORK takes 3860 s;
# the reserve is 300 + 1800 + 10 + 60 = 2170 s
POL = replace(spot_fixtures.POL, allow_on_demand=True)


def risk(shape: float, mean_h: float, co: float, out: Outage, name: str = "t") -> SpotRisk:
    scale = mean_h / math.gamma(1.0 + 1.0 / shape)
    return SpotRisk("aws", "p3", "*", Weibull(shape, scale), co, out, name)


def test_the_rule_spends_the_slack_down_to_one_preemption() -> None:
    rule = deadline.DeadlineRule(10_000.0, 300.0, 1800.0, 10.0)
    assert rule.reserve_s == pytest.approx(2170.0)
    # 3600 s of work from a checkpoint: 3620 s of wall time with its two writes
    assert deadline.remaining_wall_s(3600.0, 1800.0, 10.0) == pytest.approx(3620.0)
    up_ok = 10_000.0 - 3620.0 - 2170.0
    assert rule.spot_ok(up_ok, 3600.0)
    assert not rule.spot_ok(up_ok + 1.0, 3600.0)
    # no deadline: always spot; arrays broadcast
    ok = deadline.spot_ok([math.inf, 100.0], 0.0, 3600.0, 300.0, 1800.0, 10.0)
    assert ok.tolist() == [True, False]
    # in an outage: on demand at the latest a restart and a reserve before the spot limit
    by = deadline.on_demand_by_s(10_000.0, 3600.0, 300.0, 1800.0, 10.0)
    assert float(by) == pytest.approx(up_ok - 600.0)


def test_a_deadline_needs_the_on_demand_fallback() -> None:
    with pytest.raises(ValueError, match="allow_on_demand"):
        RecoveryPolicy(deadline_s=3600.0)
    assert RecoveryPolicy().deadline_rule() is None


def test_replay_moves_every_node_on_demand_when_the_slack_runs_out() -> None:
    """A loss at 2000 s: 1760 s of progress lost, the replacement up at 2300 s; 3600 s of work
    left (3620 s of wall time) from there. A deadline of 8200 s leaves 2280 s of slack: spot
    again; 8000 s leaves 2080 s, below the reserve: both nodes on demand to the end."""
    rows = [*BOTH, (2000.0, "remove", "a"), (2000.0, "add", "c"), (5000.0, "remove", "b")]
    rows += [(5000.0, "add", "d")]
    kept = play(rows, policy=replace(POL, deadline_s=8200.0))
    assert [e.kind for e in kept.events][:3] == ["start", "preempted", "replace"]
    moved = play(rows, policy=replace(POL, deadline_s=8000.0))
    kinds = [e.kind for e in moved.events]
    assert kinds == ["start", "preempted", "on_demand", "done"]
    assert moved.hours * 3600.0 == pytest.approx(2300.0 + 3620.0)
    assert moved.hours * 3600.0 <= 8000.0
    markets = sorted((x.market, x.launch_s, x.end_s) for x in moved.instances)
    # the survivor's spot instance ends at the loss; both run on demand from it
    assert markets == [
        ("on-demand", 2000.0, 5920.0),
        ("on-demand", 2000.0, 5920.0),
        ("spot", 0.0, 2000.0),
        ("spot", 0.0, 2000.0),
    ]


def test_replay_waits_in_an_outage_while_ahead_of_uniform_progress() -> None:
    """7200 s of work; no capacity for node a from 4000 s to 5000 s, when 3600 s are committed
    (two checkpoints, at 2050 and 3860 s). By a 20,000 s deadline the line to the work at the
    deadline less the 2170 s reserve is at 50% only at 8915 s: the job is ahead and waits (the
    lost node billed nothing); by 10,120 s it is behind (the line passes 50% at 3975 s, and
    the slack floor is at 3730 s) and goes on demand at once (a spot replacement would still
    have had the reserve), and at 5000 s its slack is too small to come back to spot."""
    rows = [*BOTH, (4000.0, "remove", "a"), (5000.0, "add", "c")]

    def run(deadline_s: float) -> spotsim.ReplayOutcome:
        return spotsim.replay(
            trace(rows),
            start_s=0.0,
            nodes=2,
            work_s=7200.0,
            policy=replace(POL, deadline_s=deadline_s),
            usd_per_hour=1.0,
            usd_per_hour_on_demand=4.0,
        )

    loose = run(20_000.0)
    assert "on_demand" not in [e.kind for e in loose.events]
    assert loose.wait_s == pytest.approx(1000.0)
    tight = run(10_120.0)
    od = [x for x in tight.instances if x.market == "on-demand"]
    assert [x.launch_s for x in od] == [4000.0]
    assert od[0].end_s == pytest.approx(tight.hours * 3600.0)  # no return to spot
    assert tight.hours * 3600.0 <= 10_120.0
    # the outage's limit: the earlier of the line and the slack floor (the floor here) ...
    by = deadline.on_demand_by_s(10_120.0, 3600.0, 300.0, 1800.0, 10.0, total_work_s=7200.0)
    assert float(by) == pytest.approx(10_120.0 - 3620.0 - 2170.0 - 600.0)
    # ... and by 20,000 s, the line (the floor: 13,610 s)
    by = deadline.on_demand_by_s(20_000.0, 3600.0, 300.0, 1800.0, 10.0, total_work_s=7200.0)
    assert float(by) == pytest.approx(0.5 * (20_000.0 - 2170.0))
    assert deadline.DeadlineRule(10_120.0, 300.0, 1800.0, 10.0).spot_ok(4300.0, 3600.0)


def test_a_deadline_too_short_for_spot_runs_on_demand_from_the_start() -> None:
    out = play(BOTH, policy=replace(POL, deadline_s=4000.0))
    assert {x.market for x in out.instances} == {"on-demand"}
    assert out.hours * 3600.0 == pytest.approx(3860.0)


def test_the_monte_carlo_meets_the_deadline_in_a_harsh_market() -> None:
    """A loss event every half hour, co-losses, long outages: every run ends by the deadline;
    without one, a tenth of the runs take a third longer."""
    r = risk(0.8, 1.5, 0.3, Outage(0.5, (0.5, 1.0, 3.0), 1.0))
    r = replace(r, rate_sigma=0.5, outage_sigma=0.5)
    dl = 6 * 3600.0
    res = spotsim.simulate(
        work_s=4 * 3600.0,
        nodes=4,
        risks=[r, r],
        policies=[
            replace(POL, deadline_s=dl, max_replacements=10**6),
            replace(POL, max_replacements=10**6),
        ],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=4.0,
        runs=4000,
        seed=5,
    )
    hours = res.samples.hours
    assert hours[0].max() * 3600.0 <= dl + 1e-6
    assert not res.samples.failed[0].any()
    assert res.hours_p90[1] * 3600.0 > dl
    # the price of the bound: more on demand, a cost between spot's and on demand's
    assert res.on_demand_hours_mean[0] > res.on_demand_hours_mean[1]
    assert res.cost_mean[0] < 4.0 * 4 * (4.0 + 0.1)


def test_replay_of_model_traces_reproduces_simulate_with_a_deadline() -> None:
    """One rule, two engines: replays of traces drawn from the model, with the deadline rule,
    give the Monte-Carlo's distribution of time and cost."""
    r = risk(0.7, 6.0, 0.3, Outage(0.4, (0.3, 0.6, 1.0, 2.0), 1.0))
    pol = RecoveryPolicy(
        checkpoint_s=10.0,
        max_replacements=40,
        allow_on_demand=True,
        zone_failover=False,
        deadline_s=14.5 * 3600.0,
    )
    sim = spotsim.simulate(
        work_s=12 * 3600.0,
        nodes=4,
        risks=[r],
        policies=[pol],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=4.0,
        runs=50000,
        seed=3,
    )
    assert 0.05 < sim.on_demand_hours_mean[0] / (4 * sim.hours_mean[0]) < 0.9  # the rule acts
    outs = [
        replays(synthetic_trace(r, pool=4, hours=120.0, seed=s), [0.0], pol)[0] for s in range(2500)
    ]
    assert max(o.hours for o in outs) <= 14.5 + 1e-9
    hours = np.array([o.hours for o in outs])
    cost = np.array([o.cost_usd for o in outs])
    od = np.array([o.on_demand_node_s for o in outs]) / 3600.0
    # the cost is bimodal (runs that end on demand cost three times more): the means agree
    # within four standard errors of the replays, the hours' p90 within 1%
    for got, want in (
        (hours, sim.hours_mean[0]),
        (cost, sim.cost_mean[0]),
        (od, sim.on_demand_hours_mean[0]),
    ):
        assert abs(got.mean() - want) < 4 * got.std() / math.sqrt(len(got))
    assert np.quantile(hours, 0.9) == pytest.approx(sim.hours_p90[0], rel=0.01)


def test_pooled_markets_widen_the_band_of_an_unseen_market() -> None:
    calm = risk(1.0, 5.0, 0.1, Outage(0.1, (0.5,), 1.0), "calm: x")
    busy = risk(1.0, 1.0, 0.3, Outage(0.5, (1.0, 2.0), 1.0), "busy: y")
    one = pool_markets([calm], cloud="aws", family="p3")
    assert one.rate_per_hour == pytest.approx(calm.rate_per_hour)
    assert one.rate_sigma == 0.0
    both = pool_markets([calm, busy], cloud="aws", family="p3")
    sd_rate, sd_out = between([calm, busy])
    assert sd_rate == pytest.approx(math.log(5.0) / math.sqrt(2.0))
    # one cloud: the spread between its markets plus the uncertainty of their mean
    s2 = sd_rate**2 * 1.5
    assert both.rate_sigma == pytest.approx(math.sqrt(s2))
    assert both.outage_sigma == pytest.approx(sd_out * math.sqrt(1.5))
    # each run draws its market: the mean rate is the log-normal's, above the geometric mean
    mid = math.sqrt(calm.rate_per_hour * busy.rate_per_hour)
    assert both.rate_per_hour == pytest.approx(mid * math.exp(s2 / 2.0))
    assert both.outage.durations_h == (0.5, 1.0, 2.0)
    # the noise of each market's mean (its regimes over few blocks) is not a market's spread
    noisy = [replace(r, rate_sigma=0.8) for r in (calm, busy)]
    few = pool_markets(noisy, cloud="aws", family="p3", blocks=[2, 2])
    assert few.rate_sigma < pool_markets(noisy, cloud="aws", family="p3").rate_sigma
    with pytest.raises(ValueError):
        pool_markets([], cloud="aws", family="p3")
    with pytest.raises(ValueError):
        pool_markets([calm], cloud="aws", family="p3", blocks=[1, 2])
    # the spread between markets lasts a whole run; each market's lasting part is pooled
    lasting = [replace(r, rate_sigma=0.8, rate_sigma_long=0.3) for r in (calm, busy)]
    pooled = pool_markets(lasting, cloud="aws", family="p3")
    assert pooled.rate_sigma_long == pytest.approx(math.sqrt(0.3**2 + s2))
    assert pooled.rate_sigma == pytest.approx(math.sqrt(0.8**2 + s2))
    # a model file without the field (before it): all of each market's spread lasts
    assert both.rate_sigma_long == pytest.approx(both.rate_sigma)
    old = {k: v for k, v in lasting[0].to_dict().items() if k != "rate_sigma_long"}
    assert SpotRisk.from_dict(old).rate_sigma_long is None
    assert SpotRisk.from_dict(lasting[0].to_dict()) == lasting[0]
    # a market's spread between periods is in the spread between markets: not added again
    moving = [replace(r, period_sigma=0.5) for r in lasting]
    assert pool_markets(moving, cloud="aws", family="p3") == pooled
    assert SpotRisk.from_dict(moving[0].to_dict()) == moving[0]
    assert SpotRisk.from_dict(lasting[0].to_dict()).period_sigma == 0.0
    lasts = 0.5**2 + 0.3**2  # the period's and the regimes' lasting part
    assert float(moving[0].rate_sigma_for(1000.0)) == pytest.approx(
        math.sqrt(lasts + (0.8**2 - 0.3**2) * 2.0 / 1000.0)
    )


def test_pooled_markets_tell_the_clouds_apart() -> None:
    """Two calm GCP markets and two busy AWS ones: an unseen AWS market is priced near the
    AWS pair (not the four's mean), with the spread within a cloud; an unseen cloud gets the
    spread between clouds too."""
    aws = [risk(1.0, h, 0.1, Outage(0.3, (0.5,), 1.0), f"aws{h}: x") for h in (1.0, 1.2)]
    gcp = [
        replace(risk(1.0, h, 0.1, Outage(0.3, (0.5,), 1.0), f"gcp{h}: x"), cloud="gcp")
        for h in (8.0, 10.0)
    ]
    rates = [r.rate_per_hour for r in aws + gcp]
    row = pool_markets(aws + gcp, cloud="aws", family="p3")
    assert math.sqrt(rates[0] * rates[1]) * 0.9 < row.rate_per_hour < rates[0] * 1.1
    tau_c2, tau_m2 = components([math.log(r) for r in rates], [0.0] * 4, ["aws"] * 2 + ["gcp"] * 2)
    assert tau_m2 < 0.05 < tau_c2
    other = pool_markets(aws + gcp, cloud="azure", family="nd")
    assert other.rate_sigma > 3 * row.rate_sigma
    m, s2 = predict([math.log(r) for r in rates], [0.0] * 4, ["aws"] * 2 + ["gcp"] * 2, "gcp")
    assert math.exp(m) == pytest.approx(math.sqrt(rates[2] * rates[3]), rel=0.05)
    assert s2 < tau_m2 + tau_c2


def test_a_deadline_plan_is_priced_with_the_rule_and_says_so() -> None:
    """With --deadline the spot rows carry the rule (in the plan file too) and their p90 time
    is within the deadline by construction; without one they carry none, as before."""
    from kplan.app import planning
    from kplan.planner.search import SearchOptions
    from kplan.planner.spot import SpotModel

    row_aws = risk(0.8, 0.7, 0.3, Outage(0.5, (0.5, 2.0), 1.0), "harsh: test")
    harsh = SpotModel((replace(row_aws, family="*"), replace(row_aws, cloud="gcp", family="*")))
    prof = planning.load_example("cifar10-resnet18")
    opts = SearchOptions(
        spot_model=harsh,
        markets=("spot",),
        instance_types=("g4dn.xlarge",),
        min_nodes=2,
        max_nodes=2,
        mixed=False,
        spot_runs=400,
        deadline_hours=2.5,
    )
    plan = planning.estimate(prof, opts).plan
    row = plan.chosen
    rec = row.spot.recovery
    assert rec is not None and rec.deadline_s == 2.5 * 3600.0 and rec.allow_on_demand
    assert row.hours_p90 <= 2.5
    assert "deadline-safe" in row.spot.model
    back = Plan.from_dict(plan.to_dict()).chosen.spot.recovery
    assert back is not None and back.deadline_s == 2.5 * 3600.0
    free = planning.estimate(prof, replace(opts, deadline_hours=None)).plan
    assert free.chosen.spot.recovery is not None
    assert free.chosen.spot.recovery.deadline_s is None
    assert "deadline_s" not in free.chosen.to_dict()["spot"]["recovery"]
