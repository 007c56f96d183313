from __future__ import annotations

import numpy as np
import pytest

from kplan.core.errors import InputError
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
    # the prior of a plain (TCP) NIC by default: P / (eta * BW), and its overlap across nodes
    eta, gamma = fit.prior_inter("tcp")
    assert fitted.inter_beta == pytest.approx(1e8 / (eta * 50e9 / 8))
    assert fitted.inter_gamma == gamma
    # over RDMA (EFA/RoCE) the NCCL efficiency measured inside a node, and the one-node overlap
    rdma = fit_perf_params(
        rows, gradient_bytes=1e8, intra_gbps=100.0, inter_gbps=50.0, inter_fabric="rdma"
    )
    assert rdma.inter_beta == pytest.approx(1e8 / (fit.PRIOR_ETA_INTER * 50e9 / 8))
    assert rdma.inter_gamma is None


def test_fabric_priors_are_physical_and_ordered() -> None:
    # TCP sockets reach far less of the NIC than RDMA, and overlap no better than one node's
    tcp_eta, tcp_gamma = fit.prior_inter("tcp")
    rdma_eta, _ = fit.prior_inter("rdma")
    assert 0.02 < tcp_eta < rdma_eta <= 1.0
    assert tcp_gamma is not None and 1.0 <= tcp_gamma <= fit.PRIOR_GAMMA
    assert 0.1 <= fit.PRIOR_INTER_LOG_SIGMA <= 0.5
    with pytest.raises(InputError, match="unknown NIC fabric"):
        fit.prior_inter("infiniband-ish")


def test_multi_node_rows_fit_the_overlap_across_nodes() -> None:
    # measured rows across nodes replace the fabric's overlap prior (inter_gamma None: gamma)
    fitted = fit_perf_params(_rows(params()), gradient_bytes=1e8, inter_gbps=50.0)
    assert fitted.inter_measured and fitted.inter_gamma is None


def test_log_sigma_reflects_noise() -> None:
    quiet = fit_perf_params(_rows(params(), noise=0.01))
    noisy = fit_perf_params(_rows(params(), noise=0.3, seed=1))
    assert quiet.log_sigma == pytest.approx(0.05)  # the floor
    assert noisy.log_sigma > 0.15
