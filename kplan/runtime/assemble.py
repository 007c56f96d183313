"""Building a job's state: the parts composed in the order job.py's docstring gives.

Context and config; the DDP wrapper with the weighted communication hook (sync.py) and the
compression (compression/); the per-worker split (pid.py) and the sampler that applies it
(sampler.py); the GNS estimator (gns.py) and LR scaler (lr_scaling.py); metrics and policies;
then a checkpoint, if one exists, restores all of them; last, the SIGTERM flag and the start
events.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)
from torch.utils.data import DataLoader, Dataset  # noqa: TID253

from kplan.core.compression_spec import DDP_BUCKET_BYTES, Compression, exchange_buckets
from kplan.core.errors import InputError
from kplan.runtime import distributed as rdist
from kplan.runtime import env, profile_steps, step_end
from kplan.runtime.amp import Amp
from kplan.runtime.batch_schedule import BatchSchedule
from kplan.runtime.checkpoint import CheckpointStore
from kplan.runtime.compression.compressor import Compressor
from kplan.runtime.compression.probe import probe_network, probe_topk_exchange
from kplan.runtime.config import RuntimeConfig
from kplan.runtime.distributed import Context
from kplan.runtime.gns import GnsEstimator
from kplan.runtime.lr_scaling import LrScaler
from kplan.runtime.metrics import MetricsWriter
from kplan.runtime.momentum import MomentumCompensator
from kplan.runtime.pid import BatchController, PidConfig
from kplan.runtime.policy import Policy, PolicyRunner
from kplan.runtime.policy_registry import load_policies
from kplan.runtime.profile_mode import ProfileRun
from kplan.runtime.resume import load_into
from kplan.runtime.sampler import GlobalBatchSampler
from kplan.runtime.selsync import SelSync
from kplan.runtime.state import JobState, Stateful
from kplan.runtime.sync import ADAM_LIKE, GradSync, Preconditioner
from kplan.runtime.timing import StepClock

GNS_DENSE_EVERY = 10
"""Under lossy compression, one step in this many all-reduces dense and gives the GNS sample."""

MAX_REPORTED_SHAPES = 4096  # distinct shapes in the model event (more: not reported)


@dataclass(frozen=True)
class LoaderOptions:
    """What ``Job(...)`` passes on to the DataLoader."""

    collate_fn: Any = None
    num_workers: int = 0
    pin_memory: bool = False
    shuffle: bool = True
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def build(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset[Any],
    batch_size: int,
    loader: LoaderOptions,
    extras: Mapping[str, Stateful],
    ddp_kwargs: Mapping[str, Any],
    config: RuntimeConfig | None,
    policies: Sequence[Policy],
) -> JobState:
    """The state of a new job (restored from the latest checkpoint, if there is one)."""
    started = time.monotonic()
    ctx = rdist.init()
    cfg = RuntimeConfig.from_env(config)
    profile = None if cfg.profile is None else ProfileRun(cfg.profile)
    params, size = _check_inputs(model, dataset, batch_size, ctx)
    accum = 1 if profile is not None else cfg.accum_steps
    schedule, schedule_index, global_batch = _first_batch(cfg, ctx, profile, batch_size, accum)
    ddp = _wrap_ddp(model, ctx, ddp_kwargs)
    amp = Amp(cfg.precision, ctx.device)
    gns_on, precond = _gns_mode(cfg, optimizer)
    clock = StepClock(ctx.device)
    compressor = _make_compressor(cfg, ctx, ddp, params, optimizer, amp)
    policy = cfg.sync_policy
    assert not isinstance(policy, str)  # parsed by RuntimeConfig
    selsync = SelSync(policy)
    sync = GradSync(ddp, params, ctx, precond, clock, compressor)
    sync.track_plain = selsync.active and ctx.world_size > 1
    caps, controller, sampler = _split(cfg, ctx, profile, global_batch, accum, size, loader)
    metrics = MetricsWriter(cfg.metrics_path, ctx.rank, cfg.job_id)
    st = JobState(
        ctx=ctx,
        config=cfg,
        module=model,
        model=model if ddp is None else ddp,
        optimizer=optimizer,
        extras=dict(extras),
        params=params,
        amp=amp,
        clock=clock,
        sync=sync,
        selsync=selsync,
        compressor=compressor,
        precond=precond,
        controller=controller,
        sampler=sampler,
        loader=_data_loader(dataset, sampler, loader, cfg.seed),
        gns=GnsEstimator(cfg.gns_smoothing),
        lr=LrScaler(cfg.lr_scaling, batch_size, global_batch, cfg.lr_ramp_steps),
        momentum=MomentumCompensator(cfg.momentum, global_batch, cfg.lr_ramp_steps),
        metrics=metrics,
        runner=_runner(cfg, ctx, metrics, policies, adapt=profile is None),
        profile=profile,
        schedule=schedule,
        store=None,
        loss_sum=torch.zeros((), dtype=torch.float64, device=ctx.device),
        base_batch=batch_size,
        accum_steps=accum,
        global_batch=global_batch,
        gns_on=gns_on,
        pid_on=cfg.pid is not None and profile is None and ctx.world_size > 1,
        pin=loader.pin_memory,
        caps=caps,
        dataset_size=size,
        local_world_size=env.local_world_size(),
        schedule_index=schedule_index,
        step_sizes=controller.sizes,
        started=started,
    )
    sync.stats_source = lambda: step_end.stats_vector(st)
    if ddp is not None:
        rdist.on_shutdown(_releaser(weakref.ref(st)))
    resumed = _restore(st)
    st.sigterm.install()
    _start_events(st, resumed)
    if profile is not None:
        profile_steps.reset_peak_memory(st)
    return st


def _split(
    cfg: RuntimeConfig,
    ctx: Context,
    profile: ProfileRun | None,
    global_batch: int,
    accum: int,
    dataset_size: int,
    loader: LoaderOptions,
) -> tuple[list[int | None], BatchController, GlobalBatchSampler]:
    """(each rank's batch cap, the split of each micro-step's global batch, the data stream that
    applies it)."""
    rows = rdist.gather_floats([float(cfg.max_local_batch or 0)], ctx)
    caps = [int(row[0]) or None for row in rows]
    pid = cfg.pid or PidConfig()
    controller = BatchController(ctx.world_size, global_batch // accum, caps, pid)
    if profile is not None:
        controller.sizes = (profile.phase.local_batch,) * ctx.world_size
    sampler = GlobalBatchSampler(
        dataset_size,
        ctx.rank,
        ctx.world_size,
        controller.sizes,
        accum_steps=accum,
        seed=cfg.seed,
        shuffle=loader.shuffle,
    )
    return caps, controller, sampler


def _runner(
    cfg: RuntimeConfig,
    ctx: Context,
    metrics: MetricsWriter,
    policies: Sequence[Policy],
    *,
    adapt: bool,
) -> PolicyRunner:
    """Adaptation (not in profile mode): the script's policies, then KPLAN_POLICIES, and the
    launcher's control file."""
    return PolicyRunner(
        [*policies, *load_policies(cfg.policies)] if adapt else [],
        rank0=ctx.rank == 0,
        write_event=lambda **fields: metrics.event("policy", **fields),
        control_path=cfg.control_path if adapt else None,
    )


