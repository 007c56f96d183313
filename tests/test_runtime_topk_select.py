"""The sampled-threshold top-k selection (compression/kernels.py fast_topk_select, issue 14)."""

from __future__ import annotations

import math

import torch

from kplan.runtime.compression.kernels import (
    FAST_SELECT_MIN,
    fast_topk_select,
    split_sent,
    topk_select,
)


def _reference(a: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(torch.topk(a.abs(), k, sorted=False).indices).values


def test_distinct_values_same_set_as_torch_topk() -> None:
    n = 300_000
    gen = torch.Generator().manual_seed(3)
    # Distinct, well separated magnitudes (a permutation of 1..n), random signs.
    mags = torch.randperm(n, generator=gen).float() + 1.0
    signs = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    a = mags * signs
    for ratio in (0.001, 0.01, 0.05, 0.3):
        k = math.ceil(ratio * n)
        for seed in (0, 1, 12345):
            idx = fast_topk_select(a, k, seed)
            assert idx.dtype == torch.int64
            assert idx.numel() == k
            assert torch.equal(idx, _reference(a, k)), (ratio, seed)
            assert bool((idx[1:] > idx[:-1]).all())  # ascending, distinct


def test_random_normal_near_optimal_energy_and_exact_k() -> None:
    gen = torch.Generator().manual_seed(7)
    for n in (FAST_SELECT_MIN, 1 << 20):
        a = torch.randn(n, generator=gen)
        for ratio in (0.001, 0.01, 0.1):
            k = math.ceil(ratio * n)
            idx = topk_select(a, k, seed=5)
            assert idx.numel() == k
            assert torch.unique(idx).numel() == k
            ref = _reference(a, k)
            got = float((a[idx] ** 2).sum())
            best = float((a[ref] ** 2).sum())
            assert got >= 0.98 * best, (n, ratio, got / best)


def test_heavy_tail_and_ties_exact_k() -> None:
    n = 200_000
    gen = torch.Generator().manual_seed(11)
    a = torch.zeros(n)
    a[torch.randperm(n, generator=gen)[:50]] = 1e6  # a sample likely misses these
    a[torch.randperm(n, generator=gen)[:1000]] = 3.0  # ties at the boundary
    for k in (10, 50, 51, 700, 2000, 5000):
        idx = fast_topk_select(a, k, seed=2)
        assert idx.numel() == k
        assert torch.unique(idx).numel() == k
        assert math.isclose(float(a[idx].abs().sum()), float(a[_reference(a, k)].abs().sum()))


def test_deterministic_and_error_feedback_exact() -> None:
    a = torch.randn(500_000, generator=torch.Generator().manual_seed(1))
    k = math.ceil(0.01 * a.numel())
    first = topk_select(a, k, seed=99)
    assert torch.equal(first, topk_select(a, k, seed=99))
    values, residual = split_sent(a, first)
    rebuilt = residual.clone()
    rebuilt[first] += values
    assert torch.equal(rebuilt, a)  # sent + residual = a, bit for bit
    assert int((residual[first] != 0).sum()) == 0


def test_small_parameter_keeps_torch_topk() -> None:
    a = torch.randn(FAST_SELECT_MIN - 1, generator=torch.Generator().manual_seed(4))
    k = 100
    assert torch.equal(topk_select(a, k, seed=1), _reference(a, k))
