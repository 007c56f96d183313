"""The tensor kernels of compression, unit-tested without a process group: top-k selection
(exact, and the sampled threshold for large parameters), the sent/residual split of error
feedback, the sparse sum of AR-Topk and the rank-ordered sum of AG-Topk's gathered parts,
AG-Topk's two all-gathers, and PowerSGD's orthonormalisation."""

from __future__ import annotations

import math
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)
import torch.distributed as dist  # noqa: TID253

Future = torch.futures.Future


FAST_SELECT_MIN = 1 << 16
"""Parameters with at least this many elements use the sampled-threshold selection."""
SELECT_SAMPLE = 16384
"""Sample size of the sampled-threshold selection."""


def topk_select(a: torch.Tensor, k: int, seed: int | None = None) -> torch.Tensor:
    """Indices of the ``k`` largest |a| entries (int64, ascending: a fixed order on all ranks).

    With ``seed`` and at least FAST_SELECT_MIN elements, the sampled-threshold selection
    (fast_topk_select); else torch.topk over all of ``a``.
    """
    if k >= a.numel():
        return torch.arange(a.numel(), device=a.device)
    if seed is not None and a.numel() >= FAST_SELECT_MIN and k > 0:
        return fast_topk_select(a, k, seed)
    idx = torch.topk(a.abs(), k, sorted=False).indices
    return torch.sort(idx).values


def fast_topk_select(
    a: torch.Tensor, k: int, seed: int, sample: int = SELECT_SAMPLE
) -> torch.Tensor:
    """The ``k`` largest |a| entries (ascending int64 indices), from a sampled threshold.

    A sample of ``sample`` positions (drawn from a generator seeded by ``seed``: the same on
    every run) estimates a threshold t that about 1.5 k entries (plus four binomial standard
    deviations) reach; the candidates |a| >= t are found with one pass, and torch.topk among
    them picks exactly k. When at least k entries pass, the set is torch.topk's over all of
    ``a`` (up to the choice among equal values), whatever the sample; when fewer pass (a
    sample that missed the large values), the threshold is lowered once to about 4 k, then
    torch.topk over all of ``a`` is the fallback. Exactly k indices either way.
    """
    n = a.numel()
    if k >= n:
        return torch.arange(n, device=a.device)
    mag = a.abs()
    if sample >= n // 4:
        return torch.sort(torch.topk(mag, k, sorted=False).indices).values
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    pos = torch.randint(n, (sample,), generator=gen).to(a.device)
    ranked = torch.sort(mag[pos], descending=True).values
    expect = sample * k / n
    for factor in (1.5, 4.0):
        m = math.ceil(factor * expect + 4.0 * math.sqrt(expect) + 1.0)
        if m >= sample:
            break
        cand = torch.nonzero(mag >= ranked[m - 1]).squeeze(1)
        if cand.numel() >= k:
            best = torch.topk(mag[cand], k, sorted=False).indices
            return torch.sort(cand[best]).values
    return torch.sort(torch.topk(mag, k, sorted=False).indices).values


def split_sent(a: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values sent, new residual): a at ``idx``, and a with those entries zeroed (exact)."""
    values = a[idx]
    residual = a.clone()
    residual[idx] = 0
    return values, residual


def scatter_reduced(numel: int, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """AR-Topk's decode: the all-reduced ``values`` at ``idx`` in a dense bucket of ``numel``
    zeros (every worker sent the same indices)."""
    out = torch.zeros(numel, dtype=values.dtype, device=values.device)
    out[idx.long()] = values
    return out


def combine_gathered(
    numel: int, parts: list[tuple[torch.Tensor, torch.Tensor]], like: torch.Tensor
) -> torch.Tensor:
    """Σ over workers (in rank order) of each worker's sparse (indices, values), dense."""
    out = torch.zeros(numel, dtype=like.dtype, device=like.device)
    for idx, values in parts:
        # One worker's indices are distinct: gather, add, scatter is exact and deterministic
        # (index_add_ uses atomics on CUDA, whose order could differ between ranks).
        where = idx.long()
        out[where] = out[where] + values
    return out


def all_gather_topk(
    works: list[Any], values: torch.Tensor, idx32: torch.Tensor, world: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """AG-Topk's two asynchronous all-gathers (values, int32 indices), appended to ``works``."""
    vals = [torch.empty_like(values) for _ in range(world)]
    ids = [torch.empty_like(idx32) for _ in range(world)]
    works.append(dist.all_gather(vals, values, async_op=True))
    works.append(dist.all_gather(ids, idx32, async_op=True))
    return vals, ids


def orthonormalise(p: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning ``p`` (reduced QR; float32 or float64 in, same out)."""
    q: torch.Tensor = torch.linalg.qr(p, mode="reduced").Q
    return q
