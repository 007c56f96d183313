"""The runtime's metrics stream (JSON lines) as the profiler reads it, as it grows: the
stream's typed records (kplan/core/records.py, which validates them) in the profiler's terms.

Per-step records carry ``step, rank, world_size, local_batch, global_batch, compute_time,
sync_time, step_time, loss, gns, grad_sqr, grad_var, phase`` (and, in the sweep,
``backward_time``: the part of ``compute_time`` the backward passes took); events carry ``event``:
``model`` (gradient bytes, parameters, the parameters' shapes), ``oom`` (a local batch that ran
out of memory), ``memory`` (peak and total bytes on CUDA), ``allreduce`` and ``codec`` (the
profiler's own microbenchmarks: profiler/allreduce.py, profiler/codec.py) and ``done``. Unknown
keys and events are ignored (kplan/runtime/API.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kplan.core import records
from kplan.core.errors import JobError


@dataclass(frozen=True)
class StepRecord:
    step: int
    rank: int
    world_size: int
    local_batch: int
    compute_time: float
    sync_time: float
    step_time: float
    loss: float | None
    phase: str  # "sweep" or "gns"
    warmup: bool | None = None  # sweep steps: true for the untimed first steps of a size
    gns: float | None = None
    grad_sqr: float | None = None
    grad_var: float | None = None
    backward_time: float | None = None  # sweep steps: the backward passes' part of compute_time


@dataclass(frozen=True)
class ModelEvent:
    gradient_bytes: int
    parameters: int
    # [(shape, count)] of distinct trainable parameter shapes; None: not reported (or too many)
    shapes: tuple[tuple[tuple[int, ...], int], ...] | None = None


@dataclass(frozen=True)
class CodecEvent:
    """Compression codec seconds per step measured on rank 0 after the job (profiler/codec.py)."""

    seconds: tuple[tuple[str, float], ...]  # (option spec, median seconds)
    device: str
    how: str
    skipped: str  # why some or all options were not measured ("" when none was skipped)


@dataclass(frozen=True)
class OomEvent:
    local_batch: int


@dataclass(frozen=True)
class MemoryEvent:
    local_batch: int | None
    peak_bytes: int
    total_bytes: int | None  # the device's memory
    rank: int


@dataclass(frozen=True)
class AllReduceEvent:
    nbytes: int
    seconds: float  # mean time of one all-reduce of nbytes
    world_size: int
    backend: str


@dataclass(frozen=True)
class DoneEvent:
    rank: int


Record = StepRecord | ModelEvent | OomEvent | MemoryEvent | AllReduceEvent | CodecEvent | DoneEvent


def _need(value: float | int | None, what: str, key: str) -> float:
    if value is None:
        raise ValueError(f"'{key}' of a {what} is missing or not a finite number")
    return float(value)


def parse_record(raw: Any) -> Record | None:
    """One JSON object from the stream as a record; None for records the profiler ignores
    (events of other kinds, also kinds newer than this kplan, and step records without a step
    time). Raises ValueError for a record that does not validate (kplan/core/records.py)."""
    kind = raw.get("event") if isinstance(raw, dict) else None
    if isinstance(kind, str) and kind not in records.EVENTS:
        return None
    try:
        rec = records.parse(raw)
    except records.RecordError as err:
        raise ValueError(err.message) from None
    if isinstance(rec, records.StepRecord):
        return _step(rec)
    if isinstance(rec, records.ModelEvent):
        return ModelEvent(
            int(_need(rec.gradient_bytes, "model record", "gradient_bytes")),
            rec.parameters or 0,
            _shape_counts(rec.gradient_shapes),
        )
    if isinstance(rec, records.OomEvent):
        return OomEvent(int(_need(rec.local_batch, "oom record", "local_batch")))
    if isinstance(rec, records.MemoryEvent):
        return MemoryEvent(
            local_batch=rec.local_batch,
            peak_bytes=int(_need(rec.peak_bytes, "memory record", "peak_bytes")),
            total_bytes=rec.device_total_bytes,
            rank=rec.rank,
        )
    if isinstance(rec, records.AllReduceEvent):
        return AllReduceEvent(
            nbytes=int(_need(rec.nbytes, "allreduce record", "nbytes")),
            seconds=_need(rec.seconds, "allreduce record", "seconds"),
            world_size=int(_need(rec.world_size, "allreduce record", "world_size")),
            backend=rec.backend or "",
        )
    if isinstance(rec, records.CodecEvent):
        return _codec(rec)
    if isinstance(rec, records.DoneEvent):
        return DoneEvent(rec.rank)
    return None


def _step(rec: records.StepRecord) -> StepRecord | None:
    if rec.step_time is None:
        return None
    what = "step record"
    return StepRecord(
        step=rec.step,
        rank=rec.rank,
        world_size=rec.world_size or 1,
        local_batch=int(_need(rec.local_batch, what, "local_batch")),
        compute_time=_need(rec.compute_time, what, "compute_time"),
        sync_time=rec.sync_time or 0.0,
        step_time=rec.step_time,
        loss=rec.loss,
        phase=rec.phase or "",
        warmup=rec.warmup,
        gns=rec.gns,
        grad_sqr=rec.grad_sqr,
        grad_var=rec.grad_var,
        backward_time=rec.backward_time,
    )


def _codec(rec: records.CodecEvent) -> CodecEvent:
    seconds = rec.seconds
    if not isinstance(seconds, dict):
        raise ValueError("'seconds' of a codec record must be an object")
    timed = []
    for k, v in seconds.items():
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        timed.append((str(k), _need(float(v) if ok else None, "codec record", str(k))))
    return CodecEvent(
        seconds=tuple(timed), device=rec.device or "", how=rec.how or "", skipped=rec.skipped or ""
    )


def _shape_counts(value: Any) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    """The model record's ``gradient_shapes`` ([[shape, count], ...]); None when absent."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError("'gradient_shapes' must be a list of [shape, count] pairs")
    out = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], list)):
            raise ValueError(f"'gradient_shapes' entry {str(pair)[:40]} is not [shape, count]")
        out.append((tuple(int(d) for d in pair[0]), int(pair[1])))
    return tuple(out)


class MetricsTail:
    """Reads the records appended to a JSON-lines file since the last call.

    A partial last line (a writer mid-write) is kept until its newline arrives.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._line = 0

    def poll(self) -> list[Record]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        out: list[Record] = []
        for line in lines:
            self._line += 1
            if not line.strip():
                continue
            try:
                record = parse_record(json.loads(line))
            except (ValueError, TypeError) as err:
                raise JobError(
                    f"{self.path}:{self._line}: bad metrics record: {err}",
                    hint="the job's runtime wrote a record the profiler cannot read; "
                    "is the script using kplan.runtime?",
                ) from None
            if record is not None:
                out.append(record)
        return out
