"""The ledger: billed seconds and dollars per instance, accrued while the job runs.

One row per instance: ``start`` is when the launcher asked for it, ``end`` the last accrual
(open row) or when the launcher first saw it gone (closed row). Both bounds are conservative,
so the ledger never shows less than the cloud bills. ``usd = billed_seconds * price / 3600``
with the cloud's rule (``Billing.billed_seconds``: AWS and GCP charge a 60 s minimum, then per
second; local is free, its seconds still recorded).

Besides the instances (issue 27; the plan's extras, kplan/planner/extra_costs.py), each row has a
``kind``: ``instance``; ``disk``, the instance's boot disk, billed with it (``<id>/disk``, the
same seconds at ``Costs.disk_usd_node_h``); ``storage``, the job's object storage (checkpoints
and data) from the job's start to its end; ``egress``, the data copied from its region, recorded
once, when the first check after the launch finds the budget can pay it (until then it is
pending: ``closed_spend`` counts it, so the guard stops a job whose egress would cross the
budget before it is spent), and the checkpoint each move copies to another region
(``egress/move-<k>: <from> -> <to>``, recorded when the move is made, which the guard allowed
first).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kplan.core.errors import InputError
from kplan.launcher.state import InstanceRecord, LedgerRow, StateDB


class BillingRule(Protocol):
    @property
    def minimum_s(self) -> float: ...

    def billed_seconds(self, seconds: float) -> float: ...


@dataclass(frozen=True)
class LocalBilling:
    """The local provider: every second recorded, none charged a minimum (price is $0)."""

    minimum_s: float = 0.0

    def billed_seconds(self, seconds: float) -> float:
        return max(float(seconds), 0.0)


def billing_for(cloud: str) -> BillingRule:
    """The cloud's billing rule from the catalog (``billing.csv``); local is per second."""
    if cloud == "local":
        return LocalBilling()
    from kplan.catalogs import load_catalog

    rule: BillingRule = load_catalog().billing[cloud]
    return rule


@dataclass(frozen=True)
class Costs:
    """What a job pays besides its instances, from its plan's extras: each node's boot disk
    (USD per node-hour), the job's object storage (USD per hour) and the data's egress (once)."""

    disk_usd_node_h: float = 0.0
    storage_usd_h: float = 0.0
    egress_usd: float = 0.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise InputError(
                    f"job costs: {name}={value!r} must be a finite number >= 0",
                    hint="re-create the plan with kplan estimate --out plan.json",
                )


STORAGE_LINE = "storage"  # the ledger's ``instance`` of the job's storage row
EGRESS_LINE = "egress"
MOVE_LINE = "egress/move-"  # a move's checkpoint copy: ``egress/move-<k>: <from> -> <to>``


def usd(billing: BillingRule, seconds: float, usd_per_hour: float) -> float:
    return billing.billed_seconds(seconds) * usd_per_hour / 3600.0


class Ledger:
    """Accrues one job's rows in the state database."""

    def __init__(
        self,
        db: StateDB,
        job_id: str,
        billing: BillingRule,
        costs: Costs | None = None,
        started: float | None = None,
    ) -> None:
        self.db = db
        self.job_id = job_id
        self.billing = billing
        self.costs = costs or Costs()
        self.started = started  # the job's start: its storage row's (None: no storage row)

    def _row(self, inst: InstanceRecord, end: float, closed: bool) -> LedgerRow:
        elapsed = max(end - inst.launched_at, 0.0)
        billed = self.billing.billed_seconds(elapsed)
        return LedgerRow(
            job=self.job_id,
            instance=inst.id,
            start=inst.launched_at,
            end=max(end, inst.launched_at),
            billed_seconds=billed,
            usd=billed * inst.price / 3600.0,
            closed=closed,
        )

    def _put(self, inst: InstanceRecord, end: float, closed: bool) -> None:
        """The instance's row and its disk's (one transaction)."""
        row = self._row(inst, end, closed)
        with self.db.transaction():
            self.db.put_ledger(row)
            rate = self.costs.disk_usd_node_h
            if rate > 0:
                disk = LedgerRow(
                    row.job,
                    f"{inst.id}/disk",
                    row.start,
                    row.end,
                    row.billed_seconds,
                    row.billed_seconds * rate / 3600.0,
                    closed,
                    kind="disk",
                )
                self.db.put_ledger(disk)

    def _storage(self, end: float, closed: bool) -> None:
        if self.started is None or self.costs.storage_usd_h <= 0:
            return
        seconds = max(end - self.started, 0.0)
        row = LedgerRow(
            self.job_id,
            STORAGE_LINE,
            self.started,
            max(end, self.started),
            seconds,
            seconds * self.costs.storage_usd_h / 3600.0,
            closed,
            kind="storage",
        )
        self.db.put_ledger(row)

    def open(self, inst: InstanceRecord) -> None:
        self._put(inst, inst.launched_at, closed=False)

    def accrue(self, alive: Iterable[InstanceRecord], now: float) -> None:
        """Bring the open rows of live instances (and the job's storage) up to ``now``."""
        with self.db.transaction():
            for inst in alive:
                self._put(inst, now, closed=False)
            self._storage(now, closed=False)

    def close(self, inst: InstanceRecord, end: float) -> None:
        """Final row of an instance seen gone at ``end`` (later calls change nothing)."""
        self._put(inst, end, closed=True)

    def close_job(self, end: float) -> None:
        """The job ended at ``end``: its storage row is final."""
        self._storage(end, closed=True)

    def egress_pending(self) -> float:
        """The egress the job has yet to record (0 once recorded, or without one)."""
        if self.costs.egress_usd <= 0:
            return 0.0
        done = any(r.instance == EGRESS_LINE for r in self.db.ledger(self.job_id))
        return 0.0 if done else self.costs.egress_usd

    def record_egress(self, now: float) -> None:
        """Record the data's egress (once; the guard has found the budget can pay it)."""
        if self.egress_pending() > 0:
            self.db.put_ledger(
                LedgerRow(
                    self.job_id,
                    EGRESS_LINE,
                    now,
                    now,
                    0.0,
                    self.costs.egress_usd,
                    True,
                    kind="egress",
                )
            )

    def record_move_egress(self, now: float, usd: float, what: str) -> str:
        """A move's checkpoint copy to another region (kplan/launcher/region_move.py): an
        ``egress`` row of its own, ``egress/move-<k>: <what>``; returns its line's name."""
        k = sum(1 for r in self.db.ledger(self.job_id) if r.instance.startswith(MOVE_LINE))
        line = f"{MOVE_LINE}{k + 1}: {what}"
        self.db.put_ledger(LedgerRow(self.job_id, line, now, now, 0.0, usd, True, kind="egress"))
        return line

    def spend(self) -> float:
        return self.db.spend(self.job_id)

    def closed_spend(self) -> float:
        """What the job has spent for good: its closed rows, and the egress it has yet to
        record (committed once the job launches: the guard counts it before it is spent)."""
        return sum(r.usd for r in self.db.ledger(self.job_id) if r.closed) + self.egress_pending()
