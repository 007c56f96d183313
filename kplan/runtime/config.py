"""Every runtime setting in one frozen dataclass; the environment overrides the script's values."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from kplan.core.compression_spec import Compression, parse_compression
from kplan.core.errors import InputError
from kplan.core.precision import PRECISIONS, Precision
from kplan.runtime import env
from kplan.runtime.batch_schedule import BatchSchedule, from_list
from kplan.runtime.momentum import MOMENTUM_MODES, MomentumMode
from kplan.runtime.pid import PidConfig
from kplan.runtime.selsync import SyncPolicy, parse_sync_policy

SyncMode = Literal["overlap", "manual"]


@dataclass(frozen=True)
class RuntimeConfig:
    """Settings of a :class:`~kplan.runtime.job.Job` (kplan/runtime/API.md lists the variables)."""

    global_batch: int | None = None
    """Global batch to run; None: the script's ``batch_size`` (the base B0)."""
    accum_steps: int = 1
    max_local_batch: int | None = None
    lr_scaling: env.LrRule = "adascale"
    lr_ramp_steps: int = env.DEFAULT_LR_RAMP_STEPS
    pid: PidConfig | None = field(default_factory=PidConfig)
    """None: equal split, no controller."""
    gns: env.GnsMode = "auto"
    gns_smoothing: float = 0.99
    checkpoint_dir: Path | None = None
    checkpoint_interval: float = env.DEFAULT_CHECKPOINT_INTERVAL
    checkpoint_steps: int = 0
    keep_checkpoints: int = 2
    metrics_path: Path | None = None
    job_id: str = "local"
    seed: int = 0
    max_steps: int | None = None
    profile: env.ProfileSchedule | None = None
    sync: SyncMode = "overlap"
    """``overlap``: all-reduce inside backward (DDP comm hook); ``manual``: after backward."""
    epochs_by: env.EpochsBy = "data"
    """``progress``: ``job.epochs(E)`` runs E x ceil(len(dataset)/B0) base-batch steps."""
    policies: tuple[str, ...] = ()
    """Policy specs loaded at start (``KPLAN_POLICIES`` syntax), added to ``Job(policies=)``."""
    control_path: Path | None = None
    """The launcher's control file (``KPLAN_CONTROL_PATH``)."""
    precision: Precision = "fp32"
    """Training precision (``KPLAN_PRECISION``): fp32, tf32, bf16 or fp16 (kplan/runtime/amp.py)."""
    batch_schedule: BatchSchedule | list[dict[str, Any]] | None = None
    """Global-batch phases (``KPLAN_BATCH_SCHEDULE``; kplan/runtime/batch_schedule.py); a list of
    ``{"progress"|"step": x, "global_batch": B}`` is converted."""
    momentum: MomentumMode = "horizon"
    """Momentum compensation when the batch changes (``KPLAN_MOMENTUM``; runtime/momentum.py)."""
    compression: Compression | str = field(default_factory=Compression)
    """Gradient compression (``KPLAN_COMPRESSION``; kplan/core/compression_spec.py): a spec such as
    ``"topk:0.01:auto"`` is parsed. Applies with two or more workers."""
    sync_policy: SyncPolicy | str = field(default_factory=SyncPolicy)
    """``every`` or ``selective:DELTA[:AVG_EVERY]`` (``KPLAN_SYNC_POLICY``; runtime/selsync.py).
    Not :attr:`sync`, which says how (overlap or manual), not when."""

    def __post_init__(self) -> None:
        if isinstance(self.compression, str):
            object.__setattr__(
                self, "compression", parse_compression(self.compression, "compression")
            )
        if isinstance(self.sync_policy, str):
            object.__setattr__(
                self, "sync_policy", parse_sync_policy(self.sync_policy, "sync_policy")
            )
        if not isinstance(self.compression, Compression):
            raise InputError(
                f"compression={self.compression!r} is not a compression spec",
                "e.g. none, fp16, topk:0.01 or powersgd:4 (KPLAN_COMPRESSION)",
            )
        if not isinstance(self.sync_policy, SyncPolicy):
            raise InputError(
                f"sync_policy={self.sync_policy!r} is not a sync policy",
                "every, or selective:DELTA[:AVG_EVERY] (KPLAN_SYNC_POLICY)",
            )
        if isinstance(self.batch_schedule, list):
            object.__setattr__(self, "batch_schedule", from_list(self.batch_schedule))
        if self.momentum not in MOMENTUM_MODES:
            raise InputError(
                f"momentum={self.momentum!r} is not one of {MOMENTUM_MODES}",
                "'horizon' (the default) or 'off' (KPLAN_MOMENTUM)",
            )
        _positive("global_batch", self.global_batch, allow_none=True)
        _positive("accum_steps", self.accum_steps)
        _positive("max_local_batch", self.max_local_batch, allow_none=True)
        _positive("keep_checkpoints", self.keep_checkpoints)
        if self.lr_scaling not in env.LR_RULES:
            raise InputError(
                f"lr_scaling={self.lr_scaling!r} is not one of {env.LR_RULES}",
                "pick one of those rules (KPLAN_LR_SCALING)",
            )
        if self.gns not in env.GNS_MODES:
            raise InputError(
                f"gns={self.gns!r} is not one of {env.GNS_MODES}",
                "pick one of those modes (KPLAN_GNS)",
            )
        if self.epochs_by not in env.EPOCHS_BY_CHOICES:
            raise InputError(
                f"epochs_by={self.epochs_by!r} is not 'data' or 'progress'",
                "'data' counts passes over the data; 'progress' base-batch steps",
            )
        if self.precision not in PRECISIONS:
            raise InputError(
                f"precision={self.precision!r} is not a precision", f"one of {PRECISIONS}"
            )
        if self.sync not in ("overlap", "manual"):
            raise InputError(
                f"sync={self.sync!r} is not 'overlap' or 'manual'",
                "'overlap' (the default) or 'manual' (you call job.sync())",
            )
        if not 0.0 <= self.gns_smoothing < 1.0:
            raise InputError(
                f"gns_smoothing={self.gns_smoothing} is not in [0, 1)",
                "an EMA weight such as 0.9; 0 keeps no history",
            )
        if not math.isfinite(self.checkpoint_interval) or self.checkpoint_interval < 0:
            raise InputError(
                f"checkpoint_interval={self.checkpoint_interval} is not >= 0",
                "seconds between checkpoints; 0 turns time-based ones off",
            )
        for name in ("lr_ramp_steps", "checkpoint_steps", "seed"):
            if getattr(self, name) < 0:
                raise InputError(f"{name}={getattr(self, name)} is negative", "use >= 0")
        if self.max_steps is not None and self.max_steps < 0:
            raise InputError(f"max_steps={self.max_steps} is negative", "use >= 0")

    @classmethod
    def from_env(
        cls, base: RuntimeConfig | None = None, environ: Mapping[str, str] | None = None
    ) -> RuntimeConfig:
        """``base`` (the script's settings, or the defaults) with every set variable applied."""
        base = base or cls()
        return dataclasses.replace(
            base,
            global_batch=_or(env.global_batch(environ), base.global_batch),
            accum_steps=_or(env.accum_steps(environ), base.accum_steps),
            max_local_batch=_or(env.max_local_batch(environ), base.max_local_batch),
            lr_scaling=_or(env.lr_scaling(environ), base.lr_scaling),
            lr_ramp_steps=_or(env.lr_ramp_steps(environ), base.lr_ramp_steps),
            gns=_or(env.gns_mode(environ), base.gns),
            checkpoint_dir=_or(env.checkpoint_dir(environ), base.checkpoint_dir),
            checkpoint_interval=_or(env.checkpoint_interval(environ), base.checkpoint_interval),
            checkpoint_steps=_or(env.checkpoint_steps(environ), base.checkpoint_steps),
            metrics_path=_or(env.metrics_path(environ), base.metrics_path),
            seed=_or(env.seed(environ), base.seed),
            max_steps=_or(env.max_steps(environ), base.max_steps),
            profile=_or(env.profile_schedule(environ), base.profile),
            epochs_by=_or(env.epochs_by(environ), base.epochs_by),
            control_path=_or(env.control_path(environ), base.control_path),
            precision=_or(env.precision(environ), base.precision),
            batch_schedule=_or(env.batch_schedule(environ), base.batch_schedule),
            momentum=_or(env.momentum_compensation(environ), base.momentum),
            compression=_or(env.compression(environ), base.compression),
            sync_policy=_or(env.sync_policy(environ), base.sync_policy),
            job_id=_or(env.job_id(environ), base.job_id)
            if env.is_set(env.JOB_ID, environ)
            else base.job_id,
            policies=(*base.policies, *(env.policies(environ) or ())),
            pid=_pid(env.pid_enabled(environ), base.pid),
        )


T = TypeVar("T")


def _or(value: T | None, current: T) -> T:
    """A variable's value where it is set (not None), else the script's setting."""
    return current if value is None else value


def _pid(enabled: bool | None, current: PidConfig | None) -> PidConfig | None:
    """``KPLAN_PID``: off drops the controller, on adds the default one where there is none."""
    if enabled is False:
        return None
    if enabled is True and current is None:
        return PidConfig()
    return current


def _positive(name: str, value: int | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name}={value!r} is not an integer >= 1", f"set {name} >= 1")
