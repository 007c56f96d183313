from __future__ import annotations

import numpy as np
import pytest

from kplan.planner import fit, perfmodel
from kplan.planner.fit import fit_perf_params
from kplan.planner.profile import Measurement
from tests.planner_fixtures import params

PLACEMENTS = [(1, 1), (1, 2), (1, 4), (2, 8), (4, 16)]
BATCHES = [8, 16, 32, 64, 128]


def _rows(p: perfmodel.PerfParams, noise: float = 0.0, seed: int = 0) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    rows = []
    for n, k in PLACEMENTS:
        for b in BATCHES:
            t = float(perfmodel.step_time(p, n, k, b)) * float(np.exp(rng.normal(0, noise)))
            s = float(perfmodel.exposed_sync_time(p, n, k, b))
            rows.append(Measurement(n, k, b, t, min(s, t)))
    return rows


def test_recovers_step_times_from_noiseless_rows() -> None:
    truth = params(two_node=0.4)
    fitted = fit_perf_params(_rows(truth))
    test = [(3, 12, 24), (8, 32, 50), (16, 64, 100), (2, 5, 40)]
    for n, k, b in test:
        assert float(perfmodel.step_time(fitted, n, k, b)) == pytest.approx(
            float(perfmodel.step_time(truth, n, k, b)), rel=0.05
        )
    assert fitted.two_node == pytest.approx(0.4, abs=0.1)
    assert fitted.inter_measured and fitted.max_nodes_measured == 4


def test_robust_to_one_wild_row() -> None:
    truth = params()
    rows = _rows(truth, noise=0.02)
    bad = rows[3]
    rows[3] = Measurement(bad.nodes, bad.workers, bad.local_batch, bad.step_time * 5, None)
    fitted = fit_perf_params(rows)
    t = float(perfmodel.step_time(fitted, 3, 12, 32))
    assert t == pytest.approx(float(perfmodel.step_time(truth, 3, 12, 32)), rel=0.1)


def test_single_node_profile_keeps_inter_node_priors() -> None:
    truth = params()
    rows = [r for r in _rows(truth) if r.nodes == 1]
    fitted = fit_perf_params(rows, gradient_bytes=1e8, intra_gbps=100.0, inter_gbps=50.0)
    assert not fitted.inter_measured
    assert fitted.two_node == 0.0
    # the prior: P / (eta * BW) with eta = fit.PRIOR_ETA_INTER
    assert fitted.inter_beta == pytest.approx(1e8 / (fit.PRIOR_ETA_INTER * 50e9 / 8))


def test_log_sigma_reflects_noise() -> None:
    quiet = fit_perf_params(_rows(params(), noise=0.01))
    noisy = fit_perf_params(_rows(params(), noise=0.3, seed=1))
    assert quiet.log_sigma == pytest.approx(0.05)  # the floor
    assert noisy.log_sigma > 0.15
