"""What a preemption cost in work: time since the last checkpoint, read from the metrics.

The runtime writes ``{"event": "checkpoint", "time": ...}`` records (rank 0) into
``<job>/metrics/`` (see ``kplan/runtime/API.md``); the work lost by a preemption at time ``t`` is
``t`` minus the newest checkpoint before ``t`` (or minus the first record, when no checkpoint
was written yet). ``None`` when the metrics cannot be read.

With a deadline, where a lost node's replacement goes (``deadline_choice``, ``deadline_wait``)
is the rule the plan was priced with (kplan/planner/deadline.py), at the plan's pace: the
Monte-Carlo and ``kplan simulate`` run the same function.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from kplan.core.records import CheckpointEvent, Record, parse_lenient
from kplan.launcher.storage import Storage
from kplan.planner import deadline

if TYPE_CHECKING:
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.measure import JobView


def _records(storage: Storage, job_id: str) -> Iterator[Record]:
    """The job's metrics records, file by file (a torn or unreadable line left out)."""
    for key in storage.list_keys(f"{job_id}/metrics/"):
        if not key.endswith(".jsonl"):
            continue
        data = storage.get_bytes(key)
        if not data:
            continue
        raws = []
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                raws.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line being written
        yield from parse_lenient(raws)  # typed: kplan/core/records.py


def last_checkpoint_time(storage: Storage, job_id: str, before: float) -> float | None:
    """Time of the newest checkpoint (or, without one, of the first record) before ``before``."""
    newest: float | None = None
    first: float | None = None
    for rec in _records(storage, job_id):
        t = rec.time
        if t is None or t > before:
            continue
        first = t if first is None else min(first, t)
        if isinstance(rec, CheckpointEvent) and (newest is None or t > newest):
            newest = t
    return newest if newest is not None else first


def last_checkpoint_bytes(storage: Storage, job_id: str) -> int | None:
    """Bytes of the newest checkpoint the metrics record (rank 0's ``checkpoint`` event: the
    shared state and rank 0's own part); None before the first one."""
    newest: tuple[float, int] | None = None
    for rec in _records(storage, job_id):
        if not isinstance(rec, CheckpointEvent) or rec.bytes is None or rec.time is None:
            continue
        if newest is None or rec.time >= newest[0]:
            newest = (rec.time, rec.bytes)
    return None if newest is None else newest[1]


def work_lost_s(storage: Storage, job_id: str, lost_at: float) -> float | None:
    t = last_checkpoint_time(storage, job_id, lost_at)
    return None if t is None else max(lost_at - t, 0.0)


# --- deadline-safe spot: the launcher's side of kplan/planner/deadline.py -------------------

DeadlineChoice = Literal["spot", "on-demand"]


def remaining_work_s(spec: JobSpec, view: JobView) -> float | None:
    """Seconds of training left, at the plan's pace: the plan's work times the share of the
    target progress not done yet (all of it before the first step record), plus a checkpoint
    interval (the progress a restart rolls back at most: the metrics show the last step, not
    the last checkpoint). None: the job has no plan to pace it."""
    plan = spec.plan
    if plan is None:
        return None
    row = plan.chosen
    work = row.steps * row.step_time_s
    left, total = view.remaining_progress, view.target_progress
    if left is not None and total:
        work *= min(max(left / total, 0.0), 1.0)
    return work + spec.recovery_policy().checkpoint_interval_s


def deadline_choice(
    spec: JobSpec, view: JobView, now: float, deadline_at: float | None
) -> DeadlineChoice | None:
    """Where a replacement (or a return to spot) may go under the deadline rule the plan was
    priced with (kplan/planner/deadline.py): ``spot`` when the slack with it up a restart from
    now covers the reserve, else ``on-demand``. None: no deadline, no plan or no on-demand
    fallback (the recovery rules as before)."""
    work = remaining_work_s(spec, view)
    if deadline_at is None or not spec.allow_on_demand or work is None:
        return None
    p = spec.recovery_policy()
    left = deadline_at - now
    ok = deadline.spot_ok(
        left, p.restart_s, work, p.restart_s, p.checkpoint_interval_s, p.checkpoint_s
    )
    return "spot" if bool(ok) else "on-demand"


def deadline_wait(spec: JobSpec, view: JobView, now: float, deadline_at: float | None) -> bool:
    """No spot capacity now: True while the rule lets the job wait for it rather than launch
    on demand (``deadline.on_demand_by_s``: ahead of uniform progress, with slack to spare)."""
    work = remaining_work_s(spec, view)
    if deadline_at is None or not spec.allow_on_demand or work is None:
        return False
    p = spec.recovery_policy()
    total = (spec.plan.chosen.steps * spec.plan.chosen.step_time_s if spec.plan else work) + (
        p.checkpoint_interval_s
    )
    # in the job's time (from its start), as the plan was priced: the progress line starts there
    span = spec.deadline_h * 3600.0 if spec.deadline_h is not None else deadline_at - now
    elapsed = now - (deadline_at - span)
    by = deadline.on_demand_by_s(
        span, work, p.restart_s, p.checkpoint_interval_s, p.checkpoint_s, total_work_s=total
    )
    return float(by) > elapsed


def move_fits_deadline(
    spec: JobSpec, view: JobView, now: float, deadline_at: float | None, copy_s: float
) -> bool:
    """The move rule's deadline check (kplan/planner/spotmove.py, as its replayer makes it):
    with the cluster up in the other region a copy and a restart from now, the slack still
    covers the reserve. True without a deadline or a plan to pace the job."""
    work = remaining_work_s(spec, view)
    if deadline_at is None or work is None:
        return True
    p = spec.recovery_policy()
    up = copy_s + p.restart_s
    left = deadline_at - now
    ok = deadline.spot_ok(left, up, work, p.restart_s, p.checkpoint_interval_s, p.checkpoint_s)
    return bool(ok)
