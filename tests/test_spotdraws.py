"""The spot Monte-Carlo's counter-based draws (kplan/planner/spotdraws.py): a row's numbers do
not depend on the rows priced with it, a seed changes every stream, the hash is uniform."""

from __future__ import annotations

import numpy as np
from scipy import stats

from kplan.planner import spotdraws, spotsim
from kplan.planner.spot import Outage, RecoveryPolicy, SpotRisk, Weibull

RISK = SpotRisk("aws", "p3", "us-east-1", Weibull(0.8, 6.0), 0.1, Outage(0.2, (0.5, 2.0), 0.5), "t")
POL = RecoveryPolicy(allow_on_demand=True)


def _batch(
    rows: list[tuple[float, int, SpotRisk | None, float]], seed: int = 0
) -> spotsim.SimResult:
    return spotsim.simulate(
        work_s=[r[0] for r in rows],
        nodes=[r[1] for r in rows],
        risks=[r[2] for r in rows],
        policies=[POL],
        usd_per_hour=[r[3] for r in rows],
        usd_per_hour_on_demand=10.0,
        log_sigma=0.2,
        runs=300,
        seed=seed,
    )


def test_a_row_draws_the_same_alone_and_in_a_batch() -> None:
    row = (50_000.0, 4, RISK, 3.0)
    g = np.random.default_rng(1)
    others = [
        (float(g.uniform(1e3, 2e5)), int(g.integers(1, 17)), RISK if i % 3 else None, 1.0 + i)
        for i in range(50)
    ]
    alone = _batch([row]).samples
    batch = _batch([*others[:20], row, *others[20:]]).samples
    for name in ("hours", "cost_usd", "failed", "losses", "lost_nodes", "wait_hours"):
        a, b = getattr(alone, name)[0], getattr(batch, name)[20]
        assert np.array_equal(a, b), name
    assert alone.losses.sum() > 0  # the row's runs do lose nodes: the draws were exercised


def test_the_seed_changes_every_stream() -> None:
    row = (50_000.0, 4, RISK, 3.0)
    a, b = _batch([row], seed=0).samples, _batch([row], seed=1).samples
    assert not np.array_equal(a.hours, b.hours)
    assert np.array_equal(a.hours, _batch([row], seed=0).samples.hours)


def test_the_hash_is_uniform() -> None:
    n = 100_000
    lane = spotdraws.lane_keys(spotdraws.row_keys([("row", 1)], 0), np.arange(n))
    u = spotdraws.uniform(lane, np.full(n, 3), 7)
    assert u.min() > 0.0
    assert u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # the event counter and the slot each give an independent stream (correlation ~ 1/sqrt(n))
    v = spotdraws.uniform(lane, np.full(n, 4), 7)
    w = spotdraws.uniform(lane, np.full(n, 3), 8)
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.02 and abs(np.corrcoef(u, w)[0, 1]) < 0.02
    counts = np.bincount((u * 100).astype(int), minlength=100)
    assert stats.chisquare(counts).pvalue > 1e-3
    z = spotdraws.normal(lane, np.zeros(n, np.int64), 1, 2)
    assert stats.kstest(z, "norm").pvalue > 1e-3
