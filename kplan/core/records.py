"""The metrics stream's records, typed: one step record and one event record per kind.

The runtime writes them (kplan/runtime/metrics.py, one JSON object a line: kplan/runtime/API.md)
and the launcher (report, adaptation, statistical cost, the live view) and the profiler read
them; this module is the contract between the two sides. ``from_dict`` validates what a record
holds (integers, finite numbers, strings and flags where the field says so, batches of at least
one) and raises :class:`RecordError` (one line and a hint) otherwise; keys it does not know are
ignored, so a newer runtime's records still read, a non-finite number reads as null (the
writer writes it so), and fields added over time are optional, so an
older runtime's records still read. ``to_dict`` is what the writer puts on the line.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from kplan.core.errors import InputError

STEP_TIME_KEY = "step_time"
"""The key only step records have (a fast filter for raw lines: kplan/launcher/noderun.py)."""

_HINT = "the metrics were not written by the kplan runtime, or were edited (kplan/runtime/API.md)"


class RecordError(InputError):
    """A metrics record that does not hold what its kind promises."""


R = TypeVar("R", bound="_Record")


@dataclass(frozen=True)
class _Record:
    """Shared validation: every field's type from its annotation, ranges from ``AT_LEAST``."""

    AT_LEAST: ClassVar[Mapping[str, float]] = {}
    """Lower bounds of numeric fields (a batch of 0 would divide by zero in every reader)."""

    @classmethod
    def from_dict(cls: type[R], raw: Mapping[str, Any]) -> R:
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise RecordError(f"{cls._what(raw)}: no '{f.name}'", _HINT)
                continue
            value = _typed(raw[f.name], hints[f.name])
            if value is _BAD:
                raise RecordError(
                    f"{cls._what(raw)}: '{f.name}' is {_show(raw[f.name])}, "
                    f"not {_type_name(hints[f.name])}",
                    _HINT,
                )
            low = cls.AT_LEAST.get(f.name)
            if low is not None and value is not None and value < low:
                raise RecordError(
                    f"{cls._what(raw)}: '{f.name}' is {_show(value)}, below {low:g}", _HINT
                )
            values[f.name] = value
        return cls(**values)

    @classmethod
    def _what(cls, raw: Mapping[str, Any]) -> str:
        step = raw.get("step")
        return f"{cls.__name__} (step {step})" if isinstance(step, int) else cls.__name__

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


_BAD = object()


