"""The spot Monte-Carlo and the trace replay: hand-computed replays, closed forms, and the
replay of traces drawn from the model reproducing the model's own distributions."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kplan.planner import costs, spotsim
from kplan.planner.spot import Outage, RecoveryPolicy, SpotRisk, Weibull
from kplan.planner.spottrace import ADD, SpotTrace, synthetic_trace
from tests.spot_fixtures import BOTH, POL, WORK, play, replays, trace

NO_RISK = Outage(0.0, (), 0.0)


def billed(out: spotsim.ReplayOutcome) -> list[tuple[str, float, float, float]]:
    return sorted((x.market, x.launch_s, x.end_s, x.billed_s) for x in out.instances)


# --- replay, by hand ------------------------------------------------------------------------


def test_replay_no_loss() -> None:
    out = play(BOTH)
    assert out.hours == pytest.approx(3860 / 3600)
    assert out.cost_usd == pytest.approx(2 * 3860 / 3600)
    assert (out.losses, out.lost_nodes, out.failed, out.wait_s) == (0, 0, False, 0.0)
    assert billed(out) == [("spot", 0.0, 3860.0, 3860.0)] * 2


def test_replay_loss_loses_the_work_since_the_checkpoint() -> None:
    # b goes at 2500: 2260 s into training, one cycle (1800 s of progress) is saved and 450 s
    # are lost; capacity 30 s later (within the restart): launched at the loss, up at 2800,
    # then 1800 s of progress and one checkpoint
    out = play([*BOTH, (2500.0, "remove", "b"), (2530.0, "add", "c")])
    assert out.hours == pytest.approx(4610 / 3600)
    assert billed(out) == [
        ("spot", 0.0, 2500.0, 2500.0),
        ("spot", 0.0, 4610.0, 4610.0),
        ("spot", 2500.0, 4610.0, 2110.0),
    ]
    assert out.cost_usd == pytest.approx((4610 + 2500 + 2110) / 3600)
    assert (out.losses, out.lost_nodes, out.failed) == (1, 1, False)
    assert [e.kind for e in out.events] == ["start", "preempted", "replace", "done"]


def test_replay_co_loss_is_one_event() -> None:
    # c goes 40 s after b (within LOSS_WINDOW_S): one event, two nodes; each replacement takes
    # the next add at or after its own loss and is up a restart after it
    rows = [
        *BOTH,
        (0.0, "add", "c"),
        (2500.0, "remove", "b"),
        (2500.0, "add", "d1"),
        (2540.0, "remove", "c"),
        (2560.0, "add", "d2"),
    ]
    out = play(rows, nodes=3)
    assert (out.losses, out.lost_nodes) == (1, 2)
    assert out.hours == pytest.approx((2840 + 1810) / 3600)
    assert sorted(x.billed_s for x in out.instances) == [2110, 2150, 2500, 2540, 4650]
    assert out.cost_usd == pytest.approx(13950 / 3600)


def test_replay_outage_waits_for_capacity() -> None:
    out = play([*BOTH, (2500.0, "remove", "b"), (3100.0, "add", "c")])
    assert out.wait_s == 600.0
    assert out.hours == pytest.approx((3400 + 1810) / 3600)
    assert out.cost_usd == pytest.approx((5210 + 2500 + 2110) / 3600)
    assert not out.failed


def test_replay_outage_beyond_capacity_wait_fails() -> None:
    # no add within capacity_wait_s (900 s): the job gives up at 2500 + 900, a billed until then
    out = play([*BOTH, (2500.0, "remove", "b"), (3500.0, "add", "c")])
    assert out.failed
    assert out.hours == pytest.approx(3400 / 3600)
    assert out.cost_usd == pytest.approx((3400 + 2500) / 3600)
    assert out.events[-1].kind == "failed"


def test_replay_on_demand_fallback_returns_to_spot() -> None:
    # on demand from 2500 (up 2800); capacity back at 4000: 1200 s of progress are saved at
    # the switch (3000 in all), spot node up at 4300, the last 600 s: done at 4900
    od = replace(POL, allow_on_demand=True)
    out = play([*BOTH, (2500.0, "remove", "b"), (4000.0, "add", "c")], policy=od)
    assert out.hours == pytest.approx(4900 / 3600)
    assert out.on_demand_node_s == 1500.0
    assert ("on-demand", 2500.0, 4000.0, 1500.0) in billed(out)
    assert out.cost_usd == pytest.approx((4900 + 2500 + 900) / 3600 + 1500 * 4.0 / 3600)
    assert [e.kind for e in out.events] == ["start", "preempted", "on_demand", "to_spot", "done"]


def test_replay_replacement_limit_fails_at_the_loss() -> None:
    none = replace(POL, max_replacements=0)
    out = play([*BOTH, (2500.0, "remove", "b"), (2500.0, "add", "c")], policy=none)
    assert out.failed and out.hours == pytest.approx(2500 / 3600)
    assert out.cost_usd == pytest.approx(5000 / 3600)


def test_replay_loss_while_booting_pays_the_billing_minimum() -> None:
    out = play([*BOTH, (30.0, "remove", "b"), (30.0, "add", "c")])
    assert out.hours == pytest.approx((330 + 3620) / 3600)  # no progress lost, later start
    assert sorted(x.billed_s for x in out.instances) == [60.0, 3920.0, 3950.0]


def test_replay_waits_for_the_first_nodes() -> None:
    # one node alive at the start, the second granted at 1000 s: a wait, then its boot
    wait = replace(POL, capacity_wait_s=1800.0)
    out = play([(0.0, "add", "a"), (1000.0, "add", "b")], policy=wait)
    assert out.wait_s == 1000.0
    assert out.hours == pytest.approx((1240 + 3620) / 3600)
    assert out.cost_usd == pytest.approx((4860 + 3860) / 3600)
    assert play([(0.0, "add", "a"), (1000.0, "add", "b")]).failed  # 900 s is not enough


def test_replay_past_the_trace_end_is_flagged() -> None:
    rows = [*BOTH, (2500.0, "remove", "b")]
    out = spotsim.replay(
        trace(rows, end_s=3000.0),
        start_s=0.0,
        nodes=2,
        work_s=WORK,
        policy=replace(POL, allow_on_demand=True),
        usd_per_hour=1.0,
        usd_per_hour_on_demand=4.0,
    )
    assert out.truncated and not out.failed


def test_replay_picks_the_youngest_nodes_by_default() -> None:
    rows = [(0.0, "add", "u"), (0.0, "add", "a"), (100.0, "add", "b"), (200.0, "add", "c")]
    tr = SpotTrace(
        name="hand",
        source="test",
        times_s=np.array([r[0] for r in rows]),
        kinds=np.full(4, ADD, dtype=np.int8),
        nodes=tuple(r[2] for r in rows),
        end_s=1e6,
        unknown_age=frozenset({"u"}),  # alive when the observation began: the oldest
    )

    def picked(pick: str) -> set[str]:
        out = spotsim.replay(
            tr,
            start_s=300.0,
            nodes=2,
            work_s=WORK,
            policy=POL,
            usd_per_hour=1.0,
            usd_per_hour_on_demand=4.0,
            pick=pick,
        )
        return {x.node for x in out.instances}

    assert picked("youngest") == {"b", "c"}
    assert picked("oldest") == {"u", "a"}
    assert len(picked("random")) == 2
    with pytest.raises(ValueError, match="pick 'newest'"):
        picked("newest")


# --- simulate: closed forms and seeding -----------------------------------------------------


def risk(shape: float, scale_h: float, co: float = 0.0, outage: Outage = NO_RISK) -> SpotRisk:
    return SpotRisk("aws", "p3", "*", Weibull(shape, scale_h), co, outage, "test")


def test_on_demand_matches_the_closed_form() -> None:
    kw = dict(train_seconds=36000.0, instances=4, usd_per_hour=3.0, preempt_per_hour=0.0)
    for sigma in (0.0, 0.2):
        sim = spotsim.simulate(
            work_s=36000.0,
            nodes=4,
            risks=[None],
            policies=[RecoveryPolicy()],
            usd_per_hour=3.0,
            usd_per_hour_on_demand=3.0,
            log_sigma=sigma,
            runs=20000,
        )
        tc = costs.time_and_cost(**kw, log_sigma=sigma, checkpoint_s=2.0)  # type: ignore[arg-type]
        # the p90's standard error: sigma sqrt(0.09 / runs) / phi(1.2816) (0.24% at 0.2); 3 of it
        tol = 1e-9 + 3.0 * sigma * math.sqrt(0.09 / 20000) / 0.1755
        assert sim.hours_p90[0] == pytest.approx(float(tc.hours_p90), rel=tol)
        assert sim.cost_p90[0] == pytest.approx(float(tc.cost_p90_usd), rel=tol)
        if sigma == 0.0:
            assert sim.hours_mean[0] == pytest.approx(float(tc.hours), rel=1e-12)
            assert sim.cost_mean[0] == pytest.approx(float(tc.cost_usd), rel=1e-12)
        else:  # the Monte-Carlo's mean is the log-normal's mean, above the median's time
            ratio = (sim.hours_mean[0] * 3600 - 240) / (float(tc.hours) * 3600 - 240)
            assert ratio == pytest.approx(math.exp(sigma**2 / 2), rel=5e-3)
    assert sim.losses_mean[0] == 0 and sim.fail_prob[0] == 0


def test_simulate_is_seeded_and_converges() -> None:
    kw = dict(
        work_s=[8 * 3600.0, 20 * 3600.0],
        nodes=[1, 4],
        risks=[risk(0.8, 3.0, 0.2, Outage(0.3, (0.2, 0.5), 0.5))],
        policies=[RecoveryPolicy(max_replacements=100, capacity_wait_s=3600.0)],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=3.0,
        log_sigma=0.1,
        runs=20000,
    )
    a, b, c = (spotsim.simulate(**kw, seed=s) for s in (1, 1, 2))  # type: ignore[arg-type]
    np.testing.assert_array_equal(a.samples.hours, b.samples.hours)
    np.testing.assert_array_equal(a.samples.cost_usd, b.samples.cost_usd)
    assert not np.array_equal(a.samples.hours, c.samples.hours)
    for x, y in ((a.samples.hours, c.samples.hours), (a.samples.cost_usd, c.samples.cost_usd)):
        se = np.hypot(x.std(axis=1), y.std(axis=1)) / math.sqrt(x.shape[1])
        assert np.all(np.abs(x.mean(axis=1) - y.mean(axis=1)) < 4 * se)
        np.testing.assert_allclose(np.quantile(x, 0.9, 1), np.quantile(y, 0.9, 1), rtol=0.02)
    assert a.hours_mean.shape == (2,) and a.samples.hours.shape == (2, 20000)


def test_every_slot_is_always_exposed() -> None:
    # exponential lives, no co-loss, no outage: every slot always holds a spot node (booting
    # ones included), so lost nodes = nodes * E[time] / mean life (Wald), whatever the restarts
    n, mean_h = 4, 5.0
    sim = spotsim.simulate(
        work_s=10 * 3600.0,
        nodes=n,
        risks=[risk(1.0, mean_h)],
        policies=[RecoveryPolicy(max_replacements=10**6)],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=3.0,
        runs=20000,
        seed=4,
    )
    exposure = n * sim.samples.hours[0] / mean_h
    se = (sim.samples.lost_nodes[0] - exposure).std() / math.sqrt(20000)
    assert abs(sim.lost_nodes_mean[0] - exposure.mean()) < 4 * se
    assert sim.losses_mean[0] == sim.lost_nodes_mean[0]  # co_loss 0: one node per event


def test_replacement_limit_and_capacity_failures() -> None:
    # one node, exponential life: a run fails iff its node is lost before the job ends

    def one(r: SpotRisk, pol: RecoveryPolicy) -> spotsim.SimResult:
        return spotsim.simulate(
            work_s=7200.0,
            nodes=1,
            risks=[r],
            policies=[pol],
            usd_per_hour=1.0,
            usd_per_hour_on_demand=3.0,
            runs=40000,
            seed=5,
        )

    fin = 240 + 7200 + 4 * 2.0  # boot, work, four checkpoints
    p_loss = 1 - math.exp(-fin / (6 * 3600))
    se = math.sqrt(p_loss * (1 - p_loss) / 40000)
    limit = one(risk(1.0, 6.0), RecoveryPolicy(max_replacements=0))
    assert abs(limit.fail_prob[0] - p_loss) < 4 * se
    # every loss finds the region out for 2 h: beyond a 1 h wait it fails; on demand it finishes
    out = risk(1.0, 6.0, 0.0, Outage(1.0, (2.0,), 1.0))
    pol = RecoveryPolicy(capacity_wait_s=3600.0)
    wait = one(out, pol)
    assert abs(wait.fail_prob[0] - p_loss) < 4 * se
    failed = wait.samples.failed[0]
    assert np.all(wait.samples.hours[0][failed] > 1.0)  # failed at the loss + 1 h
    od = RecoveryPolicy(capacity_wait_s=3600.0, allow_on_demand=True)
    fb = one(out, od)
    assert fb.fail_prob[0] == 0.0
    assert fb.on_demand_hours_mean[0] > 0 and fb.cost_mean[0] > limit.cost_mean[0]
    # zone failover: the outage is regional only with region_prob, else a replacement at once
    zonal = risk(1.0, 6.0, 0.0, Outage(1.0, (2.0,), 0.0))
    fo = one(zonal, pol)
    assert fo.fail_prob[0] == 0.0 and fo.wait_hours_mean[0] == 0.0


def test_simulate_a_harsh_market_for_many_configurations() -> None:
    """20 configurations x 2000 runs x 8 nodes of a harsh market (a loss event every few
    minutes of training): longer work takes longer. Its speed: bench/failfast.py."""
    r = risk(0.9, 1.7, 0.05, Outage(0.5, (0.1, 0.2, 0.3, 0.5), 1.0))
    res = spotsim.simulate(
        work_s=np.linspace(2, 20, 20) * 3600.0,
        nodes=8,
        risks=[r],
        policies=[RecoveryPolicy(max_replacements=10**6, capacity_wait_s=3600.0)],
        usd_per_hour=0.9,
        usd_per_hour_on_demand=3.06,
        runs=2000,
    )
    assert np.all(np.diff(res.hours_mean) > 0)


# --- the replay of traces drawn from the model reproduces the model -------------------------


def _compare(outs: list[spotsim.ReplayOutcome], sim: spotsim.SimResult) -> None:
    assert not any(o.truncated for o in outs)
    hours = np.array([o.hours for o in outs])
    cost = np.array([o.cost_usd for o in outs])
    for got, mean, p90 in (
        (hours, sim.hours_mean[0], sim.hours_p90[0]),
        (cost, sim.cost_mean[0], sim.cost_p90[0]),
    ):
        # the replayed mean's standard error is 0.1-0.7% here, the p90's 0.3-0.8% (bootstrap):
        # a 3% gap is 4 or more of them
        assert got.std() / math.sqrt(len(got)) < 0.0075 * mean
        assert got.mean() == pytest.approx(mean, rel=0.03)
        assert np.quantile(got, 0.9) == pytest.approx(p90, rel=0.03)
    fail = float(np.mean([o.failed for o in outs]))
    assert abs(fail - sim.fail_prob[0]) < 4 * math.sqrt(max(fail * (1 - fail), 1e-4) / len(outs))


def model(r: SpotRisk, pol: RecoveryPolicy) -> spotsim.SimResult:
    """The job of the replay tests: 4 nodes, 12 h of training, $1/h spot, $4/h on demand."""
    return spotsim.simulate(
        work_s=12 * 3600.0,
        nodes=4,
        risks=[r],
        policies=[pol],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=4.0,
        runs=50000,
        seed=3,
    )


@pytest.mark.parametrize("allow_on_demand", [True, False])
def test_replay_of_model_traces_reproduces_simulate(allow_on_demand: bool) -> None:
    """Fresh clusters (each replay starts at 0 of its own trace, as the model launches fresh
    nodes): a Weibull of shape 0.7, co-losses, outages; on demand, or waiting for capacity up
    to 1.5 h (a quarter of the runs fail there)."""
    durations = (0.3, 0.6, 1.0, 2.0) if allow_on_demand else (0.3, 0.5, 0.8, 1.0, 1.5, 2.0)
    r = risk(0.7, 6.0, 0.3, Outage(0.4 if allow_on_demand else 0.3, durations, 1.0))
    pol = RecoveryPolicy(
        checkpoint_s=10.0,
        max_replacements=40,
        capacity_wait_s=5400.0,
        allow_on_demand=allow_on_demand,
        zone_failover=False,  # one pool: no zone to fail over to
    )
    sim = model(r, pol)
    outs = [
        replays(synthetic_trace(r, pool=4, hours=120.0, seed=s), [0.0], pol)[0] for s in range(2500)
    ]
    _compare(outs, sim)
    if allow_on_demand:
        od = np.mean([o.on_demand_node_s for o in outs]) / 3600
        assert od == pytest.approx(sim.on_demand_hours_mean[0], rel=0.08)
    else:
        assert 0.15 < sim.fail_prob[0] < 0.35


def test_replay_from_random_starts_of_one_long_trace() -> None:
    """Exponential lives (memoryless: a start anywhere the pool is whole is a fresh start):
    random starts of one long trace, spaced by more than a job."""
    r = risk(1.0, 6.0, 0.3, Outage(0.4, (0.3, 0.6, 1.0, 2.0), 1.0))
    pol = RecoveryPolicy(
        checkpoint_s=10.0, max_replacements=10**6, capacity_wait_s=10**6, zone_failover=False
    )
    sim = model(r, pol)
    gap_s = 30 * 3600.0
    tr = synthetic_trace(r, pool=4, hours=gap_s / 3600 * 2502, seed=7)
    rng = np.random.default_rng(1)
    starts = []
    for i in range(2500):
        s = i * gap_s + rng.uniform(0, 3600)
        while tr.alive_at(s) < 4:
            s += 60.0
        starts.append(s)
    outs = replays(tr, starts, pol)
    _compare(outs, sim)
    assert np.mean([o.wait_s for o in outs]) / 3600 == pytest.approx(
        sim.wait_hours_mean[0], rel=0.08
    )


def _regime_sim(x: SpotRisk, hours: float = 20.0) -> spotsim.SimResult:
    """20,000 runs of a 2-node job of ``hours`` on ``x`` (the regime tests' configuration)."""
    return spotsim.simulate(
        work_s=hours * 3600.0,
        nodes=2,
        risks=[x],
        policies=[RecoveryPolicy(checkpoint_s=10.0, max_replacements=10**6)],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=3.0,
        runs=20000,
        seed=5,
    )


def test_regimes_widen_the_distribution_and_keep_the_mean_rate() -> None:
    """A run's period may be calmer or busier (spot.py, Regimes): with exponential lives the
    expected losses stay (the rate multiplier has mean 1) while the p90 time grows; with no
    spread the runs are the ones without the field."""
    r = risk(1.0, 4.0, 0.0, Outage(0.0, (), 1.0))
    base, wide = _regime_sim(r), _regime_sim(replace(r, rate_sigma=0.8))
    same = _regime_sim(replace(r, rate_sigma=0.0, outage_sigma=0.0))
    assert np.array_equal(base.samples.hours, same.samples.hours)
    assert wide.hours_p90[0] > base.hours_p90[0] * 1.03
    # losses per hour of wall time: the same mean rate
    assert float(np.mean(wide.samples.losses / wide.samples.hours)) == pytest.approx(
        float(np.mean(base.samples.losses / base.samples.hours)), rel=0.05
    )


def test_a_long_run_averages_the_passing_part_of_the_regimes() -> None:
    """A run of many blocks sees their mean rate: with a lasting part of 0 a 20-hour run's
    spread of losses is narrower than with all of it lasting (the field left out: an older
    model file), and its mean rate stays; a run of one block keeps its whole spread."""
    r = replace(risk(1.0, 4.0, 0.0, Outage(0.0, (), 1.0)), rate_sigma=0.8)
    assert r.rate_sigma_long is None
    assert float(replace(r, rate_sigma_long=0.0).rate_sigma_for(20.0)) == pytest.approx(
        0.8 * math.sqrt(2.0 / 20.0)
    )
    assert float(replace(r, rate_sigma_long=0.5).rate_sigma_for(1.0)) == pytest.approx(0.8)

    sim = _regime_sim
    passing = replace(r, rate_sigma_long=0.0)
    lasting, averaged = sim(r, 20.0), sim(passing, 20.0)
    rate_l = lasting.samples.losses / lasting.samples.hours
    rate_a = averaged.samples.losses / averaged.samples.hours
    assert np.std(rate_a) < 0.8 * np.std(rate_l)
    assert float(np.mean(rate_a)) == pytest.approx(float(np.mean(rate_l)), rel=0.05)
    assert lasting.hours_p90[0] > averaged.hours_p90[0]
    # one block: the same spread (the row's stream is a hash of its risk: other draws)
    short_l, short_a = sim(r, 2.0), sim(passing, 2.0)
    assert short_a.hours_p90[0] == pytest.approx(short_l.hours_p90[0], rel=0.03)
    with pytest.raises(ValueError, match="rate_sigma_long"):
        replace(r, rate_sigma_long=0.9)
