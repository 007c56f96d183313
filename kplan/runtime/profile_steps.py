"""Profile mode inside the job: the OOM vote, skipping sizes, memory events, phase changes."""

from __future__ import annotations

import contextlib
import gc
from typing import TYPE_CHECKING, Any

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
        elif phase.name == "sweep" and job._saved_bytes is not None:
            # No allocator peak on a CPU: the model state plus what autograd held for
            # backward in the phase's first step (see SavedBytes).
            job.metrics.event(
                "memory",
                local_batch=phase.local_batch,
                peak_bytes=model_state_bytes(job) + job._saved_bytes.total,
                estimated=True,
            )
        job._saved_bytes = None
        enter_profile_phase(job)


class SavedBytes:
    """Bytes of the tensors autograd saves for backward in one micro-step, each storage once,
    parameters left out: the activation memory a batch holds at its peak, measurable where no
    allocator reports a peak (a CPU). It grows with the batch as the device's peak does, so
    its slope is the per-sample memory the planner scales to a GPU."""

    def __init__(self, params: set[int]) -> None:
        self.total = 0
        self._seen = set(params)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse or other storage-less tensors
            return t
        if key and key not in self._seen:
            self._seen.add(key)
            self.total += size
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def activation_probe(job: Job) -> contextlib.AbstractContextManager[Any]:
    """Saved-tensor hooks on the first step of each sweep size on a CPU (one step: the hooks
    cost time, and the timed steps come after the warm-up); a no-op context otherwise."""
    profile = job._profile
    if profile is None or job.ctx.is_cuda or profile.done or profile.phase.name != "sweep":
        return contextlib.nullcontext()
    if profile.steps_in_phase != 0 or job._micro_in_step != 0:
        return contextlib.nullcontext()
    job._saved_bytes = SavedBytes({p.untyped_storage().data_ptr() for p in job._params})
    return torch.autograd.graph.saved_tensors_hooks(job._saved_bytes.pack, job._saved_bytes.unpack)


def model_state_bytes(job: Job) -> int:
    """Parameters, their gradients and the optimizer's state tensors, in bytes."""
    total = 0
    for p in job._params:
        total += 2 * p.numel() * p.element_size()  # the parameter and its gradient
    for state in job.optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def enter_profile_phase(job: Job) -> None:
    assert job._profile is not None
    job._saved_bytes = None  # a size that ran out of memory leaves no estimate behind
    if job._profile.done:
        job._stopped = True
        return
    batch = job._profile.phase.local_batch
    job._restart_sizes = (batch,) * job.ctx.world_size
    reset_peak_memory(job)


def reset_peak_memory(job: Job) -> None:
    if job.ctx.is_cuda:
        torch.cuda.reset_peak_memory_stats(job.ctx.device)
