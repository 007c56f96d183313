"""Bayesian-optimisation trials seeded by the model (kplan/planner/explore.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kplan.core.errors import InputError
from kplan.planner import fit
from kplan.planner.explore import Explorer, config_features
from kplan.planner.online import Config, evaluate
from kplan.planner.profile import GnsPoint
from tests.planner_fixtures import params

GNS = (GnsPoint(0.0, 100.0), GnsPoint(1.0, 4000.0))


def cfg(nodes: int, workers: int, batch: int, itype: str = "g4dn.12xlarge") -> Config:
    return Config(nodes, workers, batch, 1, itype, "on-demand", nodes * 3.9)


# 255 configurations: 1 to 16 nodes, 1 to 4 workers per node, per-worker batch 16 to 2048.
CONFIGS = [
    c
    for c in (
        cfg(n, n * g, n * g * b)
        for n in (1, 2, 3, 4, 6, 8, 12, 16)
        for g in (1, 2, 3, 4)
        for b in (16, 32, 64, 128, 256, 512, 1024, 2048)
    )
    if c.global_batch >= 32
]


def problem(truth_beta: float, prior_beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(true seconds, predicted seconds, predicted log sigma): a one-node prior, wrong across
    nodes by the ratio of the inter-node betas."""
    truth = params(inter_beta=truth_beta, two_node=0.0)
    prior = params(inter_beta=prior_beta, max_nodes_measured=1, inter_measured=False)
    kw = dict(remaining_progress=200_000, base_batch=32, gns=GNS)
    pred = evaluate(prior, CONFIGS, **kw)  # type: ignore[arg-type]
    # The explorer under a prior stated at 0.3 (log) across nodes, as online._sigma stated it for
    # any unmeasured inter-node term before issue 15 item 5; it now states the fabric prior's
    # held-out error (fit.PRIOR_INTER_LOG_SIGMA, 0.2), which a 6x-wrong beta is far outside.
    nodes = np.array([c.nodes for c in CONFIGS], dtype=float)
    extra = np.sqrt(0.3**2 - fit.PRIOR_INTER_LOG_SIGMA**2)  # hypot(.., extra) = .. 0.3
    sigma = np.where(nodes > 1, np.hypot(pred.log_sigma, extra), pred.log_sigma)
    return evaluate(truth, CONFIGS, **kw).seconds, pred.seconds, sigma  # type: ignore[arg-type]


def run(ex: Explorer, true: np.ndarray) -> None:
    while (i := ex.suggest()) is not None:
        ex.observe(i, float(true[i]), overhead=1.0)


@pytest.mark.parametrize(("truth_beta", "prior_beta"), [(0.05, 0.3), (0.6, 0.1), (0.2, 0.2)])
def test_a_few_trials_find_the_best_of_hundreds(truth_beta: float, prior_beta: float) -> None:
    true, pred, sigma = problem(truth_beta, prior_beta)
    ex = Explorer(CONFIGS, pred, log_sigma=sigma, min_gain=0.01)
    run(ex, true)
    # A model 5x too optimistic across nodes keeps the GP unsure for longer: still 12 of 255.
    assert len(ex.trials) <= (12 if truth_beta > prior_beta else 6)
    assert ex.trials[0] == int(np.argmin(pred))  # the first trial is the model's plan
    assert true[ex.best()] <= 1.03 * true.min()
    assert ex.overhead_spent == len(ex.trials)


def test_exploration_beats_the_models_plan_when_the_model_is_wrong() -> None:
    true, pred, sigma = problem(0.05, 0.3)
    plan = int(np.argmin(pred))
    assert true[plan] > 1.2 * true.min()  # the model alone picks a config 20%+ worse
    ex = Explorer(CONFIGS, pred, log_sigma=sigma)
    run(ex, true)
    assert true[ex.best()] < true[plan] / 1.15


def test_overhead_budget_and_trial_count_bound_the_search() -> None:
    true, pred, sigma = problem(0.05, 0.3)
    ex = Explorer(CONFIGS, pred, log_sigma=sigma, overhead_budget=2.5, min_gain=0.0)
    run(ex, true)
    assert len(ex.trials) == 3  # overhead 1 each: the third starts with 0.5 left, no fourth
    ex2 = Explorer(CONFIGS, pred, log_sigma=sigma, min_gain=0.0, max_trials=2)
    run(ex2, true)
    assert len(ex2.trials) == 2
    costly = Explorer(CONFIGS, pred, log_sigma=sigma, trial_overhead=1e9, overhead_budget=1e10)
    costly.observe(0, float(true[0]))
    assert costly.suggest() is None  # nothing is worth a trial that costs more than it saves


def test_a_right_model_stops_the_search_at_once() -> None:
    true, pred, _ = problem(0.2, 0.2)
    ex = Explorer(CONFIGS, pred, log_sigma=np.full(len(pred), 0.02), min_gain=0.01)
    run(ex, true)
    assert len(ex.trials) == 1 and ex.best() == int(np.argmin(true))


def test_a_limit_keeps_the_best_within_it() -> None:
    true, pred, sigma = problem(0.05, 0.3)
    cost = true * np.array([c.usd_per_hour for c in CONFIGS]) / 3600
    pred_cost = pred * np.array([c.usd_per_hour for c in CONFIGS]) / 3600
    limit = float(np.quantile(true, 0.2))
    ex = Explorer(CONFIGS, pred_cost, log_sigma=sigma, constrained=pred, limit=limit)
    run(ex, cost)
    best = ex.best()
    assert ex.feasible(best) and true[best] <= limit
    fits = true <= limit
    assert cost[best] <= 1.2 * cost[fits].min()


def test_features_add_and_validation() -> None:
    x = config_features([cfg(1, 4, 64), cfg(2, 8, 64)])
    assert x.shape == (2, 5)
    assert x[1, 0] == 1.0 and x[1, 4] == 1.0  # log2 nodes, multi-node flag
    mixed = config_features([cfg(1, 4, 64), cfg(1, 4, 64, "g5.12xlarge")])
    assert mixed.shape == (2, 7)  # one-hot instance types
    ex = Explorer([cfg(1, 4, 64)], [10.0])
    j = ex.add(cfg(2, 8, 64))
    assert j == 1 and ex.suggest() == 0  # the added config has no prediction: never suggested
    ex.observe(1, 5.0)
    assert ex.best() == 1
    with pytest.raises(InputError, match="shape"):
        Explorer([cfg(1, 4, 64)], [1.0, 2.0])
    with pytest.raises(InputError, match="predicted must be > 0"):
        Explorer([cfg(1, 4, 64)], [-1.0])
    with pytest.raises(InputError, match="out of range"):
        ex.observe(5, 1.0)
    with pytest.raises(InputError, match="both constrained values and a limit"):
        Explorer([cfg(1, 4, 64)], [1.0], limit=3.0)


def test_importing_the_explorer_loads_no_sklearn() -> None:
    code = "import sys, kplan.planner.explore; print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
