"""The environment between the launcher (and torchrun) and the runtime: one function per variable.

The launcher builds a worker's environment with :func:`kplan_environ`; the runtime reads it with
the functions below. A kplan variable that is set overrides the training script's own value; an
unset variable returns ``None`` (or the documented default) so the script's value applies.
This module imports neither torch nor anything heavy: the launcher and the CLI use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from kplan.core.compression_spec import Compression, parse_compression
from kplan.core.errors import InputError
from kplan.core.precision import Precision, check_precision
from kplan.runtime.batch_schedule import BatchSchedule
from kplan.runtime.batch_schedule import parse as parse_batch_schedule
from kplan.runtime.momentum import MOMENTUM_MODES, MomentumMode
from kplan.runtime.selsync import SyncPolicy, parse_sync_policy

# torchrun's variables.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_RANK = "GROUP_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"

# kplan's variables.
JOB_ID = "KPLAN_JOB_ID"
METRICS_PATH = "KPLAN_METRICS_PATH"
CHECKPOINT_DIR = "KPLAN_CHECKPOINT_DIR"
CHECKPOINT_INTERVAL = "KPLAN_CHECKPOINT_INTERVAL"
CHECKPOINT_STEPS = "KPLAN_CHECKPOINT_STEPS"
GLOBAL_BATCH = "KPLAN_GLOBAL_BATCH"
ACCUM_STEPS = "KPLAN_ACCUM_STEPS"
MAX_LOCAL_BATCH = "KPLAN_MAX_LOCAL_BATCH"
LR_SCALING = "KPLAN_LR_SCALING"
LR_RAMP_STEPS = "KPLAN_LR_RAMP_STEPS"
PID = "KPLAN_PID"
GNS = "KPLAN_GNS"
SEED = "KPLAN_SEED"
MAX_STEPS = "KPLAN_MAX_STEPS"
BACKEND = "KPLAN_BACKEND"
DIST_TIMEOUT = "KPLAN_DIST_TIMEOUT"
PROFILE_SCHEDULE = "KPLAN_PROFILE_SCHEDULE"
POLICIES = "KPLAN_POLICIES"
EPOCHS_BY = "KPLAN_EPOCHS_BY"
CONTROL_PATH = "KPLAN_CONTROL_PATH"
PRECISION = "KPLAN_PRECISION"
BATCH_SCHEDULE = "KPLAN_BATCH_SCHEDULE"
MOMENTUM = "KPLAN_MOMENTUM"
COMPRESSION = "KPLAN_COMPRESSION"
SYNC_POLICY = "KPLAN_SYNC_POLICY"

LrRule = Literal["adascale", "linear", "sqrt", "none"]
GnsMode = Literal["auto", "sgd", "adam", "off"]
Backend = Literal["nccl", "gloo"]
EpochsBy = Literal["data", "progress"]
LR_RULES: tuple[LrRule, ...] = ("adascale", "linear", "sqrt", "none")
GNS_MODES: tuple[GnsMode, ...] = ("auto", "sgd", "adam", "off")
BACKENDS: tuple[Backend, ...] = ("nccl", "gloo")
EPOCHS_BY_CHOICES: tuple[EpochsBy, ...] = ("data", "progress")
BUILTIN_POLICIES = ("goodput", "straggler")
"""Names ``KPLAN_POLICIES`` accepts besides ``file.py:Class`` and ``module:Class``."""
CONTROL_SCHEMA = "kplan.control/1"

_S = TypeVar("_S", bound=str)

DEFAULT_CHECKPOINT_INTERVAL = 600.0
DEFAULT_LR_RAMP_STEPS = 50
DEFAULT_DIST_TIMEOUT = 1800.0


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """True when variable ``name`` is set to a non-blank value."""
    return _raw(name, environ) is not None


def _int(name: str, environ: Mapping[str, str] | None, minimum: int) -> int | None:
    raw = _raw(name, environ)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InputError(
            f"{name}={raw!r} is not an integer", f"set {name} to an integer >= {minimum}"
        ) from None
    if value < minimum:
        raise InputError(f"{name}={value} is below {minimum}", f"set {name} >= {minimum}")
    return value


def _float(name: str, environ: Mapping[str, str] | None, minimum: float) -> float | None:
    raw = _raw(name, environ)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name}={raw!r} is not a number", f"set {name} to seconds") from None
    if not math.isfinite(value) or value < minimum:
        raise InputError(f"{name}={raw} is not a number >= {minimum}", f"set {name} >= {minimum}")
    return value


def _choice(name: str, environ: Mapping[str, str] | None, choices: tuple[_S, ...]) -> _S | None:
    raw = _raw(name, environ)
    if raw is None:
        return None
    for choice in choices:
        if raw.lower() == choice:
            return choice
    raise InputError(
        f"{name}={raw!r} is not one of {', '.join(choices)}", f"unset {name} or pick one of these"
    )


def _flag(name: str, environ: Mapping[str, str] | None) -> bool | None:
    raw = _raw(name, environ)
    if raw is None:
        return None
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise InputError(f"{name}={raw!r} is not a boolean", f"set {name} to 1 or 0")


# --- torchrun ---------------------------------------------------------------------------------


def rank(environ: Mapping[str, str] | None = None) -> int:
    """Global rank of this worker (``RANK``, set by torchrun); 0 without torchrun."""
    return _int(RANK, environ, 0) or 0


def world_size(environ: Mapping[str, str] | None = None) -> int:
    """Number of workers (``WORLD_SIZE``); 1 without torchrun."""
    return _int(WORLD_SIZE, environ, 1) or 1


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """Rank of this worker on its node (``LOCAL_RANK``), its GPU index; 0 without torchrun."""
    return _int(LOCAL_RANK, environ, 0) or 0


def local_world_size(environ: Mapping[str, str] | None = None) -> int:
    """Workers on this node (``LOCAL_WORLD_SIZE``); 1 without torchrun."""
    return _int(LOCAL_WORLD_SIZE, environ, 1) or 1


def node_rank(environ: Mapping[str, str] | None = None) -> int:
    """Rank of this node among the nodes (``GROUP_RANK``); 0 without torchrun."""
    return _int(GROUP_RANK, environ, 0) or 0


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times torchrun restarted the workers (``TORCHELASTIC_RESTART_COUNT``)."""
    return _int(RESTART_COUNT, environ, 0) or 0


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """True when torchrun (or a launcher doing its job) set ``RANK`` and ``WORLD_SIZE``."""
    return _raw(RANK, environ) is not None and _raw(WORLD_SIZE, environ) is not None


