"""What ``kplan status`` shows: a job's row, instances, spend and recent events (a
:class:`JobSummary` the terminal view reads; ``--json`` prints its :meth:`JobSummary.to_dict`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TypedDict

from kplan.launcher.state import EventRecord, InstanceRecord, JobRecord, LedgerRow, StateDB


def launcher_alive(job: JobRecord) -> bool:
    """Whether the job's launcher process still runs (on this machine)."""
    if job.launcher_pid is None or job.terminal:
        return False
    try:
        os.kill(job.launcher_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class JobSummary:
    """One job as ``kplan status`` shows it: its row, instances, ledger and latest events."""

    id: str
    status: str
    reason: str | None
    launcher: str  # "running", "gone" (its process ended without finishing) or "done"
    cloud: str
    region: str
    script: str | None
    nodes: int
    workers: int
    created_at: float
    updated_at: float
    elapsed_h: float
    budget_usd: float
    deadline_h: float | None
    spend_usd: float
    predicted_hours: float | None
    predicted_cost_usd: float | None
    predicted_cost_p90_usd: float | None
    alive_instances: int
    preemptions: int
    instances: tuple[InstanceRecord, ...]
    ledger: tuple[LedgerRow, ...]
    events: tuple[EventRecord, ...]  # the latest ones
    model: ModelSummary | None
    changes: tuple[EventRecord, ...]  # every adaptation (ADAPT_EVENTS), oldest first

    def to_dict(self) -> dict[str, object]:
        """The ``--json`` document (changes keep only their time, kind and message)."""
        return {
            "id": self.id,
            "status": self.status,
            "reason": self.reason,
            "launcher": self.launcher,
            "cloud": self.cloud,
            "region": self.region,
            "script": self.script,
            "nodes": self.nodes,
            "workers": self.workers,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "elapsed_h": self.elapsed_h,
            "budget_usd": self.budget_usd,
            "deadline_h": self.deadline_h,
            "spend_usd": self.spend_usd,
            "predicted_hours": self.predicted_hours,
            "predicted_cost_usd": self.predicted_cost_usd,
            "predicted_cost_p90_usd": self.predicted_cost_p90_usd,
            "alive_instances": self.alive_instances,
            "preemptions": self.preemptions,
            "instances": [asdict(i) for i in self.instances],
            "ledger": [asdict(r) for r in self.ledger],
            "events": [asdict(e) for e in self.events],
            "model": self.model,
            "changes": [
                {"time": e.time, "kind": e.kind, "message": e.message} for e in self.changes
            ],
        }


def job_summary(db: StateDB, job: JobRecord, now: float, events: int = 15) -> JobSummary:
    """One job's summary (``events``: how many of the latest to include)."""
    instances = db.instances(job.id)
    all_events = db.events(job.id)
    end = now if not job.terminal else job.updated_at
    launcher = "done" if job.terminal else ("running" if launcher_alive(job) else "gone")
    nodes = job.spec.get("nodes", [])
    return JobSummary(
        id=job.id,
        status=job.status,
        reason=job.reason,
        launcher=launcher,
        cloud=job.cloud,
        region=job.region,
        script=job.spec.get("script"),
        nodes=len(nodes),
        workers=sum(int(n.get("gpus", 1)) for n in nodes),
        created_at=job.created_at,
        updated_at=job.updated_at,
        elapsed_h=max(end - job.created_at, 0.0) / 3600.0,
        budget_usd=job.budget_usd,
        deadline_h=job.deadline_h,
        spend_usd=db.spend(job.id),
        predicted_hours=job.predicted_hours,
        predicted_cost_usd=job.predicted_cost_usd,
        predicted_cost_p90_usd=job.predicted_cost_p90_usd,
        alive_instances=sum(1 for i in instances if i.alive),
        preemptions=sum(1 for e in all_events if e.kind == "preempted"),
        instances=tuple(instances),
        ledger=tuple(db.ledger(job.id)),
        events=tuple(all_events[-events:]) if events else (),
        model=model_summary(all_events),
        changes=tuple(e for e in all_events if e.kind in ADAPT_EVENTS),
    )


class ModelSummary(TypedDict):
    """The online model's error, as ``kplan jobs`` shows it (values from the event's JSON)."""

    configs_measured: int
    mape: object
    last_error: object
    last_config: dict[str, object]
    last_step_time_s: object
    message: str


ADAPT_EVENTS = ("resize", "batch", "replan", "explore", "restarted")


def model_summary(events: list[EventRecord]) -> ModelSummary | None:
    """The online model's error against what the job measured (the newest ``model`` event).

    ``error`` is the relative error of the prediction for the newest measured configuration,
    made before it was measured; ``mape`` the mean absolute error over every configuration
    measured after the first."""
    latest = next((e for e in reversed(events) if e.kind == "model" and e.data), None)
    if latest is None or latest.data is None:
        return None
    d = latest.data
    return {
        "configs_measured": sum(1 for e in events if e.kind == "model"),
        "mape": d.get("mape"),
        "last_error": d.get("error"),
        "last_config": {k: d.get(k) for k in ("nodes", "workers", "global_batch")},
        "last_step_time_s": d.get("step_time_s"),
        "message": latest.message,
    }
