"""A spot row applied to markets no trace watched (``SpotRisk.market_sigma``, issue 27 item 2):
the spread between markets as the shipped rows carry it, the Monte-Carlo's reading of it, and
what a plan says when a busy market would never let its runs end."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kplan.catalogs.spot_model_file import load_spot_model
from kplan.cli.main import app
from kplan.planner import fmt, spotsim
from kplan.planner.plan import Plan
from kplan.planner.spot import Outage, RecoveryPolicy, SpotRisk, Weibull
from kplan.planner.spotpool import market_spread

BUSY = Outage(0.4, (0.3, 0.6, 1.2), 1.0)


def _risk(**kw: float) -> SpotRisk:
    return SpotRisk("aws", "p3", "*", Weibull(1.1, 3.0), 0.1, BUSY, "test", **kw)


def test_the_market_spread_raises_the_mean_rate_and_lasts_a_whole_run() -> None:
    row = _risk(rate_sigma=0.3, rate_sigma_long=0.1, period_sigma=0.4, market_sigma=0.6)
    assert row.rate_per_hour == pytest.approx(row.lifetime.rate_per_hour * math.exp(0.18))
    for hours in (1.0, 10.0, 1000.0):
        flat = math.sqrt(0.4**2 + 0.1**2 + (0.3**2 - 0.1**2) * min(1.0, 2.0 / hours))
        assert float(row.rate_sigma_for(hours)) == pytest.approx(math.hypot(flat, 0.6))
    assert _risk(outage_sigma=0.3, market_outage_sigma=0.4).outage_sigma_total == pytest.approx(0.5)
    back = SpotRisk.from_dict(json.loads(json.dumps(row.to_dict())))
    assert back == row
    old = {k: v for k, v in row.to_dict().items() if not k.startswith("market")}
    assert SpotRisk.from_dict(old).market_sigma == 0.0  # a file from before reads its own market
    with pytest.raises(ValueError, match="market_sigma"):
        _risk(market_sigma=-0.1)


def test_the_monte_carlo_draws_a_market_as_a_shifted_life_with_a_lasting_spread() -> None:
    """market_sigma s is a lasting spread of s about the fitted market as the median: the same
    runs, number for number, as a row whose life is shortened by exp(-s^2/2) and whose period
    spread is s (the same distributions: each row draws its own streams), and the outage's market
    spread adds to its regimes' in quadrature."""
    s, so = 0.7, 0.5
    marked = _risk(rate_sigma=0.2, outage_sigma=0.3, market_sigma=s, market_outage_sigma=so)
    life = Weibull(1.1, 3.0 * math.exp(-(s**2) / 2.0))
    same = replace(
        marked, lifetime=life, period_sigma=s, market_sigma=0.0, market_outage_sigma=0.0,
        outage_sigma=math.hypot(0.3, so),
    )  # fmt: skip
    kw = dict(
        work_s=[3 * 3600.0, 12 * 3600.0],
        nodes=[1, 3],
        policies=[RecoveryPolicy(max_replacements=200, capacity_wait_s=7200.0)],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=3.0,
        runs=6000,
        seed=5,
    )
    a = spotsim.simulate(risks=[marked], **kw)  # type: ignore[arg-type]
    b = spotsim.simulate(risks=[same], **kw)  # type: ignore[arg-type]
    for x, y in ((a.samples.hours, b.samples.hours), (a.samples.cost_usd, b.samples.cost_usd)):
        se = np.hypot(x.std(axis=1), y.std(axis=1)) / math.sqrt(x.shape[1])
        assert np.all(np.abs(x.mean(axis=1) - y.mean(axis=1)) < 4 * se)
        np.testing.assert_allclose(np.quantile(x, 0.9, 1), np.quantile(y, 0.9, 1), rtol=0.1)
    calm = spotsim.simulate(risks=[_risk(rate_sigma=0.2, outage_sigma=0.3)], **kw)  # type: ignore[arg-type]
    assert np.all(a.losses_mean > calm.losses_mean)  # the markets' mean rate is higher
    assert np.all(a.hours_p90 / a.hours_median > calm.hours_p90 / calm.hours_median)