def _check_inputs(
    model: torch.nn.Module, dataset: Dataset[Any], batch_size: int, ctx: Context
) -> tuple[list[torch.nn.Parameter], int]:
    """(the trainable parameters, the dataset's size), after the arguments' checks."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(
            f"batch_size={batch_size!r} is not an integer >= 1",
            "pass Job(..., batch_size=B) with B the per-worker batch the script was written for",
        )
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise InputError(
            "kplan needs a map-style dataset (with __len__ and __getitem__)",
            "wrap an iterable dataset in a torch.utils.data.Dataset that indexes its samples",
        )
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError(
            "the model has no parameters that require gradients",
            "pass the model being trained (with requires_grad parameters) to the Job",
        )
    if params[0].device != ctx.device:
        raise InputError(
            f"the model is on {params[0].device}, this worker's device is {ctx.device}",
            "call model.to(kr.init().device) before creating the Job",
        )
    return params, len(dataset)


def _first_batch(
    cfg: RuntimeConfig, ctx: Context, profile: ProfileRun | None, batch_size: int, accum: int
) -> tuple[BatchSchedule | None, int, int]:
    """(schedule, its phase index, the first global batch): a batch schedule's phases at 0 set
    the first batch (kplan/runtime/batch_schedule.py); profile mode its phase's."""
    global_batch = batch_size if cfg.global_batch is None else cfg.global_batch
    if profile is not None:
        global_batch = profile.phase.local_batch * ctx.world_size
    sched = cfg.batch_schedule
    schedule = sched if isinstance(sched, BatchSchedule) and profile is None else None
    index = -1
    if schedule is not None:
        index = schedule.due(-1, 0, 0.0)
        if index >= 0:
            global_batch = schedule.phases[index].global_batch
    if global_batch % accum:
        raise InputError(
            f"global batch {global_batch} is not divisible by {accum} accumulation steps",
            "pick a global batch that is a multiple of KPLAN_ACCUM_STEPS",
        )
    return schedule, index, global_batch


def _wrap_ddp(
    model: torch.nn.Module, ctx: Context, ddp_kwargs: Mapping[str, Any]
) -> torch.nn.parallel.DistributedDataParallel | None:
    if not ctx.distributed:
        return None
    kwargs = dict(ddp_kwargs)
    # Gradients as views into DDP's buckets: no copies between them (and less memory).
    kwargs.setdefault("gradient_as_bucket_view", True)
    if ctx.is_cuda:
        kwargs.setdefault("device_ids", [ctx.device.index])
    return torch.nn.parallel.DistributedDataParallel(model, **kwargs)


