"""The end of one optimizer step (the pipeline is described in job.py's docstring).

Functions of the job's state (:class:`~kplan.runtime.state.JobState`), kept apart from the loop
API (job.py) to keep both readable.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, TypedDict

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.core.records import StepRecord
from kplan.runtime import distributed as rdist
from kplan.runtime import local_gns, profile_steps
from kplan.runtime.gns import GnsSample, estimate
from kplan.runtime.lr_scaling import rule_factor
from kplan.runtime.momentum import lr_correction
from kplan.runtime.policy import Monitor, batch_bounds, finite
from kplan.runtime.resume import save_checkpoint
from kplan.runtime.state import JobState, round_up

# Slots of the per-step statistics vector, per rank.
_B, _SQR, _LOSS, _PREV_B, _PREV_T, _TERM, _CKPT, _CIN, _COUT, _G2, _W2 = range(11)
_WIDTH = 11
# _CIN, _COUT: this rank's |a|² and |C(a)|² of the compressed step (compression/'s gain);
# _G2, _W2: |g_i|² of the local unweighted gradient and |w|², SelSync's significance.
# Then one tail that only rank 0 fills (zeros elsewhere, so the SUM keeps its values exact):
# its pending policy requests (global batch, 0 = none; stop flag), its wall time of the previous
# step and seconds since start, and the control file's money and time (NaN = unknown).
_Q_BATCH, _Q_STOP, _Q_WALL, _Q_ELAPSED, _Q_SPEND, _Q_BUDGET, _Q_PRICE, _Q_DEADLINE = range(8)
_TAIL = 8


class Preempted(SystemExit):
    """Raised after the SIGTERM checkpoint: the worker exits with status 143 (128 + SIGTERM)."""

    def __init__(self) -> None:
        super().__init__(143)


def stats_vector(st: JobState) -> torch.Tensor:
    """This rank's slot, in a zero vector with one slot per rank (SUM over ranks = all-gather).

    Slots: local batch (all micro-steps), local |g_i|², mean local loss, the previous step's
    local batch and compute time (for the PID), SIGTERM flag, checkpoint-due flag (rank 0);
    then rank 0's tail (policy requests, its clock, the control file's values).
    """
    ctx = st.ctx
    prev_b, prev_t = st.prev_timing or (0.0, 0.0)
    rank0 = ctx.rank == 0
    due = rank0 and checkpoint_due_by_time(st)
    local_batch = st.step_sizes[ctx.rank] * st.accum_steps
    comp = st.compressor
    gain = [0.0, 0.0]
    if comp is not None and ctx.device.type == "cpu":
        gain = [float(comp.sq_in), float(comp.sq_out)]
    w2 = 0.0
    if st.sync.track_plain:
        w2 = float(torch.nn.utils.get_total_norm(st.params, norm_type=2.0)) ** 2
    flags = [prev_b, prev_t, float(st.sigterm.requested), float(due), *gain, 0.0, w2]
    tail = rank0_tail(st) if rank0 else [0.0] * _TAIL
    start = ctx.rank * _WIDTH
    size = ctx.world_size * _WIDTH + _TAIL
    if ctx.device.type == "cpu":  # one tensor from host numbers (reading CPU scalars is free)
        full = [0.0] * size
        loss = float(st.loss_sum) / st.accum_steps
        mine = [float(local_batch), float(st.sync.local_sqr), loss, *flags]
        mine[_G2] = float(st.sync.plain_sqr)
        full[start : start + _WIDTH] = mine
        full[size - _TAIL :] = tail
        return torch.tensor(full, dtype=torch.float64)
    # On a GPU the norm and loss stay on the device: reading them would wait for the GPU.
    host = torch.tensor([float(local_batch), 0.0, 0.0, *flags, *tail], dtype=torch.float64)
    slot = host.to(ctx.device, non_blocking=True)
    slot[_SQR] = st.sync.local_sqr
    slot[_LOSS] = st.loss_sum / st.accum_steps
    slot[_G2] = st.sync.plain_sqr
    if comp is not None:
        slot[_CIN] = comp.sq_in
        slot[_COUT] = comp.sq_out
    vec = torch.zeros(size, dtype=torch.float64, device=ctx.device)
    vec[start : start + _WIDTH] = slot[:_WIDTH]
    if rank0:
        vec[size - _TAIL :] = slot[_WIDTH:]
    return vec


def rank0_tail(st: JobState) -> list[float]:
    """Rank 0's tail slots (see ``_Q_*``)."""
    runner = st.runner
    req = runner.requests
    batch = 0.0 if req.batch is None else float(req.batch.batch)
    stop = 0.0 if req.stop is None else 1.0
    elapsed = time.monotonic() - st.started
    return [batch, stop, st.prev_wall, elapsed, *runner.money(time.time())]


