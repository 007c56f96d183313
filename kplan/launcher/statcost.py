"""A compressed job's statistical cost, measured against a dense job of the same training:
the samples it took to reach the dense job's final training loss, as a multiple of the dense
job's samples to it (``kplan report JOB --against DENSE``). That is the multiplier
``kplan estimate --compression-steps SPEC=MULT`` takes (kplan/planner/compression.py: it updates the
option's prior by inverse variance).

Both curves are rank 0's per-step global training loss from the runtime's step records (the last
record of a step that was redone after a resume), smoothed by one exponential moving average in
samples: each step's weight is 1 - exp(-batch / tau), tau half of a span of a twentieth of the
dense job's steps (at least 5) at its mean global batch. Per-step losses are noisy, and one tau
in samples gives both curves the same lag in samples, whatever their batch sizes. The target is
the dense job's smoothed loss at its last step; each job's cost is its cumulative samples (global
batches) at the first step whose smoothed loss is at or below it. Samples, not steps, so jobs at
different batch sizes compare. The jobs must train the same model on the same data: kplan cannot
check that, and says so. One pair of runs carries its own noise: ``--compression-steps`` takes
the figure with a log-space sigma of 0.2 unless told otherwise (``MEASURED_SIGMA``: repeated pairs
of the example MLP spread by 0.05-0.18).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kplan.core.errors import InputError
from kplan.launcher.metrics_read import MetricsLog, latest_per_step, rank0_steps, with_numbers
from kplan.planner.compstats import MAX_MEASURED, MIN_MEASURED, measurable

MIN_SPAN = 5
SPAN_FRACTION = 0.05


@dataclass(frozen=True)
class Curve:
    """One job's per-step training loss and cumulative samples (rank 0, in step order)."""

    steps: list[int]
    loss: list[float]
    samples: list[float]  # cumulative global batches up to and including each step
    compression: str  # the spec its compressed steps ran ("none": a dense job)
    selective: bool = False  # it ran SelSync (records with ``synced``): not a dense reference


@dataclass(frozen=True)
class StepsAgainst:
    """The measured multiplier (``None`` where the job never reached the target)."""

    job: str
    against: str
    compression: str
    target_loss: float
    span: int  # the smoothing's span in the dense job's steps
    dense_samples: float  # the dense job's samples to the target
    samples: float | None  # the compressed job's samples to it
    job_samples: float  # the compressed job's samples in all
    multiplier: float | None
    note: str

    def estimate_flag(self) -> str | None:
        """The ``kplan estimate`` flag that carries the measurement into a plan (None where
        there is none, or it is outside what a plan takes: ``compstats.measurable``)."""
        if self.multiplier is None or not _plannable(self.multiplier):
            return None
        return f"--compression-steps {self.compression}={self.multiplier:.3g}"


def curve(log: MetricsLog, job: str) -> Curve:
    """Rank 0's step records as a :class:`Curve` (the last record of a redone step wins).

    Every rank 0 step record must validate (kplan/core/records.py: a batch of at least one, a
    finite loss): a curve with a step of no samples has no cost in samples to measure."""
    if log.step_errors:
        err = log.step_errors[0]
        raise InputError(
            f"job {job}: {err.message}",
            hint="compare jobs whose metrics the kplan runtime wrote, unedited "
            "(kplan logs JOB shows the run)",
        )
    rank0 = rank0_steps(log.records)
    kept = with_numbers(rank0, ("loss", "global_batch"))
    recs = latest_per_step(kept)
    specs = {_spec(s, job) for r in kept if (s := r.compression) is not None} - {"none"}
    if not recs:
        raise InputError(
            f"job {job} has no step records with a loss",
            hint="compare jobs that ran steps under the kplan runtime (kplan logs JOB shows why)",
        )
    if len(specs) > 1:
        raise InputError(
            f"job {job} ran more than one compression ({', '.join(sorted(specs))})",
            hint="compare a job that ran one fixed option",
        )
    total, cum = 0.0, []
    for r in recs:
        total += float(r.global_batch or 0)
        cum.append(total)
    return Curve(
        [r.step for r in recs],
        [float(r.loss or 0.0) for r in recs],
        cum,
        specs.pop() if specs else "none",
        any(r.synced is not None for r in kept),
    )


