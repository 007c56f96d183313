"""Turn the metrics stream of a profile run into measurements, fits and a Profile.

Pure: records in, numbers out. Each swept size becomes one measurement: the mean over its
timed steps on every worker after dropping the slowest fifth (on a shared machine a few steps
stall for reasons that have nothing to do with the job). The formulas:

- compute time per step ``T_c(b) = a_c + b_c * b`` (least squares over the sweep);
- memory (CUDA only) ``peak(b) = static + per_sample * b``, and the batch ceiling where the fit
  reaches 90% of device memory when no size ran out of memory;
- gradient noise scale ``B_noise = tr(Sigma) / |G|^2`` (samples) from the runtime's running
  estimates at the end of the GNS run;
- forward's share of the compute, ``1 - sum(backward) / sum(compute)`` over the swept sizes'
  means (the part no gradient exchange can overlap: kplan/planner/compression.py's bucket pipeline).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kplan.core.errors import JobError
from kplan.planner.profile import GnsPoint, Measurement
from kplan.profiler.records import (
    AllReduceEvent,
    CodecEvent,
    MemoryEvent,
    ModelEvent,
    OomEvent,
    Record,
    StepRecord,
)

GNS_PHASE = "gns"


@dataclass(frozen=True)
class SizeStats:
    """The timed steps at one local batch, averaged over steps and workers."""

    local_batch: int
    steps: int  # timed steps (per worker)
    step_time: float
    compute_time: float
    sync_time: float
    step_time_stdev: float
    backward_time: float | None = None  # mean of the same steps; None: not every one measured


@dataclass(frozen=True)
class LinearFit:
    intercept: float  # a_c, seconds
    slope: float  # b_c, seconds per sample
    r2: float

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x


@dataclass(frozen=True)
class Analysis:
    sizes: tuple[SizeStats, ...]
    compute_fit: LinearFit
    gradient_bytes: int
    parameters: int
    oom_batch: int | None  # smallest local batch that ran out of memory
    max_local_batch: int
    gns: float | None
    gns_steps: int
    memory_fit: LinearFit | None  # bytes = static + per_sample * b (CUDA)
    allreduce: AllReduceEvent | None
    world_size: int
    # What set max_local_batch: "oom" (the sweep ran out of memory above it), "memory" (the
    # measured memory line reaches the device's memory there) or "sweep" (the largest size the
    # sweep ran, memory not measured: a CPU run).
    max_local_limit: str = "sweep"
    gradient_shapes: tuple[tuple[tuple[int, ...], int], ...] | None = None  # (shape, count)
    codec: CodecEvent | None = None  # rank 0's codec benchmark after the job
    forward_share: float | None = None  # forward_share(sizes)


def fit_line(xs: Sequence[float], ys: Sequence[float], *, nonneg: bool = False) -> LinearFit:
    """Least-squares line; a single point gives a line through the origin.

    ``nonneg`` keeps both coefficients >= 0 (a time cannot shrink with more samples, nor be
    negative at batch 0): a negative slope becomes a constant, a negative intercept a line
    through the origin.
    """
    if not xs:
        raise ValueError("no points to fit")
    if len(set(xs)) == 1:
        return LinearFit(0.0, statistics.fmean(ys) / xs[0], 1.0)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    if nonneg and slope < 0:
        slope, intercept = 0.0, my
    elif nonneg and intercept < 0:
        slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
        intercept = 0.0
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return LinearFit(intercept, slope, 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0)


def _timed_steps(steps: list[StepRecord], warmup: int, per_size: int) -> list[StepRecord]:
    """Drop warm-up steps: those marked so, else the first ``warmup`` of each worker's run."""
    if any(s.warmup is not None for s in steps):
        return [s for s in steps if not s.warmup] or steps[-1:]
    by_rank: dict[int, list[StepRecord]] = defaultdict(list)
    for s in steps:
        by_rank[s.rank].append(s)
    out: list[StepRecord] = []
    for rank_steps in by_rank.values():
        rank_steps.sort(key=lambda s: s.step)
        drop = warmup if len(rank_steps) > per_size else 0
        out.extend(rank_steps[drop:] or rank_steps[-1:])
    return out