def finish_step(st: JobState) -> None:
    """The optimizer step and everything after it (job.py's docstring lists the order)."""
    ctx, s = st.ctx, st.accum_steps
    sizes = st.step_sizes
    local_batch = sizes[ctx.rank] * s
    st.complete_sync()
    single = None
    global_sqr = torch.zeros((), dtype=torch.float64, device=ctx.device)
    # fp16: norms taken before the unscale (the DDP hook's, the manual local norm, the global
    # one) are of S x the gradients; divide them by S². The all-reduced gradients are unscaled
    # once here, before the single-worker terms and the optimizer.
    scale_sq = st.amp.scale_sq() if st.measure else 1.0
    if st.measure and ctx.world_size > 1:
        global_sqr = st.sync.global_sqr()
    st.amp.unscale(st.optimizer)
    if st.measure and ctx.world_size == 1:
        single = local_gns.single_worker_terms(st)

    # The per-rank slots (an exact all-gather): already reduced with the gradients, or now.
    vec = st.sync.stats_result
    work = None
    if vec is None:
        vec = stats_vector(st).to(rdist.comm_device(ctx))
        work = rdist.all_reduce_sum(vec, ctx)

    lr_before = st.lr.state_dict() if st.amp.scaler is not None else None
    factor = st.lr.factor(st.step_count, st.gns.grad_sqr, st.gns.grad_var)
    taken = optimizer_step(st, factor)
    if not taken and lr_before is not None:
        # fp16 overflow: the step was skipped; it is no progress, and its gradients are no
        # GNS sample (nor the previous-step half of the next one).
        st.lr.load_state_dict(lr_before, st.step_count)
        st.prev_grads = None

    if work is not None:
        work.wait()
    flat = vec.tolist()
    rows = [flat[r * _WIDTH : (r + 1) * _WIDTH] for r in range(ctx.world_size)]
    tail = flat[ctx.world_size * _WIDTH :]
    compute_time = st.clock.compute_time()
    end = time.perf_counter()
    st.prev_timing = (float(local_batch), compute_time)

    if taken:
        update_gns(st, rows, single, float(global_sqr), scale_sq)
    update_split(st, rows)
    comm = after_sync(st, rows, sizes)
    batches = [row[_B] for row in rows]
    total = sum(batches)
    loss = sum(b * row[_LOSS] for b, row in zip(batches, rows, strict=True)) / total
    step_time = end - (st.last_end if st.last_end is not None else end)
    record = step_record(st, local_batch, int(total), compute_time, step_time, loss)
    st.metrics.step(dataclasses.replace(record, **comm, **_step_extras(st, taken)))
    st.step_count += 1
    _after_record(st, rows, tail, loss)
    st.prev_wall = step_time
    st.last_end = time.perf_counter()


class StepExtras(TypedDict, total=False):
    """The step record's fp16 and profile-mode fields (StepRecord's of the same names)."""

    loss_scale: float | None
    skipped: bool
    phase: str
    warmup: bool
    backward_time: float | None


class CommFields(TypedDict, total=False):
    """The step record's communication fields: compression and SelSync (StepRecord's of the
    same names)."""

    averaged: bool
    synced: bool
    significance: float | None
    synced_steps: int
    skipped_steps: int
    compression: str
    bytes_sent: float
    blocked_s: float
    compress_ratio: float | None
    topk_ratio: float
    collective: tuple[str, ...] | None
    compress_gain: float
    next_topk_ratio: float


def _step_extras(st: JobState, taken: bool) -> StepExtras:
    """The step record's fp16 and profile-mode fields, where they apply."""
    extra: StepExtras = {}
    if st.amp.scaler is not None:
        extra["loss_scale"], extra["skipped"] = st.amp.loss_scale(), not taken
    if st.profile is not None:
        # backward_time: the sweep's, compute_time minus forward and the input
        extra["phase"], extra["warmup"] = st.profile.phase.name, st.profile.warmup
        extra["backward_time"] = st.clock.backward_time()
    return extra


