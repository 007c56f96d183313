"""The Monte-Carlo's event cut (kplan/planner/spotsim.py ``more_events``): runs that go on past
a first cut give the result of a fresh simulation with the larger cut, and ``simulate_rows``
keeps the cut above every row's replacement limit."""

from __future__ import annotations

import numpy as np
import pytest

from kplan.planner import spotplan, spotsim
from kplan.planner.spot import Outage, RecoveryPolicy, SpotRisk, Weibull

RISKY = SpotRisk("aws", "p3", "*", Weibull(0.8, 4.0), 0.2, Outage(0.3, (0.2, 0.5), 0.5), "test")
KW = dict(
    work_s=[6 * 3600.0, 20 * 3600.0, 3 * 3600.0],
    nodes=[8, 3, 1],
    risks=[RISKY, RISKY, None],
    policies=[RecoveryPolicy(max_replacements=10**9)],
    usd_per_hour=[1.0, 1.0, 3.0],
    usd_per_hour_on_demand=3.0,
    log_sigma=0.1,
    runs=300,
    seed=5,
)


def _same(a: spotsim.SimResult, b: spotsim.SimResult) -> None:
    for name in ("hours", "cost_usd", "failed", "losses", "lost_nodes", "wait_hours"):
        assert np.array_equal(getattr(a.samples, name), getattr(b.samples, name)), name


def test_going_on_past_a_cut_is_a_fresh_run_with_the_larger_cut() -> None:
    asked: list[int] = []

    def more(res: spotsim.SimResult) -> int | None:
        asked.append(int(res.samples.failed.sum()))
        return 40 if len(asked) == 1 else None

    went_on = spotsim.simulate(**KW, max_events=10, more_events=more)  # type: ignore[arg-type]
    fresh = spotsim.simulate(**KW, max_events=40)  # type: ignore[arg-type]
    assert asked[0] > int(fresh.samples.failed.sum())  # runs were cut at 10: fewer fail at 40
    _same(went_on, fresh)
    cut = spotsim.simulate(**KW, max_events=10, more_events=lambda r: None)  # type: ignore[arg-type]
    _same(cut, spotsim.simulate(**KW, max_events=10))  # type: ignore[arg-type]


def test_the_cut_stays_above_every_replacement_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spotplan, "MAX_EVENTS", 8)  # below this row's limit (at least 20)
    rows = spotplan.simulate_rows(
        work_s=np.array([20 * 3600.0]),
        nodes=np.array([8.0]),
        risks=[RISKY],
        policies=[RecoveryPolicy()],
        usd_per_hour=np.array([1.0]),
        usd_per_hour_on_demand=np.array([3.0]),
        log_sigma=np.array([0.1]),
        billing_min_s=np.array([60.0]),
        billing_increment_s=np.array([1.0]),
        runs=300,
        seed=5,
    )
    limit = rows[0].policy.max_replacements
    fresh = spotsim.simulate(
        work_s=20 * 3600.0,
        nodes=8,
        risks=[RISKY],
        policies=[RecoveryPolicy(max_replacements=10**9)],
        usd_per_hour=1.0,
        usd_per_hour_on_demand=3.0,
        log_sigma=0.1,
        runs=300,
        seed=5,
        max_events=limit + 1,
    )
    assert limit >= 20
    assert rows[0].hours == float(fresh.hours_median[0])
    assert rows[0].cost_p90_usd == float(fresh.cost_p90[0])
