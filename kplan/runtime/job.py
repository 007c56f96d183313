"""The job: the training loop's one object (the contract is kplan/runtime/API.md).

Its state is a :class:`~kplan.runtime.state.JobState`; construction (assemble.py) composes the
parts in this order: context and config; the DDP wrapper with the
weighted communication hook (sync.py); the per-worker split (pid.py) and the sampler that
applies it (sampler.py); the GNS estimator (gns.py) and LR scaler (lr_scaling.py); metrics;
then a checkpoint, if one exists, restores all of them; last, the SIGTERM flag.

One optimizer step, at the end of its last micro-step (``step_end.finish_step``):

1. finish the gradient average (overlap mode: DDP already did; manual: one weighted all-reduce)
2. global squared norm |g|² (the GNS "big batch"), before the optimizer step
3. start ONE small all-reduce: per rank [local batch, local |g_i|², loss, previous step's batch
   and compute time, SIGTERM flag, checkpoint-due flag, |g|²] in that rank's own slot; a SUM over
   disjoint slots is an all-gather with exact values, so every rank makes the same decisions
4. optimizer step at the scaled learning rate, gradients cleared
5. wait for the all-reduce; update the GNS, the PID split, write the metrics record
6. checkpoint if due (steps, period, SIGTERM), profile-mode bookkeeping
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)
from torch.utils.data import Dataset  # noqa: TID253

from kplan.core.errors import InputError
from kplan.runtime import assemble, local_gns, profile_steps, step_end
from kplan.runtime import distributed as rdist
from kplan.runtime.amp import Amp
from kplan.runtime.assemble import GNS_DENSE_EVERY, LoaderOptions
from kplan.runtime.config import RuntimeConfig
from kplan.runtime.metrics import MetricsWriter
from kplan.runtime.policy import Monitor, Policy
from kplan.runtime.profile_mode import is_oom
from kplan.runtime.profile_steps import activation_probe
from kplan.runtime.resume import save_checkpoint
from kplan.runtime.sampler import Position
from kplan.runtime.state import Stateful


class _StepContext:
    """One micro-step; its body runs under the job's autocast (bf16/fp16), the step after it."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._cast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        self._probe: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        self._trace: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

    def __enter__(self) -> _StepContext:
        self.job._enter_step()
        self._trace = profile_steps.trace_probe(self.job._state)
        self._trace.__enter__()
        self._probe = activation_probe(self.job._state)
        self._probe.__enter__()
        self._cast = self.job.autocast()
        self._cast.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        self._cast.__exit__(type(exc) if exc is not None else None, exc, None)
        self._probe.__exit__(None, None, None)
        try:
            return self.job._exit_step(exc)
        finally:
            self._trace.__exit__(None, None, None)