# --- kplan ------------------------------------------------------------------------------------


def job_id(environ: Mapping[str, str] | None = None) -> str:
    """Job identifier written into every metrics record (``KPLAN_JOB_ID``); ``"local"``."""
    return _raw(JOB_ID, environ) or "local"


def metrics_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where metrics go (``KPLAN_METRICS_PATH``); None: no metrics.

    A path ending in ``.jsonl`` is one file shared by all ranks; any other path is a directory
    holding ``rank-<R>.jsonl`` per rank.
    """
    raw = _raw(METRICS_PATH, environ)
    return None if raw is None else Path(raw)


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """Checkpoint directory shared by all ranks (``KPLAN_CHECKPOINT_DIR``); None: no checkpoints."""
    raw = _raw(CHECKPOINT_DIR, environ)
    return None if raw is None else Path(raw)


def checkpoint_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between periodic checkpoints (``KPLAN_CHECKPOINT_INTERVAL``); default 600."""
    return _float(CHECKPOINT_INTERVAL, environ, 0.0)


def checkpoint_steps(environ: Mapping[str, str] | None = None) -> int | None:
    """Also checkpoint every this many optimizer steps (``KPLAN_CHECKPOINT_STEPS``); 0 = off."""
    return _int(CHECKPOINT_STEPS, environ, 0)


def global_batch(environ: Mapping[str, str] | None = None) -> int | None:
    """Global batch to run, all workers and micro-steps (``KPLAN_GLOBAL_BATCH``)."""
    return _int(GLOBAL_BATCH, environ, 1)


def accum_steps(environ: Mapping[str, str] | None = None) -> int | None:
    """Gradient-accumulation micro-steps per optimizer step (``KPLAN_ACCUM_STEPS``); default 1."""
    return _int(ACCUM_STEPS, environ, 1)


def max_local_batch(environ: Mapping[str, str] | None = None) -> int | None:
    """Largest micro-batch this worker fits in memory (``KPLAN_MAX_LOCAL_BATCH``)."""
    return _int(MAX_LOCAL_BATCH, environ, 1)


def lr_scaling(environ: Mapping[str, str] | None = None) -> LrRule | None:
    """Learning-rate rule for a global batch B != B0 (``KPLAN_LR_SCALING``); default adascale."""
    return _choice(LR_SCALING, environ, LR_RULES)


def lr_ramp_steps(environ: Mapping[str, str] | None = None) -> int | None:
    """Steps over which a change of the LR factor is ramped (``KPLAN_LR_RAMP_STEPS``); 50."""
    return _int(LR_RAMP_STEPS, environ, 0)


