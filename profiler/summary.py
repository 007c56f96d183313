"""The summary of a profile run as plain data (``kplan profile --json`` prints it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
        "model": {"gradient_bytes": a.gradient_bytes, "parameters": a.parameters},
        "sweep": [
            {
                "local_batch": s.local_batch,
                "steps": s.steps,
                "step_time": s.step_time,
                "compute_time": s.compute_time,
                "sync_time": s.sync_time,
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
