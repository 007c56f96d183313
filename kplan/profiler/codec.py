"""Measure gradient-compression compute (compress + decompress) on a model's gradient shapes.

The planner (kplan/planner/compression.py) adds this codec time to the step of each option. It is
measured here on tensors of the model's own parameter shapes, with the runtime's own pieces
(``kplan.runtime.compression``: top-k selection, the sent/residual split, the sparse sum,
PowerSGD's orthonormalisation) and without the collectives, on the device given:

- fp16/bf16: cast to 16 bits and back.
- powersgd:r: per matrix (rows x cols, the runtime's view) error feedback add, P = M Q,
  orthonormalise P, Q = M^T P, the approximation P Q^T, the new error, the gain's two norms,
  and the decompression P Q_sum^T; vectors untouched.
- topk:x:ag: per parameter error feedback add, top-k selection, the split, the gain's two
  norms, then the dense sum of ``workers`` gathered (indices, values) parts; ``:ar``: the same
  selection (on the broadcasting worker) and the scatter of the reduced values.

Returns the median over ``repeats`` after one warm-up, in seconds per step. ``bench_after_job``
runs it in a profile's rank-0 worker on the planner's default options, bounded in elements and
seconds; the profile records the times (``codec_seconds``) and the shapes it used.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path


def codec_seconds(
    spec: str,
    shapes: Sequence[tuple[int, ...]],
    *,
    workers: int = 2,
    repeats: int = 3,
    device: str = "cpu",
    seed: int = 0,
) -> float:
    """Median seconds of one step's compress + decompress of ``spec`` on ``shapes``."""
    import torch

    from kplan.core.compression_spec import powersgd_matrix, topk_count
    from kplan.planner.compression import parse
    from kplan.runtime.compression import kernels as rcomp

    c = parse(spec)
    if c.kind == "none":
        return 0.0
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(*s, generator=gen).to(device) for s in shapes]
    errors = [torch.zeros_like(g).reshape(-1) for g in grads]
    qs: dict[int, torch.Tensor] = {}
    collective = "ag" if c.collective == "auto" else c.collective

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def once() -> None:
        # The runtime compressor's work per parameter, in its order, without the collectives
        # (a gathered or reduced tensor is this worker's own, ``workers`` times for AG).
        for j, g in enumerate(grads):
            flat = g.reshape(-1)
            if c.kind in ("fp16", "bf16"):
                dtype = torch.float16 if c.kind == "fp16" else torch.bfloat16
                flat.to(dtype).to(flat.dtype)
                continue
            if c.kind == "powersgd":
                rows, cols = powersgd_matrix(tuple(g.shape))
                r = min(c.rank, rows, cols)
                if g.dim() < 2 or r * (rows + cols) >= flat.numel():
                    continue
                m = flat.clone()
                m.add_(errors[j])
                mm = m.view(rows, cols)
                q = qs.get(j)
                if q is None:
                    q = torch.randn(cols, r, generator=gen).to(device)
                p_hat = rcomp.orthonormalise((mm @ q).reshape(-1).view(rows, r))
                q_local = mm.t() @ p_hat
                approx = p_hat @ q_local.t()
                errors[j] = (mm - approx).reshape(-1)
                float((mm * mm).sum())
                float((approx * approx).sum())
                payload = torch.cat([q_local.reshape(-1)])
                out = torch.empty_like(flat)
                out[:] = (p_hat @ payload.view(cols, r).t()).reshape(-1)
                qs[j] = payload.view(cols, r).clone()
                continue
            a = flat.clone()
            a.add_(errors[j])
            # the runtime's own selection (sampled threshold on large parameters, seeded)
            idx = rcomp.topk_select(a, topk_count(a.numel(), c.ratio), seed=j)
            if collective == "ar":
                idx = idx.to(torch.int32).long()
            values, residual = rcomp.split_sent(a, idx)
            errors[j] = residual.clone()
            float(torch.dot(a, a))
            float(torch.dot(values, values))
            if collective == "ag":
                idx32 = idx.to(torch.int32)
                rcomp.combine_gathered(a.numel(), [(idx32, values)] * workers, flat)
            else:
                rcomp.scatter_reduced(flat.numel(), idx, values)

    once()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        once()
        sync()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


