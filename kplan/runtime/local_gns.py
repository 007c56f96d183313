"""Gradient noise scale with one worker: micro-batches or consecutive steps as the small batches.

With gradient accumulation over s micro-batches of b samples, the micro-batch gradients are s
"workers" of b samples each and their mean is the big batch (gns.py's formulas with k = s).
Their gradients are kept apart by moving each micro-batch's gradient into a buffer after its
norm is taken (one extra copy of the gradients). Without accumulation, the previous step's
gradient (a copy kept for one step) and this step's form the pair; the parameters moved in
between, so this is the least accurate of the variants (small learning rates keep the bias small).

How small (derived here for plain SGD at learning rate η with Hessian H; a simulation with exact
per-sample gradients in tests/test_runtime_gns_units.py matches it): the pair's
|G|² sample is g_{t-1}·g_t, and g_t's true gradient moved by -η H g_{t-1}, which is correlated
with g_{t-1}'s own noise, so E[sample] = |G|² - η (GᵀHG + tr(HΣ)/b): |G|² reads low by a
relative η λ (1 + B_noise/b) for a typical curvature λ, and the noise scale high by as much or
more. Near convergence (B_noise >> b) that is not small: in the simulation (η 0.02, λ 2, b 64,
B_noise 580) |G|² reads 38% low, the noise scale ~1.6x high. Micro-batches (``accum_steps``
>= 2) or two workers pair gradients at the same parameters and have no such bias.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.runtime.sync import squared_norm

if TYPE_CHECKING:
    from kplan.runtime.job import Job


def stash_micro_grad(job: Job, last: bool) -> None:
    """One worker with accumulation: keep each micro-batch's gradient norm apart."""
    params, grads = job._sync.grads()
    # The grads are of loss/s, times the fp16 loss scale S (unscaled only at the step's end).
    scale = float(job.accum_steps) ** 2 / job.amp.scale_sq()
    job._micro_sqr.append(squared_norm(params, grads, job._precond) * scale)
    for p in job._params:
        acc = job._acc.get(id(p))
        if not last:
            if p.grad is not None:
                job._acc[id(p)] = p.grad if acc is None else acc.add_(p.grad)
                p.grad = None
        elif acc is not None:
            p.grad = acc if p.grad is None else p.grad.add_(acc)
    if last:
        job._acc = {}


def single_worker_terms(job: Job) -> tuple[list[torch.Tensor], list[int], torch.Tensor] | None:
    """(small norms, their batches, big norm) for one worker, before the optimizer step."""
    params, grads = job._sync.grads()
    big = squared_norm(params, grads, job._precond)
    b = job._step_sizes[0]
    if job.accum_steps > 1:
        return job._micro_sqr, [b] * job.accum_steps, big
    prev, prev_b = job._prev_grads, job._prev_batch
    job._prev_grads = [g.detach().clone() for g in grads]
    job._prev_batch = b
    if prev is None or len(prev) != len(grads):
        return None
    total = prev_b + b
    combined = [(pg * prev_b + g * b) / total for pg, g in zip(prev, grads, strict=True)]
    small = [squared_norm(params, prev, job._precond), big]
    return small, [prev_b, b], squared_norm(params, combined, job._precond)
