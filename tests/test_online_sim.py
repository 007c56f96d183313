"""The trace-driven simulation of online adaptation (bench/online_sim.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bench import online_sim
from bench.online_sim import Progress, SimOptions, hindsight, load_truth, simulate
from kplan.planner import fit
from kplan.planner.profile import Measurement
from scripts.traces import data_root

needs_traces = pytest.mark.skipif(
    not (data_root() / "traces" / "pollux" / "t4").is_dir(),
    reason="the Pollux traces (../shared/data) are not here",
)
QUICK = SimOptions(replan_every=0.05, chunks=200)


@needs_traces
def test_the_space_and_the_profile_follow_the_protocol() -> None:
    truth = load_truth("bert")
    batches = np.array([c.global_batch for c in truth.configs])
    assert batches.min() >= truth.base_batch and batches.max() <= truth.max_batch
    assert {m.nodes for m in truth.profile} == {1}  # the profile measures one node only
    assert max(c.nodes for c in truth.configs) == 16  # scalability rows are in the space
    prices = np.array([c.usd_per_hour / c.nodes for c in truth.configs])
    np.testing.assert_allclose(prices, truth.node_price)
    assert truth.gns[0].progress > 0.0 and truth.gns[-1].progress == pytest.approx(1.0)


@needs_traces
def test_progress_steps_and_advance_are_inverse() -> None:
    truth = load_truth("cifar10")
    prog = Progress(truth, 50)
    n = prog.steps(0.1, 0.37, 1024)
    assert prog.advance(0.1, n, 1024) == pytest.approx(0.37)
    # At the base batch one step is one base-batch step of progress.
    assert prog.steps(0.0, 1.0, truth.base_batch) == pytest.approx(truth.progress)
    assert prog.steps(0.0, 1.0, 4096) > truth.progress * truth.base_batch / 4096


@needs_traces
def test_online_reaches_the_hindsight_best_on_bert() -> None:
    r = simulate("bert", QUICK)
    truth = load_truth("bert")
    usd, _ = hindsight(truth, Progress(truth, QUICK.chunks), QUICK)
    assert r.best_usd == pytest.approx(usd.min())
    assert r.online.trials >= 1
    assert r.online.explore_usd <= QUICK.overhead * r.static_usd + 1.0
    assert r.online.cost <= 1.05 * r.best_usd
    assert r.online.final is not None


@needs_traces
def test_quick_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    results = online_sim.main(["--quick", "--models", "bert"])
    out = capsys.readouterr().out
    assert "hindsight best" in out and "bert" in out
    assert len(results) == 1 and results[0].ratio > 0


@needs_traces
def test_a_deadline_does_not_lock_the_job_into_the_dearest_cluster() -> None:
    # cifar10, deadline halfway (geometrically) between the fastest and the cheapest config:
    # the early forecast's spread made every config miss at its p90, and the job took the
    # best chance at any price (16 nodes until 88% of the job: 4.7x the hindsight best).
    # Issue 15 item 5: with the plain-TCP inter-node prior (multi-node steps no longer 0.59x of
    # the measured) the model's first trial is 8 nodes, not 2, and the coarse re-plans of QUICK
    # take one detour (4 nodes) before 3: 1.19x here (0.84x with the former optimistic prior);
    # at the default re-plan interval cifar10 is 1.12x (1.29x before).
    # 2026-11-27: node counts between the measured ones (2-7 after a trial at 8) now carry
    # their held-out sigma (fit.PRIOR_NODES_LOG_SIGMA: their p90 covered 82% of the measured
    # times, now 92%), so fewer clusters are safe at their p90 and the job takes a detour via
    # 6 nodes: 1.31x here, 1.34x at the default interval. Still far from the dearest cluster.
    r = simulate("cifar10", replace(QUICK, deadline_frac=0.5))
    assert r.deadline_s is not None and r.online.seconds <= r.deadline_s
    assert r.online.cost <= 1.40 * r.best_usd


def test_implied_gradient_bytes_reads_the_ring_all_reduce_back() -> None:
    # Syncs made by the PCIe prior's ring all-reduce of 30 MB over a 100 Gbit/s link.
    size, gbps = 30e6, 100.0
    (eta, _), c0 = fit.prior_intra("pcie"), fit.PRIOR_NCCL_CALL
    rows = [
        Measurement(1, k, 64, 0.1, c0 + size * 2 * (k - 1) / k / (eta * gbps * 1e9 / 8))
        for k in (2, 3, 4)
    ]
    one_gpu = Measurement(1, 1, 64, 0.09, 0.0)
    assert online_sim.implied_gradient_bytes([one_gpu, *rows], gbps, "pcie") == pytest.approx(size)
    # read at the NVLink efficiency, the same waits mean more bytes
    nvlink = online_sim.implied_gradient_bytes(rows, gbps)
    assert nvlink == pytest.approx(size * fit.prior_intra(None)[0] / eta)
    assert online_sim.implied_gradient_bytes([one_gpu], gbps, "pcie") is None


@needs_traces
def test_ncf_gets_a_gradient_size_and_keeps_its_zero_slack_deadline() -> None:
    # ncf's size is not published. With none, the inter-node bandwidth term was zero: every
    # multi-node config looked no slower than one node (0.30x of its measured steps), and the
    # deadline run took 2 nodes (2.5x the hindsight best, deadline missed). Its fastest config
    # is its cheapest, so the deadline is that config's own time: a run of it must not "miss"
    # by the rounding of its re-plan intervals either.
    truth = load_truth("ncf")
    assert online_sim.GRADIENT_BYTES["ncf"] is None
    size = online_sim.gradient_bytes(truth)
    assert size is not None and 1e6 < size < 1e9
    r = simulate("ncf", replace(QUICK, deadline_frac=0.5))
    assert r.deadline_s is not None
    assert online_sim._met(r, r.online.seconds) == "" and online_sim._met(r, r.adapt_s) == ""
    assert r.online.cost <= 1.10 * r.best_usd


@needs_traces
def test_the_hindsight_best_keeps_a_zero_slack_deadline_through_rounding() -> None:
    # ncf's fastest config is its cheapest: fastest^0.7 x cheapest^0.3 is that config's time,
    # a few 1e-14 s below it after rounding; the hindsight best was then "no config" (index 0:
    # 1 GPU at B=257, 10x the cheapest) instead of the fastest and cheapest config.
    truth = load_truth("ncf")
    usd, seconds = hindsight(truth, Progress(truth, QUICK.chunks), QUICK)
    assert np.argmin(usd) == np.argmin(seconds)
    r = simulate("ncf", replace(QUICK, deadline_frac=0.3))
    assert r.best_usd == pytest.approx(float(usd.min()))
    assert online_sim.within(r.online.seconds, r.deadline_s or 0.0)