class Job:
    """Wraps a model, optimizer and dataset into kplan's loop (see kplan/runtime/API.md)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Dataset[Any],
        batch_size: int,
        *,
        collate_fn: Any = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        shuffle: bool = True,
        extras: Mapping[str, Stateful] | None = None,
        ddp_kwargs: Mapping[str, Any] | None = None,
        config: RuntimeConfig | None = None,
        policies: Sequence[Policy] = (),
        **loader_kwargs: Any,
    ) -> None:
        loader = LoaderOptions(collate_fn, num_workers, pin_memory, shuffle, loader_kwargs)
        self._state = assemble.build(
            model,
            optimizer,
            dataset,
            batch_size,
            loader,
            extras or {},
            ddp_kwargs or {},
            config,
            policies,
        )

    # --- the parts, read-only ------------------------------------------------------------------

    @property
    def ctx(self) -> rdist.Context:
        return self._state.ctx

    @property
    def config(self) -> RuntimeConfig:
        return self._state.config

    @property
    def profiling(self) -> bool:
        return self._state.profiling

    @property
    def module(self) -> torch.nn.Module:
        """The user's model."""
        return self._state.module

    @property
    def model(self) -> torch.nn.Module:
        """What to call in the loop: the DDP wrapper of ``module`` (with 2+ workers), else it."""
        return self._state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._state.optimizer

    @property
    def extras(self) -> dict[str, Stateful]:
        return self._state.extras

    @property
    def amp(self) -> Amp:
        """The precision: TF32 switches, autocast and fp16's loss scaler (kplan/runtime/amp.py)."""
        return self._state.amp

    @property
    def metrics(self) -> MetricsWriter:
        return self._state.metrics

    @property
    def base_batch(self) -> int:
        return self._state.base_batch

    @property
    def accum_steps(self) -> int:
        return self._state.accum_steps

    @property
    def global_batch(self) -> int:
        return self._state.global_batch

    @property
    def step_count(self) -> int:
        return self._state.step_count

    # --- read-only state ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._state.position.epoch

    @property
    def precision(self) -> str:
        """The precision this job trains in: fp32, tf32, bf16 or fp16."""
        return self._state.amp.precision

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast in the job's precision, for model code outside ``job.step()`` (evaluation).

        ``with job.step():`` enters it by itself; for fp32 and tf32 it does nothing.
        """
        return self._state.amp.autocast()

    @property
    def local_batch(self) -> int:
        """This worker's micro-batch size in the current step."""
        return self._state.local_batch

    @property
    def gns(self) -> float | None:
        return self._state.gns.gns

    @property
    def lr_factor(self) -> float:
        return self._state.lr.last_factor

    @property
    def progress(self) -> float:
        return self._state.progress

    @property
    def is_last_micro_step(self) -> bool:
        return self._state.is_last_micro_step

    @property
    def policies(self) -> tuple[Policy, ...]:
        """The adaptation policies running in this job (the script's, then KPLAN_POLICIES)."""
        st = self._state
        return tuple(st.runner.policies)

    @property
    def monitor(self) -> Monitor:
        """What the policies saw last (the job's own state before the first step)."""
        st = self._state
        return st.runner.monitor or step_end.base_monitor(st)

    @property
    def stopped(self) -> str | None:
        """The reason a policy or the launcher stopped the job, else None."""
        return self._state.stop_reason

    # --- the loop ------------------------------------------------------------------------------

    def epochs(self, total: int) -> Iterator[int]:
        """Epoch numbers from the resumed epoch up to ``total`` (profile mode: until done).

        With ``KPLAN_EPOCHS_BY=progress`` the loop runs until ``job.progress`` reaches
        ``total`` x len(dataset)/B0 base-batch steps (the planner's samples to train, N x E, in
        base-batch steps), through as many data passes as that takes (the last one stops
        mid-epoch).
        """
        st = self._state
        if total < 0:
            raise InputError(
                f"epochs({total}): the number of epochs is negative",
                "iterate `for epoch in job.epochs(E):` with E >= 0",
            )
        by_progress = st.config.epochs_by == "progress" and not st.profiling
        # N x E samples at B0, as the planner counts them (ceil(N/B0) per epoch read up to
        # a step per epoch high: 2.4% at N = 10,000, B0 = 256)
        target = total * st.dataset_size / st.base_batch
        if by_progress:
            st.progress_target = target
        if not st.profiling:
            st.schedule_target = target
        if not st.profiling:  # the launcher's measure of the work left (kplan/launcher/adapt.py)
            st.metrics.event(
                "epochs",
                total=total,
                by=st.config.epochs_by,
                target_progress=target,
                base_batch=st.base_batch,
                dataset_size=st.dataset_size,
            )
        while not st.stopped and self._more_epochs(total):
            epoch = st.position.epoch
            self._hook("before_epoch")
            st.in_epoch = True
            try:
                yield epoch
            finally:
                st.in_epoch = False
            if st.position.epoch == epoch and not st.stopped:  # the body left early
                st.position = Position(epoch + 1, 0, st.position.micro)
            self._hook("after_epoch", epoch)
        self.finish()

    def _more_epochs(self, total: int) -> bool:
        st = self._state
        if st.profiling:
            return True
        if st.progress_target is not None:
            return st.progress < st.progress_target - 1e-9
        return st.position.epoch < total

    def _hook(self, name: str, epoch: int | None = None) -> None:
        """Run hook ``name`` of every policy with the latest monitor."""
        st = self._state
        if not st.runner.policies:
            return
        m = self.monitor
        if name.endswith("epoch"):
            m = dataclasses.replace(m, epoch=self.epoch if epoch is None else epoch)
        st.runner.call(name, m)

    def batches(self) -> Iterator[Any]:
        """This worker's micro-batches for the rest of the current epoch, on its device."""
        st = self._state
        if not st.in_epoch:
            raise InputError(
                "job.batches() was called outside `for epoch in job.epochs(E):`",
                "iterate job.batches() inside job.epochs()",
            )
        epoch = st.position.epoch
        st.sampler.rewind(st.position)
        assert st.loader is not None, "the job's process group was shut down"
        iterator = iter(st.loader)
        while not st.stopped:
            if st.restart_sizes is not None:  # profile: drop prefetched data, new size
                st.sampler.rewind(st.position)
                st.sampler.set_sizes(st.position.micro, st.restart_sizes)
                st.restart_sizes = None
                iterator = iter(st.loader)
            if st.micro_in_step == 0:
                if st.hooked_step != st.step_count and self._next_step_fits():
                    st.hooked_step = st.step_count
                    self._hook("before_step")
                st.clock.start()
                if st.last_end is None:
                    st.last_end = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            self._begin_micro()
            yield self._to_device(batch)
            if st.expect_step:
                raise InputError(
                    "a batch from job.batches() was not used in a `with job.step():` block",
                    "wrap each iteration's forward and job.backward(loss) in `with job.step():`",
                )
        del iterator
        if not st.stopped and st.position.epoch == epoch and st.micro_in_step == 0:
            st.position = Position(epoch + 1, 0, st.position.micro)

    def _next_step_fits(self) -> bool:
        """Whether the next step's data is in the current epoch (the sampler's own rule)."""
        st = self._state
        pos = st.position
        need = st.accum_steps * sum(st.sampler.sizes_at(pos.micro))
        return pos.offset + need <= st.dataset_size

    def step(self) -> _StepContext:
        """Context of one micro-step; on leaving the last one of a step, the optimizer steps."""
        return _StepContext(self)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass of the micro-batch's mean loss (scaled for accumulation)."""
        st = self._state
        if not st.in_step:
            raise InputError(
                "job.backward(loss) was called outside `with job.step():`",
                "call it inside the `with job.step():` block of each batch",
            )
        if st.backward_called:
            raise InputError(
                "job.backward(loss) was called twice in one micro-step",
                "sum the losses and call job.backward once per batch",
            )
        if loss.dim() != 0:
            raise InputError(
                f"the loss has shape {tuple(loss.shape)}, expected a scalar",
                "pass the mean loss over the micro-batch",
            )
        single_accum = self._single_accum_gns()
        first = st.first_grad
        if st.micro_in_step > 0 and not single_accum and first is not None and first.grad is None:
            raise InputError(
                "gradients were cleared inside an accumulation step",
                "remove optimizer.zero_grad() from the loop: kplan clears gradients",
            )
        st.loss_sum = st.loss_sum + loss.detach().double()
        last = st.is_last_micro_step
        scaled = loss / st.accum_steps if st.accum_steps > 1 else loss
        sweep = st.sweeping()  # time backward apart from forward (no exchange inside it)
        if sweep:
            st.clock.backward_begin()
        with st.amp.outside_autocast():
            st.amp.scale(scaled).backward()  # type: ignore[no-untyped-call]
        if sweep:
            st.clock.backward_end()
        if st.first_grad is None:
            st.first_grad = next((p for p in st.params if p.grad is not None), None)
        if single_accum:
            local_gns.stash_micro_grad(st, last)
        if last and not (st.overlap_now() and st.sync.hook_calls > 0):
            st.clock.mark_compute_end()
        st.backward_called = True
        if last and not sweep:  # the gradients are averaged when backward returns
            st.complete_sync()

    def set_global_batch(self, batch: int) -> None:
        """Run global batch ``batch`` from the next step the data loader has not fetched yet."""
        st = self._state
        if st.profiling:
            raise InputError(
                "set_global_batch() is not available in profile mode",
                "the profiler sets the batch sizes it measures; skip the call when job.profiling",
            )
        if batch < 1 or batch % st.accum_steps:
            raise InputError(
                f"global batch {batch} is not a positive multiple of {st.accum_steps}",
                "pick a multiple of the accumulation steps (KPLAN_ACCUM_STEPS)",
            )
        st.set_global_batch(batch)

    def checkpoint(self, reason: str = "manual") -> None:
        """Write a checkpoint now; every rank must call it at the same step."""
        save_checkpoint(self._state, reason)

    def finish(self) -> None:
        """Final checkpoint and ``done`` event (idempotent; job.epochs() calls it at its end)."""
        st = self._state
        if st.finished:
            return
        st.finished = True
        st.stopped = True
        if st.store is not None and st.last_ckpt_step != st.step_count:
            self.checkpoint("final")
        if st.stop_reason is None:
            st.metrics.event("done", step=st.step_count)
        else:
            st.metrics.event("done", step=st.step_count, stopped=st.stop_reason)
        st.sigterm.uninstall()
        st.metrics.close()
        rdist.mark_completed()

    # --- one micro-step ------------------------------------------------------------------------

    def _single_accum_gns(self) -> bool:
        st = self._state
        return st.measure and st.ctx.world_size == 1 and st.accum_steps > 1

    def _begin_micro(self) -> None:
        st = self._state
        info = st.sampler.info(st.position.micro)
        st.position = info.after
        if st.micro_in_step == 0:
            st.step_sizes = info.sizes
            st.loss_sum = torch.zeros((), dtype=torch.float64, device=st.ctx.device)
            params = st.params
            ready = st.precond is None or st.precond.ready(params)
            st.step_synced = st.selsync.next_sync or st.ctx.world_size == 1
            comp = st.compressor
            lossy = comp is not None and comp.spec.lossy
            # No GNS sample from a local (SelSync-skipped) step; under lossy compression one
            # step in GNS_DENSE_EVERY runs dense and is the GNS sample (docs/runtime.md).
            st.measure = (
                st.gns_on
                and ready
                and st.step_synced
                and (not lossy or st.step_count % GNS_DENSE_EVERY == 0)
            )
            weight = info.sizes[st.ctx.rank] / sum(info.sizes)
            if comp is not None and comp.momentum is not None:
                # the momentum the optimizer step will use (compensated: kplan/runtime/momentum.py)
                comp.momentum.ratio = st.momentum.ratio(st.step_count)
            st.sync.begin_step(
                weight,
                st.measure and st.ctx.world_size > 1,
                step=st.step_count,
                dense=comp is None or (lossy and st.measure),
            )
            st.micro_sqr = []
            st.synced = False
        st.sync.set_sync(st.is_last_micro_step and st.overlap_now() and st.step_synced)
        st.expect_step = True

    def _enter_step(self) -> None:
        st = self._state
        if not st.expect_step or st.in_step:
            raise InputError(
                "`with job.step():` must wrap exactly one batch from job.batches()",
                "write `for batch in job.batches():` then `with job.step():` inside it",
            )
        st.expect_step = False
        st.in_step = True
        st.backward_called = False

    def _exit_step(self, exc: BaseException | None) -> bool:
        st = self._state
        st.in_step = False
        sweep = st.sweeping()
        if exc is not None:
            if not is_oom(exc):
                return False
            if sweep:
                profile_steps.sweep_vote(st, failed=True)
                profile_steps.profile_oom(st)
                return True
            st.metrics.event("oom", local_batch=st.local_batch, step=st.step_count)
            return False
        if not st.backward_called:
            raise InputError(
                "the `with job.step():` block did not call job.backward(loss)",
                "call job.backward(loss) once in each step block",
            )
        if sweep and profile_steps.sweep_vote(st, failed=False):
            profile_steps.profile_oom(st)
            return False
        if not st.is_last_micro_step:
            st.micro_in_step += 1
            return False
        st.micro_in_step = 0
        step_end.finish_step(st)
        return False

    def _to_device(self, batch: Any) -> Any:
        st = self._state
        device = st.ctx.device
        if device.type == "cpu":
            return batch
        if isinstance(batch, torch.Tensor):
            return batch.to(device, non_blocking=st.pin)
        if isinstance(batch, list | tuple):
            moved = [self._to_device(b) for b in batch]
            return type(batch)(moved) if isinstance(batch, tuple) else moved
        if isinstance(batch, dict):
            return {k: self._to_device(v) for k, v in batch.items()}
        return batch
