"""Weighted gradient averaging across workers, and the squared norms the GNS needs.

With per-worker batches b_i (B = Σ b_i) and each worker's loss a mean over its own batch, the
full-batch gradient is Σ_i (b_i/B) g_i. Two ways to get it (both checked in NOTES.md):

- ``overlap`` (default): a DDP communication hook multiplies each gradient bucket by
  w_i = b_i/B and all-reduces with SUM, overlapped with the backward pass like plain DDP. The
  hook sees the *local* bucket before the reduction, so it also adds |bucket|² to this worker's
  local squared norm: the GNS costs no extra pass over the gradients.
- ``manual``: backward runs under ``no_sync``; afterwards the local norm is taken and the
  gradients are flattened, weighted and all-reduced in one go. Used by the profile sweep (so
  compute and communication are timed apart, and an out-of-memory error on one worker cannot
  leave the others waiting inside a bucket all-reduce).

The per-step statistics vector (each rank's local norm, batch, loss, timing, flags in its own
slot; see step_end.py) rides along with the gradients: it is appended to the last bucket (or
the last manual chunk) when the gradients are float32/float64, so a step needs no collective
beyond plain DDP's. (A separate small all-reduce costs ~1 ms with gloo on a busy 2-core host.)

Norms may be measured in the Adam metric: |g|²_P = Σ g² / (sqrt(v̂) + eps), with v̂ Adam's
bias-corrected second moment (AdaptDL's preconditioned noise scale), taken before the
optimizer step so local and global norms use the same preconditioner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)
import torch.distributed as dist  # noqa: TID253

from kplan.runtime.compression.compressor import Compressor
from kplan.runtime.distributed import Context
from kplan.runtime.timing import StepClock

_CHUNK_ELEMENTS = 1 << 24  # manual all-reduce in pieces of at most 16 Mi elements

ADAM_LIKE: tuple[type, ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
)


class Preconditioner:
    """Adam's diagonal preconditioner 1/(sqrt(v̂) + eps) per parameter, read from its state."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._group: dict[int, dict[str, Any]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._group[id(p)] = group

    def ready(self, params: Iterable[torch.Tensor]) -> bool:
        """True once every parameter has a second-moment estimate (after the first step)."""
        state = self.optimizer.state
        return all(p in state and "exp_avg_sq" in state[p] for p in params)

    def denom(self, p: torch.Tensor) -> torch.Tensor | None:
        """sqrt(v̂) + eps for parameter ``p``, or None before its first step."""
        st = self.optimizer.state.get(p)
        if not st or "exp_avg_sq" not in st:
            return None
        group = self._group[id(p)]
        beta2 = float(group["betas"][1])
        step = float(st["step"])
        correction = 1.0 - beta2**step
        denom: torch.Tensor = (st["exp_avg_sq"] / correction).sqrt().add_(float(group["eps"]))
        return denom


def squared_norm(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    precond: Preconditioner | None,
) -> torch.Tensor:
    """Σ |g|² over ``grads`` (in the Adam metric when ``precond`` is given), a 0-d float64."""
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    if precond is None:
        total = torch.nn.utils.get_total_norm(list(grads), norm_type=2.0)
        return total.double().square()
    parts = []
    for p, g in zip(params, grads, strict=True):
        denom = precond.denom(p)
        gd = g.double()
        parts.append((gd * gd).sum() if denom is None else (gd * gd / denom).sum())
    return torch.stack(parts).sum()


