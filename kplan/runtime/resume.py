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

import time
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from kplan.core.errors import JobError
from kplan.runtime import checkpoint as ckpt
from kplan.runtime import distributed as rdist
from kplan.runtime.compression.compressor import CompressorState
from kplan.runtime.gns import GnsState
from kplan.runtime.lr_scaling import LrState
from kplan.runtime.momentum import MomentumState
from kplan.runtime.pid import ControllerState
from kplan.runtime.sampler import Position
from kplan.runtime.selsync import SelSyncState
from kplan.runtime.state import JobState

FORMAT = 1


class RuntimePart(TypedDict):
    """The kplan-built part of the shared checkpoint (``state.pt``'s ``runtime``): where the
    data and the batch stand and each part's own state. Fields marked NotRequired are absent
    from checkpoints of earlier versions."""

    step: int
    epoch: int
    offset: int
    world_size: int
    configured_global_batch: int | None
    global_batch: int
    accum_steps: int
    controller: ControllerState
    gns: GnsState
    lr: LrState
    momentum: NotRequired[MomentumState]
    batch_schedule_index: NotRequired[int]
    control_seq: NotRequired[int]
    precision: NotRequired[str]
    scaler: NotRequired[dict[str, Any] | None]  # torch's GradScaler state_dict (fp16)
    selsync: NotRequired[SelSyncState]


def runtime_state(st: JobState) -> dict[str, Any]:
    """The shared part of a checkpoint of ``st`` at the end of its current step: torch's
    state_dicts of the model, optimizer and extras, and the :class:`RuntimePart`."""
    return {
        "format": FORMAT,
        "model": st.module.state_dict(),
        "optimizer": st.optimizer.state_dict(),
        "extras": {name: obj.state_dict() for name, obj in st.extras.items()},
        "runtime": _runtime_part(st),
    }


def _runtime_part(st: JobState) -> RuntimePart:
    pos = st.position
    return {
        "step": st.step_count,
        "epoch": pos.epoch,
        "offset": pos.offset,
        "world_size": st.ctx.world_size,
        "configured_global_batch": st.config.global_batch,
        "global_batch": st.global_batch,
        "accum_steps": st.accum_steps,
        "controller": st.controller.state_dict(),
        "gns": st.gns.state_dict(),
        "lr": st.lr.state_dict(),
        "momentum": st.momentum.state_dict(),
        "batch_schedule_index": st.schedule_index,
        "control_seq": st.runner.control_seq,
        "precision": st.amp.precision,
        "scaler": st.amp.state_dict(),
        "selsync": st.selsync.state_dict(),
    }


class LocalState(TypedDict):
    """A rank's own file of a checkpoint (see :func:`local_state`)."""

    rng: ckpt.RngState
    rank: int
    world_size: int
    compressor: NotRequired[CompressorState]
    replica: NotRequired[dict[str, dict[str, Any]]]  # "model", "optimizer": torch state_dicts


def local_state(st: JobState) -> LocalState:
    """This rank's own part: its RNG, the error-feedback state of compression and, once
    SelSync has skipped a step (replicas and their optimizer states differ), its own model and
    optimizer (rank 0's are the shared ones)."""
    out: LocalState = {
        "rng": ckpt.capture_rng(),
        "rank": st.ctx.rank,
        "world_size": st.ctx.world_size,
    }
    if st.compressor is not None:
        out["compressor"] = st.compressor.state_dict()
    if st.selsync.skipped_steps > 0 and st.ctx.rank > 0:
        out["replica"] = {"model": st.module.state_dict(), "optimizer": st.optimizer.state_dict()}
    return out


def load_into(st: JobState, path: Path) -> None:
    """Restore ``st`` from the checkpoint directory ``path`` (before its first step)."""
    shared = ckpt.load(path / ckpt.STATE_FILE)
    if not isinstance(shared, dict) or shared.get("format") != FORMAT:
        got = shared.get("format") if isinstance(shared, dict) else type(shared).__name__
        raise JobError(
            f"checkpoint {path} has format {got}, this kplan reads format {FORMAT}",
            "use the kplan version that wrote it, or remove the checkpoint directory",
        )
    st.module.load_state_dict(shared["model"])
    st.optimizer.load_state_dict(shared["optimizer"])
    for name, obj in st.extras.items():
        if name in shared["extras"]:
            obj.load_state_dict(shared["extras"][name])
    rt: RuntimePart = shared["runtime"]
    st.step_count = int(rt["step"])
    # The micro-step counter restarts at a step boundary (accumulation may differ now).
    st.position = Position(int(rt["epoch"]), int(rt["offset"]), st.step_count * st.accum_steps)
    if rt["configured_global_batch"] == st.config.global_batch and int(rt["accum_steps"]) == (
        st.accum_steps
    ):  # same launch settings: keep a batch set by set_global_batch()
        saved = int(rt["global_batch"])
        if saved != st.global_batch:
            st.controller.set_total(saved // st.accum_steps)
            st.global_batch = saved
    st.controller.load_state_dict(rt["controller"])
    st.gns.load_state_dict(rt["gns"])
    st.lr.batch = st.global_batch
    st.lr.load_state_dict(rt["lr"], st.step_count)
    if "momentum" in rt:  # absent in checkpoints from before momentum compensation
        st.momentum.load_state_dict(rt["momentum"], st.step_count, st.global_batch)
    if st.schedule is not None:  # the phases already applied are not applied again
        st.schedule_index = max(st.schedule_index, int(rt.get("batch_schedule_index", -1)))
    st.amp.load_state_dict(rt.get("scaler"))  # fp16's loss scale (absent: fresh)
    st.runner.control_seq = int(rt.get("control_seq", -1))  # launcher commands already taken
    st.last_ckpt_step = st.step_count
    if "selsync" in rt:
        st.selsync.load_state_dict(rt["selsync"])
    mine = path / ckpt.rank_file(st.ctx.rank)
    if mine.is_file():
        local = ckpt.load(mine)
        ckpt.restore_rng(local["rng"])
        same_world = int(local.get("world_size", -1)) == st.ctx.world_size
        # Error feedback and replicas are per worker: kept only on the same world size (a
        # resize starts them afresh: residuals at zero, replicas from rank 0's model).
        if same_world and st.compressor is not None and "compressor" in local:
            st.compressor.load_state_dict(local["compressor"])
        if same_world and "replica" in local:
            st.module.load_state_dict(local["replica"]["model"])
            st.optimizer.load_state_dict(local["replica"]["optimizer"])
    else:  # no file for this rank (world grew, or storage not shared): deterministic re-seed
        rdist.seed_all(st.config.seed * 1_000_003 + 7_919 * (st.ctx.rank + 1) + st.step_count)


def save_checkpoint(st: JobState, reason: str) -> None:
    """Write a checkpoint of the job now (every rank, at the same step) and its event."""
    if st.store is None:
        return
    start = time.perf_counter()
    shared = runtime_state(st) if st.ctx.rank == 0 else None
    local = local_state(st)
    path, size = st.store.save(st.step_count, shared, local, lambda: rdist.barrier(st.ctx))
    if st.ctx.rank == 0:
        st.metrics.event(
            "checkpoint",
            step=st.step_count,
            path=str(path),
            bytes=size,
            seconds=time.perf_counter() - start,
            reason=reason,
        )
    st.last_ckpt_step = st.step_count
    st.last_ckpt_time = time.monotonic()
