"""Property tests (hypothesis) of the planner's invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kplan.planner import costs, efficiency, perfmodel
from kplan.planner.profile import GnsPoint
from kplan.planner.search import pareto_front
from tests.planner_fixtures import params

pos = st.floats(min_value=1e-5, max_value=10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    a=pos,
    b=pos,
    gamma=st.floats(1.0, 10.0),
    beta=pos,
    nodes=st.integers(1, 64),
    gpn=st.integers(1, 8),
    accum=st.integers(1, 8),
    two=st.floats(0.0, 3.0),
)
def test_step_time_non_decreasing_in_local_batch(
    a: float, b: float, gamma: float, beta: float, nodes: int, gpn: int, accum: int, two: float
) -> None:
    p = params(
        compute_a=a,
        compute_b=b / 100,
        gamma=gamma,
        inter_beta=beta,
        intra_beta=beta / 5,
        two_node=two,
    )
    batches = np.arange(1, 400)
    t = perfmodel.step_time(p, nodes, nodes * gpn, batches, accum)
    assert np.all(np.diff(t) >= -1e-12)
    assert np.all(t > 0)


@settings(max_examples=200, deadline=None)
@given(
    seconds=st.floats(1.0, 1e7),
    n=st.integers(1, 64),
    price=st.floats(0.0, 100.0),
    rate=st.floats(0.0, 3.0),
    sigma=st.floats(0.0, 1.0),
    ckpt=st.floats(0.0, 600.0),
)
def test_cost_is_non_negative_and_p90_above_mean(
    seconds: float, n: int, price: float, rate: float, sigma: float, ckpt: float
) -> None:
    tc = costs.time_and_cost(
        train_seconds=seconds,
        instances=n,
        usd_per_hour=price,
        preempt_per_hour=rate,
        log_sigma=sigma,
        checkpoint_s=ckpt,
    )
    cost = float(tc.cost_usd)
    if np.isnan(cost):
        return  # infeasible (mostly restarting) is reported as NaN, never as a number
    assert cost >= 0
    assert float(tc.cost_p90_usd) >= cost - 1e-9
    assert float(tc.hours_p90) >= float(tc.hours) - 1e-12


@settings(max_examples=200, deadline=None)
@given(h=st.lists(st.floats(0.01, 1e4), min_size=1, max_size=60), seed=st.integers(0, 2**31 - 1))
def test_frontier_is_non_dominated_and_complete(h: list[float], seed: int) -> None:
    hours = np.array(h)
    cost = np.random.default_rng(seed).uniform(1, 1000, len(h))
    front = set(pareto_front(hours, cost).tolist())
    for i in range(len(h)):
        dominated = np.any(
            (hours <= hours[i]) & (cost <= cost[i]) & ((hours < hours[i]) | (cost < cost[i]))
        )
        if i in front:
            assert not dominated
        elif not dominated:
            # an exact duplicate of a frontier point is the only undominated non-member
            assert any(hours[j] == hours[i] and cost[j] == cost[i] for j in front)


@settings(max_examples=200, deadline=None)
@given(
    scales=st.lists(st.floats(1.0, 1e6), min_size=1, max_size=10),
    b0=st.integers(1, 4096),
    mult=st.floats(1.0, 1000.0),
)
def test_statistical_efficiency_in_unit_interval(scales: list[float], b0: int, mult: float) -> None:
    gns = tuple(GnsPoint(i / max(len(scales) - 1, 1), s) for i, s in enumerate(scales))
    e = efficiency.efficiency(gns, b0, b0 * mult)
    assert 0.0 < float(e) <= 1.0 + 1e-12
