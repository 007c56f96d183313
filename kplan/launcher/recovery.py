"""What a preemption cost in work: time since the last checkpoint, read from the metrics.

The runtime writes ``{"event": "checkpoint", "time": ...}`` records (rank 0) into
``<job>/metrics/`` (see ``kplan/runtime/API.md``); the work lost by a preemption at time ``t`` is
``t`` minus the newest checkpoint before ``t`` (or minus the first record, when no checkpoint
was written yet). ``None`` when the metrics cannot be read.
"""

from __future__ import annotations

import json

from kplan.core.records import CheckpointEvent, parse_lenient
from kplan.launcher.storage import Storage


def last_checkpoint_time(storage: Storage, job_id: str, before: float) -> float | None:
    """Time of the newest checkpoint (or, without one, of the first record) before ``before``."""
    newest: float | None = None
    first: float | None = None
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
        for rec in parse_lenient(raws):  # typed: kplan/core/records.py
            t = rec.time
            if t is None or t > before:
                continue
            first = t if first is None else min(first, t)
            if isinstance(rec, CheckpointEvent) and (newest is None or t > newest):
                newest = t
    return newest if newest is not None else first


def work_lost_s(storage: Storage, job_id: str, lost_at: float) -> float | None:
    t = last_checkpoint_time(storage, job_id, lost_at)
    return None if t is None else max(lost_at - t, 0.0)
