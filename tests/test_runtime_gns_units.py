"""GnsEstimator's standard error and effective number of steps (runtime/gns.py, "Precision")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kplan.runtime.gns import GnsEstimator, GnsSample, estimate


def test_effective_steps_counts_the_first_samples_then_tends_to_the_ema_limit() -> None:
    est = GnsEstimator(smoothing=0.9)
    assert est.effective_steps == 0.0
    est.update(GnsSample(1.0, 10.0))
    assert est.effective_steps == pytest.approx(1.0)
    for _ in range(2000):
        est.update(GnsSample(1.0, 10.0))
    assert est.effective_steps == pytest.approx((1 + 0.9) / (1 - 0.9), rel=1e-6)
    flat = GnsEstimator(smoothing=0.0)  # only the last sample counts
    for _ in range(5):
        flat.update(GnsSample(1.0, 10.0))
    assert flat.effective_steps == pytest.approx(1.0)


@pytest.mark.parametrize(("smoothing", "steps", "sd"), [(0.99, 3000, 1.5), (0.998, 400, 2.0)])
def test_rel_error_matches_the_scatter_of_the_noise_scale(
    smoothing: float, steps: int, sd: float
) -> None:
    """Independent noisy samples of |G|² (sd 1.5-2x its mean: B_noise/B ~ 3-4 in gns.py's
    "Precision") and of tr(Σ), negatively correlated as the two estimates from one step are:
    the reported relative error agrees with the spread of the reported GNS over repeats, late
    (n_eff ~ (1 + β)/(1 - β)) and early (n_eff ~ count), where the error is ~10% (the delta
    method's range)."""
    rng = np.random.default_rng(3)
    sqr, var = 1.0, 500.0
    cov = [[sd**2, -0.3 * sd * 175.0], [-0.3 * sd * 175.0, 175.0**2]]
    values, errors = [], []
    for _ in range(300):
        est = GnsEstimator(smoothing)
        for q, v in rng.multivariate_normal([sqr, var], cov, size=steps):
            est.update(GnsSample(float(q), float(v)))
        assert est.gns is not None and est.rel_error is not None
        values.append(est.gns)
        errors.append(est.rel_error)
    spread = float(np.std(np.log(values)))  # relative scatter, robust to the ratio's skew
    assert float(np.median(errors)) == pytest.approx(spread, rel=0.15)
    assert spread > 0.04  # not vacuous: the noise is large


def test_rel_error_is_none_until_meaningful_and_survives_a_checkpoint() -> None:
    est = GnsEstimator(0.9)
    est.update(GnsSample(1.0, 10.0))
    est.update(GnsSample(2.0, 11.0))
    early = est.rel_error
    assert early is None  # fewer than 3 samples
    est.update(GnsSample(1.5, 12.0))
    err = est.rel_error
    assert err is not None and 0.0 < err < 1.0
    clone = GnsEstimator(0.9)
    clone.load_state_dict(est.state_dict())
    assert clone.rel_error == pytest.approx(err) and clone.gns == est.gns
    # A state saved before the error was tracked: the value resumes, its error is unknown.
    old = {k: v for k, v in est.state_dict().items() if k != "moments"}
    legacy = GnsEstimator(0.9)
    legacy.load_state_dict(old)
    assert legacy.gns == est.gns and legacy.rel_error is None
    legacy.update(GnsSample(1.0, 10.0))
    assert legacy.rel_error is None and legacy.gns is not None and math.isfinite(legacy.gns)


def test_consecutive_steps_pair_reads_low_by_the_derived_training_bias() -> None:
    """kplan/runtime/local_gns.py: one worker without micro-batches pairs the previous step's
    gradient with this one; after an SGD step of η in between, the |G|² sample (with the
    finite-set correction) is low by η (GᵀHG + tr(HΣ)/b (N - b)/(N - 1)), not zero. A linear
    regression with exact per-sample gradients, pairs of steps from one fixed point."""
    rng = np.random.default_rng(0)
    n, b, eta = 2048, 64, 0.02
    x = np.c_[rng.normal(size=(n, 16)), np.ones(n)]
    y = x @ rng.normal(size=17) + rng.normal(size=n)
    fit = np.linalg.lstsq(x, y, rcond=None)[0]
    d = rng.normal(size=17)
    start = fit + 0.18 * d / np.linalg.norm(d)  # B_noise ~ 580, over N/5

    def per_sample(theta: np.ndarray) -> np.ndarray:
        return np.asarray(2.0 * (x @ theta - y)[:, None] * x)

    grads = per_sample(start)
    g = grads.mean(axis=0)
    cov = (grads - g).T @ (grads - g) / n
    hess = 2.0 * x.T @ x / n
    samples = []
    for _ in range(4000):
        idx = rng.permutation(n)[: 2 * b]
        first = grads[idx[:b]].mean(axis=0)
        second = per_sample(start - eta * first)[idx[b:]].mean(axis=0)
        big = (first + second) / 2
        pair = estimate([float(first @ first), float(second @ second)], [b, b], float(big @ big), n)
        samples.append(pair.grad_sqr)
    bias = float(np.mean(samples)) - float(g @ g)
    stderr = float(np.std(samples)) / math.sqrt(len(samples))
    predicted = -eta * (g @ hess @ g + np.trace(hess @ cov) / b * (n - b) / (n - 1))
    assert predicted < -0.3 * float(g @ g)  # a large bias here: the test is not vacuous
    assert abs(bias - predicted) < 4 * stderr + 0.01 * abs(predicted)