def _after_record(st: JobState, rows: list[list[float]], tail: list[float], loss: float) -> None:
    """Profile-mode bookkeeping, or the stop conditions, adaptation and the checkpoint."""
    if st.profile is not None:
        profile_steps.profile_step_done(st)
        return
    if st.config.max_steps is not None and st.step_count >= st.config.max_steps:
        st.stopped = True
    target = st.progress_target
    if target is not None and st.progress >= target - 1e-9:
        st.stopped = True
    adapt(st, rows, tail, loss)
    maybe_checkpoint(st, rows)


def step_record(
    st: JobState,
    local_batch: int,
    global_batch: int,
    compute_time: float,
    step_time: float,
    loss: float,
) -> StepRecord:
    """The step's record: the fields every step record has (kplan/core/records.py)."""
    return StepRecord(
        step=st.step_count,
        world_size=st.ctx.world_size,
        local_batch=local_batch,
        global_batch=global_batch,
        compute_time=compute_time,
        sync_time=max(step_time - compute_time, 0.0),
        step_time=step_time,
        loss=loss,
        gns=st.gns.gns,
        grad_sqr=st.gns.grad_sqr,
        grad_var=st.gns.grad_var,
        gns_rel_error=st.gns.rel_error,
        lr=st.lr_value,
        time=time.time(),
        epoch=st.position.epoch,
        accum_steps=st.accum_steps,
        progress=st.progress,
    )


def after_sync(st: JobState, rows: list[list[float]], sizes: tuple[int, ...]) -> CommFields:
    """Compression and SelSync bookkeeping after the optimizer step (every rank, from
    all-gathered values); returns the step record's communication fields."""
    comp, sel = st.compressor, st.selsync
    if comp is None:
        return {}
    compressed = comp.active and st.step_synced
    ratio = comp.ratio  # the one this step used (adaptive may change it below)
    gain = None
    if compressed and comp.spec.lossy:  # adaptive: the gain over all workers
        gain = comp.observe_gain(sum(r[_CIN] for r in rows), sum(r[_COUT] for r in rows))
    out: CommFields = {}
    if sel.active:
        lr = st.lr_value or 0.0
        scale_sq = st.amp.scale_sq()
        sig = [
            lr * math.sqrt(max(r[_G2], 0.0) / scale_sq) / math.sqrt(r[_W2])
            if r[_W2] > 0
            else math.inf
            for r in rows
        ]
        if sel.after_step(st.step_count, st.step_synced, sig):
            st.sync.average_parameters(sizes[st.ctx.rank] / sum(sizes))
            out["averaged"] = True
        out["synced"], out["significance"] = st.step_synced, sel.last_significance
        out["synced_steps"], out["skipped_steps"] = sel.synced_steps, sel.skipped_steps
    spec = comp.spec
    out["compression"] = spec.spec() if compressed else "none"
    out["bytes_sent"] = comp.bytes_sent
    if comp.times_blocking and compressed:
        out["blocked_s"] = comp.blocked_s
    out["compress_ratio"] = comp.dense_bytes / comp.bytes_sent if comp.bytes_sent > 0 else None
    if spec.sparse:
        out["topk_ratio"] = ratio
        out["collective"] = tuple(sorted(comp.collectives)) if compressed else None
    if gain is not None:  # adaptive closed its window: the gain that set the next ratio
        out["compress_gain"] = gain
        out["next_topk_ratio"] = comp.ratio
    return out


def adapt(st: JobState, rows: list[list[float]], tail: list[float], loss: float) -> None:
    """Apply rank 0's requests (every rank, same step), run the policies, poll the control."""
    runner = st.runner
    rank0 = st.ctx.rank == 0
    apply_schedule(st)
    if tail[_Q_BATCH] > 0:
        apply_batch(st, round(tail[_Q_BATCH]))
    if tail[_Q_STOP] > 0 and st.stop_reason is None:
        request = runner.requests.stop
        st.stop_reason = "stopped on rank 0's request" if request is None else request.reason
        st.stopped = True
        if rank0 and request is not None:
            st.metrics.event(
                "policy",
                action="stop",
                policy=request.policy,
                reason=request.reason,
                step=st.step_count,
            )
    if runner.policies:
        runner.call("after_step", monitor(st, rows, tail, loss))
    if rank0:
        runner.poll_control(time.monotonic())


