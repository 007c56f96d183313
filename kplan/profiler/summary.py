"""The summary of a profile run as plain data (``kplan profile --json`` prints it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kplan.profiler.analyze import Analysis, fit_quality
from kplan.profiler.device import DeviceFacts
from kplan.profiler.run import ProfileResult


def summary_dict(
    result: ProfileResult, out: Path | None = None, measurements: Path | None = None
) -> dict[str, Any]:
    a = result.analysis
    fit = a.compute_fit
    facts = result.device
    allreduce = a.allreduce
    doc: dict[str, Any] = {
        "name": result.profile.name,
        "profile": str(out) if out else None,
        "measurements": str(measurements) if measurements else None,
        "wall_s": round(result.wall_s, 3),
        "job_wall_s": round(result.job_wall_s, 3),
        "workers": result.workers,
        "precision": result.profile.precision,
        "device": {
            "gpu": result.profile.gpu,
            "description": facts.description if facts else None,
            "fp32_tflops": facts.fp32_tflops if facts else None,
            "mem_bw_gbs": facts.mem_bw_gbs if facts else None,
            "memory_gb": facts.memory_gb if facts else None,
        },
        "model": {
            "gradient_bytes": a.gradient_bytes,
            "parameters": a.parameters,
            "forward_share": a.forward_share,
        },
        "sweep": [
            {
                "local_batch": s.local_batch,
                "steps": s.steps,
                "step_time": s.step_time,
                "compute_time": s.compute_time,
                "sync_time": s.sync_time,
                "backward_time": s.backward_time,
                "step_time_stdev": s.step_time_stdev,
                "samples_per_s": s.local_batch * result.workers / s.step_time,
            }
            for s in a.sizes
        ],
        "compute_fit": {"a_c": fit.intercept, "b_c": fit.slope, "r2": fit.r2},
        "oom_local_batch": a.oom_batch,
        "max_local_batch": a.max_local_batch,
        "gns": {
            "noise_scale": a.gns,
            "steps": a.gns_steps,
            "local_batch": result.schedule.gns_batch,
        },
        "allreduce": None,
        "workdir": str(result.workdir) if result.workdir else None,
        "max_local_limit": a.max_local_limit,
        "warnings": warnings(a, facts),
    }
    if allreduce is not None:
        k = allreduce.world_size
        # Ring all-reduce moves 2(k-1)/k of the buffer through each link: the "bus bandwidth".
        bus = 2 * (k - 1) / k * allreduce.nbytes / allreduce.seconds / 1e9
        doc["allreduce"] = {
            "nbytes": allreduce.nbytes,
            "seconds": allreduce.seconds,
            "workers": k,
            "backend": allreduce.backend,
            "bus_gbs": bus,
        }
    return doc


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
