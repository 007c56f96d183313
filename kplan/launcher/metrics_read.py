"""A job's metrics read back for ``kplan report``: rank 0's step records (typed, validated
once by kplan/core/records.py), the step-time statistics, the series the report plots (thinned to
``MAX_POINTS``) and the gradient exchange (:class:`Communication`)."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kplan.core import records as records_mod
from kplan.core.records import (
    CheckpointEvent,
    EpochsEvent,
    Event,
    Record,
    RecordError,
    ResumeEvent,
    StepRecord,
)
from kplan.launcher.storage import Storage

T = TypeVar("T")
MAX_POINTS = 400  # trajectory points kept per series (evenly thinned, last point kept)


@dataclass(frozen=True)
class StepStats:
    records: int
    median_s: float
    mean_s: float
    p90_s: float


@dataclass(frozen=True)
class Communication:
    """The gradient exchange, from rank 0's step records (kplan/runtime/API.md's communication
    fields; present where the job ran two or more workers). Bytes are counted from the tensor
    sizes by the runtime, not measured on the wire."""

    compression: str  # the spec its compressed steps ran ("none": dense all-reduce only)
    compressed_steps: int
    dense_steps: int  # steps that exchanged dense (GNS samples, a warm-up, a dense job)
    bytes_sent: float  # rank 0's gradient bytes, summed over the steps
    dense_bytes: float  # what dense would have sent over the same steps
    collectives: list[str]  # top-k: the collectives it ran
    topk_ratios: list[tuple[int, float]]  # top-k: (first step, ratio) at the start and each change
    synced_steps: int | None = None  # SelSync: steps that synchronised
    skipped_steps: int | None = None
    averages: int | None = None  # SelSync: parameter averages

    def summary(self) -> str:
        """One line for the terminal and the page."""
        parts = []
        if self.compression == "none":
            parts.append(f"dense exchange on {self.dense_steps} steps")
        else:
            parts.append(
                f"{self.compression} on {self.compressed_steps} of "
                f"{self.compressed_steps + self.dense_steps} steps"
            )
        sent = f"{self.bytes_sent / 1e6:,.4g} MB sent by rank 0 (counted)"
        if self.bytes_sent > 0 and self.dense_bytes > self.bytes_sent:
            sent += f", {self.dense_bytes / self.bytes_sent:.3g}x fewer than dense"
        parts.append(sent)
        if self.collectives:
            parts.append("collectives " + ", ".join(c.upper() for c in self.collectives))
        if len(self.topk_ratios) > 1:
            parts.append(
                "top-k ratio " + " -> ".join(f"{r:g} (step {s})" for s, r in self.topk_ratios)
            )
        if self.synced_steps is not None:
            total = self.synced_steps + (self.skipped_steps or 0)
            parts.append(
                f"SelSync synced {self.synced_steps} of {total} steps, "
                f"{self.averages or 0} parameter averages"
            )
        return "; ".join(parts)


@dataclass(frozen=True)
class MetricsLog:
    """A job's metrics as read: every record that validates (kplan/core/records.py), in file
    order, how many JSON objects were read, and the errors of rank 0's step records that did
    not validate (a live view leaves them out; ``kplan report --against`` refuses them)."""

    records: tuple[Record, ...]
    read: int
    step_errors: tuple[RecordError, ...] = ()

    @classmethod
    def parse(cls, raws: Sequence[dict[str, object]]) -> MetricsLog:
        """The log of ``raws`` (JSON objects of the metrics files)."""
        records: list[Record] = []
        errors: list[RecordError] = []
        for raw in raws:
            try:
                records.append(records_mod.parse(raw))
            except RecordError as err:
                if "event" not in raw and raw.get("rank", 0) == 0:
                    errors.append(err)
        return cls(tuple(records), len(raws), tuple(errors))


def rank0_steps(records: Sequence[Record]) -> list[StepRecord]:
    """Rank 0's step records (no events), in time order."""
    steps = [r for r in records if isinstance(r, StepRecord) and r.rank == 0]
    return sorted(steps, key=lambda r: r.time or 0)


def with_numbers(records: Sequence[StepRecord], numbers: Sequence[str]) -> list[StepRecord]:
    """The records whose ``numbers`` fields are all set, in their order."""
    return [r for r in records if all(getattr(r, k) is not None for k in numbers)]


def latest_per_step(records: Sequence[StepRecord]) -> list[StepRecord]:
    """Of step records in time order, the last of each step, in step order: a step redone
    after a resume counts once."""
    by_step = {r.step: r for r in records}
    return [by_step[s] for s in sorted(by_step)]


