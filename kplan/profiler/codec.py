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

    from kplan.planner.compression import parse

    c = parse(spec)
    if c.kind == "none":
        return 0.0
    from kplan.profiler.codec_step import CodecStep

    work = CodecStep(c, shapes, workers=workers, device=device, seed=seed)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    work.once()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        work.once()
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

    rec = model_record(metrics)
    pairs = None if rec is None else rec.gradient_shapes
    if not isinstance(pairs, list):
        return None
    return tuple(tuple(int(d) for d in s) for s, n in pairs for _ in range(int(n)))
