"""The summary of a profile run as a typed record (``kplan profile`` renders it, ``--json`` prints
it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kplan.profiler.analyze import Analysis, fit_quality
from kplan.profiler.device import DeviceFacts
from kplan.profiler.run import ProfileResult


@dataclass(frozen=True)
class SummaryDevice:
    gpu: str
    description: str | None
    fp32_tflops: float | None
    mem_bw_gbs: float | None
    memory_gb: float | None


@dataclass(frozen=True)
class SummaryModel:
    gradient_bytes: int
    parameters: int
    forward_share: float | None


@dataclass(frozen=True)
class SummarySize:
    """One swept local batch: its median times (seconds) and throughput over all workers."""

    local_batch: int
    steps: int
    step_time: float
    compute_time: float
    sync_time: float
    backward_time: float | None
    step_time_stdev: float
    samples_per_s: float


@dataclass(frozen=True)
class SummaryFit:
    """The compute line T_c(b) = a_c + b_c * b and its R²."""

    a_c: float
    b_c: float
    r2: float


@dataclass(frozen=True)
class SummaryGns:
    noise_scale: float | None
    steps: int
    local_batch: int | None


@dataclass(frozen=True)
class SummaryAllReduce:
    nbytes: int
    seconds: float
    workers: int
    backend: str | None
    bus_gbs: float


@dataclass(frozen=True)
class ProfileSummary:
    """What one profile run found, for its reader (``kplan profile`` renders it; ``--json``
    prints its fields in this order, ``dataclasses.asdict``)."""

    name: str
    profile: str | None
    measurements: str | None
    wall_s: float
    job_wall_s: float
    workers: int
    precision: str
    device: SummaryDevice
    model: SummaryModel
    sweep: tuple[SummarySize, ...]
    compute_fit: SummaryFit
    oom_local_batch: int | None
    max_local_batch: int
    gns: SummaryGns
    allreduce: SummaryAllReduce | None
    workdir: str | None
    max_local_limit: str
    warnings: tuple[str, ...]


def summarize(
    result: ProfileResult, out: Path | None = None, measurements: Path | None = None
) -> ProfileSummary:
    a = result.analysis
    fit = a.compute_fit
    facts = result.device
    return ProfileSummary(
        name=result.profile.name,
        profile=str(out) if out else None,
        measurements=str(measurements) if measurements else None,
        wall_s=round(result.wall_s, 3),
        job_wall_s=round(result.job_wall_s, 3),
        workers=result.workers,
        precision=result.profile.precision,
        device=SummaryDevice(
            gpu=result.profile.gpu,
            description=facts.description if facts else None,
            fp32_tflops=facts.fp32_tflops if facts else None,
            mem_bw_gbs=facts.mem_bw_gbs if facts else None,
            memory_gb=facts.memory_gb if facts else None,
        ),
        model=SummaryModel(a.gradient_bytes, a.parameters, a.forward_share),
        sweep=tuple(
            SummarySize(
                local_batch=s.local_batch,
                steps=s.steps,
                step_time=s.step_time,
                compute_time=s.compute_time,
                sync_time=s.sync_time,
                backward_time=s.backward_time,
                step_time_stdev=s.step_time_stdev,
                samples_per_s=s.local_batch * result.workers / s.step_time,
            )
            for s in a.sizes
        ),
        compute_fit=SummaryFit(fit.intercept, fit.slope, fit.r2),
        oom_local_batch=a.oom_batch,
        max_local_batch=a.max_local_batch,
        gns=SummaryGns(a.gns, a.gns_steps, result.schedule.gns_batch),
        allreduce=_allreduce(a),
        workdir=str(result.workdir) if result.workdir else None,
        max_local_limit=a.max_local_limit,
        warnings=tuple(warnings(a, facts)),
    )


def _allreduce(a: Analysis) -> SummaryAllReduce | None:
    ar = a.allreduce
    if ar is None or ar.nbytes is None or ar.seconds is None or ar.world_size is None:
        return None
    k = ar.world_size
    # Ring all-reduce moves 2(k-1)/k of the buffer through each link: the "bus bandwidth".
    bus = 2 * (k - 1) / k * ar.nbytes / ar.seconds / 1e9
    return SummaryAllReduce(ar.nbytes, ar.seconds, k, ar.backend, bus)


FIT_RMS_WARN = 0.10  # the compute line misses the swept times by more than this (relative RMS)
SPREAD_WARN = 2.0  # the device benchmark's slowest repeat over its fastest


def warnings(a: Analysis, facts: DeviceFacts | None) -> list[str]:
    """What a user should know before trusting this profile's numbers, one line each."""
    out: list[str] = []
    rms = fit_quality(a.sizes, a.compute_fit)
    if rms > FIT_RMS_WARN and len(a.sizes) > 1:
        out.append(
            f"the compute line misses the swept step times by {rms:.0%} RMS "
            f"(R\u00b2 {a.compute_fit.r2:.2f}): the steps are noisy (a busy machine?) or do not "
            "grow with the batch; predictions at other batches carry that error "
            "(more --steps on a quiet machine narrow it)"
        )
    if facts is not None and facts.spread > SPREAD_WARN:
        out.append(
            f"the device benchmark's repeats varied {facts.spread:.1f}x (the fastest is kept): "
            "the machine is busy, so predictions for other devices from this profile are "
            "uncertain; re-run on a quiet machine"
        )
    if a.max_local_limit == "sweep":
        out.append(
            f"max batch {a.max_local_batch} per worker is the largest swept, not a memory limit"
            + (
                " (memory per sample is estimated from the tensors autograd saves on a CPU: "
                "plans on GPUs scale it to each GPU's memory)"
                if a.memory_fit is not None
                else "; plans will not exceed it: raise --max-local-batch to lift it"
            )
        )
    return out