def pid_enabled(environ: Mapping[str, str] | None = None) -> bool | None:
    """Per-worker batch sizes by the PID controller (``KPLAN_PID``, 1/0); default on."""
    return _flag(PID, environ)


def gns_mode(environ: Mapping[str, str] | None = None) -> GnsMode | None:
    """Gradient-noise-scale estimator (``KPLAN_GNS``): auto, sgd, adam or off; default auto."""
    return _choice(GNS, environ, GNS_MODES)


def seed(environ: Mapping[str, str] | None = None) -> int | None:
    """Seed of the data order and of the RNGs (``KPLAN_SEED``); default 0."""
    return _int(SEED, environ, 0)


def max_steps(environ: Mapping[str, str] | None = None) -> int | None:
    """Stop after this many optimizer steps (``KPLAN_MAX_STEPS``); None: run all epochs."""
    return _int(MAX_STEPS, environ, 0)


def backend(environ: Mapping[str, str] | None = None) -> Backend | None:
    """Process-group backend override (``KPLAN_BACKEND``); default nccl with CUDA, else gloo."""
    return _choice(BACKEND, environ, BACKENDS)


def dist_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Timeout of collectives in seconds (``KPLAN_DIST_TIMEOUT``); default 1800."""
    value = _float(DIST_TIMEOUT, environ, 1.0)
    return DEFAULT_DIST_TIMEOUT if value is None else value


def policies(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """Adaptation policies to add to the script's (``KPLAN_POLICIES``, comma list); None: none.

    Each item is a built-in name (``goodput``, ``straggler``), ``path/to/file.py:ClassName`` or
    ``package.module:ClassName``. Only the syntax is checked here; runtime/policy_registry.py
    loads them.
    """
    raw = _raw(POLICIES, environ)
    if raw is None:
        return None
    hint = (
        f"set {POLICIES} to a comma list of {', '.join(BUILTIN_POLICIES)}, "
        "path/to/file.py:ClassName or package.module:ClassName"
    )
    items = [item.strip() for item in raw.split(",")]
    for item in items:
        if item in BUILTIN_POLICIES:
            continue
        where, sep, name = item.rpartition(":")
        if not sep or not where.strip() or not name.isidentifier():
            raise InputError(f"{POLICIES}={raw!r}: {item!r} is not a policy", hint)
    return tuple(items)


def epochs_by(environ: Mapping[str, str] | None = None) -> EpochsBy | None:
    """What ``job.epochs(E)`` counts (``KPLAN_EPOCHS_BY``): ``data`` passes (default) or
    ``progress``: E x ceil(len(dataset)/B0) base-batch-equivalent steps."""
    return _choice(EPOCHS_BY, environ, EPOCHS_BY_CHOICES)


def control_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The launcher's control file (``KPLAN_CONTROL_PATH``, JSON); None: no launcher control."""
    raw = _raw(CONTROL_PATH, environ)
    return None if raw is None else Path(raw)


def precision(environ: Mapping[str, str] | None = None) -> Precision | None:
    """Training precision (``KPLAN_PRECISION``): fp32, tf32, bf16 or fp16; default fp32."""
    raw = _raw(PRECISION, environ)
    return None if raw is None else check_precision(raw, PRECISION)


@dataclass(frozen=True)
class Control:
    """One version of the control file the launcher writes (schema ``kplan.control/1``).

    ``spend_usd`` is what the job had cost at Unix time ``time``; ``usd_per_hour`` the price of
    the whole cluster now; ``global_batch`` and ``stop`` are commands, applied once per ``seq``.
    """

    seq: int
    time: float
    spend_usd: float
    budget_usd: float | None
    usd_per_hour: float
    deadline_time: float | None
    global_batch: int | None
    stop: str | None

    def to_json(self) -> str:
        return json.dumps({"schema": CONTROL_SCHEMA, **dataclasses.asdict(self)})


