"""Profile mode inside the job: the OOM vote, skipping sizes, memory events, phase changes."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.runtime import distributed as rdist

if TYPE_CHECKING:
    from kplan.runtime.job import Job


def sweep_vote(job: Job, failed: bool) -> bool:
    """All workers agree whether anyone ran out of memory in this sweep step."""
    rows = rdist.gather_floats([1.0 if failed else 0.0], job.ctx)
    return any(row[0] > 0 for row in rows)


def profile_oom(job: Job) -> None:
    assert job._profile is not None
    batch = job._profile.phase.local_batch
    job.optimizer.zero_grad(set_to_none=True)
    job._micro_in_step = 0
    job._loss_sum = torch.zeros((), dtype=torch.float64, device=job.ctx.device)
    gc.collect()
    if job.ctx.is_cuda:
        torch.cuda.empty_cache()
    job.metrics.event("oom", local_batch=batch, step=job.step_count)
    job._profile.out_of_memory()
    enter_profile_phase(job)


def profile_step_done(job: Job) -> None:
    assert job._profile is not None
    phase = job._profile.phase
    if job._profile.step_done():
        if phase.name == "sweep" and job.ctx.is_cuda:
            job.metrics.event(
                "memory",
                local_batch=phase.local_batch,
                peak_bytes=torch.cuda.max_memory_allocated(job.ctx.device),
                device_total_bytes=torch.cuda.get_device_properties(job.ctx.device).total_memory,
            )
        enter_profile_phase(job)


def enter_profile_phase(job: Job) -> None:
    assert job._profile is not None
    if job._profile.done:
        job._stopped = True
        return
    batch = job._profile.phase.local_batch
    job._restart_sizes = (batch,) * job.ctx.world_size
    reset_peak_memory(job)


def reset_peak_memory(job: Job) -> None:
    if job.ctx.is_cuda:
        torch.cuda.reset_peak_memory_stats(job.ctx.device)
