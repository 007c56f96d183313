"""One step of gradient-compression work, as ``kplan.profiler.codec.codec_seconds`` times it.

Imported only when a codec is measured (it imports torch and the runtime's compressor).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch  # noqa: TID253 (imported only when a codec is measured, after the torch check)

from kplan.core.compression_spec import Compression, powersgd_matrix, topk_count
from kplan.runtime.compression import kernels as rcomp


class CodecStep:
    """The runtime compressor's work per parameter, in its order, without the collectives
    (a gathered or reduced tensor is this worker's own, ``workers`` times for AG)."""

    def __init__(
        self,
        c: Compression,
        shapes: Sequence[tuple[int, ...]],
        *,
        workers: int,
        device: str,
        seed: int,
    ) -> None:
        self.c = c
        self.workers = workers
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.grads = [torch.randn(*s, generator=self.gen).to(device) for s in shapes]
        self.errors = [torch.zeros_like(g).reshape(-1) for g in self.grads]
        self.qs: dict[int, torch.Tensor] = {}
        self.collective = "ag" if c.collective == "auto" else c.collective

    def once(self) -> None:
        for j, g in enumerate(self.grads):
            flat = g.reshape(-1)
            if self.c.kind in ("fp16", "bf16"):
                dtype = torch.float16 if self.c.kind == "fp16" else torch.bfloat16
                flat.to(dtype).to(flat.dtype)
            elif self.c.kind == "powersgd":
                self._powersgd(j, g, flat)
            else:
                self._topk(j, flat)

    def _powersgd(self, j: int, g: torch.Tensor, flat: torch.Tensor) -> None:
        rows, cols = powersgd_matrix(tuple(g.shape))
        r = min(self.c.rank, rows, cols)
        if g.dim() < 2 or r * (rows + cols) >= flat.numel():
            return
        m = flat.clone()
        m.add_(self.errors[j])
        mm = m.view(rows, cols)
        q = self.qs.get(j)
        if q is None:
            q = torch.randn(cols, r, generator=self.gen).to(self.device)
        p_hat = rcomp.orthonormalise((mm @ q).reshape(-1).view(rows, r))
        q_local = mm.t() @ p_hat
        approx = p_hat @ q_local.t()
        self.errors[j] = (mm - approx).reshape(-1)
        float((mm * mm).sum())
        float((approx * approx).sum())
        payload = torch.cat([q_local.reshape(-1)])
        out = torch.empty_like(flat)
        out[:] = (p_hat @ payload.view(cols, r).t()).reshape(-1)
        self.qs[j] = payload.view(cols, r).clone()

    def _topk(self, j: int, flat: torch.Tensor) -> None:
        a = flat.clone()
        a.add_(self.errors[j])
        # the runtime's own selection (sampled threshold on large parameters, seeded)
        idx = rcomp.topk_select(a, topk_count(a.numel(), self.c.ratio), seed=j)
        if self.collective == "ar":
            idx = idx.to(torch.int32).long()
        values, residual = rcomp.split_sent(a, idx)
        self.errors[j] = residual.clone()
        float(torch.dot(a, a))
        float(torch.dot(values, values))
        if self.collective == "ag":
            idx32 = idx.to(torch.int32)
            rcomp.combine_gathered(a.numel(), [(idx32, values)] * self.workers, flat)
        else:
            rcomp.scatter_reduced(flat.numel(), idx, values)
