"""The online model, evaluation and re-planning (kplan/planner/online.py): tables of numbers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kplan.core.errors import InputError
from kplan.planner import perfmodel
from kplan.planner.online import Config, Evaluation, OnlineModel, evaluate, remaining_gns
from kplan.planner.perfmodel import PerfParams
from kplan.planner.profile import GnsPoint, Measurement
from kplan.planner.replan import Decision, deadline_safe, replan
from tests.planner_fixtures import params

TRUTH = params(inter_beta=0.3, two_node=0.3)
PRICE = 3.9  # USD per node-hour


def row(p: PerfParams, nodes: int, workers: int, local: int) -> Measurement:
    step = float(perfmodel.step_time(p, [nodes], [workers], [local])[0])
    sync = float(perfmodel.exposed_sync_time(p, [nodes], [workers], [local])[0])
    return Measurement(nodes, workers, local, step, min(max(sync, 0.0), step))


ONE_NODE = [row(TRUTH, 1, k, b) for k in (1, 2, 4) for b in (16, 32, 64, 128)]


def cfg(nodes: int, workers: int, batch: int) -> Config:
    return Config(nodes, workers, batch, 1, "g4dn.12xlarge", "on-demand", nodes * PRICE)


def one_node_prior() -> PerfParams:
    """What a one-node profile gives: inter-node terms from priors (here 3x too optimistic)."""
    return params(inter_beta=0.1, two_node=0.0, max_nodes_measured=1, inter_measured=False)


def test_config_validates_and_derives() -> None:
    c = cfg(2, 8, 256)
    assert c.local_batch == 32.0
    assert "2x g4dn.12xlarge" in c.label and "B=256" in c.label
    assert c.same_cluster(cfg(2, 8, 512)) and not c.same_cluster(cfg(3, 12, 256))
    with pytest.raises(InputError, match="nodes=3, workers=2"):
        Config(3, 2, 64)
    with pytest.raises(InputError, match="global_batch=4"):
        Config(1, 8, 4)
    with pytest.raises(InputError, match="usd_per_hour"):
        Config(1, 1, 8, usd_per_hour=-1.0)


def test_observe_reports_error_before_and_refit_learns_inter_node_terms() -> None:
    model = OnlineModel(one_node_prior(), base_rows=ONE_NODE)
    trials = [row(TRUTH, 2, 8, 64), row(TRUTH, 4, 16, 32), row(TRUTH, 4, 16, 128)]
    first = model.observe(trials[0])
    assert first is not None and first > 0.15  # the prior misses the two-node step badly
    model.refit()
    for m in trials[1:]:
        model.observe(m)
    model.refit()
    # Unseen multi-node configurations are now predicted within 6%.
    for nodes, workers, local in ((3, 12, 64), (8, 32, 64), (2, 8, 128)):
        step, sigma = model.predict(cfg(nodes, workers, workers * local))
        true = float(perfmodel.step_time(TRUTH, [nodes], [workers], [local])[0])
        assert step == pytest.approx(true, rel=0.06)
        assert sigma >= model.params.log_sigma
    err = model.error
    assert err.n == 3 and err.last is not None and err.mape is not None
    assert err.mape >= err.last  # later predictions came from a better model


def test_refit_keeps_the_priors_inter_terms_without_multi_node_rows() -> None:
    prior = one_node_prior()
    model = OnlineModel(prior, base_rows=ONE_NODE[:4])  # one worker only
    model.observe(row(TRUTH, 1, 4, 64))
    p = model.refit()
    assert (p.inter_beta, p.inter_alpha, p.two_node) == (
        prior.inter_beta,
        prior.inter_alpha,
        prior.two_node,
    )
    assert p.intra_beta != prior.intra_beta  # the one-node, four-worker row identifies it


def test_refit_with_one_batch_only_rescales_the_prior() -> None:
    prior = one_node_prior()
    model = OnlineModel(prior, min_rows_to_refit=2)
    slow = [Measurement(m.nodes, m.workers, 64, 1.0) for m in (row(prior, 1, 1, 64),)]
    model.observe(slow[0])
    assert model.refit() is prior  # fewer rows than min_rows_to_refit
    before = float(perfmodel.step_time(prior, [1], [1], [64])[0])
    model.observe(Measurement(1, 2, 64, 1.2))
    model.refit()
    ratio_1 = 1.0 / before
    ratio_2 = 1.2 / float(perfmodel.step_time(prior, [1], [2], [64])[0])
    expected = math.sqrt(ratio_1 * ratio_2)  # median of two ratios = their mean; close to this
    got = model.predict(Config(1, 1, 64))[0] / before
    assert got == pytest.approx((ratio_1 + ratio_2) / 2, rel=1e-6)
    assert got == pytest.approx(expected, rel=0.1)


def test_repeated_observations_are_merged_newest_weighted() -> None:
    model = OnlineModel(one_node_prior(), newest_weight=0.75)
    assert model.observe(Measurement(1, 4, 32, 1.0, 0.2)) is None  # no base rows: no model yet
    assert model.observe(Measurement(1, 4, 32, 2.0, 0.4)) is not None
    (merged,) = model.observed
    assert merged.step_time == pytest.approx(1.75)
    assert merged.sync_time == pytest.approx(0.35)
    assert model.error.n == 1


GNS = (GnsPoint(0.0, 100.0), GnsPoint(1.0, 4000.0))


def test_evaluate_steps_time_cost_and_restart() -> None:
    p = TRUTH
    configs = [cfg(1, 4, 128), cfg(2, 8, 1024)]
    ev = evaluate(p, configs, remaining_progress=1000, base_batch=128, gns=GNS, restart_s=60.0)
    assert ev.steps[0] == pytest.approx(1000.0)  # the base batch makes one base step per step
    # At 8x the base batch a step is worth less than 8 base steps (efficiency < 1).
    assert 1000 / 8 < ev.steps[1] < 1000
    step = perfmodel.step_time(p, [1, 2], [4, 8], [32, 128])
    np.testing.assert_allclose(ev.seconds, ev.steps * step + 60.0)
    np.testing.assert_allclose(ev.cost_usd, ev.seconds / 3600 * np.array([PRICE, 2 * PRICE]))
    assert np.all(ev.cost_p90_usd > ev.cost_usd)
    # Without a GNS trajectory only the base batch has a value.
    bare = evaluate(p, configs, remaining_progress=1000, base_batch=128, gns=())
    assert math.isfinite(bare.cost_usd[0]) and math.isnan(bare.cost_usd[1])


def test_done_fraction_uses_the_rest_of_the_trajectory() -> None:
    big = [cfg(2, 8, 2048)]
    early = evaluate(TRUTH, big, remaining_progress=500, base_batch=128, gns=GNS)
    late = evaluate(TRUTH, big, remaining_progress=500, base_batch=128, gns=GNS, done_fraction=0.8)
    assert late.steps[0] < early.steps[0]  # the noise scale is larger late in training
    rest = remaining_gns(GNS, 0.5)
    assert rest[0] == GnsPoint(0.0, 2050.0) and rest[-1] == GnsPoint(1.0, 4000.0)


def decide(current: Config, candidates: list[Config], **kw: Any) -> Decision:
    args: dict[str, Any] = dict(
        remaining_progress=200_000,
        base_batch=32,
        gns=GNS,
        objective="cost",
        restart_s=60.0,
        margin=0.1,
    )
    args.update(kw)
    return replan(TRUTH, current, candidates, **args)


def test_replan_switches_only_beyond_the_margin() -> None:
    current = cfg(1, 4, 32)
    better = cfg(1, 4, 256)  # same cluster: a bigger batch, no restart
    d = decide(current, [better])
    assert d.switch and d.best == better and d.gain > 0.1
    assert "switch to" in d.reason
    # The same candidate with a margin above its gain: stay.
    gain = d.gain
    stay = decide(current, [better], margin=min(gain + 0.05, 0.99))
    assert not stay.switch and "margin" in stay.reason


def test_restart_penalty_blocks_a_switch_near_the_end() -> None:
    current = cfg(1, 4, 256)
    bigger = cfg(4, 16, 2048)
    time_far = decide(current, [bigger], objective="time", remaining_progress=2_000_000)
    assert time_far.switch
    time_near = decide(current, [bigger], objective="time", remaining_progress=200, restart_s=120)
    assert not time_near.switch


def test_deadline_and_budget_are_respected() -> None:
    current = cfg(1, 4, 256)
    fast = cfg(4, 16, 2048)
    base = decide(current, [fast], objective="cost")
    assert not base.switch  # the faster cluster costs more
    cur_s = base.current_value
    ev = evaluate(TRUTH, [current, fast], remaining_progress=200_000, base_batch=32, gns=GNS)
    deadline = float(ev.seconds_p90[0]) * 0.75
    assert ev.seconds_p90[1] < deadline
    d = decide(current, [fast], objective="cost", deadline_left_s=deadline)
    assert d.switch and d.best == fast and "deadline" in d.reason
    assert cur_s > 0
    poor = decide(current, [fast], objective="time", budget_left_usd=0.01)
    assert not poor.switch and "fits" in poor.reason


def test_replan_rejects_bad_input() -> None:
    with pytest.raises(InputError, match="unknown objective 'fast'"):
        decide(cfg(1, 4, 128), [cfg(1, 4, 256)], objective="fast")
    with pytest.raises(InputError, match="margin"):
        decide(cfg(1, 4, 128), [cfg(1, 4, 256)], margin=1.5)
    with pytest.raises(InputError, match="remaining_progress"):
        decide(cfg(1, 4, 128), [cfg(1, 4, 256)], remaining_progress=-1.0)


def test_forecast_grows_the_gns_and_widens_the_p90() -> None:
    one = (GnsPoint(0.0, 100.0),)
    big = [cfg(2, 8, 2048)]
    held = evaluate(TRUTH, big, remaining_progress=500, base_batch=128, gns=one)
    fc = evaluate(TRUTH, big, remaining_progress=500, base_batch=128, gns=one, forecast=True)
    assert fc.steps[0] < held.steps[0]  # the noise scale is forecast to grow
    assert held.steps_log_sigma is None
    assert fc.steps_log_sigma is not None and fc.steps_log_sigma[0] > 0.1
    ratio = (fc.seconds_p90 / fc.seconds)[0]
    assert ratio > float(np.exp(1.2815 * fc.log_sigma[0]))  # the forecast's spread is in it
    # Late in the job, only the rest of training counts.
    late = evaluate(
        TRUTH, big, remaining_progress=500, base_batch=128, gns=one, forecast=True,
        done_fraction=0.5,
    )  # fmt: skip
    assert late.steps[0] < fc.steps[0]


def test_no_candidate_meets_the_deadline_takes_the_best_chance() -> None:
    current = cfg(1, 4, 256)
    fast = cfg(4, 16, 2048)
    ev = evaluate(TRUTH, [current, fast], remaining_progress=200_000, base_batch=32, gns=GNS)
    deadline = float(ev.seconds[1]) * 0.98  # below every p90, near the fast one's median
    assert deadline < float(ev.seconds_p90[1])
    d = decide(current, [fast], objective="cost", deadline_left_s=deadline)
    assert d.switch and d.best == fast and "best chance" in d.reason
    hopeless = decide(current, [fast], objective="cost", deadline_left_s=1.0)
    assert not hopeless.switch  # no chance anywhere: nothing to gain by moving


def _ev(seconds: list[float], p90: list[float]) -> Evaluation:
    s, q = np.array(seconds), np.array(p90)
    zero = np.zeros_like(s)
    return Evaluation(zero + 1.0, zero, zero + 1.0, s, s, q, q)


def test_deadline_safe_alone_and_with_a_fallback() -> None:
    cheap, fast = cfg(1, 4, 256), cfg(4, 16, 2048)  # a restart apart
    ev = _ev([800.0, 300.0], [1200.0, 900.0])
    down = np.zeros(2)
    alone, safe = deadline_safe([cheap, fast], ev, down, 1000.0, hold_share=None, restart_s=60)
    assert list(alone) == [False, True] and list(safe) == [False, True]  # no re-plan: p90 only
    # Re-planning after 10% of the rest: cheap runs 120 s (at its p90), then fast finishes the
    # other 90% at its p90 after a restart: 120 + 60 + 0.9 * 900 = 990 s <= 1000 s.
    share = np.array([0.1, 0.1])
    alone, safe = deadline_safe([cheap, fast], ev, down, 1000.0, hold_share=share, restart_s=60)
    assert list(alone) == [False, True] and list(safe) == [True, True]
    _, edge = deadline_safe([cheap, fast], ev, down, 990.0, hold_share=share, restart_s=60)
    _, tight = deadline_safe([cheap, fast], ev, down, 989.0, hold_share=share, restart_s=60)
    assert list(edge) == [True, True] and list(tight) == [False, True]
    # A hold that is the whole rest of the job leaves no re-plan to fall back from: p90 only.
    whole = np.array([1.0, 1.0])
    _, last = deadline_safe([cheap, fast], ev, down, 1000.0, hold_share=whole, restart_s=60)
    assert list(last) == [False, True]
    # The median must meet the deadline too: a fallback does not make a hopeless config safe.
    slow = _ev([1100.0, 300.0], [1500.0, 500.0])
    _, safe = deadline_safe([cheap, fast], slow, down, 1000.0, hold_share=share, restart_s=60)
    assert list(safe) == [False, True]


def test_replan_with_a_recheck_stays_cheap_while_a_fallback_keeps_the_deadline() -> None:
    one = (GnsPoint(0.0, 50.0),)  # one point: a wide forecast, so the p90 is far off the median
    current, fast = cfg(1, 2, 128), cfg(4, 16, 2048)
    kw: dict[str, Any] = dict(gns=one, forecast=True, base_batch=32, objective="cost")
    ev = evaluate(TRUTH, [current, fast], remaining_progress=200_000, base_batch=32, gns=one,
                  forecast=True, restart_s=np.array([0.0, 60.0]))  # fmt: skip
    assert ev.seconds_p90[1] < ev.seconds[0] < ev.seconds_p90[0]
    assert ev.cost_usd[1] > ev.cost_usd[0]  # the fast cluster is the dearer one
    deadline = float(ev.seconds[0]) * 1.05  # the median meets it, the p90 does not
    forced = decide(current, [fast], deadline_left_s=deadline, **kw)
    assert forced.switch and forced.best == fast  # p90 alone: the dear cluster at once
    kept = decide(current, [fast], deadline_left_s=deadline, recheck_fraction=0.02, **kw)
    assert not kept.switch  # the fast cluster stays the fallback
    # With little slack left for the fallback, the deadline wins over the price again.
    late = decide(current, [fast], deadline_left_s=float(ev.seconds_p90[1]) * 1.01,
                  recheck_fraction=0.02, **kw)  # fmt: skip
    assert late.switch and late.best == fast


def test_with_no_safe_config_a_cheap_one_runs_on_while_it_costs_little_chance() -> None:
    current, fast = cfg(1, 4, 256), cfg(4, 16, 2048)
    ev = evaluate(TRUTH, [current, fast], remaining_progress=200_000, base_batch=32, gns=GNS,
                  restart_s=np.array([0.0, 60.0]))  # fmt: skip
    deadline = float(ev.seconds[1]) * 0.98  # below every p90, near the fast one's median
    # Re-planning after 1% of the job: the cheap config runs on (92 s), the fast one stays the
    # fallback; the chance of the deadline drops 40% -> 38%, within the 10% margin.
    kept = decide(
        current, [fast], objective="cost", deadline_left_s=deadline, recheck_fraction=0.01
    )
    assert not kept.switch and "best chance" in kept.reason
    # Re-planning after 5%: holding the cheap config (458 s) costs more chance than the margin.
    moved = decide(
        current, [fast], objective="cost", deadline_left_s=deadline, recheck_fraction=0.05
    )
    assert moved.switch and moved.best == fast


def test_a_config_safe_by_its_fallback_is_valued_with_the_cheapest_fallback_that_fits() -> None:
    from kplan.planner.replan import _contingent_value, _deadline_chance

    cheap, mid, fast = cfg(1, 4, 256), cfg(2, 8, 512), cfg(4, 16, 2048)
    secs, p90 = np.array([1000.0, 600.0, 400.0]), np.array([1200.0, 700.0, 450.0])
    price = np.array([c.usd_per_hour for c in (cheap, mid, fast)]) / 3600.0
    ev = Evaluation(np.ones(3), np.full(3, 0.1), np.ones(3), secs, secs * price, p90, p90 * price)
    down, boot, share = np.zeros(3), np.zeros(3), np.full(3, 0.1)
    value = _contingent_value([cheap, mid, fast], ev, down, boot, 1050.0, share,
                              objective="cost", restart_s=60.0, boot_s=0.0)  # fmt: skip
    chance = float(_deadline_chance(ev, down, 1050.0)[0])
    assert 0.6 < chance < 0.8  # log(1050 / 1000) / 0.1 sigmas
    hold = 0.1 * 1000.0 * price[0]
    # cheap too slow: after its 100 s, mid (60 + 0.9 x 700 = 690 s <= 950 s left) is the
    # cheapest that still finishes at its p90; the fastest would cost more
    via_mid = 60.0 * price[1] + 0.9 * 600.0 * price[1]
    via_fast = 60.0 * price[2] + 0.9 * 400.0 * price[2]
    assert via_mid < via_fast
    assert value[0] == pytest.approx(chance * 1000.0 * price[0] + (1 - chance) * (hold + via_mid))