def model_shapes(model: object) -> tuple[tuple[int, ...], ...]:
    """The shapes of a torch module's trainable parameters (in ``parameters()`` order)."""
    params = model.parameters()  # type: ignore[attr-defined]
    return tuple(tuple(int(d) for d in p.shape) for p in params if p.requires_grad)


def elements(shapes: Sequence[tuple[int, ...]]) -> int:
    return sum(math.prod(s) for s in shapes)


# After a profile run (``kplan.profiler.worker``), rank 0 times the planner's default options on
# the model's own shapes, within these bounds:
CODEC_REPEATS = 3  # timed repetitions after one warm-up (the median is recorded)
CODEC_WORKERS = 2  # gathered parts AG-Topk's decompression sums (the planner prices k workers)
MAX_CODEC_ELEMENTS = 200_000_000  # past this (0.8 GB of FP32 gradient): skipped, with a note
CODEC_BUDGET_S = 60.0  # later options not started when this is spent: skipped, with a note


def measure_options(
    shapes: Sequence[tuple[int, ...]],
    options: Sequence[str],
    *,
    device: str = "cpu",
    repeats: int = CODEC_REPEATS,
    budget_s: float = CODEC_BUDGET_S,
    max_elements: int = MAX_CODEC_ELEMENTS,
) -> tuple[dict[str, float], str]:
    """({canonical spec: median seconds}, what was skipped and why, "" when nothing was).
    Top-k's ``auto`` is timed as each of its collectives (``:ar`` and ``:ag``, whose
    decompressions differ), as the planner prices it (``compression.variants``)."""
    from kplan.planner.compression import parse, variants

    n = elements(shapes)
    if n > max_elements:
        return {}, f"not measured: {n} gradient elements is more than {max_elements}"
    specs = [v.spec() for spec in options for v in variants(parse(spec))]
    out: dict[str, float] = {}
    start = time.perf_counter()
    for i, spec in enumerate(specs):
        if i and time.perf_counter() - start > budget_s:
            rest = ", ".join(specs[i:])
            return out, f"{rest} not measured: the {budget_s:g} s budget was spent"
        out[spec] = codec_seconds(
            spec, shapes, workers=CODEC_WORKERS, repeats=repeats, device=device
        )
    return out, ""


def bench_after_job(metrics: Path) -> None:
    """On rank 0 after the job: time the default compression options on the shapes of the
    model record and append a ``codec`` record (read by kplan/profiler/records.py)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    shapes = _shapes_from(metrics)
    if not shapes:
        return
    import torch

    from kplan.planner.compression import DEFAULT_OPTIONS

    device = "cpu"
    if torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    seconds, skipped = measure_options(shapes, DEFAULT_OPTIONS, device=device)
    record = {
        "event": "codec",
        "seconds": seconds,
        "device": device.split(":")[0],
        "how": (
            f"kplan/profiler/codec.py on rank 0 after the job: median of {CODEC_REPEATS} after 1 "
            f"warm-up, the runtime's compressor code on the model's {len(shapes)} parameter "
            f"tensors ({elements(shapes)} elements), {CODEC_WORKERS} workers' parts, "
            "no collectives"
        ),
        "skipped": skipped,
    }
    with metrics.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _shapes_from(metrics: Path) -> tuple[tuple[int, ...], ...] | None:
    """Every parameter's shape from the runtime's last ``model`` record, if it has them."""
    from kplan.profiler.allreduce import model_record

    raw = model_record(metrics)
    pairs = None if raw is None else raw.get("gradient_shapes")
    if not isinstance(pairs, list):
        return None
    return tuple(tuple(int(d) for d in s) for s, n in pairs for _ in range(int(n)))
