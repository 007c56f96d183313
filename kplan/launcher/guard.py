"""The budget and deadline guard: stop the job *before* either would be crossed.

At each monitor tick ``t`` the guard projects the spend at ``t + horizon``, with
``horizon = check_interval + grace + teardown``: if the job is not stopped now, the next check
comes at ``t + check_interval`` at the latest, and a stop decided then has every instance gone
(workers checkpointed on SIGTERM, instances terminated and seen terminated) ``grace + teardown``
later. Each live instance is projected with the cloud's billing rule::

    projected = closed rows + sum_live price_i * billed(t + horizon - start_i) / 3600
                            + sum_new  price_j * billed(horizon) / 3600

where ``new`` are instances about to be launched (a replacement pays at least the billing
minimum). ``closed rows`` include the data's egress the job has yet to record, ``live`` each
instance's boot disk with it and the job's storage, and each new instance pays its disk too
(kplan/launcher/ledger.py). The job stops when ``projected > budget`` or ``t + horizon > deadline``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from kplan.launcher.ledger import BillingRule

StopReason = Literal["budget", "deadline"]
_EPS = 1e-9


@dataclass(frozen=True)
class Running:
    """What the guard needs of a live instance."""

    start: float  # ledger start (when it was requested)
    usd_per_hour: float


@dataclass(frozen=True)
class Decision:
    stop: bool
    reason: StopReason | None
    projected_usd: float
    message: str


@dataclass(frozen=True)
class Guard:
    budget_usd: float
    deadline_at: float | None  # epoch seconds; None: no deadline
    horizon_s: float
    billing: BillingRule
    disk_usd_node_h: float = 0.0  # each new instance's boot disk (kplan/launcher/ledger.py)

    def projected(
        self,
        closed_usd: float,
        live: Iterable[Running],
        now: float,
        new_prices: Iterable[float] = (),
    ) -> float:
        end = now + self.horizon_s
        total = closed_usd
        for inst in live:
            total += self.billing.billed_seconds(max(end - inst.start, 0.0)) * inst.usd_per_hour
        for price in new_prices:
            total += self.billing.billed_seconds(self.horizon_s) * (price + self.disk_usd_node_h)
        # ``total`` accumulated USD*seconds/hour for the live part; convert once.
        return closed_usd + (total - closed_usd) / 3600.0

    def check(
        self,
        closed_usd: float,
        live: Iterable[Running],
        now: float,
        new_prices: Iterable[float] = (),
    ) -> Decision:
        new = list(new_prices)
        projected = self.projected(closed_usd, live, now, new)
        what = f" with {len(new)} new instance(s)" if new else ""
        if projected > self.budget_usd + _EPS:
            return Decision(
                True,
                "budget",
                projected,
                f"projected spend ${projected:,.4f}{what} by the next check plus teardown "
                f"({self.horizon_s:.0f} s) would exceed the budget ${self.budget_usd:,.2f}",
            )
        if self.deadline_at is not None and now + self.horizon_s > self.deadline_at + _EPS:
            left = self.deadline_at - now
            return Decision(
                True,
                "deadline",
                projected,
                f"{max(left, 0.0):.0f} s left before the deadline, less than the next check "
                f"plus teardown ({self.horizon_s:.0f} s)",
            )
        return Decision(False, None, projected, f"projected ${projected:,.4f}{what}")
