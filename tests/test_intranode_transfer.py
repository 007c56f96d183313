"""bench/intranode_transfer.py: the one-GPU -> one-node protocol on the Pollux T4 traces, and
the per-link intra-node prior it fits (fit.prior_intra), as kplan estimate applies it."""

from __future__ import annotations

import numpy as np
import pytest

from bench import intranode_transfer as it
from kplan.planner import costs, fit, perfmodel
from kplan.planner.perfmodel import PerfParams
from scripts.traces import data_root

pytestmark = pytest.mark.skipif(
    not (data_root() / "traces" / "pollux" / "t4").is_dir(), reason="shared Pollux traces absent"
)


@pytest.fixture(scope="module")
def before() -> it.Fitted:
    out = {}
    for m in it.SCORED:
        s = it.load_split(m)
        assert (s.one.workers == 1).all() and (s.multi.workers > 1).all()
        assert (s.multi.nodes == 1).all()
        out[m] = (it.fit_one_gpu(s, None), s.multi)
    return out


def test_a_one_gpu_fit_takes_the_links_prior(before: it.Fitted) -> None:
    s = it.load_split("imagenet")
    nvlink, pcie = it.fit_one_gpu(s, "nvlink"), it.fit_one_gpu(s, "pcie")
    assert nvlink.max_workers_measured == pcie.max_workers_measured == 1
    eta, gamma = fit.prior_intra("pcie")
    assert pcie.gamma == pytest.approx(gamma) and nvlink.gamma == pytest.approx(fit.PRIOR_GAMMA)
    assert pcie.gradient_bytes is not None and pcie.intra_gbps is not None
    bytes_per_s = pcie.gradient_bytes / pcie.intra_beta
    assert bytes_per_s == pytest.approx(eta * pcie.intra_gbps * 1e9 / 8, rel=1e-6)
    assert fit.prior_intra(None) == fit.prior_intra("none") == (fit.PRIOR_ETA_INTRA, 2.5)
    assert fit.PRIOR_GAMMA_INTRA_BY_LINK["nvlink"] == fit.PRIOR_GAMMA
    with pytest.raises(Exception, match="unknown GPU link"):
        fit.prior_intra("infinity-fabric")


def test_shipped_pcie_prior_is_the_fit_on_the_five_models(before: it.Fitted) -> None:
    eta, gamma = it.fit_prior(before, it.SCORED)
    shipped_eta, shipped_gamma = fit.prior_intra("pcie")
    assert shipped_eta == pytest.approx(eta, rel=0.05)
    assert shipped_gamma == pytest.approx(gamma, rel=0.05)


def test_held_out_prior_is_unbiased_and_its_sigma_is_calibrated(before: it.Fitted) -> None:
    errors = it.held_out_errors(before, it.SCORED)
    # the held-out RMS log error is what fit.py states for an unmeasured intra-node term
    assert it.rms(errors) == pytest.approx(fit.PRIOR_INTRA_LOG_SIGMA, abs=0.015)
    err = np.concatenate(list(errors.values()))
    assert abs(float(np.mean(err))) < 0.05  # the NVLink prior on PCIe: log(0.89) = -0.12
    old = np.concatenate([np.log(it.predict(p, r) / r.step_time) for p, r in before.values()])
    assert float(np.mean(old)) < -0.08  # what the per-link prior removes
    # the measured time is at or below the shipped p90 (the sigma kplan states for these rows)
    shipped = {m: (it.fit_one_gpu(it.load_split(m), "pcie"), r) for m, (_, r) in before.items()}
    hits = [
        np.log(it.predict(p, r) / r.step_time) >= -costs.Z90 * it.stated_sigma(p, r)
        for p, r in shipped.values()
    ]
    assert 0.85 <= float(np.mean(np.concatenate(hits))) <= 0.99


def _one_gpu(intra_gbps: float) -> PerfParams:
    return PerfParams(
        compute_a=0.01, compute_b=0.001, gamma=2.5, intra_alpha=1e-3, intra_beta=0.05,
        intra_lat=1e-5, inter_alpha=1e-3, inter_beta=0.1, inter_lat=5e-5, two_node=0.0,
        log_sigma=0.05, gradient_bytes=1e8, intra_gbps=intra_gbps, inter_gbps=50.0,
        max_workers_measured=1,
    )  # fmt: skip


def test_the_stated_sigma_adds_the_intra_prior_only_where_a_node_shares_gpus() -> None:
    p = _one_gpu(100.0)
    sig = fit.prior_log_sigma(p, np.array([1.0, 1.0]), np.array([1.0, 4.0]))
    assert sig[0] == pytest.approx(0.05)
    assert sig[1] == pytest.approx(np.hypot(0.05, fit.PRIOR_INTRA_LOG_SIGMA))
    measured = perfmodel.replace_fields(p, max_workers_measured=4)
    assert fit.prior_log_sigma(measured, np.array([1.0]), np.array([4.0]))[0] == 0.05


def test_kplan_estimate_plans_a_one_gpu_profile_with_the_targets_link_prior() -> None:
    """for_instance rebuilds the intra-node terms of a one-GPU profile from the prior of each
    instance's GPU link: PCIe (g4dn.12xlarge) slower and unoverlapped, NVLink as before."""
    from dataclasses import replace

    from kplan.app.planning import estimate, load_example
    from kplan.catalogs import load_catalog
    from kplan.catalogs.device_model import load_device_model
    from kplan.planner.search import SearchOptions
    from kplan.planner.workload import for_instance

    est = estimate(load_example("imagenet-resnet50"), SearchOptions(clouds=("aws",)))
    w = replace(est.workload, params=perfmodel.replace_fields(
        est.workload.params, max_workers_measured=1, gamma=fit.PRIOR_GAMMA
    ))  # fmt: skip
    cat, dm = load_catalog(), load_device_model()
    for name, link in (("g4dn.12xlarge", "pcie"), ("p4d.24xlarge", "nvlink")):
        inst = cat.instances[("aws", name)]
        assert inst.interconnect == link and inst.gpu_count > 1
        p = for_instance(w, inst, cat.gpus[inst.gpu], dm).params
        eta, gamma = fit.prior_intra(link)
        assert p.gamma == pytest.approx(gamma)
        assert p.gradient_bytes is not None
        bytes_per_s = p.gradient_bytes / p.intra_beta
        assert bytes_per_s == pytest.approx(eta * inst.interconnect_gbps * 1e9 / 8, rel=1e-9)
    # a profile that measured several GPUs keeps its own intra-node terms
    inst = cat.instances[("aws", "g4dn.12xlarge")]
    kept = for_instance(est.workload, inst, cat.gpus[inst.gpu], dm).params
    assert kept.gamma == pytest.approx(est.workload.params.gamma)
