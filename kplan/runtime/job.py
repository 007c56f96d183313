"""The job: the training loop's one object (the contract is kplan/runtime/API.md).

Construction composes the parts in this order: context and config; the DDP wrapper with the
weighted communication hook (sync.py); the per-worker split (pid.py) and the sampler that
applies it (sampler.py); the GNS estimator (gns.py) and LR scaler (lr_scaling.py); metrics;
then a checkpoint, if one exists, restores all of them; last, the SIGTERM flag.

One optimizer step, at the end of its last micro-step (``_finish_step``):

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
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch  # noqa: TID253 (torch is the runtime's core dependency)
from torch.utils.data import DataLoader, Dataset  # noqa: TID253

from kplan.core.compression_spec import DDP_BUCKET_BYTES, exchange_buckets
from kplan.core.errors import InputError
from kplan.runtime import distributed as rdist
from kplan.runtime import env, local_gns, profile_steps, step_end
from kplan.runtime.amp import Amp
from kplan.runtime.batch_schedule import BatchSchedule
from kplan.runtime.checkpoint import CheckpointStore, SigtermFlag, capture_rng
from kplan.runtime.compression.compressor import Compressor
from kplan.runtime.compression.probe import probe_network, probe_topk_exchange
from kplan.runtime.config import RuntimeConfig
from kplan.runtime.gns import GnsEstimator
from kplan.runtime.lr_scaling import LrScaler
from kplan.runtime.metrics import MetricsWriter
from kplan.runtime.momentum import MomentumCompensator
from kplan.runtime.pid import BatchController, PidConfig
from kplan.runtime.policy import Monitor, Policy, PolicyRunner, load_policies
from kplan.runtime.profile_mode import ProfileRun, is_oom
from kplan.runtime.profile_steps import SavedBytes, activation_probe
from kplan.runtime.resume import load_into, local_state, runtime_state
from kplan.runtime.sampler import GlobalBatchSampler, Position
from kplan.runtime.selsync import SelSync
from kplan.runtime.step_end import round_up
from kplan.runtime.sync import ADAM_LIKE, GradSync, Preconditioner
from kplan.runtime.timing import StepClock

GNS_DENSE_EVERY = 10
"""Under lossy compression, one step in this many all-reduces dense and gives the GNS sample."""


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class _StepContext:
    """One micro-step; its body runs under the job's autocast (bf16/fp16), the step after it."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._cast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        self._probe: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

    def __enter__(self) -> _StepContext:
        self.job._enter_step()
        self._probe = activation_probe(self.job)
        self._probe.__enter__()
        self._cast = self.job.autocast()
        self._cast.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        self._cast.__exit__(type(exc) if exc is not None else None, exc, None)
        self._probe.__exit__(None, None, None)
        return self.job._exit_step(exc)


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
        self._started = time.monotonic()
        self.ctx = ctx = rdist.init()
        self.config = cfg = RuntimeConfig.from_env(config)
        self.profiling = cfg.profile is not None
        self._profile = None if cfg.profile is None else ProfileRun(cfg.profile)
        self._saved_bytes: SavedBytes | None = None  # a CPU sweep's activation probe
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size={batch_size!r} is not an integer >= 1", "")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise InputError("kplan needs a map-style dataset (with __len__ and __getitem__)", "")
        self.base_batch = batch_size
        self.accum_steps = 1 if self.profiling else cfg.accum_steps
        self.global_batch = batch_size if cfg.global_batch is None else cfg.global_batch
        if self._profile is not None:
            self.global_batch = self._profile.phase.local_batch * ctx.world_size
        # A batch schedule (kplan/runtime/batch_schedule.py): its phases at 0 set the first batch.
        sched = cfg.batch_schedule
        self._schedule = sched if isinstance(sched, BatchSchedule) and not self.profiling else None
        self._schedule_index = -1
        self._schedule_target: float | None = None  # job.epochs' target progress
        if self._schedule is not None:
            self._schedule_index = self._schedule.due(-1, 0, 0.0)
            if self._schedule_index >= 0:
                self.global_batch = self._schedule.phases[self._schedule_index].global_batch
        if self.global_batch % self.accum_steps:
            raise InputError(
                f"global batch {self.global_batch} is not divisible by {self.accum_steps} "
                "accumulation steps",
                "pick a global batch that is a multiple of KPLAN_ACCUM_STEPS",
            )
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise InputError("the model has no parameters that require gradients", "")
        if params[0].device != ctx.device:
            raise InputError(
                f"the model is on {params[0].device}, this worker's device is {ctx.device}",
                "call model.to(kr.init().device) before creating the Job",
            )
        self.module = model
        self.optimizer = optimizer
        self.extras = dict(extras or {})
        self.model: torch.nn.Module = model
        ddp = None
        if ctx.distributed:
            kwargs = dict(ddp_kwargs or {})
            # Gradients as views into DDP's buckets: no copies between them (and less memory).
            kwargs.setdefault("gradient_as_bucket_view", True)
            if ctx.is_cuda:
                kwargs.setdefault("device_ids", [ctx.device.index])
            ddp = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
            self.model = ddp
            rdist.on_shutdown(_releaser(weakref.ref(self)))
        self._params = params
        self.amp = Amp(cfg.precision, ctx.device)
        """The precision: TF32 switches, autocast and fp16's loss scaler (kplan/runtime/amp.py)."""

        # GNS flavour: plain, or in Adam's preconditioned metric.
        gns_mode = cfg.gns
        if gns_mode == "auto":
            gns_mode = "adam" if isinstance(optimizer, ADAM_LIKE) else "sgd"
        if gns_mode == "adam" and not isinstance(optimizer, ADAM_LIKE):
            raise InputError(
                f"GNS mode 'adam' needs an Adam-like optimizer, got {type(optimizer).__name__}",
                "use KPLAN_GNS=sgd or auto",
            )
        self._gns_on = gns_mode != "off"
        self._precond = Preconditioner(optimizer) if gns_mode == "adam" else None
        self._clock = StepClock(ctx.device)
        # Compression (compression/) and selective sync (selsync.py): with two
        # or more workers; the compressor also counts the bytes of a dense run.
        comp = cfg.compression
        assert not isinstance(comp, str)  # parsed by RuntimeConfig
        self._compressor: Compressor | None = None
        if ddp is not None and ctx.world_size > 1:
            network, exchange = None, None
            if comp.sparse and comp.collective == "auto":
                network = probe_network(ctx)
                cap = int(getattr(ddp, "bucket_bytes_cap", DDP_BUCKET_BYTES))
                buckets = exchange_buckets([p.numel() for p in params], cap)
                exchange = probe_topk_exchange(ctx, buckets, comp.ratio)
            self._compressor = Compressor(
                comp, params, ctx, cfg.seed, network, optimizer, self.amp.precision, exchange
            )
        policy = cfg.sync_policy
        assert not isinstance(policy, str)
        self._selsync = SelSync(policy)
        self._step_synced = True
        self._sync = GradSync(ddp, params, ctx, self._precond, self._clock, self._compressor)
        self._sync.track_plain = self._selsync.active and ctx.world_size > 1
        self._sync.stats_source = lambda: step_end.stats_vector(self)

        # The split of each micro-step's global batch, and the data stream that applies it.
        caps = rdist.gather_floats([float(cfg.max_local_batch or 0)], ctx)
        self._caps = [int(row[0]) or None for row in caps]
        self._pid_on = cfg.pid is not None and not self.profiling and ctx.world_size > 1
        self._controller = BatchController(
            ctx.world_size,
            self.global_batch // self.accum_steps,
            self._caps,
            cfg.pid or PidConfig(),
        )
        if self._profile is not None:
            self._controller.sizes = (self._profile.phase.local_batch,) * ctx.world_size
        self._sampler = GlobalBatchSampler(
            len(dataset),
            ctx.rank,
            ctx.world_size,
            self._controller.sizes,
            accum_steps=self.accum_steps,
            seed=cfg.seed,
            shuffle=shuffle,
        )
        self._loader = DataLoader(
            dataset,
            batch_sampler=self._sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
            generator=torch.Generator().manual_seed(cfg.seed),
            **loader_kwargs,
        )
        self._pin = pin_memory
        self._gns = GnsEstimator(cfg.gns_smoothing)
        self._lr = LrScaler(cfg.lr_scaling, self.base_batch, self.global_batch, cfg.lr_ramp_steps)
        self._momentum = MomentumCompensator(cfg.momentum, self.global_batch, cfg.lr_ramp_steps)
        self.metrics = MetricsWriter(cfg.metrics_path, ctx.rank, cfg.job_id)
        # Adaptation: policies (the script's, then KPLAN_POLICIES) and the launcher's control.
        self._dataset_size = len(dataset)
        self._local_world_size = env.local_world_size()
        adapt = not self.profiling
        self._runner = PolicyRunner(
            [*policies, *load_policies(cfg.policies)] if adapt else [],
            rank0=ctx.rank == 0,
            write_event=lambda **fields: self.metrics.event("policy", **fields),
            control_path=cfg.control_path if adapt else None,
        )

        # Loop state.
        self.step_count = 0
        self._position = Position(0, 0, 0)
        self._micro_in_step = 0
        self._step_sizes = self._controller.sizes
        self._in_epoch = False
        self._in_step = False
        self._expect_step = False
        self._backward_called = False
        self._stopped = False
        self._finished = False
        self._restart_sizes: tuple[int, ...] | None = None
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        self._measure = False
        self._synced = False
        self._prev_timing: tuple[float, float] | None = None
        self._last_end: float | None = None
        self._lr_value: float | None = None
        self._first_grad: torch.Tensor | None = None
        self._micro_sqr: list[torch.Tensor] = []
        self._acc: dict[int, torch.Tensor] = {}
        self._prev_grads: list[torch.Tensor] | None = None
        self._prev_batch = 0
        self._last_ckpt_step = -1
        self._last_ckpt_time = time.monotonic()
        self._prev_wall = 0.0
        self._stop_reason: str | None = None
        self._progress_target: float | None = None
        self._hooked_step = -1

        self._store: CheckpointStore | None = None
        resumed: str | None = None
        if cfg.checkpoint_dir is not None and not self.profiling:
            self._store = CheckpointStore(
                cfg.checkpoint_dir, ctx.rank, env.restart_count(), cfg.keep_checkpoints
            )
            latest = self._store.latest()
            if latest is not None:
                load_into(self, latest)
                resumed = str(latest)
        if resumed is None:  # distinct dropout streams per worker, reproducible
            rdist.seed_all(cfg.seed * 1_000_003 + 7_919 * (ctx.rank + 1))
        self._sampler.rewind(self._position)
        self._sampler.set_sizes(self._position.micro, self._controller.sizes)
        self._sigterm = SigtermFlag()
        self._sigterm.install()
        self.metrics.event(
            "start",
            world_size=ctx.world_size,
            backend=ctx.backend,
            device=str(ctx.device),
            restart_count=env.restart_count(),
            resumed_step=self.step_count if resumed else None,
            global_batch=self.global_batch,
            base_batch=self.base_batch,
            accum_steps=self.accum_steps,
            profiling=self.profiling,
            precision=self.amp.precision,
            # The GNS records are moving averages: their mean age in steps, and the data-set
            # size its finite-population correction uses (kplan/runtime/gns.py).
            gns_window_steps=round(self._gns.window_steps, 1),
            gns_population=self._dataset_size,
        )
        self.metrics.event(
            "model",
            gradient_bytes=sum(p.numel() * p.element_size() for p in params),
            parameters=sum(p.numel() for p in model.parameters()),
            gradient_shapes=shape_counts(params),
        )
        if self._compressor is not None and (comp.kind != "none" or self._selsync.active):
            net, exch = self._compressor.network, self._compressor.exchange
            self.metrics.event(
                "compression",
                compression=comp.spec(),
                sync_policy=policy.spec(),
                bandwidth_Bps=None if net is None else net[0],
                latency_s=None if net is None else net[1],
                topk_exchange=None if exch is None else dataclasses.asdict(exch),
                gns_dense_every=GNS_DENSE_EVERY if comp.lossy and self._gns_on else None,
            )
        if resumed:
            self.metrics.event("resume", step=self.step_count, path=resumed)
        if self._profile is not None:
            profile_steps.reset_peak_memory(self)

    # --- read-only state ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._position.epoch

    @property
    def precision(self) -> str:
        """The precision this job trains in: fp32, tf32, bf16 or fp16."""
        return self.amp.precision

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast in the job's precision, for model code outside ``job.step()`` (evaluation).

        ``with job.step():`` enters it by itself; for fp32 and tf32 it does nothing.
        """
        return self.amp.autocast()

    @property
    def local_batch(self) -> int:
        """This worker's micro-batch size in the current step."""
        return self._step_sizes[self.ctx.rank]

    @property
    def gns(self) -> float | None:
        return self._gns.gns

    @property
    def lr_factor(self) -> float:
        return self._lr.last_factor

    @property
    def progress(self) -> float:
        return self._lr.progress

    @property
    def is_last_micro_step(self) -> bool:
        return self._micro_in_step == self.accum_steps - 1

    @property
    def policies(self) -> tuple[Policy, ...]:
        """The adaptation policies running in this job (the script's, then KPLAN_POLICIES)."""
        return tuple(self._runner.policies)

    @property
    def monitor(self) -> Monitor:
        """What the policies saw last (the job's own state before the first step)."""
        return self._runner.monitor or step_end.base_monitor(self)

    @property
    def stopped(self) -> str | None:
        """The reason a policy or the launcher stopped the job, else None."""
        return self._stop_reason

    # --- the loop ------------------------------------------------------------------------------

    def epochs(self, total: int) -> Iterator[int]:
        """Epoch numbers from the resumed epoch up to ``total`` (profile mode: until done).

        With ``KPLAN_EPOCHS_BY=progress`` the loop runs until ``job.progress`` reaches
        ``total`` x len(dataset)/B0 base-batch steps (the planner's samples to train, N x E, in
        base-batch steps), through as many data passes as that takes (the last one stops
        mid-epoch).
        """
        if total < 0:
            raise InputError(f"epochs({total}): the number of epochs is negative", "")
        by_progress = self.config.epochs_by == "progress" and not self.profiling
        # N x E samples at B0, as the planner counts them (ceil(N/B0) per epoch read up to
        # a step per epoch high: 2.4% at N = 10,000, B0 = 256)
        target = total * self._dataset_size / self.base_batch
        if by_progress:
            self._progress_target = target
        if not self.profiling:
            self._schedule_target = target
        if not self.profiling:  # the launcher's measure of the work left (kplan/launcher/adapt.py)
            self.metrics.event(
                "epochs",
                total=total,
                by=self.config.epochs_by,
                target_progress=target,
                base_batch=self.base_batch,
                dataset_size=self._dataset_size,
            )
        while not self._stopped and self._more_epochs(total):
            epoch = self._position.epoch
            self._hook("before_epoch")
            self._in_epoch = True
            try:
                yield epoch
            finally:
                self._in_epoch = False
            if self._position.epoch == epoch and not self._stopped:  # the body left early
                self._position = Position(epoch + 1, 0, self._position.micro)
            self._hook("after_epoch", epoch)
        self.finish()

    def _more_epochs(self, total: int) -> bool:
        if self.profiling:
            return True
        if self._progress_target is not None:
            return self.progress < self._progress_target - 1e-9
        return self._position.epoch < total

    def _hook(self, name: str, epoch: int | None = None) -> None:
        """Run hook ``name`` of every policy with the latest monitor."""
        if not self._runner.policies:
            return
        m = self.monitor
        if name.endswith("epoch"):
            m = dataclasses.replace(m, epoch=self.epoch if epoch is None else epoch)
        self._runner.call(name, m)

    def batches(self) -> Iterator[Any]:
        """This worker's micro-batches for the rest of the current epoch, on its device."""
        if not self._in_epoch:
            raise InputError(
                "job.batches() was called outside `for epoch in job.epochs(E):`",
                "iterate job.batches() inside job.epochs()",
            )
        epoch = self._position.epoch
        self._sampler.rewind(self._position)
        iterator = iter(self._loader)
        while not self._stopped:
            if self._restart_sizes is not None:  # profile: drop prefetched data, new size
                self._sampler.rewind(self._position)
                self._sampler.set_sizes(self._position.micro, self._restart_sizes)
                self._restart_sizes = None
                iterator = iter(self._loader)
            if self._micro_in_step == 0:
                if self._hooked_step != self.step_count and self._next_step_fits():
                    self._hooked_step = self.step_count
                    self._hook("before_step")
                self._clock.start()
                if self._last_end is None:
                    self._last_end = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            self._begin_micro()
            yield self._to_device(batch)
            if self._expect_step:
                raise InputError(
                    "a batch from job.batches() was not used in a `with job.step():` block",
                    "wrap each iteration's forward and job.backward(loss) in `with job.step():`",
                )
        del iterator
        if not self._stopped and self._position.epoch == epoch and self._micro_in_step == 0:
            self._position = Position(epoch + 1, 0, self._position.micro)

    def _next_step_fits(self) -> bool:
        """Whether the next step's data is in the current epoch (the sampler's own rule)."""
        pos = self._position
        need = self.accum_steps * sum(self._sampler.sizes_at(pos.micro))
        return pos.offset + need <= self._dataset_size

    def step(self) -> _StepContext:
        """Context of one micro-step; on leaving the last one of a step, the optimizer steps."""
        return _StepContext(self)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass of the micro-batch's mean loss (scaled for accumulation)."""
        if not self._in_step:
            raise InputError("job.backward(loss) was called outside `with job.step():`", "")
        if self._backward_called:
            raise InputError("job.backward(loss) was called twice in one micro-step", "")
        if loss.dim() != 0:
            raise InputError(
                f"the loss has shape {tuple(loss.shape)}, expected a scalar",
                "pass the mean loss over the micro-batch",
            )
        single_accum = self._single_accum_gns()
        first = self._first_grad
        if (
            self._micro_in_step > 0
            and not single_accum
            and first is not None
            and first.grad is None
        ):
            raise InputError(
                "gradients were cleared inside an accumulation step",
                "remove optimizer.zero_grad() from the loop: kplan clears gradients",
            )
        self._loss_sum = self._loss_sum + loss.detach().double()
        last = self.is_last_micro_step
        scaled = loss / self.accum_steps if self.accum_steps > 1 else loss
        sweep = self._sweeping()  # time backward apart from forward (no exchange inside it)
        if sweep:
            self._clock.backward_begin()
        with self.amp.outside_autocast():
            self.amp.scale(scaled).backward()  # type: ignore[no-untyped-call]
        if sweep:
            self._clock.backward_end()
        if self._first_grad is None:
            self._first_grad = next((p for p in self._params if p.grad is not None), None)
        if single_accum:
            local_gns.stash_micro_grad(self, last)
        if last and not (self._overlap_now() and self._sync.hook_calls > 0):
            self._clock.mark_compute_end()
        self._backward_called = True
        if last and not sweep:  # the gradients are averaged when backward returns
            self._complete_sync()

    def set_global_batch(self, batch: int) -> None:
        """Run global batch ``batch`` from the next step the data loader has not fetched yet."""
        if self.profiling:
            raise InputError("set_global_batch() is not available in profile mode", "")
        if batch < 1 or batch % self.accum_steps:
            raise InputError(
                f"global batch {batch} is not a positive multiple of {self.accum_steps}", ""
            )
        sizes = self._controller.set_total(batch // self.accum_steps)
        first = round_up(self._sampler.next_micro, self.accum_steps)
        self._sampler.set_sizes(first, sizes)
        self._lr.set_batch(first // self.accum_steps, batch)
        self._momentum.set_batch(first // self.accum_steps, batch)
        self.global_batch = batch

    def checkpoint(self, reason: str = "manual") -> None:
        """Write a checkpoint now; every rank must call it at the same step."""
        if self._store is None:
            return
        start = time.perf_counter()
        shared = runtime_state(self) if self.ctx.rank == 0 else None
        local = {"rng": capture_rng(), "rank": self.ctx.rank, "world_size": self.ctx.world_size}
        local.update(local_state(self))
        path, size = self._store.save(
            self.step_count, shared, local, lambda: rdist.barrier(self.ctx)
        )
        if self.ctx.rank == 0:
            self.metrics.event(
                "checkpoint",
                step=self.step_count,
                path=str(path),
                bytes=size,
                seconds=time.perf_counter() - start,
                reason=reason,
            )
        self._last_ckpt_step = self.step_count
        self._last_ckpt_time = time.monotonic()

    def finish(self) -> None:
        """Final checkpoint and ``done`` event (idempotent; job.epochs() calls it at its end)."""
        if self._finished:
            return
        self._finished = True
        self._stopped = True
        if self._store is not None and self._last_ckpt_step != self.step_count:
            self.checkpoint("final")
        if self._stop_reason is None:
            self.metrics.event("done", step=self.step_count)
        else:
            self.metrics.event("done", step=self.step_count, stopped=self._stop_reason)
        self._sigterm.uninstall()
        self.metrics.close()
        rdist.mark_completed()

    # --- one micro-step ------------------------------------------------------------------------

    def _sweeping(self) -> bool:
        return self._profile is not None and self._profile.phase.name == "sweep"

    def _overlap_now(self) -> bool:
        """Gradients all-reduced inside backward (else after it, by manual_reduce)."""
        return self.config.sync == "overlap" and not self._sweeping()

    def _complete_sync(self) -> None:
        """Manual mode: local norm, then the weighted all-reduce (overlap: DDP did it)."""
        if self._synced:
            return
        self._synced = True
        if not self._step_synced:  # SelSync skipped it: a local step, gradients stay local
            if self._sync.track_plain:
                self._sync.plain_norm_now()
            return
        if not self._overlap_now():
            if self._measure and self.ctx.world_size > 1:
                self._sync.local_norm_now()
            if self._sync.track_plain:
                self._sync.plain_norm_now()
            self._sync.manual_reduce()

    def _single_accum_gns(self) -> bool:
        return self._measure and self.ctx.world_size == 1 and self.accum_steps > 1

    def _begin_micro(self) -> None:
        info = self._sampler.info(self._position.micro)
        self._position = info.after
        if self._micro_in_step == 0:
            self._step_sizes = info.sizes
            self._loss_sum = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
            params = self._params
            ready = self._precond is None or self._precond.ready(params)
            self._step_synced = self._selsync.next_sync or self.ctx.world_size == 1
            comp = self._compressor
            lossy = comp is not None and comp.spec.lossy
            # No GNS sample from a local (SelSync-skipped) step; under lossy compression one
            # step in GNS_DENSE_EVERY runs dense and is the GNS sample (docs/runtime.md).
            self._measure = (
                self._gns_on
                and ready
                and self._step_synced
                and (not lossy or self.step_count % GNS_DENSE_EVERY == 0)
            )
            weight = info.sizes[self.ctx.rank] / sum(info.sizes)
            if comp is not None and comp.momentum is not None:
                # the momentum the optimizer step will use (compensated: kplan/runtime/momentum.py)
                comp.momentum.ratio = self._momentum.ratio(self.step_count)
            self._sync.begin_step(
                weight,
                self._measure and self.ctx.world_size > 1,
                step=self.step_count,
                dense=comp is None or (lossy and self._measure),
            )
            self._micro_sqr = []
            self._synced = False
        self._sync.set_sync(self.is_last_micro_step and self._overlap_now() and self._step_synced)
        self._expect_step = True

    def _enter_step(self) -> None:
        if not self._expect_step or self._in_step:
            raise InputError(
                "`with job.step():` must wrap exactly one batch from job.batches()", ""
            )
        self._expect_step = False
        self._in_step = True
        self._backward_called = False

    def _exit_step(self, exc: BaseException | None) -> bool:
        self._in_step = False
        sweep = self._sweeping()
        if exc is not None:
            if not is_oom(exc):
                return False
            if sweep:
                profile_steps.sweep_vote(self, failed=True)
                profile_steps.profile_oom(self)
                return True
            self.metrics.event("oom", local_batch=self.local_batch, step=self.step_count)
            return False
        if not self._backward_called:
            raise InputError("the `with job.step():` block did not call job.backward(loss)", "")
        if sweep and profile_steps.sweep_vote(self, failed=False):
            profile_steps.profile_oom(self)
            return False
        if not self.is_last_micro_step:
            self._micro_in_step += 1
            return False
        self._micro_in_step = 0
        step_end.finish_step(self)
        return False

    def _to_device(self, batch: Any) -> Any:
        device = self.ctx.device
        if device.type == "cpu":
            return batch
        if isinstance(batch, torch.Tensor):
            return batch.to(device, non_blocking=self._pin)
        if isinstance(batch, list | tuple):
            moved = [self._to_device(b) for b in batch]
            return type(batch)(moved) if isinstance(batch, tuple) else moved
        if isinstance(batch, dict):
            return {k: self._to_device(v) for k, v in batch.items()}
        return batch


def _releaser(ref: weakref.ref[Job]) -> Callable[[], None]:
    def release() -> None:
        job = ref()
        if job is not None:
            job.model = job.module
            job._sync.ddp = None
            job._loader = None  # type: ignore[assignment]

    return release


MAX_REPORTED_SHAPES = 4096  # distinct shapes in the model event (more: not reported)


def shape_counts(params: Sequence[torch.Tensor]) -> list[list[Any]] | None:
    """The parameters' shapes as [[shape, count], ...] of distinct shapes in first-seen order (the
    profiler prices gradient compression with them); None past ``MAX_REPORTED_SHAPES``."""
    counts: dict[tuple[int, ...], int] = {}
    for p in params:
        key = tuple(int(d) for d in p.shape)
        counts[key] = counts.get(key, 0) + 1
        if len(counts) > MAX_REPORTED_SHAPES:
            return None
    return [[list(k), n] for k, n in counts.items()]