def parse_control(text: str) -> Control:
    """A control file's content; InputError naming the problem when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"control file is not JSON: {err.msg}",
            "the launcher writes this file; re-launch the job",
        ) from None
    if not isinstance(data, dict) or data.get("schema") != CONTROL_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise InputError(
            f"control file has schema {got!r}, expected {CONTROL_SCHEMA!r}",
            "the launcher and the workers run different kplan versions",
        )

    def number(key: str, optional: bool = False) -> float | None:
        value = data.get(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(
                f"control file: {key}={value!r} is not a number",
                "the launcher writes this file; re-launch the job",
            )
        if not math.isfinite(value):
            raise InputError(
                f"control file: {key}={value!r} is not finite",
                "the launcher writes this file; re-launch the job",
            )
        return float(value)

    batch, stop, seq = data.get("global_batch"), data.get("stop"), data.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise InputError(
            f"control file: seq={seq!r} is not an integer",
            "the launcher writes this file; re-launch the job",
        )
    if batch is not None and (not _is_int(batch) or batch < 1):
        raise InputError(
            f"control file: global_batch={batch!r} is not an integer >= 1",
            "the launcher writes this file; re-launch the job",
        )
    if stop is not None and not isinstance(stop, str):
        raise InputError(
            f"control file: stop={stop!r} is not a string",
            "the launcher writes this file; re-launch the job",
        )
    return Control(
        seq=seq,
        time=number("time") or 0.0,
        spend_usd=number("spend_usd") or 0.0,
        budget_usd=number("budget_usd", optional=True),
        usd_per_hour=number("usd_per_hour") or 0.0,
        deadline_time=number("deadline_time", optional=True),
        global_batch=batch,
        stop=stop,
    )


@dataclass(frozen=True)
class ProfileSchedule:
    """Profile mode: a sweep over local batches, then GNS steps (see kplan/runtime/API.md)."""

    local_batches: tuple[int, ...]
    warmup_steps: int
    steps_per_batch: int
    gns_batch: int
    gns_steps: int

    def __post_init__(self) -> None:
        if not self.local_batches:
            raise InputError("profile schedule has no local_batches", "list at least one size")
        if any(b < 1 for b in self.local_batches):
            raise InputError(
                f"profile local_batches {list(self.local_batches)} holds a size below 1",
                "use positive sizes",
            )
        if list(self.local_batches) != sorted(set(self.local_batches)):
            raise InputError(
                f"profile local_batches {list(self.local_batches)} are not strictly ascending",
                "list each size once, smallest first",
            )
        for name in ("warmup_steps", "gns_steps"):
            if getattr(self, name) < 0:
                raise InputError(f"profile {name}={getattr(self, name)} is negative", "use >= 0")
        if self.steps_per_batch < 1:
            raise InputError(f"profile steps_per_batch={self.steps_per_batch} < 1", "use >= 1")
        if self.gns_batch < 1:
            raise InputError(f"profile gns_batch={self.gns_batch} < 1", "use >= 1")

    def to_json(self) -> str:
        return json.dumps(
            {
                "local_batches": list(self.local_batches),
                "warmup_steps": self.warmup_steps,
                "steps_per_batch": self.steps_per_batch,
                "gns_batch": self.gns_batch,
                "gns_steps": self.gns_steps,
            }
        )


def profile_schedule(environ: Mapping[str, str] | None = None) -> ProfileSchedule | None:
    """Profile mode schedule (``KPLAN_PROFILE_SCHEDULE``, JSON); None: normal training."""
    raw = _raw(PROFILE_SCHEDULE, environ)
    if raw is None:
        return None
    hint = (
        f"{PROFILE_SCHEDULE} must be JSON like "
        '{"local_batches": [8, 16], "warmup_steps": 2, "steps_per_batch": 5, '
        '"gns_batch": 8, "gns_steps": 20}'
    )
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise InputError(f"{PROFILE_SCHEDULE} is not JSON: {err.msg} in {raw!r}", hint) from None
    keys = {"local_batches", "warmup_steps", "steps_per_batch", "gns_batch", "gns_steps"}
    if not isinstance(data, dict) or set(data) != keys:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise InputError(f"{PROFILE_SCHEDULE} has keys {got}, expected {sorted(keys)}", hint)
    batches = data["local_batches"]
    ints = [data[k] for k in sorted(keys - {"local_batches"})]
    if not isinstance(batches, list) or not all(_is_int(b) for b in [*batches, *ints]):
        raise InputError(f"{PROFILE_SCHEDULE} holds a value that is not an integer: {raw}", hint)
    return ProfileSchedule(
        local_batches=tuple(batches),
        warmup_steps=data["warmup_steps"],
        steps_per_batch=data["steps_per_batch"],
        gns_batch=data["gns_batch"],
        gns_steps=data["gns_steps"],
    )


def batch_schedule(environ: Mapping[str, str] | None = None) -> BatchSchedule | None:
    """The global-batch schedule (``KPLAN_BATCH_SCHEDULE``: JSON; runtime/batch_schedule.py)."""
    raw = _raw(BATCH_SCHEDULE, environ)
    return None if raw is None else parse_batch_schedule(raw, BATCH_SCHEDULE)


def momentum_compensation(environ: Mapping[str, str] | None = None) -> MomentumMode | None:
    """Momentum compensation on a batch change (``KPLAN_MOMENTUM``: horizon, off)."""
    return _choice(MOMENTUM, environ, MOMENTUM_MODES)


def compression(environ: Mapping[str, str] | None = None) -> Compression | None:
    """Gradient compression (``KPLAN_COMPRESSION``: none, fp16, bf16, powersgd:RANK,
    topk:RATIO[:ar|ag|auto], adaptive[:MIN:MAX][:ar|ag|auto]; kplan/core/compression_spec.py)."""
    raw = _raw(COMPRESSION, environ)
    return None if raw is None else parse_compression(raw, COMPRESSION)


def sync_policy(environ: Mapping[str, str] | None = None) -> SyncPolicy | None:
    """When to synchronise (``KPLAN_SYNC_POLICY``: every, selective:DELTA[:AVG_EVERY];
    kplan/runtime/selsync.py)."""
    raw = _raw(SYNC_POLICY, environ)
    return None if raw is None else parse_sync_policy(raw, SYNC_POLICY)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def kplan_environ(
    *,
    job_id: str | None = None,
    metrics_path: Path | str | None = None,
    checkpoint_dir: Path | str | None = None,
    checkpoint_interval: float | None = None,
    checkpoint_steps: int | None = None,
    global_batch: int | None = None,
    accum_steps: int | None = None,
    max_local_batch: int | None = None,
    lr_scaling: LrRule | None = None,
    lr_ramp_steps: int | None = None,
    pid_enabled: bool | None = None,
    gns_mode: GnsMode | None = None,
    seed: int | None = None,
    max_steps: int | None = None,
    backend: Backend | None = None,
    dist_timeout: float | None = None,
    profile_schedule: ProfileSchedule | None = None,
    policies: Sequence[str] | None = None,
    epochs_by: EpochsBy | None = None,
    control_path: Path | str | None = None,
    precision: Precision | None = None,
    batch_schedule: BatchSchedule | None = None,
    momentum_compensation: MomentumMode | None = None,
    compression: Compression | str | None = None,
    sync_policy: SyncPolicy | str | None = None,
) -> dict[str, str]:
    """The kplan variables for a worker, as strings; None leaves a variable out.

    The result is validated by reading it back with the functions above, so the launcher cannot
    write a value the runtime would reject.
    """
    values: dict[str, object | None] = {
        JOB_ID: job_id,
        METRICS_PATH: metrics_path,
        CHECKPOINT_DIR: checkpoint_dir,
        CHECKPOINT_INTERVAL: checkpoint_interval,
        CHECKPOINT_STEPS: checkpoint_steps,
        GLOBAL_BATCH: global_batch,
        ACCUM_STEPS: accum_steps,
        MAX_LOCAL_BATCH: max_local_batch,
        LR_SCALING: lr_scaling,
        LR_RAMP_STEPS: lr_ramp_steps,
        PID: None if pid_enabled is None else ("1" if pid_enabled else "0"),
        GNS: gns_mode,
        SEED: seed,
        MAX_STEPS: max_steps,
        BACKEND: backend,
        DIST_TIMEOUT: dist_timeout,
        PROFILE_SCHEDULE: None if profile_schedule is None else profile_schedule.to_json(),
        POLICIES: None if not policies else ",".join(policies),
        EPOCHS_BY: epochs_by,
        CONTROL_PATH: control_path,
        PRECISION: precision,
        BATCH_SCHEDULE: None if batch_schedule is None else batch_schedule.to_json(),
        MOMENTUM: momentum_compensation,
        COMPRESSION: compression.spec() if isinstance(compression, Compression) else compression,
        SYNC_POLICY: sync_policy.spec() if isinstance(sync_policy, SyncPolicy) else sync_policy,
    }
    out = {name: str(value) for name, value in values.items() if value is not None}
    for reader in READERS:
        reader(out)
    return out


READERS = (
    job_id,
    metrics_path,
    checkpoint_dir,
    checkpoint_interval,
    checkpoint_steps,
    global_batch,
    accum_steps,
    max_local_batch,
    lr_scaling,
    lr_ramp_steps,
    pid_enabled,
    gns_mode,
    seed,
    max_steps,
    backend,
    dist_timeout,
    profile_schedule,
    policies,
    epochs_by,
    control_path,
    precision,
    batch_schedule,
    momentum_compensation,
    compression,
    sync_policy,
)
"""Every kplan variable's reader, for validating an environment in one pass."""
