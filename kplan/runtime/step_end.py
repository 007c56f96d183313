"""The end of one optimizer step (the pipeline is described in job.py's docstring).

Functions over a :class:`~kplan.runtime.job.Job`, kept apart from the loop API to keep both
readable; they use the job's private state as a friend module.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch  # noqa: TID253 (torch is the runtime's core dependency)

from kplan.runtime import distributed as rdist
from kplan.runtime import local_gns, profile_steps
from kplan.runtime.gns import GnsSample, estimate
from kplan.runtime.lr_scaling import rule_factor
from kplan.runtime.momentum import lr_correction
from kplan.runtime.policy import Monitor, batch_bounds, finite

if TYPE_CHECKING:
    from kplan.runtime.job import Job

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


def stats_vector(job: Job) -> torch.Tensor:
    """This rank's slot, in a zero vector with one slot per rank (SUM over ranks = all-gather).

    Slots: local batch (all micro-steps), local |g_i|², mean local loss, the previous step's
    local batch and compute time (for the PID), SIGTERM flag, checkpoint-due flag (rank 0);
    then rank 0's tail (policy requests, its clock, the control file's values).
    """
    ctx = job.ctx
    prev_b, prev_t = job._prev_timing or (0.0, 0.0)
    rank0 = ctx.rank == 0
    due = rank0 and checkpoint_due_by_time(job)
    local_batch = job._step_sizes[ctx.rank] * job.accum_steps
    comp = job._compressor
    gain = [0.0, 0.0]
    if comp is not None and ctx.device.type == "cpu":
        gain = [float(comp.sq_in), float(comp.sq_out)]
    w2 = 0.0
    if job._sync.track_plain:
        w2 = float(torch.nn.utils.get_total_norm(job._params, norm_type=2.0)) ** 2
    flags = [prev_b, prev_t, float(job._sigterm.requested), float(due), *gain, 0.0, w2]
    tail = rank0_tail(job) if rank0 else [0.0] * _TAIL
    start = ctx.rank * _WIDTH
    size = ctx.world_size * _WIDTH + _TAIL
    if ctx.device.type == "cpu":  # one tensor from host numbers (reading CPU scalars is free)
        full = [0.0] * size
        loss = float(job._loss_sum) / job.accum_steps
        mine = [float(local_batch), float(job._sync.local_sqr), loss, *flags]
        mine[_G2] = float(job._sync.plain_sqr)
        full[start : start + _WIDTH] = mine
        full[size - _TAIL :] = tail
        return torch.tensor(full, dtype=torch.float64)
    # On a GPU the norm and loss stay on the device: reading them would wait for the GPU.
    host = torch.tensor([float(local_batch), 0.0, 0.0, *flags, *tail], dtype=torch.float64)
    slot = host.to(ctx.device, non_blocking=True)
    slot[_SQR] = job._sync.local_sqr
    slot[_LOSS] = job._loss_sum / job.accum_steps
    slot[_G2] = job._sync.plain_sqr
    if comp is not None:
        slot[_CIN] = comp.sq_in
        slot[_COUT] = comp.sq_out
    vec = torch.zeros(size, dtype=torch.float64, device=ctx.device)
    vec[start : start + _WIDTH] = slot[:_WIDTH]
    if rank0:
        vec[size - _TAIL :] = slot[_WIDTH:]
    return vec


def rank0_tail(job: Job) -> list[float]:
    """Rank 0's tail slots (see ``_Q_*``)."""
    runner = job._runner
    req = runner.requests
    batch = 0.0 if req.batch is None else float(req.batch.batch)
    stop = 0.0 if req.stop is None else 1.0
    elapsed = time.monotonic() - job._started
    return [batch, stop, job._prev_wall, elapsed, *runner.money(time.time())]