def _gns_mode(
    cfg: RuntimeConfig, optimizer: torch.optim.Optimizer
) -> tuple[bool, Preconditioner | None]:
    """(GNS on, Adam's preconditioner): plain, or in Adam's preconditioned metric."""
    mode = cfg.gns
    if mode == "auto":
        mode = "adam" if isinstance(optimizer, ADAM_LIKE) else "sgd"
    if mode == "adam" and not isinstance(optimizer, ADAM_LIKE):
        raise InputError(
            f"GNS mode 'adam' needs an Adam-like optimizer, got {type(optimizer).__name__}",
            "use KPLAN_GNS=sgd or auto",
        )
    return mode != "off", Preconditioner(optimizer) if mode == "adam" else None


def _make_compressor(
    cfg: RuntimeConfig,
    ctx: Context,
    ddp: torch.nn.parallel.DistributedDataParallel | None,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    amp: Amp,
) -> Compressor | None:
    """Compression (compression/) with two or more workers; it also counts a dense run's bytes."""
    comp = cfg.compression
    assert isinstance(comp, Compression)  # parsed by RuntimeConfig
    if ddp is None or ctx.world_size < 2:
        return None
    network, exchange = None, None
    if comp.sparse and comp.collective == "auto":
        network = probe_network(ctx)
        cap = int(getattr(ddp, "bucket_bytes_cap", DDP_BUCKET_BYTES))
        buckets = exchange_buckets([p.numel() for p in params], cap)
        exchange = probe_topk_exchange(ctx, buckets, comp.ratio)
    return Compressor(comp, params, ctx, cfg.seed, network, optimizer, amp.precision, exchange)


def _data_loader(
    dataset: Dataset[Any], sampler: GlobalBatchSampler, opts: LoaderOptions, seed: int
) -> DataLoader[Any]:
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=opts.collate_fn,
        num_workers=opts.num_workers,
        pin_memory=opts.pin_memory,
        generator=torch.Generator().manual_seed(seed),
        **opts.extra,
    )


def _restore(st: JobState) -> str | None:
    """Load the latest checkpoint, if any (its path), and put the data stream at its position."""
    cfg, ctx = st.config, st.ctx
    resumed: str | None = None
    if cfg.checkpoint_dir is not None and not st.profiling:
        st.store = CheckpointStore(
            cfg.checkpoint_dir, ctx.rank, env.restart_count(), cfg.keep_checkpoints
        )
        latest = st.store.latest()
        if latest is not None:
            load_into(st, latest)
            resumed = str(latest)
    if resumed is None:  # distinct dropout streams per worker, reproducible
        rdist.seed_all(cfg.seed * 1_000_003 + 7_919 * (ctx.rank + 1))
    st.sampler.rewind(st.position)
    st.sampler.set_sizes(st.position.micro, st.controller.sizes)
    return resumed


def _start_events(st: JobState, resumed: str | None) -> None:
    ctx = st.ctx
    st.metrics.event(
        "start",
        world_size=ctx.world_size,
        backend=ctx.backend,
        device=str(ctx.device),
        restart_count=env.restart_count(),
        resumed_step=st.step_count if resumed else None,
        global_batch=st.global_batch,
        base_batch=st.base_batch,
        accum_steps=st.accum_steps,
        profiling=st.profiling,
        precision=st.amp.precision,
        # The GNS records are moving averages: their mean age in steps, and the data-set
        # size its finite-population correction uses (kplan/runtime/gns.py).
        gns_window_steps=round(st.gns.window_steps, 1),
        gns_population=st.dataset_size,
    )
    st.metrics.event(
        "model",
        gradient_bytes=sum(p.numel() * p.element_size() for p in st.params),
        parameters=sum(p.numel() for p in st.module.parameters()),
        gradient_shapes=shape_counts(st.params),
    )
    comp, policy = st.config.compression, st.config.sync_policy
    assert isinstance(comp, Compression) and not isinstance(policy, str)
    if st.compressor is not None and (comp.kind != "none" or st.selsync.active):
        net, exch = st.compressor.network, st.compressor.exchange
        st.metrics.event(
            "compression",
            compression=comp.spec(),
            sync_policy=policy.spec(),
            bandwidth_Bps=None if net is None else net[0],
            latency_s=None if net is None else net[1],
            topk_exchange=None if exch is None else dataclasses.asdict(exch),
            gns_dense_every=GNS_DENSE_EVERY if comp.lossy and st.gns_on else None,
        )
    if resumed:
        st.metrics.event("resume", step=st.step_count, path=resumed)


def _releaser(ref: weakref.ref[JobState]) -> Callable[[], None]:
    """At process-group shutdown: drop the DDP wrapper and the loader (their workers)."""

    def release() -> None:
        st = ref()
        if st is not None:
            st.model = st.module
            st.sync.ddp = None
            st.loader = None

    return release


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