def communication(rank0: list[StepRecord]) -> Communication | None:
    """:class:`Communication` from rank 0's step records in time order (the last record of a
    redone step wins); None where no record has the fields (one worker, or an older runtime)."""
    recs = latest_per_step(with_numbers(rank0, ("bytes_sent",)))
    if not recs:
        return None
    specs = {str(r.compression) for r in recs} - {"none", "None"}
    compressed = [r for r in recs if str(r.compression) in specs]
    # dense's bytes per step: sent x ratio; a step that sent nothing (SelSync skipped it) would
    # have sent what the median step with a ratio did
    per_step = [
        None if r.compress_ratio is None else (r.bytes_sent or 0.0) * r.compress_ratio for r in recs
    ]
    known = [b for b in per_step if b is not None]
    typical = statistics.median(known) if known else 0.0
    dense = math.fsum(typical if b is None else b for b in per_step)
    ratios: list[tuple[int, float]] = []
    for r in recs:
        x = r.topk_ratio
        if x is not None and (not ratios or ratios[-1][1] != x):
            ratios.append((r.step, x))
    last = recs[-1]
    selsync = last.synced_steps is not None
    return Communication(
        compression=" + ".join(sorted(specs)) or "none",
        compressed_steps=len(compressed),
        dense_steps=len(recs) - len(compressed),
        bytes_sent=math.fsum(r.bytes_sent or 0.0 for r in recs),
        dense_bytes=dense,
        collectives=sorted({c for r in compressed for c in (r.collective or ())}),
        topk_ratios=ratios,
        synced_steps=last.synced_steps,
        skipped_steps=(last.skipped_steps or 0) if selsync else None,
        averages=sum(1 for r in recs if r.averaged) if selsync else None,
    )


@dataclass(frozen=True)
class Metrics:
    note: str  # where they came from, or why they are missing
    steps: int = 0  # optimizer steps recorded by rank 0
    step_time: StepStats | None = None
    step_times: list[tuple[int, float]] = field(default_factory=list)  # rank 0 (step, s)
    global_batch: list[tuple[int, int]] = field(default_factory=list)
    local_batch: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # by rank
    gns: list[tuple[int, float]] = field(default_factory=list)
    checkpoints: int = 0
    resumes: int = 0
    loss: list[tuple[int, float]] = field(default_factory=list)  # rank 0 (step, global loss)
    throughput: list[tuple[int, float]] = field(default_factory=list)  # (step, samples/s)
    step_clock: list[tuple[int, float]] = field(default_factory=list)  # (step, unix time)
    first_step_time: float | None = None  # unix time of rank 0's first step record
    last_step_time: float | None = None
    samples: float = 0.0  # samples trained (rank 0's global batches; redone steps count again)
    epochs: float | None = None  # the work the job set out to do (the runtime's "epochs" event)
    dataset_size: int | None = None
    communication: Communication | None = None


def read_records(storage: Storage, job_id: str) -> MetricsLog:
    """Every rank's step records and events under ``<job>/metrics/``, typed (unparsable lines,
    such as one being written when the job stopped, are left out)."""
    raws: list[dict[str, object]] = []
    for key in sorted(storage.list_keys(f"{job_id}/metrics/")):
        if not key.endswith(".jsonl"):
            continue
        data = storage.get_bytes(key) or b""
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                raws.append(rec)
    return MetricsLog.parse(raws)


def read_metrics(storage: Storage, job_id: str) -> Metrics:
    """Step records and events of every rank under ``<job>/metrics/`` (typed:
    kplan/core/records.py; a record that does not validate is left out)."""
    log = read_records(storage, job_id)
    if not log.read:
        return Metrics(f"no metrics under {storage.uri}/{job_id}/metrics/")
    records = log.records
    steps = [r for r in records if isinstance(r, StepRecord)]
    events = [r for r in records if isinstance(r, Event)]
    rank0 = rank0_steps(records)
    times = [(r.step, r.step_time) for r in rank0 if r.step_time]
    local: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in sorted(steps, key=lambda r: r.time or 0):
        if r.local_batch is not None:
            local[r.rank].append((r.step, r.local_batch))
    values = [t for _, t in times]
    work = next((e for e in events if isinstance(e, EpochsEvent) and e.rank == 0), None)
    clock = [(r.step, r.time) for r in rank0 if r.time is not None]
    return Metrics(
        note=f"{log.read} records from {storage.uri}/{job_id}/metrics/",
        steps=len({s for s, _ in times}),
        step_time=_step_stats(values),
        step_times=_thin(times),
        global_batch=_thin([(r.step, r.global_batch) for r in rank0 if r.global_batch]),
        local_batch={k: _thin(v) for k, v in sorted(local.items())},
        gns=_thin([(r.step, r.gns) for r in rank0 if r.gns is not None]),
        checkpoints=sum(1 for e in events if isinstance(e, CheckpointEvent)),
        resumes=sum(1 for e in events if isinstance(e, ResumeEvent) and e.rank == 0),
        loss=_thin([(r.step, r.loss) for r in rank0 if r.loss is not None]),
        throughput=_thin(
            [
                (r.step, r.global_batch / r.step_time)
                for r in rank0
                if r.global_batch and r.step_time
            ]
        ),
        step_clock=_thin(clock),
        first_step_time=clock[0][1] if clock else None,
        last_step_time=clock[-1][1] if clock else None,
        samples=math.fsum(float(r.global_batch) for r in rank0 if r.global_batch),
        epochs=None if work is None or work.total is None else float(work.total),
        dataset_size=None if work is None else work.dataset_size,
        communication=communication(rank0),
    )


def _step_stats(values: list[float]) -> StepStats | None:
    if not values:
        return None
    ordered = sorted(values)
    return StepStats(
        records=len(values),
        median_s=statistics.median(values),
        mean_s=math.fsum(values) / len(values),
        p90_s=ordered[min(math.ceil(0.9 * len(ordered)) - 1, len(ordered) - 1)],
    )


def _thin(points: list[T]) -> list[T]:
    if len(points) <= MAX_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_POINTS)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])