def _plannable(multiplier: float) -> bool:
    """The multiplier as the report prints it (3 significant digits) is one a plan takes."""
    return measurable(float(f"{multiplier:.3g}"))


def _spec(text: str, job: str) -> str:
    """A step record's ``compression``, checked as the runtime parses it: the report prints it
    and suggests it to ``--compression-steps`` (``zip``, a newline or 5,000 digits were printed
    as found)."""
    from kplan.core.compression_spec import parse_compression

    hint = "compare jobs whose metrics the kplan runtime wrote, unedited"
    where = f"job {job}'s step records: compression"
    if len(text) > 80:
        raise InputError(f"{where} {text[:40]!r}... ({len(text):,} characters) is no spec", hint)
    try:
        parse_compression(text, where)
    except InputError as err:
        raise InputError(err.message, hint=hint) from None
    return text.strip()


def smoothed(c: Curve, tau: float) -> list[float]:
    """The loss as an exponential moving average in samples: a step of batch b weighs
    1 - exp(-b / tau) (a constant batch B: an EMA of span about 2 tau / B steps)."""
    out: list[float] = []
    acc: float | None = None
    before = 0.0
    for v, total in zip(c.loss, c.samples, strict=True):
        a = 1.0 - math.exp(-(total - before) / tau)
        before = total
        acc = v if acc is None else a * v + (1 - a) * acc
        out.append(acc)
    return out


def samples_to(c: Curve, target: float, tau: float) -> float | None:
    """Cumulative samples at the first step whose smoothed loss is at or below ``target``."""
    for value, samples in zip(smoothed(c, tau), c.samples, strict=True):
        if value <= target:
            return samples
    return None


def steps_against(job: str, job_c: Curve, dense: str, dense_c: Curve) -> StepsAgainst:
    """``job``'s samples to ``dense``'s final smoothed loss, as a multiple of ``dense``'s."""
    if dense_c.selective or job_c.selective:
        which = dense if dense_c.selective else job
        raise InputError(
            f"job {which} ran SelSync (--sync-policy selective), which kplan estimate does not "
            "price",
            hint="compare a job with --compression (and --sync-policy every) against a dense one",
        )
    if dense_c.compression != "none":
        raise InputError(
            f"--against {dense}: that job ran {dense_c.compression}, not dense",
            hint="give a job of the same training without --compression",
        )
    if job_c.compression == "none":
        raise InputError(
            f"job {job} ran dense: there is no compression to measure",
            hint="kplan report COMPRESSED_JOB --against DENSE_JOB",
        )
    if job_c.compression.startswith("adaptive"):
        raise InputError(
            f"job {job} ran {job_c.compression}, whose ratio changed during training: "
            "it has no fixed price to measure",
            hint="measure a fixed option (e.g. topk:0.01) against the dense job",
        )
    span = max(MIN_SPAN, round(SPAN_FRACTION * len(dense_c.steps)))
    tau = span / 2 * dense_c.samples[-1] / len(dense_c.steps)
    target = smoothed(dense_c, tau)[-1]
    dense_samples = samples_to(dense_c, target, tau)
    assert dense_samples is not None  # its own last smoothed value reaches it
    got = samples_to(job_c, target, tau)
    mult = None if got is None else got / dense_samples
    same = "the same model and data are assumed (kplan cannot check)"
    if got is None:
        note = (
            f"{job} did not reach {dense}'s loss {target:.4g} in its {job_c.samples[-1]:.4g} "
            f"samples (over {job_c.samples[-1] / dense_samples:.2f}x {dense}'s "
            f"{dense_samples:.4g}); {same}"
        )
    else:
        note = (
            f"{job} reached {dense}'s final training loss {target:.4g} (smoothed, span {span} "
            f"steps) after {got:.4g} samples, {dense} after {dense_samples:.4g}: x{mult:.3g}; "
            f"one pair of runs; {same}"
        )
        if not _plannable(got / dense_samples):  # mult, which is not None here
            note += (
                f"; x{mult:.3g} is outside the [{MIN_MEASURED:g}, {MAX_MEASURED:g}] a plan "
                "takes: are the two jobs the same training?"
            )
    return StepsAgainst(
        job,
        dense,
        job_c.compression,
        target,
        span,
        dense_samples,
        got,
        job_c.samples[-1],
        mult,
        note,
    )
