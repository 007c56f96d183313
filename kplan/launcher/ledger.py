"""The ledger: billed seconds and dollars per instance, accrued while the job runs.

One row per instance: ``start`` is when the launcher asked for it, ``end`` the last accrual
(open row) or when the launcher first saw it gone (closed row). Both bounds are conservative,
so the ledger never shows less than the cloud bills. ``usd = billed_seconds * price / 3600``
with the cloud's rule (``Billing.billed_seconds``: AWS and GCP charge a 60 s minimum, then per
second; local is free, its seconds still recorded).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

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


def usd(billing: BillingRule, seconds: float, usd_per_hour: float) -> float:
    return billing.billed_seconds(seconds) * usd_per_hour / 3600.0


class Ledger:
    """Accrues one job's rows in the state database."""

    def __init__(self, db: StateDB, job_id: str, billing: BillingRule) -> None:
        self.db = db
        self.job_id = job_id
        self.billing = billing

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

    def open(self, inst: InstanceRecord) -> None:
        self.db.put_ledger(self._row(inst, inst.launched_at, closed=False))

    def accrue(self, alive: Iterable[InstanceRecord], now: float) -> None:
        """Bring the open rows of live instances up to ``now`` (one transaction)."""
        with self.db.transaction():
            for inst in alive:
                self.db.put_ledger(self._row(inst, now, closed=False))

    def close(self, inst: InstanceRecord, end: float) -> None:
        """Final row of an instance seen gone at ``end`` (later calls change nothing)."""
        self.db.put_ledger(self._row(inst, end, closed=True))

    def spend(self) -> float:
        return self.db.spend(self.job_id)

    def closed_spend(self) -> float:
        return sum(r.usd for r in self.db.ledger(self.job_id) if r.closed)
