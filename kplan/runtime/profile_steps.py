"""Profile mode inside the job: the OOM vote, skipping sizes, memory events, phase changes."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.runtime import distributed as rdist
from kplan.runtime.state import JobState


def sweep_vote(st: JobState, failed: bool) -> bool:
    """All workers agree whether anyone ran out of memory in this sweep step."""
    rows = rdist.gather_floats([1.0 if failed else 0.0], st.ctx)
    return any(row[0] > 0 for row in rows)


def profile_oom(st: JobState) -> None:
    assert st.profile is not None
    batch = st.profile.phase.local_batch
    st.optimizer.zero_grad(set_to_none=True)
    st.micro_in_step = 0
    st.loss_sum = torch.zeros((), dtype=torch.float64, device=st.ctx.device)
    gc.collect()
    if st.ctx.is_cuda:
        torch.cuda.empty_cache()
    st.metrics.event("oom", local_batch=batch, step=st.step_count)
    st.profile.out_of_memory()
    enter_profile_phase(st)


def profile_step_done(st: JobState) -> None:
    assert st.profile is not None
    phase = st.profile.phase
    if st.profile.step_done():
        if phase.name == "sweep" and st.ctx.is_cuda:
            st.metrics.event(
                "memory",
                local_batch=phase.local_batch,
                peak_bytes=torch.cuda.max_memory_allocated(st.ctx.device),
                device_total_bytes=torch.cuda.get_device_properties(st.ctx.device).total_memory,
            )
        elif phase.name == "sweep" and st.saved_bytes is not None:
            # No allocator peak on a CPU: the model state plus what autograd held for
            # backward in the phase's first step (see SavedBytes).
            st.metrics.event(
                "memory",
                local_batch=phase.local_batch,
                peak_bytes=model_state_bytes(st) + st.saved_bytes.total,
                estimated=True,
            )
        st.saved_bytes = None
        enter_profile_phase(st)


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


def activation_probe(st: JobState) -> contextlib.AbstractContextManager[Any]:
    """Saved-tensor hooks on the first step of each sweep size on a CPU (one step: the hooks
    cost time, and the timed steps come after the warm-up); a no-op context otherwise."""
    profile = st.profile
    if profile is None or st.ctx.is_cuda or profile.done or profile.phase.name != "sweep":
        return contextlib.nullcontext()
    if profile.steps_in_phase != 0 or st.micro_in_step != 0:
        return contextlib.nullcontext()
    st.saved_bytes = SavedBytes({p.untyped_storage().data_ptr() for p in st.params})
    return torch.autograd.graph.saved_tensors_hooks(st.saved_bytes.pack, st.saved_bytes.unpack)


def model_state_bytes(st: JobState) -> int:
    """Parameters, their gradients and the optimizer's state tensors, in bytes."""
    total = 0
    for p in st.params:
        total += 2 * p.numel() * p.element_size()  # the parameter and its gradient
    for state in st.optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def enter_profile_phase(st: JobState) -> None:
    assert st.profile is not None
    st.saved_bytes = None  # a size that ran out of memory leaves no estimate behind
    if st.profile.done:
        st.stopped = True
        return
    batch = st.profile.phase.local_batch
    st.restart_sizes = (batch,) * st.ctx.world_size
    reset_peak_memory(st)


def reset_peak_memory(st: JobState) -> None:
    if st.ctx.is_cuda:
        torch.cuda.reset_peak_memory_stats(st.ctx.device)


# A factory the profiler's worker registers (kplan/profiler/opgraph_trace.py): called with the
# local batch, its context is held around one whole step (forward, backward, optimizer).
_STEP_TRACERS: list[Callable[[int], contextlib.AbstractContextManager[Any]]] = []


def set_step_tracer(factory: Callable[[int], contextlib.AbstractContextManager[Any]]) -> None:
    """Trace one step of the profile on rank 0: the first of its GNS phase (the base local
    batch), or with no GNS phase the first at that batch in the sweep (``ProfileRun.trace_now``)."""
    _STEP_TRACERS[:] = [factory]


def trace_probe(st: JobState) -> contextlib.AbstractContextManager[Any]:
    """The registered tracer's context for this step (once), or a no-op context."""
    profile = st.profile
    if not _STEP_TRACERS or profile is None or profile.done or st.ctx.rank != 0:
        return contextlib.nullcontext()
    if not profile.trace_now() or st.micro_in_step != 0:
        return contextlib.nullcontext()
    return _STEP_TRACERS.pop()(profile.phase.local_batch)