class GradSync:
    """Averages gradients weighted by batch share and measures local norms on the way."""

    def __init__(
        self,
        ddp: torch.nn.parallel.DistributedDataParallel | None,
        params: Sequence[torch.Tensor],
        ctx: Context,
        precond: Preconditioner | None,
        clock: StepClock,
        compressor: Compressor | None = None,
    ) -> None:
        self.ddp = ddp
        self.params = list(params)
        self.compressor = compressor
        """Gradient compression (compression/compressor.py); None: dense all-reduce."""
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.track_plain = False
        """Also sum |g_i|² of the unweighted local gradient (SelSync's significance)."""
        self.plain_sqr = torch.zeros((), dtype=torch.float64, device=ctx.device)
        self.ctx = ctx
        self.precond = precond
        self.clock = clock
        self.weight = 1.0
        self.measure = False
        self.hook_calls = 0
        self.local_sqr = torch.zeros((), dtype=torch.float64, device=ctx.device)
        self.stats_source: Callable[[], torch.Tensor] | None = None
        """Builds this step's statistics vector when the last gradients are reduced."""
        self.stats_result: torch.Tensor | None = None
        """The reduced statistics of this step, when they travelled with the gradients."""
        self.global_parts: list[torch.Tensor] = []
        """|reduced bucket|² per bucket (SGD metric): the global norm without another pass."""
        self.folded_sqr: torch.Tensor | None = None
        """Manual sync under the momentum fold: |reduced gradient|² before it became the
        optimizer's G (``.grad`` then no longer holds the average)."""
        if ddp is not None:
            ddp.register_comm_hook(self, _weighted_hook)

    def begin_step(self, weight: float, measure: bool, step: int = 0, dense: bool = True) -> None:
        """Set this worker's share b_i/B for the step's synchronisation; ``dense``: this step
        all-reduces uncompressed (always without a compressor)."""
        self.weight = weight
        self.measure = measure
        self.hook_calls = 0
        self.local_sqr = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        self.plain_sqr = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        if self.compressor is not None:
            self.compressor.begin_step(step, dense, weight)
        self.stats_result = None
        self.global_parts = []
        self.folded_sqr = None

    def set_sync(self, enabled: bool) -> None:
        """Whether the next forward/backward all-reduces (False: accumulate locally)."""
        if self.ddp is not None:
            self.ddp.require_backward_grad_sync = enabled

    def global_sqr(self) -> torch.Tensor:
        """|averaged gradient|² after the step's synchronisation (in the Adam metric if set)."""
        if self.precond is None and self.hook_calls and len(self.global_parts) == self.hook_calls:
            return torch.stack(self.global_parts).sum()
        if self.folded_sqr is not None:
            return self.folded_sqr
        params, grads = self.grads()
        return squared_norm(params, grads, self.precond).to(self.ctx.device)

    def grads(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(params, grads) of parameters that have a gradient."""
        pairs = [(p, p.grad) for p in self.params if p.grad is not None]
        return [p for p, _ in pairs], [g for _, g in pairs]

    def local_norm_now(self) -> None:
        """Measure this worker's gradient norm from ``.grad`` (manual mode, before reducing)."""
        params, grads = self.grads()
        self.local_sqr = squared_norm(params, grads, self.precond).to(self.ctx.device)

    def plain_norm_now(self) -> None:
        """|g_i|² of this worker's local gradient from ``.grad`` (before any reduction)."""
        params, grads = self.grads()
        self.plain_sqr = squared_norm(params, grads, None).to(self.ctx.device)

    def average_parameters(self, weight: float) -> None:
        """Replace every parameter by Σ_i w_i θ_i over the workers (SelSync's averaging)."""
        if not self.ctx.distributed or self.ctx.world_size == 1:
            return
        with torch.no_grad():
            for chunk in _chunks(self.params):
                flat = torch.cat([p.detach().reshape(-1) for p in chunk]).mul_(weight)
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                if self.compressor is not None:
                    self.compressor.count_dense(flat.numel(), flat.element_size())
                offset = 0
                for p in chunk:
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()

    def manual_reduce(self) -> None:
        """All-reduce ``.grad`` weighted by :attr:`weight` (after a ``no_sync`` backward)."""
        for p in self.params:
            if p.grad is None:  # every worker must contribute the same tensors
                p.grad = torch.zeros_like(p)
        if not self.ctx.distributed or self.ctx.world_size == 1:
            return
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for p in self.params:
            grad = p.grad
            assert grad is not None  # filled with zeros above
            groups.setdefault((grad.dtype, grad.device), []).append(grad)
        pieces = [chunk for grads in groups.values() for chunk in _chunks(grads)]
        comp = self.compressor
        grad_index = {id(p.grad): i for i, p in enumerate(self.params)}
        for index, chunk in enumerate(pieces):
            flat = torch.cat([g.reshape(-1) for g in chunk])
            flat.mul_(self.weight)
            n = flat.numel()
            last = index == len(pieces) - 1
            if comp is not None and comp.active:
                ids = [grad_index[id(g)] for g in chunk]
                reduced = comp.reduce(flat, ids, self.stats_source if last else None).wait()
                if comp.stats is not None:
                    self.stats_result = comp.stats.double()
                _unflatten(chunk, reduced)
                continue
            post = None
            if comp is not None:
                comp.count_dense(n, flat.element_size())
                post = comp.dense_momentum(flat, [grad_index[id(g)] for g in chunk])
            stats = self._stats(flat.dtype) if last else None
            if stats is not None:
                flat = torch.cat([flat, stats])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            if stats is not None:
                self.stats_result = flat[n:].double()
            if post is not None:
                grads = flat[:n]
                part = torch.dot(grads, grads).double()
                self.folded_sqr = part if self.folded_sqr is None else self.folded_sqr + part
                flat = post(grads)
            _unflatten(chunk, flat)

    def _stats(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The statistics vector in ``dtype``, if it can travel in that precision."""
        if self.stats_source is None or dtype not in (torch.float32, torch.float64):
            return None
        return self.stats_source().to(dtype)


def _unflatten(chunk: list[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    for g in chunk:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def _chunks(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for g in grads:
        if out[-1] and size + g.numel() > _CHUNK_ELEMENTS:
            out.append([])
            size = 0
        out[-1].append(g)
        size += g.numel()
    return out


def _weighted_hook(state: GradSync, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: local norm (optional), scale by b_i/B, SUM all-reduce."""
    buffer = bucket.buffer()
    if state.measure:
        if state.precond is None:
            state.local_sqr = state.local_sqr + torch.dot(buffer, buffer).double()
        else:
            state.local_sqr = state.local_sqr + squared_norm(
                bucket.parameters(), bucket.gradients(), state.precond
            )
    if state.track_plain:
        state.plain_sqr = state.plain_sqr + torch.dot(buffer, buffer).double()
    state.hook_calls += 1
    state.clock.mark_compute_end()
    buffer.mul_(state.weight)
    n = buffer.numel()
    comp = state.compressor
    if comp is not None and comp.active:  # compressed (compression/); stats go alongside
        last = bucket.is_last() and state.stats_source is not None
        ids = [state._index[id(p)] for p in bucket.parameters()]
        # DDP launches the buckets in index order: the last one is the step's final round
        fut = comp.reduce(buffer, ids, state.stats_source if last else None, final=bucket.is_last())
        if not last:
            return fut

        def with_stats(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            if comp.stats is not None:
                state.stats_result = comp.stats.double()
            return f.value()

        return fut.then(with_stats)
    post = None
    if comp is not None:
        comp.count_dense(n, buffer.element_size())
        # top-k with momentum SGD: the rest of the folded gradient stays local (compression/)
        post = comp.dense_momentum(buffer, [state._index[id(p)] for p in bucket.parameters()])
    # The last bucket is reduced after all others were launched: the local norm is complete.
    stats = state._stats(buffer.dtype) if bucket.is_last() else None
    payload = buffer if stats is None else torch.cat([buffer, stats])
    work = dist.all_reduce(payload, op=dist.ReduceOp.SUM, async_op=True)

    measure = state.measure and state.precond is None

    def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        out = fut.value()[0]
        grads = out if stats is None else out[:n]
        if stats is not None:
            state.stats_result = out[n:].double()
        if measure:  # list.append is atomic: callbacks may run on the backend's threads
            state.global_parts.append(torch.dot(grads, grads).double())
        return grads if post is None else post(grads)

    future: torch.futures.Future[torch.Tensor] = work.get_future().then(done)
    return future


# DDP checks the hook's annotations as objects; ``from __future__ import annotations`` made them
# strings, so state the real ones (GradBucket is not visible to the type checker).
_weighted_hook.__annotations__ = {
    "state": GradSync,
    "bucket": dist.GradBucket,  # type: ignore[attr-defined]
    "return": torch.futures.Future[torch.Tensor],
}
