"""Top-k compression with momentum SGD: the momentum folded into the step size (issue 14).

Used by compression/ for ``topk`` and ``adaptive`` when the optimizer is ``torch.optim.SGD``
with momentum; docs/runtime.md has the measurements behind the choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.core.errors import InputError
from kplan.runtime.momentum import compensated, sgd_momentum


class MomentumFold:
    """Top-k with momentum SGD: error feedback at the SGD-equivalent step, the optimizer's own
    momentum cancelled for the exchanged update (``torch.optim.SGD`` untouched).

    Why: error feedback on the gradient with the optimizer's momentum applied after the
    exchange (the obvious composition) diverges at top-k ratios of a few percent with momentum
    0.9: a coordinate's gradient waits ~1/ratio steps in the residual, is released at once,
    and the momentum buffer keeps pushing it for ~1/(1-m) more steps while the gradients that
    would stop it wait in the residual again. Heavy-ball momentum is stable up to
    lr λ < 2(1+m), plain SGD only to lr λ < 2; momentum keeps that margin only when every
    coordinate is updated every step, which sparse, delayed updates are not. (DGC's momentum
    correction, accumulating the local velocity u = m u + g in the residual and masking u where
    sent, was measured too; it trained 3-20x worse than dense at ratios 0.01-0.05:
    docs/runtime.md.)

    What: in dense momentum SGD each gradient moves the weights by lr (1-d)/(1-m) in all (the
    SGD-equivalent step, kplan/runtime/momentum.py). So each worker feeds error feedback with
    s = (1-d)/(1-m) times its weighted gradient (nesterov: 1/(1-m)), weight decay included
    (w the worker's batch share, Σ w = 1)::

        a <- r + s w (g + wd θ);   send top-k(a);   r <- a - sent;   θ <- θ - lr Σ_workers sent

    Nothing is lost (Σ sent + Σ r = Σ s g' over the run, as dense momentum's total). The step
    is plain SGD on the exchanged update D: the hook returns the ``G`` for which torch's SGD step
    (d_p = G + wd θ; buf <- m buf + (1-d) d_p, buf <- d_p on the first step; update buf, or
    d_p + m buf with nesterov) applies exactly D::

        G = (D - m buf)/(1-d) - wd θ          G = (D - m² buf)/(1+m) - wd θ   (nesterov)

    with ``buf`` the optimizer's momentum buffer before the step (absent: 0, and no 1/(1-d)).
    The optimizer's buffer then equals D after each step (to rounding), and its state, the
    script's scheduler and checkpoints are the script's own; ``.grad`` after the exchange holds
    G, not the mean gradient. Under momentum compensation of a batch change (runtime/momentum.py:
    ``m^k`` and the LR x ``(1 - m^k)/(1 - m)`` during ``optimizer.step()``), ``m`` is the step's
    compensated value (``ratio`` = ``k``, set by the job before the step's exchange): the step
    then applies ``lr' D`` and each gradient moves the weights by ``lr' s = lr/(1 - m)`` in all,
    as compensated dense momentum SGD does. It is stable where plain SGD at lr/(1-m) is (measured:
    docs/runtime.md). A dense step (the GNS sample, job.py) sends the plain weighted gradient
    w g; the rest of s w g' stays in r. Groups with ``momentum == 0`` use plain error feedback.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        self.optimizer = optimizer
        self.params = list(params)
        groups: dict[int, dict[str, Any]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                groups[id(p)] = group
        self._groups = [groups.get(id(p)) for p in self.params]
        self.weight = 1.0
        """This worker's batch share b_i/B this step (weight decay is weighted with it)."""
        self.ratio = 1.0
        """The batch ratio ``k`` the momentum compensation uses at this step's optimizer step
        (``MomentumCompensator.ratio``; 1: none)."""

    @staticmethod
    def needed(optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` is SGD with momentum in some group (the case folded)."""
        # exactly torch's SGD: a subclass may step differently, and G would then be wrong
        return type(optimizer) is torch.optim.SGD and any(
            float(g.get("momentum", 0.0) or 0.0) > 0 for g in optimizer.param_groups
        )

    @staticmethod
    def check(optimizer: torch.optim.Optimizer, spec: str) -> None:
        """InputError for the SGD settings whose momentum cannot be cancelled."""
        for g in optimizer.param_groups:
            if float(g.get("momentum", 0.0) or 0.0) <= 0:
                continue
            if g.get("maximize", False):
                raise InputError(
                    f"compression {spec} with momentum SGD does not support maximize=True",
                    "minimise the negated objective, or use compression powersgd:RANK or bf16",
                )
            if float(g.get("dampening", 0.0)) >= 1.0:
                raise InputError(
                    f"compression {spec} with momentum SGD needs dampening < 1, got "
                    f"{g['dampening']}",
                    "use dampening=0 (PyTorch's default)",
                )

    def _hyper(self, j: int) -> tuple[float, float, float, bool] | None:
        """(momentum, dampening, weight decay, nesterov) of parameter ``j``; None: no momentum."""
        group = self._groups[j]
        if group is None:
            return None
        m = float(group.get("momentum", 0.0) or 0.0)
        if m <= 0:
            return None
        if self.ratio != 1.0 and sgd_momentum(group):  # what the compensator sets for the step
            m = compensated(m, self.ratio)
        return m, float(group["dampening"]), float(group["weight_decay"]), bool(group["nesterov"])

    def increment(self, j: int, grad: torch.Tensor) -> torch.Tensor | None:
        """s w (g + wd θ) of parameter ``j`` from its weighted gradient ``grad`` = w g (a new
        tensor); None: no momentum for this parameter (plain error feedback)."""
        hyper = self._hyper(j)
        if hyper is None:
            return None
        m, d, wd, nesterov = hyper
        scale = (1.0 if nesterov else 1.0 - d) / (1.0 - m)
        out = grad * scale
        if wd != 0:
            out.add_(self.params[j].detach().reshape(-1), alpha=scale * self.weight * wd)
        return out

    def inverse(self, j: int) -> tuple[float, torch.Tensor | None] | None:
        """(c, z) with G = c (D - z) for parameter ``j`` (the class docstring), read before the
        optimizer step; None: no momentum (G = D)."""
        hyper = self._hyper(j)
        if hyper is None:
            return None
        m, d, wd, nesterov = hyper
        p = self.params[j]
        buf = self.optimizer.state.get(p, {}).get("momentum_buffer")
        z: torch.Tensor | None = None
        if nesterov:
            c = 1.0 / (1.0 + m)
            if buf is not None:
                z = (m * m) * buf.detach().reshape(-1)
        elif buf is None:
            c = 1.0
        else:
            c = 1.0 / (1.0 - d)
            z = m * buf.detach().reshape(-1)
        if wd != 0:  # - wd θ = c (-(wd θ / c))
            extra = (wd / c) * p.detach().reshape(-1)
            z = extra if z is None else z + extra
        return c, z


def unfolded_warning(spec: str, optimizer: torch.optim.Optimizer) -> str | None:
    """The start warning for top-k with an optimizer that averages over steps and is not
    folded (Adam-like: ``betas``; others with ``momentum`` > 0); None when there is none."""
    name = type(optimizer).__name__
    groups = optimizer.param_groups
    if any("betas" in g for g in groups):
        why = (
            "top-k error feedback hands Adam rare, large coordinates that its per-coordinate "
            "scaling shrinks, so it trains slower than dense"
        )
    elif any(float(g.get("momentum", 0.0) or 0.0) > 0 for g in groups):
        why = "its momentum is applied after the exchange, which can diverge at small ratios"
    else:
        return None
    return (
        f"kplan: warning: compression {spec} with {name}: {why} (docs/runtime.md); "
        "prefer powersgd:RANK or bf16"
    )
