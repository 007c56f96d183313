"""What a checkpoint holds for a job, and how a restarted job takes it back.

Shared state (rank 0 writes it; every rank reads it): model, optimizer, extras (for example the
LR scheduler), the step count, the exact data position, the PID split, the GNS averages and the
LR scaler (its ramp and progress), SelSync's counters. Per-rank state: the RNG generators, the
compression's error feedback (residuals, PowerSGD's Q and error, the adaptive ratio's window;
top-k's momentum fold adds none: its residuals carry it, and the optimizer's momentum buffer,
the same on every rank, is in the shared optimizer state) and, under SelSync, the rank's own
model and optimizer. Together they make a restarted run continue exactly where the checkpoint
was taken: same samples in the same global batches, same parameters, same random numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kplan.core.errors import JobError
from kplan.runtime import checkpoint as ckpt
from kplan.runtime import distributed as rdist
from kplan.runtime.sampler import Position

if TYPE_CHECKING:
    from kplan.runtime.job import Job

FORMAT = 1


def runtime_state(job: Job) -> dict[str, Any]:
    """The shared part of a checkpoint of ``job`` at the end of its current step."""
    pos = job._position
    return {
        "format": FORMAT,
        "model": job.module.state_dict(),
        "optimizer": job.optimizer.state_dict(),
        "extras": {name: obj.state_dict() for name, obj in job.extras.items()},
        "runtime": {
            "step": job.step_count,
            "epoch": pos.epoch,
            "offset": pos.offset,
            "world_size": job.ctx.world_size,
            "configured_global_batch": job.config.global_batch,
            "global_batch": job.global_batch,
            "accum_steps": job.accum_steps,
            "controller": job._controller.state_dict(),
            "gns": job._gns.state_dict(),
            "lr": job._lr.state_dict(),
            "momentum": job._momentum.state_dict(),
            "batch_schedule_index": job._schedule_index,
            "control_seq": job._runner.control_seq,
            "precision": job.amp.precision,
            "scaler": job.amp.state_dict(),
            "selsync": job._selsync.state_dict(),
        },
    }


def local_state(job: Job) -> dict[str, Any]:
    """This rank's own part besides its RNG: the error-feedback state of compression and, once
    SelSync has skipped a step (replicas and their optimizer states differ), its own model and
    optimizer (rank 0's are the shared ones)."""
    out: dict[str, Any] = {}
    if job._compressor is not None:
        out["compressor"] = job._compressor.state_dict()
    if job._selsync.skipped_steps > 0 and job.ctx.rank > 0:
        out["replica"] = {"model": job.module.state_dict(), "optimizer": job.optimizer.state_dict()}
    return out


def load_into(job: Job, path: Path) -> None:
    """Restore ``job`` from the checkpoint directory ``path`` (before its first step)."""
    shared = ckpt.load(path / ckpt.STATE_FILE)
    if not isinstance(shared, dict) or shared.get("format") != FORMAT:
        got = shared.get("format") if isinstance(shared, dict) else type(shared).__name__
        raise JobError(
            f"checkpoint {path} has format {got}, this kplan reads format {FORMAT}",
            "use the kplan version that wrote it, or remove the checkpoint directory",
        )
    job.module.load_state_dict(shared["model"])
    job.optimizer.load_state_dict(shared["optimizer"])
    for name, obj in job.extras.items():
        if name in shared["extras"]:
            obj.load_state_dict(shared["extras"][name])
    rt = shared["runtime"]
    job.step_count = int(rt["step"])
    # The micro-step counter restarts at a step boundary (accumulation may differ now).
    job._position = Position(int(rt["epoch"]), int(rt["offset"]), job.step_count * job.accum_steps)
    if rt["configured_global_batch"] == job.config.global_batch and int(rt["accum_steps"]) == (
        job.accum_steps
    ):  # same launch settings: keep a batch set by set_global_batch()
        saved = int(rt["global_batch"])
        if saved != job.global_batch:
            job._controller.set_total(saved // job.accum_steps)
            job.global_batch = saved
    job._controller.load_state_dict(rt["controller"])
    job._gns.load_state_dict(rt["gns"])
    job._lr.batch = job.global_batch
    job._lr.load_state_dict(rt["lr"], job.step_count)
    if "momentum" in rt:  # absent in checkpoints from before momentum compensation
        job._momentum.load_state_dict(rt["momentum"], job.step_count, job.global_batch)
    if job._schedule is not None:  # the phases already applied are not applied again
        job._schedule_index = max(job._schedule_index, int(rt.get("batch_schedule_index", -1)))
    job.amp.load_state_dict(rt.get("scaler"))  # fp16's loss scale (absent: fresh)
    job._runner.control_seq = int(rt.get("control_seq", -1))  # launcher commands already taken
    job._last_ckpt_step = job.step_count
    if "selsync" in rt:
        job._selsync.load_state_dict(rt["selsync"])
    mine = path / ckpt.rank_file(job.ctx.rank)
    if mine.is_file():
        local = ckpt.load(mine)
        ckpt.restore_rng(local["rng"])
        same_world = int(local.get("world_size", -1)) == job.ctx.world_size
        # Error feedback and replicas are per worker: kept only on the same world size (a
        # resize starts them afresh: residuals at zero, replicas from rank 0's model).
        if same_world and job._compressor is not None and "compressor" in local:
            job._compressor.load_state_dict(local["compressor"])
        if same_world and "replica" in local:
            job.module.load_state_dict(local["replica"]["model"])
            job.optimizer.load_state_dict(local["replica"]["optimizer"])
    else:  # no file for this rank (world grew, or storage not shared): deterministic re-seed
        rdist.seed_all(job.config.seed * 1_000_003 + 7_919 * (job.ctx.rank + 1) + job.step_count)
