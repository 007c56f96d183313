"""The job's state: the parts it composes and the training loop's mutable values, in one record.

``Job`` (job.py) is the user's API; the end of a step (step_end.py), the checkpoint's contents
(resume.py), profile mode (profile_steps.py) and one worker's GNS (local_gns.py) are functions
of a :class:`JobState`. They import this module, never job.py, so the imports run one way:
job -> assemble -> step_end -> resume/profile_steps/local_gns -> state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch  # noqa: TID253 (torch is the runtime's core dependency)
from torch.utils.data import DataLoader  # noqa: TID253

from kplan.runtime.amp import Amp
from kplan.runtime.batch_schedule import BatchSchedule
from kplan.runtime.checkpoint import CheckpointStore, SigtermFlag
from kplan.runtime.compression.compressor import Compressor
from kplan.runtime.config import RuntimeConfig
from kplan.runtime.distributed import Context
from kplan.runtime.gns import GnsEstimator
from kplan.runtime.lr_scaling import LrScaler
from kplan.runtime.metrics import MetricsWriter
from kplan.runtime.momentum import MomentumCompensator
from kplan.runtime.pid import BatchController
from kplan.runtime.policy import PolicyRunner
from kplan.runtime.profile_mode import ProfileRun
from kplan.runtime.sampler import GlobalBatchSampler, Position
from kplan.runtime.selsync import SelSync
from kplan.runtime.sync import GradSync, Preconditioner
from kplan.runtime.timing import StepClock


class Stateful(Protocol):
    """An object a checkpoint saves and restores (``Job(extras=...)``: an LR scheduler)."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


@dataclass(eq=False)
class JobState:
    """Everything one worker's job holds (built by assemble.py, in the order job.py describes)."""

    # --- the parts ---
    ctx: Context
    config: RuntimeConfig
    module: torch.nn.Module
    """The user's model."""
    model: torch.nn.Module
    """What the training loop calls: the DDP wrapper of ``module``, or ``module`` itself."""
    optimizer: torch.optim.Optimizer
    extras: dict[str, Stateful]
    params: list[torch.nn.Parameter]
    amp: Amp
    """The precision: TF32 switches, autocast and fp16's loss scaler (kplan/runtime/amp.py)."""
    clock: StepClock
    sync: GradSync
    selsync: SelSync
    compressor: Compressor | None
    precond: Preconditioner | None
    controller: BatchController
    sampler: GlobalBatchSampler
    loader: DataLoader[Any] | None
    gns: GnsEstimator
    lr: LrScaler
    momentum: MomentumCompensator
    metrics: MetricsWriter
    runner: PolicyRunner
    profile: ProfileRun | None
    schedule: BatchSchedule | None
    store: CheckpointStore | None
    loss_sum: torch.Tensor
    """This step's summed micro-step losses (float64, on the device)."""

    # --- fixed settings ---
    base_batch: int
    accum_steps: int
    global_batch: int
    gns_on: bool
    pid_on: bool
    pin: bool
    caps: list[int | None]
    """Each rank's KPLAN_MAX_LOCAL_BATCH (None: no cap)."""
    dataset_size: int
    local_world_size: int
    started: float = field(default_factory=time.monotonic)

    # --- the loop ---
    step_count: int = 0
    position: Position = field(default_factory=lambda: Position(0, 0, 0))
    micro_in_step: int = 0
    step_sizes: tuple[int, ...] = ()
    in_epoch: bool = False
    in_step: bool = False
    expect_step: bool = False
    backward_called: bool = False
    stopped: bool = False
    finished: bool = False
    stop_reason: str | None = None
    restart_sizes: tuple[int, ...] | None = None
    measure: bool = False
    """This step is a GNS sample."""
    synced: bool = False
    step_synced: bool = True
    """This step all-reduces (SelSync may skip it)."""
    prev_timing: tuple[float, float] | None = None
    last_end: float | None = None
    prev_wall: float = 0.0
    lr_value: float | None = None
    first_grad: torch.Tensor | None = None
    micro_sqr: list[torch.Tensor] = field(default_factory=list)
    acc: dict[int, torch.Tensor] = field(default_factory=dict)
    prev_grads: list[torch.Tensor] | None = None
    prev_batch: int = 0
    last_ckpt_step: int = -1
    last_ckpt_time: float = field(default_factory=time.monotonic)
    progress_target: float | None = None
    """``job.progress`` at which ``KPLAN_EPOCHS_BY=progress`` stops."""
    schedule_index: int = -1
    schedule_target: float | None = None
    """The progress the batch schedule's fractions are of."""
    hooked_step: int = -1
    saved_bytes: Any = None
    """A CPU sweep's activation probe (profile_steps.SavedBytes)."""
    sigterm: SigtermFlag = field(default_factory=SigtermFlag)

    @property
    def profiling(self) -> bool:
        return self.profile is not None

    @property
    def progress(self) -> float:
        """Steps done in base-batch units (the LR scaler's count)."""
        return self.lr.progress

    @property
    def is_last_micro_step(self) -> bool:
        return self.micro_in_step == self.accum_steps - 1

    @property
    def local_batch(self) -> int:
        """This worker's micro-batch size in the current step."""
        return self.step_sizes[self.ctx.rank]

    def sweeping(self) -> bool:
        """Profile mode's sweep phase (backward timed apart, no exchange inside it)."""
        return self.profile is not None and self.profile.phase.name == "sweep"

    def overlap_now(self) -> bool:
        """Gradients all-reduced inside backward (else after it, by manual_reduce)."""
        return self.config.sync == "overlap" and not self.sweeping()

    def complete_sync(self) -> None:
        """Manual mode: local norm, then the weighted all-reduce (overlap: DDP did it)."""
        if self.synced:
            return
        self.synced = True
        if not self.step_synced:  # SelSync skipped it: a local step, gradients stay local
            if self.sync.track_plain:
                self.sync.plain_norm_now()
            return
        if not self.overlap_now():
            if self.measure and self.ctx.world_size > 1:
                self.sync.local_norm_now()
            if self.sync.track_plain:
                self.sync.plain_norm_now()
            self.sync.manual_reduce()

    def set_global_batch(self, batch: int) -> None:
        """Run global batch ``batch`` from the next step the data loader has not fetched yet
        (``batch``: a positive multiple of ``accum_steps``, checked by the caller)."""
        sizes = self.controller.set_total(batch // self.accum_steps)
        first = round_up(self.sampler.next_micro, self.accum_steps)
        self.sampler.set_sizes(first, sizes)
        self.lr.set_batch(first // self.accum_steps, batch)
        self.momentum.set_batch(first // self.accum_steps, batch)
        self.global_batch = batch


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