def _typed(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (JSON lists become tuples), or ``_BAD``."""
    if tp is Any:
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        if inner is float and isinstance(value, float) and not math.isfinite(value):
            return None  # the writer's convention: a non-finite number is written as null
        return _typed(value, inner)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return _BAD
        items = [_typed(v, args[0]) for v in value]
        return _BAD if any(i is _BAD for i in items) else tuple(items)
    if tp is bool:
        return value if isinstance(value, bool) else _BAD
    if isinstance(value, bool):
        return _BAD
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) else _BAD
    if tp is float:
        ok = isinstance(value, int | float) and math.isfinite(value)
        return float(value) if ok else _BAD
    if tp is str:
        return value if isinstance(value, str) else _BAD
    raise TypeError(f"no validation for {tp!r}")  # a field of a type this module does not know


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _type_name(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    inner = args[0] if args else tp
    if typing.get_origin(inner) is tuple:
        return "a list"
    names = {int: "an integer", float: "a finite number", str: "a string", bool: "true/false"}
    return names.get(inner, str(inner))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- the step record ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord(_Record):
    """One optimizer step as one rank saw it (rank 0's is the job's; kplan/runtime/API.md)."""

    AT_LEAST: ClassVar[Mapping[str, float]] = {
        "step": 0,
        "rank": 0,
        "world_size": 1,
        "local_batch": 1,
        "global_batch": 1,
        "accum_steps": 1,
        "compute_time": 0.0,
        STEP_TIME_KEY: 0.0,
    }

    step: int
    rank: int = 0
    world_size: int | None = None
    local_batch: int | None = None
    global_batch: int | None = None
    compute_time: float | None = None
    sync_time: float | None = None
    step_time: float | None = None
    loss: float | None = None
    gns: float | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    gns_rel_error: float | None = None
    lr: float | None = None
    time: float | None = None
    epoch: int | None = None
    accum_steps: int | None = None
    progress: float | None = None
    job: str | None = None
    # fp16's loss scaling
    loss_scale: float | None = None
    skipped: bool | None = None
    # profile mode
    phase: str | None = None
    warmup: bool | None = None
    backward_time: float | None = None
    # communication (two or more workers): compression and SelSync
    compression: str | None = None
    bytes_sent: float | None = None
    blocked_s: float | None = None
    compress_ratio: float | None = None
    topk_ratio: float | None = None
    collective: tuple[str, ...] | None = None
    compress_gain: float | None = None
    next_topk_ratio: float | None = None
    synced: bool | None = None
    averaged: bool | None = None
    significance: float | None = None
    synced_steps: int | None = None
    skipped_steps: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields every step record has (``STEP_KEYS``), and the others where they apply:
        a field of a group the step has (``_NULL_WITH``) is written even when null."""
        doc = super().to_dict()
        return {
            k: v
            for k, v in doc.items()
            if v is not None or k in STEP_KEYS or doc.get(_NULL_WITH.get(k, "")) is not None
        }


_NULL_WITH = {"collective": "topk_ratio", "compress_ratio": "bytes_sent", "significance": "synced"}
"""Fields written as null where the step has their group's anchor: the collective of a top-k
step that ran dense, the ratio of a step that sent nothing, SelSync's significance of a step
without one."""


STEP_KEYS = (
    "step",
    "rank",
    "world_size",
    "local_batch",
    "global_batch",
    "compute_time",
    "sync_time",
    STEP_TIME_KEY,
    "loss",
    "gns",
    "grad_sqr",
    "grad_var",
    "gns_rel_error",
    "lr",
    "time",
)
"""The keys every step record the runtime writes has (values may be null)."""


# --- events ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event(_Record):
    """An event of the stream: ``KIND`` is its ``event`` value. Fields: what the runtime writes;
    all optional where older runtimes did not write them."""

    KIND: ClassVar[str] = ""
    rank: int = 0
    time: float | None = None
    job: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.KIND, **super().to_dict()}


@dataclass(frozen=True)
class StartEvent(Event):
    KIND: ClassVar[str] = "start"
    AT_LEAST: ClassVar[Mapping[str, float]] = {"world_size": 1, "global_batch": 1, "base_batch": 1}
    world_size: int | None = None
    backend: str | None = None
    device: str | None = None
    restart_count: int | None = None
    resumed_step: int | None = None
    global_batch: int | None = None
    base_batch: int | None = None
    accum_steps: int | None = None
    profiling: bool | None = None
    precision: str | None = None
    gns_window_steps: float | None = None
    gns_population: int | None = None


@dataclass(frozen=True)
class ModelEvent(Event):
    KIND: ClassVar[str] = "model"
    gradient_bytes: int | None = None
    parameters: int | None = None
    gradient_shapes: Any = None  # [[shape, count], ...] (profiler/records.py reads it)


@dataclass(frozen=True)
class CompressionEvent(Event):
    KIND: ClassVar[str] = "compression"
    compression: str | None = None
    sync_policy: str | None = None
    bandwidth_Bps: float | None = None
    latency_s: float | None = None
    topk_exchange: Any = None
    gns_dense_every: int | None = None


@dataclass(frozen=True)
class ResumeEvent(Event):
    KIND: ClassVar[str] = "resume"
    step: int | None = None
    path: str | None = None


@dataclass(frozen=True)
class EpochsEvent(Event):
    """The training's length (``job.epochs``): the launcher's measure of the work left."""

    KIND: ClassVar[str] = "epochs"
    AT_LEAST: ClassVar[Mapping[str, float]] = {"total": 0, "base_batch": 1, "dataset_size": 1}
    total: int | None = None
    by: str | None = None
    target_progress: float | None = None
    base_batch: int | None = None
    dataset_size: int | None = None