def apply_batch(st: JobState, wanted: int) -> None:
    """Run global batch ``wanted`` (clamped to what fits) from the first step not yet fetched."""
    ctx, accum = st.ctx, st.accum_steps
    request = st.runner.requests.batch
    st.runner.requests.batch = None
    lo, hi = batch_bounds(ctx.world_size, accum, st.caps, st.dataset_size)
    batch = min(max(wanted // accum * accum, lo), hi)
    if batch == st.global_batch:
        return
    previous = st.global_batch
    first = round_up(st.sampler.next_micro, accum) // accum
    st.set_global_batch(batch)
    if ctx.rank == 0 and request is not None:
        st.metrics.event(
            "policy",
            action="set_batch",
            policy=request.policy,
            reason=request.reason if batch == wanted else f"{request.reason} (asked {wanted})",
            step=first,
            global_batch=batch,
            previous=previous,
        )


def apply_schedule(st: JobState) -> None:
    """Enter the batch schedule's next phase once its trigger is reached (every rank, from
    all-gathered values only: the step count and ``st.progress``), clamped to what fits."""
    sched = st.schedule
    if sched is None:
        return
    target = st.schedule_target
    fraction = st.progress / target if target else None
    index = sched.due(st.schedule_index, st.step_count, fraction)
    if index == st.schedule_index:
        return
    st.schedule_index = index
    phase = sched.phases[index]
    accum = st.accum_steps
    lo, hi = batch_bounds(st.ctx.world_size, accum, st.caps, st.dataset_size)
    batch = min(max(phase.global_batch // accum * accum, lo), hi)
    previous = st.global_batch
    first = round_up(st.sampler.next_micro, accum) // accum
    if batch != previous:
        st.set_global_batch(batch)
    if st.ctx.rank == 0:
        group = st.optimizer.param_groups[0]
        k = st.momentum.batch / st.momentum.ref_batch if st.momentum.mode != "off" else 1.0
        momentum = st.momentum.targets([group], k)[0]
        m = float(group.get("momentum", 0.0) or 0.0) if "betas" not in group else 0.0
        factor = rule_factor(st.lr.rule, st.base_batch, batch, st.gns.grad_sqr, st.gns.grad_var)
        st.metrics.event(
            "batch_schedule",
            step=first,
            phase=index,
            trigger=sched.trigger,
            at=phase.at,
            progress=st.progress,
            previous=previous,
            global_batch=batch,
            asked=phase.global_batch,
            lr_factor=factor * (lr_correction(m, k) if momentum is not None else 1.0),
            momentum=list(momentum) if isinstance(momentum, tuple) else momentum,
            ramp_steps=st.config.lr_ramp_steps,
        )


def monitor(st: JobState, rows: list[list[float]], tail: list[float], loss: float) -> Monitor:
    """The policies' view after this step, from all-gathered values only (same on every rank)."""
    prev_b = [row[_PREV_B] for row in rows]
    times: tuple[float, ...] | None = tuple(row[_PREV_T] for row in rows)
    timed: int | None = st.step_count - 2
    if any(b <= 0 for b in prev_b):
        prev_b, times, timed = [row[_B] for row in rows], None, None
    else:
        st.runner.timing(prev_b, times or (), tail[_Q_WALL])
    step_time, throughput, sync = st.runner.window_stats(st.global_batch)
    return base_monitor(
        st,
        timed_step=timed,
        local_batches=tuple(int(b) for b in prev_b),
        compute_times=times,
        step_time=step_time,
        throughput=throughput,
        sync_time=sync,
        loss=finite(loss),
        elapsed_s=tail[_Q_ELAPSED],
        spend_usd=finite(tail[_Q_SPEND]),
        budget_usd=finite(tail[_Q_BUDGET]),
        usd_per_hour=finite(tail[_Q_PRICE]),
        deadline_s_left=finite(tail[_Q_DEADLINE]),
    )


def base_monitor(st: JobState, **fields: Any) -> Monitor:
    """The Monitor from the job's own (rank-independent) state, no timings; ``fields`` replace."""
    monitor = Monitor(
        step=st.step_count,
        epoch=st.position.epoch,
        progress=st.progress,
        progress_target=st.progress_target,
        global_batch=st.global_batch,
        base_batch=st.base_batch,
        accum_steps=st.accum_steps,
        world_size=st.ctx.world_size,
        local_world_size=st.local_world_size,
        dataset_size=st.dataset_size,
        max_local_batches=tuple(st.caps),
        pid=st.pid_on,
        timed_step=None,
        local_batches=tuple(b * st.accum_steps for b in st.step_sizes),
        compute_times=None,
        step_time=None,
        throughput=None,
        sync_time=None,
        gns=st.gns.gns,
        grad_sqr=st.gns.grad_sqr,
        grad_var=st.gns.grad_var,
        loss=None,
        lr=st.lr_value,
        elapsed_s=0.0,
        spend_usd=None,
        budget_usd=None,
        usd_per_hour=None,
        deadline_s_left=None,
    )
    return dataclasses.replace(monitor, **fields)


def optimizer_step(st: JobState, factor: float) -> bool:
    """The optimizer step at ``factor`` x the LR; False when fp16 loss scaling skipped it."""
    groups = st.optimizer.param_groups
    saved = [g["lr"] for g in groups]
    for g, lr in zip(groups, saved, strict=True):
        g["lr"] = lr * factor
    # Momentum compensation of a batch change (kplan/runtime/momentum.py): m^k, and the LR x
    # (1 - m^k)/(1 - m) that keeps the SGD-equivalent step; k = 1 (nothing) at the start batch.
    kept = st.momentum.apply(groups, st.momentum.ratio(st.step_count))
    applied = float(groups[0]["lr"]) if groups else None
    try:
        taken = st.amp.step(st.optimizer)
    finally:
        st.momentum.restore(groups, kept)
        for g, lr in zip(groups, saved, strict=True):
            g["lr"] = lr
    st.optimizer.zero_grad(set_to_none=True)
    st.lr_value = applied
    return taken


def update_gns(
    st: JobState,
    rows: list[list[float]],
    single: tuple[list[torch.Tensor], list[int], torch.Tensor] | None,
    global_sqr: float,
    scale_sq: float = 1.0,
) -> None:
    """Add this step's GNS sample; ``scale_sq``: S², which the all-gathered norms carry (fp16)."""
    if not st.measure:
        return
    if st.ctx.world_size > 1:
        local = [row[_SQR] / scale_sq for row in rows]
        batches = [int(row[_B]) for row in rows]
        big = global_sqr / scale_sq
    elif single is not None:
        local = [float(t) for t in single[0]]
        batches = single[1]
        big = float(single[2])
    else:
        return
    if all(math.isfinite(v) for v in [*local, big]):
        # Within an epoch the sampler draws without replacement: the finite-set correction.
        sample: GnsSample = estimate(local, batches, big, population=st.dataset_size)
        st.gns.update(sample)


def update_split(st: JobState, rows: list[list[float]]) -> None:
    if not st.pid_on:
        return
    prev_b = [row[_PREV_B] for row in rows]
    if any(b <= 0 for b in prev_b):
        return
    sizes = tuple(int(b) // st.accum_steps for b in prev_b)
    times = [row[_PREV_T] for row in rows]
    new = st.controller.observe(st.step_count - 1, sizes, times)
    if new is not None:
        first = round_up(st.sampler.next_micro, st.accum_steps)
        st.sampler.set_sizes(first, new)
        st.metrics.event("batch_sizes", step=first // st.accum_steps, local_batches=list(new))


def checkpoint_due_by_time(st: JobState) -> bool:
    interval = st.config.checkpoint_interval
    if st.store is None or interval <= 0:
        return False
    return time.monotonic() - st.last_ckpt_time >= interval


def maybe_checkpoint(st: JobState, rows: list[list[float]]) -> None:
    sigterm = any(row[_TERM] > 0 for row in rows)
    every = st.config.checkpoint_steps
    reason = None
    if sigterm:
        reason = "sigterm"
    elif rows[0][_CKPT] > 0:
        reason = "period"
    elif every and st.step_count % every == 0:
        reason = "steps"
    if reason is not None and st.store is not None:
        save_checkpoint(st, reason)
    if sigterm:
        st.stopped = True
        st.finished = True
        st.metrics.event("preempted", step=st.step_count)
        st.metrics.close()
        raise Preempted()