def finish_step(job: Job) -> None:
    ctx, s = job.ctx, job.accum_steps
    sizes = job._step_sizes
    local_batch = sizes[ctx.rank] * s
    job._complete_sync()
    single = None
    global_sqr = torch.zeros((), dtype=torch.float64, device=ctx.device)
    # fp16: norms taken before the unscale (the DDP hook's, the manual local norm, the global
    # one) are of S x the gradients; divide them by S². The all-reduced gradients are unscaled
    # once here, before the single-worker terms and the optimizer.
    scale_sq = job.amp.scale_sq() if job._measure else 1.0
    if job._measure and ctx.world_size > 1:
        global_sqr = job._sync.global_sqr()
    job.amp.unscale(job.optimizer)
    if job._measure and ctx.world_size == 1:
        single = local_gns.single_worker_terms(job)

    # The per-rank slots (an exact all-gather): already reduced with the gradients, or now.
    vec = job._sync.stats_result
    work = None
    if vec is None:
        vec = stats_vector(job).to(rdist.comm_device(ctx))
        work = rdist.all_reduce_sum(vec, ctx)

    lr_before = job._lr.state_dict() if job.amp.scaler is not None else None
    factor = job._lr.factor(job.step_count, job._gns.grad_sqr, job._gns.grad_var)
    taken = optimizer_step(job, factor)
    if not taken and lr_before is not None:
        # fp16 overflow: the step was skipped; it is no progress, and its gradients are no
        # GNS sample (nor the previous-step half of the next one).
        job._lr.load_state_dict(lr_before, job.step_count)
        job._prev_grads = None

    if work is not None:
        work.wait()
    flat = vec.tolist()
    rows = [flat[r * _WIDTH : (r + 1) * _WIDTH] for r in range(ctx.world_size)]
    tail = flat[ctx.world_size * _WIDTH :]
    compute_time = job._clock.compute_time()
    end = time.perf_counter()
    job._prev_timing = (float(local_batch), compute_time)

    if taken:
        update_gns(job, rows, single, float(global_sqr), scale_sq)
    update_split(job, rows)
    comm = after_sync(job, rows, sizes)
    batches = [row[_B] for row in rows]
    total = sum(batches)
    loss = sum(b * row[_LOSS] for b, row in zip(batches, rows, strict=True)) / total
    step_time = end - (job._last_end if job._last_end is not None else end)
    record: dict[str, Any] = {
        "step": job.step_count,
        "world_size": ctx.world_size,
        "local_batch": local_batch,
        "global_batch": int(total),
        "compute_time": compute_time,
        "sync_time": max(step_time - compute_time, 0.0),
        "step_time": step_time,
        "loss": loss,
        "gns": job._gns.gns,
        "grad_sqr": job._gns.grad_sqr,
        "grad_var": job._gns.grad_var,
        "gns_rel_error": job._gns.rel_error,
        "lr": job._lr_value,
        "time": time.time(),
        "epoch": job._position.epoch,
        "accum_steps": s,
        "progress": job.progress,
    }
    record.update(comm)
    if job.amp.scaler is not None:
        record["loss_scale"] = job.amp.loss_scale()
        record["skipped"] = not taken
    if job._profile is not None:
        record["phase"] = job._profile.phase.name
        record["warmup"] = job._profile.warmup
        backward = job._clock.backward_time()
        if backward is not None:  # the sweep's: compute_time minus forward and the input
            record["backward_time"] = backward
    job.metrics.write(record)
    job.step_count += 1

    if job._profile is not None:
        profile_steps.profile_step_done(job)
    else:
        if job.config.max_steps is not None and job.step_count >= job.config.max_steps:
            job._stopped = True
        target = job._progress_target
        if target is not None and job.progress >= target - 1e-9:
            job._stopped = True
        adapt(job, rows, tail, loss)
        maybe_checkpoint(job, rows)
    job._prev_wall = step_time
    job._last_end = time.perf_counter()


def after_sync(job: Job, rows: list[list[float]], sizes: tuple[int, ...]) -> dict[str, Any]:
    """Compression and SelSync bookkeeping after the optimizer step (every rank, from
    all-gathered values); returns the step record's communication fields."""
    comp, sel = job._compressor, job._selsync
    if comp is None:
        return {}
    compressed = comp.active and job._step_synced
    ratio = comp.ratio  # the one this step used (adaptive may change it below)
    gain = None
    if compressed and comp.spec.lossy:  # adaptive: the gain over all workers
        gain = comp.observe_gain(sum(r[_CIN] for r in rows), sum(r[_COUT] for r in rows))
    out: dict[str, Any] = {}
    if sel.active:
        lr = job._lr_value or 0.0
        scale_sq = job.amp.scale_sq()
        sig = [
            lr * math.sqrt(max(r[_G2], 0.0) / scale_sq) / math.sqrt(r[_W2])
            if r[_W2] > 0
            else math.inf
            for r in rows
        ]
        if sel.after_step(job.step_count, job._step_synced, sig):
            job._sync.average_parameters(sizes[job.ctx.rank] / sum(sizes))
            out["averaged"] = True
        out.update(
            synced=job._step_synced,
            significance=sel.last_significance,
            synced_steps=sel.synced_steps,
            skipped_steps=sel.skipped_steps,
        )
    spec = comp.spec
    out["compression"] = spec.spec() if compressed else "none"
    out["bytes_sent"] = comp.bytes_sent
    if comp.times_blocking and compressed:
        out["blocked_s"] = comp.blocked_s
    out["compress_ratio"] = comp.dense_bytes / comp.bytes_sent if comp.bytes_sent > 0 else None
    if spec.sparse:
        out["topk_ratio"] = ratio
        out["collective"] = sorted(comp.collectives) if compressed else None
    if gain is not None:  # adaptive closed its window: the gain that set the next ratio
        out["compress_gain"] = gain
        out["next_topk_ratio"] = comp.ratio
    return out


