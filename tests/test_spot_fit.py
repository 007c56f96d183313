"""The fitted spot model: the estimators recover the parameters of traces drawn from the model,
and the shipped kplan/catalogs/data/spot_model.json is what scripts/fit_spot_model.py computes."""

from __future__ import annotations

import math
from math import comb

import numpy as np
import pytest

from kplan.catalogs.spot_model_file import load_spot_model
from kplan.catalogs.spot_traces import from_bamboo_csv
from kplan.planner.spot import Outage, SpotRisk, Weibull
from kplan.planner.spottrace import synthetic_trace
from scripts import fit_spot_model as fit
from tests.test_spot_trace import TRACES, needs_data

DURATIONS = (0.1, 0.5, 2.0)  # hours; all longer than the 300 s restart


def _risk(shape: float, scale: float, co: float, p: float) -> SpotRisk:
    return SpotRisk("aws", "x", "*", Weibull(shape, scale), co, Outage(p, DURATIONS, 1.0), "t")


@pytest.mark.parametrize(("shape", "scale"), [(0.7, 2.0), (1.3, 0.8)])
def test_weibull_mle_recovers_the_lifetime_of_a_synthetic_trace(shape: float, scale: float) -> None:
    # no co-loss: every node's life is the Weibull itself, censored at the end
    t = synthetic_trace(_risk(shape, scale, 0.0, 0.3), pool=8, hours=2500 * scale, seed=11)
    r = fit.fit_risk(t, cloud="aws", family="x", region="*", cluster_sizes=(8,))
    lives = fit.sample(t)
    d = int(lives.removed.sum())
    assert d > 4000
    _, se = fit.weibull_mle(lives.life_h, lives.removed)
    # asymptotic sd: shape ~ 0.78 k / sqrt(d); log scale ~ 1.05 / (k sqrt(d)); allow 4 sd
    assert se == pytest.approx(0.78 * shape / math.sqrt(d), rel=0.2)
    assert abs(r.lifetime.shape - shape) < 4 * se
    assert abs(math.log(r.lifetime.scale_h / scale)) < 4 * 1.05 / (shape * math.sqrt(d))


def test_weibull_mle_uses_censoring_and_truncation() -> None:
    rng = np.random.default_rng(5)
    k, lam, n = 0.8, 3.0, 20_000
    life = lam * rng.weibull(k, n)
    # right-censoring at 2 h: about 40% censored
    cens = np.minimum(life, 2.0)
    w, se = fit.weibull_mle(cens, life <= 2.0)
    assert abs(w.shape - k) < 4 * se and w.scale_h == pytest.approx(lam, rel=0.05)
    naive, _ = fit.weibull_mle(cens, np.ones(n, dtype=bool))  # censoring ignored: far off
    assert naive.scale_h < 0.7 * lam
    # left-truncation: only nodes that lived past their entry age are seen
    entry = rng.uniform(0, 3.0, n)
    seen = life > entry
    w, se = fit.weibull_mle(life[seen], np.ones(int(seen.sum()), dtype=bool), entry[seen])
    assert abs(w.shape - k) < 4 * se and w.scale_h == pytest.approx(lam, rel=0.05)


@pytest.mark.parametrize(("co", "pool"), [(0.0, 8), (0.3, 8), (0.15, 4)])
def test_co_loss_and_outage_are_recovered_from_a_synthetic_trace(co: float, pool: int) -> None:
    p = 0.3
    t = synthetic_trace(_risk(0.8, 2.0, co, p), pool=pool, hours=4000, seed=3)
    # the synthetic pool is one cluster: read it so (pool_view=False); a real pool is shared
    r = fit.fit_risk(
        t,
        cloud="aws",
        family="x",
        region="*",
        cluster_sizes=(pool,),
        pool_view=False,
        smooth_tail=False,
    )
    s = fit.sample(t)
    n_ev = len(s.size)
    # co_loss: mean of (b - 1) / (N - 1) over ~n_ev events, sd <= 0.5 / sqrt(n_ev); events
    # closer than LOSS_WINDOW_S merge (~1-2% of them), a small upward bias
    assert abs(r.co_loss - co) < 4 * 0.5 / math.sqrt(n_ev) + 0.01
    out = fit.outage_estimate(s.wait_s, s.censored, s.continues, pool_view=False)
    assert out.events > 1000
    shared = fit.outage_estimate(s.wait_s, s.censored, s.continues)
    assert shared.prob >= out.prob  # a node of the pool also waits through others' outages
    assert abs(r.outage.prob - p) < 4 * math.sqrt(p * (1 - p) / out.events) + 0.01
    # the waits are the drawn durations (a merged event starts up to the window earlier)
    d = np.asarray(r.outage.durations_h)
    near = np.min(np.abs(d[:, None] - np.asarray(DURATIONS)[None, :]), axis=1) <= 61 / 3600
    assert near.mean() > 0.97
    for v in DURATIONS:
        assert np.mean(np.abs(d - v) <= 61 / 3600) == pytest.approx(1 / 3, abs=0.06)


