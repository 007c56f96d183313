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

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.runtime.state import JobState
from kplan.runtime.sync import squared_norm


def stash_micro_grad(st: JobState, last: bool) -> None:
    """One worker with accumulation: keep each micro-batch's gradient norm apart."""
    params, grads = st.sync.grads()
    # The grads are of loss/s, times the fp16 loss scale S (unscaled only at the step's end).
    scale = float(st.accum_steps) ** 2 / st.amp.scale_sq()
    st.micro_sqr.append(squared_norm(params, grads, st.precond) * scale)
    for p in st.params:
        acc = st.acc.get(id(p))
        if not last:
            if p.grad is not None:
                st.acc[id(p)] = p.grad if acc is None else acc.add_(p.grad)
                p.grad = None
        elif acc is not None:
            p.grad = acc if p.grad is None else p.grad.add_(acc)
    if last:
        st.acc = {}


def single_worker_terms(st: JobState) -> tuple[list[torch.Tensor], list[int], torch.Tensor] | None:
    """(small norms, their batches, big norm) for one worker, before the optimizer step."""
    params, grads = st.sync.grads()
    big = squared_norm(params, grads, st.precond)
    b = st.step_sizes[0]
    if st.accum_steps > 1:
        return st.micro_sqr, [b] * st.accum_steps, big
    prev, prev_b = st.prev_grads, st.prev_batch
    st.prev_grads = [g.detach().clone() for g in grads]
    st.prev_batch = b
    if prev is None or len(prev) != len(grads):
        return None
    total = prev_b + b
    combined = [(pg * prev_b + g * b) / total for pg, g in zip(prev, grads, strict=True)]
    small = [squared_norm(params, prev, st.precond), big]
    return small, [prev_b, b], squared_norm(params, combined, st.precond)