def adapt(job: Job, rows: list[list[float]], tail: list[float], loss: float) -> None:
    """Apply rank 0's requests (every rank, same step), run the policies, poll the control."""
    runner = job._runner
    rank0 = job.ctx.rank == 0
    apply_schedule(job)
    if tail[_Q_BATCH] > 0:
        apply_batch(job, round(tail[_Q_BATCH]))
    if tail[_Q_STOP] > 0 and job._stop_reason is None:
        request = runner.requests.stop
        job._stop_reason = "stopped on rank 0's request" if request is None else request.reason
        job._stopped = True
        if rank0 and request is not None:
            job.metrics.event(
                "policy",
                action="stop",
                policy=request.policy,
                reason=request.reason,
                step=job.step_count,
            )
    if runner.policies:
        runner.call("after_step", monitor(job, rows, tail, loss))
    if rank0:
        runner.poll_control(time.monotonic())


def apply_batch(job: Job, wanted: int) -> None:
    """Run global batch ``wanted`` (clamped to what fits) from the first step not yet fetched."""
    ctx, accum = job.ctx, job.accum_steps
    request = job._runner.requests.batch
    job._runner.requests.batch = None
    lo, hi = batch_bounds(ctx.world_size, accum, job._caps, job._dataset_size)
    batch = min(max(wanted // accum * accum, lo), hi)
    if batch == job.global_batch:
        return
    previous = job.global_batch
    first = round_up(job._sampler.next_micro, accum) // accum
    job.set_global_batch(batch)
    if ctx.rank == 0 and request is not None:
        job.metrics.event(
            "policy",
            action="set_batch",
            policy=request.policy,
            reason=request.reason if batch == wanted else f"{request.reason} (asked {wanted})",
            step=first,
            global_batch=batch,
            previous=previous,
        )


def apply_schedule(job: Job) -> None:
    """Enter the batch schedule's next phase once its trigger is reached (every rank, from
    all-gathered values only: the step count and ``job.progress``), clamped to what fits."""
    sched = job._schedule
    if sched is None:
        return
    target = job._schedule_target
    fraction = job.progress / target if target else None
    index = sched.due(job._schedule_index, job.step_count, fraction)
    if index == job._schedule_index:
        return
    job._schedule_index = index
    phase = sched.phases[index]
    accum = job.accum_steps
    lo, hi = batch_bounds(job.ctx.world_size, accum, job._caps, job._dataset_size)
    batch = min(max(phase.global_batch // accum * accum, lo), hi)
    previous = job.global_batch
    first = round_up(job._sampler.next_micro, accum) // accum
    if batch != previous:
        job.set_global_batch(batch)
    if job.ctx.rank == 0:
        group = job.optimizer.param_groups[0]
        k = job._momentum.batch / job._momentum.ref_batch if job._momentum.mode != "off" else 1.0
        momentum = job._momentum.targets([group], k)[0]
        m = float(group.get("momentum", 0.0) or 0.0) if "betas" not in group else 0.0
        factor = rule_factor(
            job._lr.rule, job.base_batch, batch, job._gns.grad_sqr, job._gns.grad_var
        )
        job.metrics.event(
            "batch_schedule",
            step=first,
            phase=index,
            trigger=sched.trigger,
            at=phase.at,
            progress=job.progress,
            previous=previous,
            global_batch=batch,
            asked=phase.global_batch,
            lr_factor=factor * (lr_correction(m, k) if momentum is not None else 1.0),
            momentum=list(momentum) if isinstance(momentum, tuple) else momentum,
            ramp_steps=job.config.lr_ramp_steps,
        )


def monitor(job: Job, rows: list[list[float]], tail: list[float], loss: float) -> Monitor:
    """The policies' view after this step, from all-gathered values only (same on every rank)."""
    prev_b = [row[_PREV_B] for row in rows]
    times: tuple[float, ...] | None = tuple(row[_PREV_T] for row in rows)
    timed: int | None = job.step_count - 2
    if any(b <= 0 for b in prev_b):
        prev_b, times, timed = [row[_B] for row in rows], None, None
    else:
        job._runner.timing(prev_b, times or (), tail[_Q_WALL])
    step_time, throughput, sync = job._runner.window_stats(job.global_batch)
    return base_monitor(
        job,
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


def base_monitor(job: Job, **fields: Any) -> Monitor:
    """The Monitor from the job's own (rank-independent) state, no timings; ``fields`` replace."""
    values: dict[str, Any] = {
        "step": job.step_count,
        "epoch": job._position.epoch,
        "progress": job.progress,
        "progress_target": job._progress_target,
        "global_batch": job.global_batch,
        "base_batch": job.base_batch,
        "accum_steps": job.accum_steps,
        "world_size": job.ctx.world_size,
        "local_world_size": job._local_world_size,
        "dataset_size": job._dataset_size,
        "max_local_batches": tuple(job._caps),
        "pid": job._pid_on,
        "timed_step": None,
        "local_batches": tuple(b * job.accum_steps for b in job._step_sizes),
        "compute_times": None,
        "step_time": None,
        "throughput": None,
        "sync_time": None,
        "gns": job._gns.gns,
        "grad_sqr": job._gns.grad_sqr,
        "grad_var": job._gns.grad_var,
        "loss": None,
        "lr": job._lr_value,
        "elapsed_s": 0.0,
        "spend_usd": None,
        "budget_usd": None,
        "usd_per_hour": None,
        "deadline_s_left": None,
    }
    values.update(fields)
    return Monitor(**values)


def optimizer_step(job: Job, factor: float) -> bool:
    """The optimizer step at ``factor`` x the LR; False when fp16 loss scaling skipped it."""
    groups = job.optimizer.param_groups
    saved = [g["lr"] for g in groups]
    for g, lr in zip(groups, saved, strict=True):
        g["lr"] = lr * factor
    # Momentum compensation of a batch change (kplan/runtime/momentum.py): m^k, and the LR x
    # (1 - m^k)/(1 - m) that keeps the SGD-equivalent step; k = 1 (nothing) at the start batch.
    kept = job._momentum.apply(groups, job._momentum.ratio(job.step_count))
    applied = float(groups[0]["lr"]) if groups else None
    try:
        taken = job.amp.step(job.optimizer)
    finally:
        job._momentum.restore(groups, kept)
        for g, lr in zip(groups, saved, strict=True):
            g["lr"] = lr
    job.optimizer.zero_grad(set_to_none=True)
    job._lr_value = applied
    return taken


def update_gns(
    job: Job,
    rows: list[list[float]],
    single: tuple[list[torch.Tensor], list[int], torch.Tensor] | None,
    global_sqr: float,
    scale_sq: float = 1.0,
) -> None:
    """Add this step's GNS sample; ``scale_sq``: S², which the all-gathered norms carry (fp16)."""
    if not job._measure:
        return
    if job.ctx.world_size > 1:
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
        sample: GnsSample = estimate(local, batches, big, population=job._dataset_size)
        job._gns.update(sample)


def update_split(job: Job, rows: list[list[float]]) -> None:
    if not job._pid_on:
        return
    prev_b = [row[_PREV_B] for row in rows]
    if any(b <= 0 for b in prev_b):
        return
    sizes = tuple(int(b) // job.accum_steps for b in prev_b)
    times = [row[_PREV_T] for row in rows]
    new = job._controller.observe(job.step_count - 1, sizes, times)
    if new is not None:
        first = round_up(job._sampler.next_micro, job.accum_steps)
        job._sampler.set_sizes(first, new)
        job.metrics.event("batch_sizes", step=first // job.accum_steps, local_batches=list(new))


def checkpoint_due_by_time(job: Job) -> bool:
    interval = job.config.checkpoint_interval
    if job._store is None or interval <= 0:
        return False
    return time.monotonic() - job._last_ckpt_time >= interval


def maybe_checkpoint(job: Job, rows: list[list[float]]) -> None:
    sigterm = any(row[_TERM] > 0 for row in rows)
    every = job.config.checkpoint_steps
    reason = None
    if sigterm:
        reason = "sigterm"
    elif rows[0][_CKPT] > 0:
        reason = "period"
    elif every and job.step_count % every == 0:
        reason = "steps"
    if reason is not None and job._store is not None:
        job.checkpoint(reason)
    if sigterm:
        job._stopped = True
        job._finished = True
        job.metrics.event("preempted", step=job.step_count)
        job.metrics.close()
        raise Preempted()


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