def test_co_loss_of_one_batch_matches_its_closed_form() -> None:
    # one event of b removals out of N; clusters of 2: 1 + c = (2b/N) / P(hit)
    b, big_n = 6, 30
    hit = 1 - comb(big_n - b, 2) / comb(big_n, 2)
    c = fit.co_loss_estimate(np.array([b]), np.array([big_n]), (2,))
    assert c == pytest.approx((2 * b / big_n) / hit - 1, abs=1e-9)
    # a pool-wide loss takes every node: co_loss 1; single losses in a big pool: ~0
    assert fit.co_loss_estimate(np.array([10]), np.array([10]), (4,)) == pytest.approx(1.0)
    assert fit.co_loss_estimate(np.array([1, 1]), np.array([40, 40]), (2, 4)) < 1e-6


def test_outage_estimate_counts_only_waits_it_knows() -> None:
    wait = np.array([60.0, 400.0, 7200.0, 100.0, 900.0])
    censored = np.array([False, False, False, True, True])  # a short open wait: unknown
    continues = np.array([False, False, True, False, False])
    out = fit.outage_estimate(wait, censored, continues, restart_s=300.0, pool_view=False)
    assert (out.events, out.outages, out.lower_bounds) == (3, 2, 1)
    assert out.prob == pytest.approx(2 / 3)
    assert out.durations_h == (round(400 / 3600, 4), 0.25)
    # seen from a cluster of the pool, the loss during the 7200 s outage waits too
    shared = fit.outage_estimate(wait, censored, continues, restart_s=300.0)
    assert (shared.events, shared.outages) == (4, 3)
    assert shared.durations_h == (round(400 / 3600, 4), 0.25, 2.0)


@needs_data
def test_fit_on_halves_splits_the_trace() -> None:
    t = from_bamboo_csv(TRACES / "p3-trace.csv")
    half = t.end_s / 2
    a, b = fit.sample(t, until_s=half), fit.sample(t, since_s=half)
    whole = fit.sample(t)
    assert a.removals + b.removals == whole.removals
    assert a.node_hours + b.node_hours == pytest.approx(whole.node_hours)
    assert len(a.size) + len(b.size) >= len(whole.size)  # an event may straddle the cut
    assert np.all(b.entry_h >= 0) and np.any(b.entry_h > 0)  # left-truncated survivors
    r = fit.fit_risk(t, cloud="aws", family="p3", region="*", until_s=half)
    assert 0.3 < r.lifetime.shape < 3 and 0 <= r.co_loss <= 1


@needs_data
def test_shipped_model_is_the_fit_of_the_shared_traces() -> None:
    shipped = load_spot_model()
    assert "fit_spot_model" in shipped.fitted
    fresh = fit.fit_all(fit.DEFAULT_DATA if fit.DEFAULT_DATA.is_dir() else TRACES.parents[2])
    assert [r.to_dict() for r in shipped.risks] == [r.to_dict() for r in fresh.risks]
    p3 = shipped.lookup("aws", "p3.2xlarge", "us-east-1")
    assert p3.family == "p3" and "167 removals" in p3.source and "273.1 node-hours" in p3.source
    assert shipped.lookup("aws", "g5.xlarge", "us-west-2").family == "*"
    assert shipped.lookup("gcp", "a2-highgpu-1g", "us-east1").region == "us-east1"
    for r in shipped.risks:
        assert r.outage.region_prob == 1.0 and "region_prob 1.0 assumed" in r.source
        assert all(d * 3600 > 300 for d in r.outage.durations_h)
        # one spread between periods for every row, from every trace's halves
        assert "Period: the halves of 4 traces" in r.source
        assert r.period_sigma == shipped.risks[0].period_sigma > 0


def test_the_outage_tail_is_a_log_normal_through_the_recorded_waits() -> None:
    """Sampling the kept quantiles gives the recorded median, and waits beyond the longest
    recorded one (a handful of outages does not show the tail)."""
    rng = np.random.default_rng(5)
    restart = 300.0
    excess = rng.lognormal(np.log(900.0), 0.8, size=12)
    recorded = tuple(float(x) for x in (restart + excess) / 3600.0)
    kept = np.asarray(fit.lognormal_durations(recorded, restart))
    assert kept.size == fit.TAIL_POINTS and np.all(kept * 3600 > restart)
    assert np.median(kept) == pytest.approx(
        (restart + np.exp(np.mean(np.log(excess)))) / 3600, rel=1e-3
    )
    assert kept.max() > max(recorded)
    assert fit.lognormal_durations(recorded[:2], restart) == recorded[:2]