def test_the_spread_between_markets_is_the_within_cloud_variance() -> None:
    """Markets known without noise: tau_m^2 is the pooled variance within clouds; an untraced
    family of a cloud is centred on the cloud's mean shrunk toward the grand mean."""

    def row(cloud: str, rate: float) -> SpotRisk:
        k = 1.0
        return SpotRisk(cloud, "x", "*", Weibull(k, 1.0 / rate), 0.0, BUSY, "t")

    rates = {"aws": (0.5, 2.0), "gcp": (0.1, 0.2)}
    rows = [row(c, r) for c, rs in rates.items() for r in rs]
    sp = market_spread(rows, "aws", [1, 1, 1, 1])
    within = [(math.log(a) - math.log(b)) ** 2 / 2 for a, b in rates.values()]  # var, ddof 1
    assert sp.sibling == pytest.approx(math.sqrt(np.mean(within)))
    assert sp.unseen >= sp.sibling  # and the cloud's mean is uncertain too
    assert math.log(0.1) < math.log(sp.median_rate) < math.log(2.0)
    with pytest.raises(ValueError, match="block counts"):
        market_spread(rows, "aws", [1, 1])


def test_the_shipped_rows_carry_the_markets_they_stand_for() -> None:
    model = load_spot_model()
    by = {(r.cloud, r.family, r.region): r for r in model.risks}
    p3, g4dn, aws = by["aws", "p3", "*"], by["aws", "g4dn", "*"], by["aws", "*", "*"]
    assert p3.market_sigma == g4dn.market_sigma > 0.3  # traced families, zones unwatched
    assert p3.market_outage_sigma > 0
    assert aws.market_sigma >= p3.market_sigma and by["gcp", "*", "*"].market_sigma > 0
    for r in model.risks:
        if r.region != "*":  # a row of its own zone's market
            assert r.market_sigma == 0 and r.market_outage_sigma == 0
    assert p3.rate_per_hour > p3.lifetime.rate_per_hour


runner = CliRunner()


def test_a_plan_whose_busier_markets_never_end_says_so_and_asks_for_a_budget(
    tmp_path: Path,
) -> None:
    """Sixteen p3 spot nodes for days: at the markets' p90 rate losses come faster than the job
    recovers, so its p90 has no bound, the share of runs that would not end is stated, and the
    launch line leaves the budget to the user (it used to crash on the infinite p90); the plan
    file writes the p90 as null and reads it back (it wrote Infinity, which it then refused)."""
    args = ["estimate", "-e", "imagenet-resnet50", "--cloud", "aws", "--spot"]
    args += ["--instance-type", "p3.2xlarge", "--nodes", "16"]
    out = tmp_path / "plan.json"
    res = runner.invoke(app, [*args, "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output

    def strict(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    doc = json.loads(res.output, parse_constant=strict)
    row = doc["chosen"]
    assert row["hours_p90"] is None and row["cost_p90_usd"] is None  # JSON has no infinity
    plan = Plan.from_dict(json.loads(out.read_text(), parse_constant=strict))
    assert plan.chosen.hours_p90 == plan.chosen.cost_p90_usd == math.inf
    assert Plan.from_dict(plan.to_dict()) == plan
    assert 0.1 <= row["spot"]["fail_prob"] < 0.5
    assert doc["next_command"].endswith("--budget BUDGET")
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    flat = " ".join(text.output.split())
    assert f"({fmt.UNBOUNDED})" in flat and "runs would not end" in flat
    assert "BUDGET: what you will spend at most" in flat
    assert fmt.duration(math.inf) == fmt.money(math.inf) == fmt.UNBOUNDED
    # kplan simulate sizes its replays by 3x the median where the p90 has no bound (it said
    # the plan "takes up to inf h" and refused every trace)
    from kplan.app.simulating import job_from_plan

    job = job_from_plan(plan)
    assert job.horizon_s == pytest.approx(3.0 * job.hours * 3600.0)


def test_the_replacement_limit_is_set_from_the_runs_that_ended() -> None:
    """Runs cut while still going (a busy market: they would never end) are left out of the p99
    of lost nodes the replacement limit is set from: their count grows with the cut itself."""
    from kplan.planner.spotplan import ended_lost_p99

    busy = _risk(market_sigma=1.5)
    res = spotsim.simulate(
        work_s=[20 * 3600.0, 5 * 3600.0],
        nodes=[8, 1],
        risks=[busy],
        policies=[RecoveryPolicy(max_replacements=10**9, capacity_wait_s=10**7)],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=3.0,
        runs=2000,
        max_events=60,
    )
    failed = res.samples.failed
    assert failed[0].mean() > 0.02  # the cut stops some runs of the 8-node row
    want = [np.quantile(x[~f], 0.99) for x, f in zip(res.samples.lost_nodes, failed, strict=True)]
    np.testing.assert_allclose(ended_lost_p99(res), want)
    assert ended_lost_p99(res)[0] < res.lost_nodes_p99[0]
