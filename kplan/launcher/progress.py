"""A running job's progress as plain data: what ``kplan launch`` shows live and ``status --watch``.

Read-side only. Every number comes from where the launcher and the runtime already write it:

- the state database: the job row (status, budget, prediction), its instances (node states),
  its events (the last one, preemptions) and its ledger (spend);
- the runtime's metrics stream, ``<job>/metrics/*.jsonl`` in the job's storage
  (``kplan/runtime/API.md``): rank 0's step records give the step, epoch, loss, global batch and
  ``progress`` (base-batch steps); the ``epochs`` event gives the epoch count and the
  ``target_progress`` that the ETA counts down to.

Spend between two monitor ticks is extrapolated the way the ledger will bill it: each open
ledger row of a live instance is billed to now at its price (``Billing.billed_seconds``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kplan.core.errors import KplanError
from kplan.core.records import EpochsEvent, Record, ResumeEvent, StepRecord
from kplan.launcher.ledger import BillingRule, billing_for
from kplan.launcher.measure import MetricsFeed
from kplan.launcher.state import EventRecord, InstanceRecord, StateDB
from kplan.launcher.storage import Storage

RATE_WINDOW = 30  # rank-0 step records the samples/s and the ETA are measured over


@dataclass(frozen=True)
class NodeState:
    rank: int
    instance: str
    state: str
    type: str
    market: str
    usd_per_hour: float


@dataclass(frozen=True)
class LastEvent:
    time: float
    kind: str
    message: str


@dataclass(frozen=True)
class Progress:
    """One snapshot of a job. ``None``: not known yet (no step record, no epochs event)."""

    job_id: str
    status: str
    reason: str | None
    time: float  # when the snapshot was taken (epoch seconds)
    elapsed_s: float
    nodes: tuple[NodeState, ...]
    step: int | None
    epoch: int | None  # 0-based, as the runtime counts
    epochs: int | None
    loss: float | None
    samples_per_s: float | None
    progress: float | None  # base-batch steps done
    target_progress: float | None  # base-batch steps of the whole run
    eta_s: float | None
    spend_usd: float
    budget_usd: float
    predicted_cost_usd: float | None
    predicted_hours: float | None
    preemptions: int
    last_event: LastEvent | None

    @property
    def fraction(self) -> float | None:
        """The share of the work done, in [0, 1]."""
        if self.progress is None or not self.target_progress:
            return None
        return min(max(self.progress / self.target_progress, 0.0), 1.0)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["fraction"] = self.fraction
        return doc


@dataclass
class _Training:
    """What the metrics said so far (rank 0)."""

    step: int | None = None
    epoch: int | None = None
    epochs: int | None = None
    loss: float | None = None
    progress: float | None = None
    target_progress: float | None = None
    # (time, global batch, progress) of the newest step records
    window: deque[tuple[float, int, float | None]] = field(
        default_factory=lambda: deque(maxlen=RATE_WINDOW)
    )

    def feed(self, records: Sequence[Record]) -> None:
        """Take new records (:meth:`~kplan.launcher.measure.MetricsFeed.poll`)."""
        for rec in records:
            if rec.rank != 0:
                continue
            if isinstance(rec, EpochsEvent):
                self.epochs = rec.total if rec.total is not None else self.epochs
                if rec.target_progress is not None:
                    self.target_progress = rec.target_progress
            elif isinstance(rec, ResumeEvent):
                self.window.clear()  # the steps before the restart would bend the rate
            elif isinstance(rec, StepRecord) and rec.phase is None:  # not profile mode
                if self.step is not None and rec.step < self.step:
                    self.window.clear()  # resumed from an earlier checkpoint
                self.step = rec.step
                self.epoch = rec.epoch if rec.epoch is not None else self.epoch
                self.loss = rec.loss if rec.loss is not None else self.loss
                self.progress = rec.progress if rec.progress is not None else self.progress
                if rec.time is not None:
                    self.window.append((rec.time, rec.global_batch or 0, rec.progress))

    def rates(self) -> tuple[float | None, float | None]:
        """Samples per second and base-batch steps per second over the window."""
        if len(self.window) < 2:
            return None, None
        (t0, _, p0), (t1, _, p1) = self.window[0], self.window[-1]
        if t1 <= t0:
            return None, None
        samples = sum(b for _, b, _ in list(self.window)[1:])
        per_s = samples / (t1 - t0) if samples > 0 else None
        steps_per_s = None if p0 is None or p1 is None or p1 <= p0 else (p1 - p0) / (t1 - t0)
        return per_s, steps_per_s


class ProgressTracker:
    """Builds :class:`Progress` snapshots of one job; each call reads only what is new.

    ``storage`` is the job's storage (its metrics); ``None`` shows the job without training
    numbers. Use one tracker per thread (it keeps offsets into the metrics files)."""

    def __init__(self, job_id: str, storage: Storage | None) -> None:
        self.job_id = job_id
        self.feed = None if storage is None else MetricsFeed(storage, job_id)
        self.training = _Training()
        self.last_seq = 0
        self.last_event: LastEvent | None = None
        self.preemptions = 0
        self.metrics_error: str | None = None
        self.billing: BillingRule | None = None

    def read_metrics(self) -> None:
        """Take the metrics records written since the last call (errors are kept, not raised:
        a bucket that cannot be read leaves the training numbers unknown)."""
        if self.feed is None:
            return
        try:
            self.training.feed(self.feed.poll())
            self.metrics_error = None
        except Exception as err:  # a view must never end the launch
            self.metrics_error = f"{type(err).__name__}: {err}"

    def snapshot(self, db: StateDB, now: float, metrics: bool = True) -> Progress | None:
        """The job now, or None while it has no row in ``db``; ``metrics`` False skips the
        storage read (cloud buckets are polled less often than the database)."""
        job = db.job(self.job_id)
        if job is None:
            return None
        if metrics:
            self.read_metrics()
        for e in db.events(self.job_id, after=self.last_seq):
            self.last_seq = e.seq
            self._event(e)
        instances = db.instances(self.job_id)
        current: dict[int, NodeState] = {}
        for i in instances:  # ordered by launch: the newest instance of a rank wins
            current[i.node_rank] = NodeState(i.node_rank, i.id, i.state, i.type, i.market, i.price)
        if self.billing is None and not job.terminal:
            try:
                self.billing = billing_for(job.cloud)
            except (KeyError, KplanError):  # an unknown cloud: the ledger as written
                self.billing = None
        spend = _spend_now(db, self.job_id, now, None if job.terminal else self.billing, instances)
        t = self.training
        samples_per_s, steps_per_s = t.rates()
        eta = None
        if t.progress is not None and t.target_progress is not None and steps_per_s:
            eta = max(t.target_progress - t.progress, 0.0) / steps_per_s
        end = job.updated_at if job.terminal else now
        return Progress(
            job_id=job.id,
            status=job.status,
            reason=job.reason,
            time=now,
            elapsed_s=max(end - job.created_at, 0.0),
            nodes=tuple(current[r] for r in sorted(current)),
            step=t.step,
            epoch=t.epoch,
            epochs=t.epochs,
            loss=t.loss,
            samples_per_s=samples_per_s,
            progress=t.progress,
            target_progress=t.target_progress,
            eta_s=None if job.terminal else eta,
            spend_usd=spend,
            budget_usd=job.budget_usd,
            predicted_cost_usd=job.predicted_cost_usd,
            predicted_hours=job.predicted_hours,
            preemptions=self.preemptions,
            last_event=self.last_event,
        )

    def _event(self, e: EventRecord) -> None:
        self.last_event = LastEvent(e.time, e.kind, e.message)
        if e.kind == "preempted":
            self.preemptions += 1


def _spend_now(
    db: StateDB,
    job_id: str,
    now: float,
    billing: BillingRule | None,
    instances: list[InstanceRecord],
) -> float:
    """The ledger's spend, with each open row of a live instance billed up to ``now``
    (``billing`` None: the ledger as written, e.g. for a job that ended)."""
    rows = db.ledger(job_id)
    if billing is None:
        return sum(r.usd for r in rows)
    price = {i.id: i.price for i in instances if i.alive}
    total = 0.0
    for r in rows:
        if r.closed or r.instance not in price or now <= r.end:
            total += r.usd
        else:
            total += max(r.usd, billing.billed_seconds(now - r.start) * price[r.instance] / 3600)
    return total