@dataclass(frozen=True)
class CheckpointEvent(Event):
    KIND: ClassVar[str] = "checkpoint"
    step: int | None = None
    path: str | None = None
    bytes: int | None = None
    seconds: float | None = None
    reason: str | None = None


@dataclass(frozen=True)
class DoneEvent(Event):
    KIND: ClassVar[str] = "done"
    step: int | None = None
    stopped: str | None = None


@dataclass(frozen=True)
class PreemptedEvent(Event):
    KIND: ClassVar[str] = "preempted"
    step: int | None = None


@dataclass(frozen=True)
class OomEvent(Event):
    KIND: ClassVar[str] = "oom"
    local_batch: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class MemoryEvent(Event):
    KIND: ClassVar[str] = "memory"
    local_batch: int | None = None
    peak_bytes: int | None = None
    device_total_bytes: int | None = None
    estimated: bool | None = None


@dataclass(frozen=True)
class PolicyEvent(Event):
    """A policy's action: the runtime applied it (set_batch, stop) or asks the launcher."""

    KIND: ClassVar[str] = "policy"
    action: str | None = None  # resize, replace, stop, set_batch
    policy: str | None = None
    reason: str | None = None
    step: int | None = None
    nodes: int | None = None
    workers_per_node: int | None = None
    instance_type: str | None = None
    node_rank: int | None = None
    global_batch: int | None = None
    previous: int | None = None


@dataclass(frozen=True)
class BatchSizesEvent(Event):
    KIND: ClassVar[str] = "batch_sizes"
    step: int | None = None
    local_batches: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BatchScheduleEvent(Event):
    KIND: ClassVar[str] = "batch_schedule"
    step: int | None = None
    phase: int | None = None
    trigger: str | None = None
    at: float | None = None
    progress: float | None = None
    previous: int | None = None
    global_batch: int | None = None
    asked: int | None = None
    lr_factor: float | None = None
    momentum: Any = None  # a float, or Adam's (beta1, beta2)
    ramp_steps: int | None = None


@dataclass(frozen=True)
class AllReduceEvent(Event):
    """The profiler's all-reduce microbenchmark (profiler/allreduce.py)."""

    KIND: ClassVar[str] = "allreduce"
    nbytes: int | None = None
    seconds: float | None = None
    world_size: int | None = None
    backend: str | None = None


@dataclass(frozen=True)
class CodecEvent(Event):
    """The profiler's compression codec timings (profiler/codec.py)."""

    KIND: ClassVar[str] = "codec"
    seconds: Any = None  # {option spec: median seconds}
    device: str | None = None
    how: str | None = None
    skipped: str | None = None


EVENTS: dict[str, type[Event]] = {
    e.KIND: e
    for e in (
        StartEvent,
        ModelEvent,
        CompressionEvent,
        ResumeEvent,
        EpochsEvent,
        CheckpointEvent,
        DoneEvent,
        PreemptedEvent,
        OomEvent,
        MemoryEvent,
        PolicyEvent,
        BatchSizesEvent,
        BatchScheduleEvent,
        AllReduceEvent,
        CodecEvent,
    )
}
"""Every event kind by its ``event`` value."""

Record = StepRecord | Event


def event(kind: str, **fields: Any) -> Event:
    """A new event of ``kind`` (the writer's side: unknown kinds and fields are errors)."""
    cls = EVENTS.get(kind)
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"event {kind!r} has no field {', '.join(sorted(unknown))}")
    return cls.from_dict(fields)


def parse(raw: Any) -> Record:
    """One JSON object of the stream as its typed record (:class:`RecordError` if it is not)."""
    if not isinstance(raw, dict):
        raise RecordError(f"a metrics record is {type(raw).__name__}, not an object", _HINT)
    kind = raw.get("event")
    if kind is None:
        return StepRecord.from_dict(raw)
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"unknown event kind {_show(kind)}", _HINT)
    return cls.from_dict(raw)


def parse_lenient(raws: list[Any]) -> list[Record]:
    """The records of ``raws`` that parse, in their order (a live reader's view: a record it
    cannot read is left out, as a torn line is)."""
    out: list[Record] = []
    for raw in raws:
        try:
            out.append(parse(raw))
        except RecordError:
            continue
    return out
