"""What the running job measures, as the launcher reads it: the runtime's metrics records
(``<job>/metrics/`` in the job's storage, typed by kplan/core/records.py) grouped into
*segments* (consecutive steps of one configuration: nodes, workers, global batch,
accumulation), each segment's steady steps as one measured configuration (the median step and
sync time), the job's view (step, progress, GNS and its history, the work left) and the
requests of the runtime's policies (``policy`` events). adapt.py decides what to do with them.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from kplan.core.records import (
    EpochsEvent,
    Event,
    PolicyEvent,
    Record,
    StartEvent,
    StepRecord,
    parse_lenient,
)
from kplan.launcher.bootstrap import job_key
from kplan.launcher.storage import Storage
from kplan.planner.profile import Measurement

STEADY_SKIP = 3  # steps of a segment left out of its measurement (warm-up, the ramp, a restart)
MIN_STEADY = 5  # steps a segment needs before it counts as a measurement
GNS_HISTORY = 512  # points kept of the job's GNS; past it every other one is dropped

# --- the metrics stream ---------------------------------------------------------------------


class MetricsFeed:
    """The records appended to the job's metrics files since the last poll (whole lines only),
    typed (kplan/core/records.py: a record that does not validate is left out, as a torn line
    is)."""

    def __init__(self, storage: Storage, job_id: str) -> None:
        self.storage = storage
        self.prefix = job_key(job_id, "metrics/")
        self.offsets: dict[str, int] = {}

    def poll(self) -> list[Record]:
        out: list[object] = []
        for key in self.storage.list_keys(self.prefix):
            if not key.endswith(".jsonl"):
                continue
            start = self.offsets.get(key, 0)
            data = _read_from(self.storage, key, start)
            if not data:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue  # a line being written: read it whole next time
            self.offsets[key] = start + end + 1
            for line in data[: end + 1].splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn line of a killed writer: skip it
                if isinstance(rec, dict):
                    out.append(rec)
        return parse_lenient(out)


def _read_from(storage: Storage, key: str, start: int) -> bytes:
    reader = getattr(storage, "read_from", None)
    if reader is not None:
        data = reader(key, start)
        return data if isinstance(data, bytes) else b""
    whole = storage.get_bytes(key)
    return b"" if whole is None or len(whole) <= start else whole[start:]


# --- segments: one configuration's consecutive steps ----------------------------------------


@dataclass
class Segment:
    generation: int
    nodes: int
    workers: int
    global_batch: int
    accum_steps: int
    first_step: int
    step_times: list[float] = field(default_factory=list)
    sync_times: list[float] = field(default_factory=list)
    reported: int = 0  # steady steps at the last observation

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.nodes, self.workers, self.global_batch, self.accum_steps)

    @property
    def steady(self) -> int:
        return max(len(self.step_times) - STEADY_SKIP, 0)

    def measurement(self) -> Measurement | None:
        """The median of the steady steps, or None while there are too few."""
        if self.steady < MIN_STEADY:
            return None
        steps = self.step_times[STEADY_SKIP:]
        syncs = self.sync_times[STEADY_SKIP:]
        step = statistics.median(steps)
        sync = min(statistics.median(syncs), step) if syncs else None
        local = max(round(self.global_batch / (self.workers * self.accum_steps)), 1)
        return Measurement(
            nodes=self.nodes,
            workers=self.workers,
            local_batch=local,
            step_time=step,
            sync_time=sync,
            accum_steps=self.accum_steps,
        )


@dataclass(frozen=True)
class PolicyRequest:
    """An action a runtime policy asked the launcher for (a ``policy`` event)."""

    action: str  # resize, replace, stop, set_batch
    policy: str
    reason: str
    step: int | None
    nodes: int | None = None
    workers_per_node: int | None = None
    instance_type: str | None = None
    node_rank: int | None = None
    global_batch: int | None = None

    @staticmethod
    def from_event(ev: PolicyEvent) -> PolicyRequest | None:
        """The request of a ``policy`` event; None for actions the launcher does not carry out."""
        if ev.action not in ("resize", "replace", "stop", "set_batch"):
            return None

        def opt(value: int | None) -> int | None:
            return value if value is not None and value >= 0 else None

        return PolicyRequest(
            action=ev.action,
            policy=ev.policy or "policy",
            reason=ev.reason or "",
            step=opt(ev.step),
            nodes=opt(ev.nodes),
            workers_per_node=opt(ev.workers_per_node),
            instance_type=ev.instance_type or None,
            node_rank=opt(ev.node_rank),
            global_batch=opt(ev.global_batch),
        )


@dataclass
class JobView:
    """What the launcher knows of the training, from the metrics (rank 0's step records)."""

    step: int = -1
    progress: float | None = None
    target_progress: float | None = None
    base_batch: int | None = None
    global_batch: int | None = None
    world_size: int | None = None
    gns: float | None = None
    last_step_time: float | None = None  # wall clock of the newest step record
    steps_in_generation: int = 0
    # (progress, gns) as the job measured them, thinned (at most GNS_HISTORY points): the
    # trajectory the planner's GNS forecast starts from
    gns_history: list[tuple[float, float]] = field(default_factory=list)
    # the runtime's GNS is a moving average about this many steps old (start event)
    gns_window_steps: float | None = None
    # (step, progress) of the previous step record: the progress one step makes
    last_step_progress: tuple[int, float] | None = None

    @property
    def remaining_progress(self) -> float | None:
        if self.progress is None or self.target_progress is None:
            return None
        return max(self.target_progress - self.progress, 0.0)


class Observer:
    """Turns metrics records into segments, measurements, the job view and policy requests."""

    def __init__(self) -> None:
        self.view = JobView()
        self.segments: list[Segment] = []
        self.requests: list[PolicyRequest] = []
        self.generation = 0
        self.nodes = 1

    def new_generation(self, generation: int, nodes: int) -> None:
        self.generation = generation
        self.nodes = nodes
        self.view.steps_in_generation = 0

    def feed(self, records: Sequence[Record]) -> list[Segment]:
        """Take new records (:meth:`MetricsFeed.poll`); return the segments that gained steady
        steps."""
        grown: dict[int, Segment] = {}
        for rec in records:
            if isinstance(rec, Event):
                self._event(rec)
                continue
            if rec.rank != 0 or rec.phase is not None:
                continue  # another rank's, or profile mode
            seg = self._segment(rec)
            if rec.step_time is None or rec.step_time <= 0:
                continue
            seg.step_times.append(rec.step_time)
            if rec.sync_time is not None:
                seg.sync_times.append(max(rec.sync_time, 0.0))
            self._view(rec)
            grown[id(seg)] = seg
        return [s for s in grown.values() if s.steady > 0]

    def _segment(self, rec: StepRecord) -> Segment:
        world = rec.world_size or 1
        batch = rec.global_batch or 0
        accum = rec.accum_steps or 1
        last = self.segments[-1] if self.segments else None
        if (
            last is not None
            and last.generation == self.generation
            and (last.workers, last.global_batch, last.accum_steps) == (world, batch, accum)
            and rec.step >= last.first_step
        ):
            return last
        seg = Segment(self.generation, min(self.nodes, world), world, batch, accum, rec.step)
        self.segments.append(seg)
        return seg

    def _view(self, rec: StepRecord) -> None:
        v = self.view
        v.step = rec.step
        v.global_batch = rec.global_batch or v.global_batch
        v.world_size = rec.world_size or 1
        previous = v.last_step_progress
        v.progress = rec.progress if rec.progress is not None else v.progress
        if v.progress is not None:
            v.last_step_progress = (v.step, v.progress)
        if rec.gns is not None and rec.gns > 0:
            v.gns = rec.gns
            if v.progress is not None:
                _remember(v.gns_history, _gns_progress(v, previous), rec.gns)
        v.last_step_time = rec.time if rec.time is not None else v.last_step_time
        v.steps_in_generation += 1

    def _event(self, ev: Event) -> None:
        if isinstance(ev, StartEvent):
            window = ev.gns_window_steps
            if window is not None and window > 0:
                self.view.gns_window_steps = window
        elif isinstance(ev, EpochsEvent):  # the job's statistical target (runtime: job.epochs)
            if ev.target_progress is not None and ev.target_progress > 0:
                self.view.target_progress = ev.target_progress
            if ev.base_batch is not None:
                self.view.base_batch = ev.base_batch
        elif isinstance(ev, PolicyEvent) and ev.rank == 0:
            req = PolicyRequest.from_event(ev)
            if req is not None and req.action != "set_batch":
                self.requests.append(req)

    def take_requests(self) -> list[PolicyRequest]:
        out, self.requests = self.requests, []
        return out


def _gns_progress(v: JobView, previous: tuple[int, float] | None) -> float:
    """The progress the job's GNS refers to. The runtime reports a moving average (a mean age
    of ``gns_window_steps`` once full; of about half the steps so far before, as its start is
    debiased), so the value is filed that many steps back, at the progress a step makes now."""
    progress = v.progress or 0.0
    window = v.gns_window_steps
    if window is None or previous is None or v.step <= previous[0]:
        return progress
    per_step = max(progress - previous[1], 0.0) / (v.step - previous[0])
    beta = window / (1.0 + window)  # the EMA's weight: mean age beta/(1-beta) = window
    n = v.step + 1
    age = window - n * beta**n / (1.0 - beta**n)  # mean age of a debiased EMA of n samples
    return max(progress - max(age, 0.0) * per_step, progress / n)


def _remember(history: list[tuple[float, float]], progress: float, gns: float) -> None:
    # a resumed job repeats progress: its new points replace those of the lost stretch
    while history and history[-1][0] >= progress:
        history.pop()
    history.append((progress, gns))
    if len(history) > GNS_HISTORY:
        del history[-2::-2]  # every other point, the newest kept
