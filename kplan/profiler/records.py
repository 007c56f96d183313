"""The runtime's metrics stream (JSON lines), parsed into typed records as it grows.

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


def _float(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _req_float(raw: dict[str, Any], key: str) -> float:
    value = _float(raw, key)
    if value is None:
        raise ValueError(f"'{key}' is missing or not a finite number")
    return value


def _req_int(raw: dict[str, Any], key: str) -> int:
    return int(_req_float(raw, key))


def parse_record(raw: Any) -> Record | None:
    """One JSON object from the stream as a record; None for records the profiler ignores."""
    if not isinstance(raw, dict):
        raise ValueError("a record must be a JSON object")
    event = raw.get("event")
    if event is None:
        if "step_time" not in raw:
            return None
        return StepRecord(
            step=_req_int(raw, "step"),
            rank=int(raw.get("rank", 0)),
            world_size=int(raw.get("world_size", 1)),
            local_batch=_req_int(raw, "local_batch"),
            compute_time=_req_float(raw, "compute_time"),
            sync_time=_float(raw, "sync_time") or 0.0,
            step_time=_req_float(raw, "step_time"),
            loss=_float(raw, "loss"),
            phase=str(raw.get("phase", "")),
            warmup=raw["warmup"] if isinstance(raw.get("warmup"), bool) else None,
            gns=_float(raw, "gns"),
            grad_sqr=_float(raw, "grad_sqr"),
            grad_var=_float(raw, "grad_var"),
            backward_time=_float(raw, "backward_time"),
        )
    if event == "model":
        return ModelEvent(
            _req_int(raw, "gradient_bytes"),
            int(raw.get("parameters", 0)),
            _shape_counts(raw.get("gradient_shapes")),
        )
    if event == "oom":
        return OomEvent(_req_int(raw, "local_batch"))
    if event == "memory":
        lb = raw.get("local_batch")
        total = raw.get("device_total_bytes")
        return MemoryEvent(
            local_batch=None if lb is None else int(lb),
            peak_bytes=_req_int(raw, "peak_bytes"),
            total_bytes=None if total is None else int(total),
            rank=int(raw.get("rank", 0)),
        )
    if event == "allreduce":
        return AllReduceEvent(
            nbytes=_req_int(raw, "nbytes"),
            seconds=_req_float(raw, "seconds"),
            world_size=_req_int(raw, "world_size"),
            backend=str(raw.get("backend", "")),
        )
    if event == "codec":
        seconds = raw.get("seconds")
        if not isinstance(seconds, dict):
            raise ValueError("'seconds' of a codec record must be an object")
        return CodecEvent(
            seconds=tuple((str(k), _req_float(seconds, k)) for k in seconds),
            device=str(raw.get("device", "")),
            how=str(raw.get("how", "")),
            skipped=str(raw.get("skipped", "")),
        )
    if event == "done":
        return DoneEvent(int(raw.get("rank", 0)))
    return None


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