def _trim_slowest(steps: list[StepRecord]) -> list[StepRecord]:
    """Drop the slowest fifth of the steps (rounded down): a shared machine's hiccups."""
    ordered = sorted(steps, key=lambda s: s.step_time)
    return ordered[: len(ordered) - len(ordered) // 5]


def size_stats(steps: Sequence[StepRecord], warmup: int, per_size: int) -> tuple[SizeStats, ...]:
    """Per local batch: means over the timed steps of every worker, slowest fifth dropped."""
    by_size: dict[int, list[StepRecord]] = defaultdict(list)
    for s in steps:
        if s.phase != GNS_PHASE:
            by_size[s.local_batch].append(s)
    out = []
    for b in sorted(by_size):
        timed = _timed_steps(by_size[b], warmup, per_size)
        kept = _trim_slowest(timed)
        times = [s.step_time for s in kept]
        ranks = {s.rank for s in timed}
        backward = [s.backward_time for s in kept if s.backward_time is not None]
        out.append(
            SizeStats(
                local_batch=b,
                steps=len(timed) // max(1, len(ranks)),
                step_time=statistics.fmean(times),
                compute_time=statistics.fmean(s.compute_time for s in kept),
                sync_time=statistics.fmean(s.sync_time for s in kept),
                step_time_stdev=statistics.stdev(times) if len(times) > 1 else 0.0,
                backward_time=statistics.fmean(backward) if len(backward) == len(kept) else None,
            )
        )
    return tuple(out)


FORWARD_SHARE_RANGE = (0.02, 0.98)  # a share outside is a timing artefact, not a model


def forward_share(sizes: Sequence[SizeStats]) -> float | None:
    """Forward's (and the input's) share of the compute: ``1 - sum(backward) / sum(compute)``
    over the sizes whose steps all timed their backward passes (a sum, so the larger batches a
    job trains at weigh more than a tiny size's fixed costs); None if none did. Clipped to
    ``FORWARD_SHARE_RANGE``."""
    timed = [s for s in sizes if s.backward_time is not None and s.compute_time > 0]
    if not timed:
        return None
    backward = sum(s.backward_time or 0.0 for s in timed)
    share = 1.0 - backward / sum(s.compute_time for s in timed)
    low, high = FORWARD_SHARE_RANGE
    return min(max(share, low), high)


def noise_scale(steps: Sequence[StepRecord]) -> tuple[float | None, int]:
    """B_noise at the end of the GNS run (rank 0), and how many GNS steps went into it.

    The runtime keeps bias-corrected moving averages of |G|^2 (``grad_sqr``) and tr(Sigma)
    (``grad_var``) and reports their ratio; its last values are its best estimate.
    """
    gns_steps = [s for s in steps if s.phase == GNS_PHASE and s.rank == 0]
    for s in reversed(gns_steps):
        if s.grad_sqr is not None and s.grad_var is not None:
            if s.grad_sqr > 0 and s.grad_var > 0:
                return s.grad_var / s.grad_sqr, len(gns_steps)
            return None, len(gns_steps)  # all noise or no noise: no finite scale yet
        if s.gns is not None and s.gns > 0:
            return s.gns, len(gns_steps)
    return None, len(gns_steps)


def analyze(records: Sequence[Record], warmup: int, steps_per_batch: int) -> Analysis:
    """Summarise a finished profile run; JobError if it measured nothing usable."""
    steps = [r for r in records if isinstance(r, StepRecord)]
    models = [r for r in records if isinstance(r, ModelEvent)]
    ooms = [r.local_batch for r in records if isinstance(r, OomEvent)]
    memory = [r for r in records if isinstance(r, MemoryEvent)]
    allreduce = [r for r in records if isinstance(r, AllReduceEvent)]
    codec = [r for r in records if isinstance(r, CodecEvent)]
    sizes = size_stats(steps, warmup, steps_per_batch)
    if not sizes:
        hint = (
            "the smallest batch ran out of memory: lower --min-local-batch"
            if ooms
            else ("is the script using kplan.runtime (it reads KPLAN_PROFILE_SCHEDULE)?")
        )
        raise JobError("the job finished without timing a single training step", hint=hint)
    if not models:
        raise JobError(
            "the job never reported its gradient size (no 'model' record)",
            hint="the runtime emits it when the model is wrapped; is the script using it?",
        )
    fit = fit_line([s.local_batch for s in sizes], [s.compute_time for s in sizes], nonneg=True)
    oom = min(ooms) if ooms else None
    max_local = max(s.local_batch for s in sizes if oom is None or s.local_batch < oom)
    memory_fit = None
    by_batch: dict[int, int] = {}
    for m in memory:
        if m.local_batch is not None:
            by_batch[m.local_batch] = max(by_batch.get(m.local_batch, 0), m.peak_bytes)
    limit = "oom" if oom is not None else "sweep"
    if len(by_batch) >= 2:
        totals = [m.total_bytes for m in memory if m.total_bytes]
        # CUDA peaks come from the caching allocator, in blocks; a CPU's estimate is exact.
        memory_fit = _memory_line(by_batch, ALLOCATOR_BLOCK_BYTES if totals else 1.0)
        if oom is None and totals:
            ceiling = int((0.9 * min(totals) - memory_fit.intercept) / memory_fit.slope)
            if ceiling > max_local:
                max_local, limit = min(ceiling, MAX_LOCAL_CEILING), "memory"
    gns, gns_used = noise_scale(steps)
    return Analysis(
        sizes=sizes,
        compute_fit=fit,
        gradient_bytes=models[-1].gradient_bytes,
        parameters=models[-1].parameters,
        oom_batch=oom,
        max_local_batch=max_local,
        gns=gns,
        gns_steps=gns_used,
        memory_fit=memory_fit,
        allreduce=allreduce[-1] if allreduce else None,
        world_size=max(s.world_size for s in steps),
        max_local_limit=limit,
        gradient_shapes=models[-1].shapes,
        codec=codec[-1] if codec else None,
        forward_share=forward_share(sizes),
    )


ALLOCATOR_BLOCK_BYTES = 2 * 2**20  # the CUDA caching allocator rounds large blocks to 2 MiB
MAX_LOCAL_CEILING = 2**20  # a per-GPU batch past this is no memory limit worth stating


def _memory_line(peak_by_batch: dict[int, int], resolution: float) -> LinearFit:
    """Peak bytes against the local batch, with a per-sample slope of at least what the
    measurement can resolve: a tiny model's peak may not grow measurably over the sweep (or
    shrink by allocator noise), and a slope of 0 (or less) would call every batch free. The
    floor is ``resolution`` bytes over the swept range (one allocator block on CUDA, a byte
    for a CPU's exact count), an upper bound on a growth the sweep could not see; the line
    still passes through the mean of the points."""
    xs = list(peak_by_batch)
    ys = [float(v) for v in peak_by_batch.values()]
    fit = fit_line(xs, ys)
    floor = resolution / max(max(xs) - min(xs), 1)
    if fit.slope >= floor:
        return fit
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return LinearFit(my - floor * mx, floor, fit.r2)


def fit_quality(sizes: Sequence[SizeStats], fit: LinearFit) -> float:
    """The compute line's relative RMS error over the swept sizes (0.1 = 10%): R^2 alone
    cannot tell a flat, well-fitted line (a tiny model's fixed cost) from noise."""
    errs = [
        (fit(s.local_batch) - s.compute_time) / s.compute_time for s in sizes if s.compute_time > 0
    ]
    return math.sqrt(statistics.fmean(e * e for e in errs)) if errs else 0.0


def measurements(a: Analysis, gpu: str) -> tuple[Measurement, ...]:
    """One measurements-CSV row per swept size (a mean over timed steps and workers)."""
    return tuple(
        Measurement(
            nodes=1,
            workers=a.world_size,
            local_batch=s.local_batch,
            step_time=s.step_time,
            sync_time=min(max(s.sync_time, 0.0), s.step_time),
            accum_steps=1,
            gpu=gpu,
        )
        for s in a.sizes
    )


def gns_trajectory(a: Analysis) -> tuple[GnsPoint, ...]:
    """The noise scale at the start of training (a profile sees only the first steps)."""
    return (GnsPoint(0.0, a.gns),) if a.gns is not None and a.gns > 0 else ()