def _blocks(rates: list[float], rng: np.random.Generator, e: float = 50.0) -> list[fit.Sample]:
    """Blocks of ``e`` node-hours whose removals are Poisson at the given rates."""
    return [
        fit.Sample(
            name="b",
            life_h=np.zeros(0),
            removed=np.zeros(0, dtype=bool),
            entry_h=np.zeros(0),
            size=np.ones(0, dtype=np.int64),
            pool=np.ones(0, dtype=np.int64),
            wait_s=np.zeros(0),
            censored=np.zeros(0, dtype=bool),
            continues=np.zeros(0, dtype=bool),
            hours=2.0,
            node_hours=e,
            removals=int(rng.poisson(rate * e)),
        )
        for rate in rates
    ]


def _multipliers(rng: np.random.Generator, sd: float, n: int, run: int = 1) -> np.ndarray:
    """Mean-1 log-normal multipliers of log-sd ``sd``, each held for ``run`` blocks."""
    z = np.repeat(rng.standard_normal(-(-n // run)), run)[:n]
    out: np.ndarray = np.exp(sd * z - sd**2 / 2)
    return out


def test_regime_spread_is_found_where_blocks_differ_and_not_where_they_do_not() -> None:
    """Blocks whose loss rates are drawn around a common one (a multiplier of log-sd 0.6)
    give a rate sigma near 0.6; blocks of one Poisson rate give about 0."""
    rng = np.random.default_rng(11)

    def parts(sd: float, n: int = 400) -> list[fit.Sample]:
        return _blocks(list(0.6 * _multipliers(rng, sd, n)), rng)

    spread, _, long = fit.regime_sigmas(parts(0.6))
    assert spread == pytest.approx(0.6, abs=0.1)
    assert long < 0.25  # every block drew its own: a long run averages it away
    calm, _, _ = fit.regime_sigmas(parts(0.0))
    assert calm < 0.1
    assert fit.regime_sigmas(parts(0.6, n=1)) == (0.0, 0.0, 0.0)  # one block: no spread to see


def test_the_lasting_part_of_the_spread_is_what_longer_windows_keep() -> None:
    """A market busy or calm for 8 blocks at a time (log-sd 0.5) with a block-to-block
    spread on top (0.8): the lasting part is found near 0.5 and the whole near
    sqrt(0.5^2 + 0.8^2); a market whose periods last 8 blocks with nothing on top keeps all
    of its spread (the estimator reads no fall with the window, so nothing is averaged)."""
    rng = np.random.default_rng(5)
    n = 1600
    both = _multipliers(rng, 0.5, n, run=8) * _multipliers(rng, 0.8, n)
    rate, _, long = fit.regime_sigmas(_blocks(list(0.6 * both), rng))
    assert rate == pytest.approx(math.sqrt(0.5**2 + 0.8**2), abs=0.12)
    assert long == pytest.approx(0.5, abs=0.15)
    lasting = _multipliers(rng, 0.5, n, run=8)
    rate, _, long = fit.regime_sigmas(_blocks(list(0.6 * lasting), rng))
    assert long == pytest.approx(rate, abs=0.08)
    assert fit.long_rate_sigma([_blocks([0.6, 0.6], rng)], 0.3) == 0.3  # one width: all lasts


def test_two_halves_read_their_whole_spread() -> None:
    """Each window is measured against its own group's rate, which it pulls toward itself:
    without taking that pull out, groups of two halves read about half their spread."""
    rng = np.random.default_rng(0)
    for sd in (0.3, 0.6):
        groups = []
        for _ in range(3000):
            e = rng.uniform(50.0, 150.0, 2)
            m = np.exp(sd * rng.standard_normal(2) - sd**2 / 2)
            groups.append((rng.poisson(0.5 * e * m).astype(float), e))
        var, windows, used = fit._rate_var(groups)
        assert (windows, used) == (6000, 3000)
        true = math.exp(sd**2) - 1  # the multiplier's variance
        assert math.exp(var) - 1 == pytest.approx(true, rel=0.25)
        # without the pull taken out: about half
        num = den = 0.0
        for r, e in groups:
            mu = r.sum() / e.sum() * e
            num += float(np.sum((r - mu) ** 2 - mu))
            den += float(np.sum(mu**2))
        assert num / den < 0.65 * true
    assert fit._own_mean_factor(np.array([1.0, 1.0])) == pytest.approx([0.5, 0.5])


def test_a_market_that_keeps_its_rate_has_no_spread_between_periods() -> None:
    """Traces drawn from one market throughout: the halves differ by chance only, so the
    spread between periods is about 0; a market whose second half runs at five times the
    rate of its first has one."""
    calm = _risk(1.0, 4.0, 0.0, 0.0)
    fits = [(synthetic_trace(calm, pool=8, hours=400, seed=s), calm) for s in range(4)]
    period, why = fit.period_sigma(fits)
    assert period < 0.15 and "4 traces" in why
    r = np.array([40.0, 200.0])
    e = np.array([100.0, 100.0])
    var, _, _ = fit._rate_var([(r, e)])
    assert math.sqrt(var) > 0.7  # one pair five times apart: far beyond chance
