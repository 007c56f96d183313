"""Stop with a checkpoint before the budget runs out: an example kplan adaptation policy.

The launcher writes the job's spend, budget and price into the control file; every rank sees
them in the Monitor. This policy stops the loop (final checkpoint, ``done`` event with
``stopped``) once the spend, extrapolated ``horizon_s`` seconds ahead, would pass the budget,
so that the job ends cleanly before the launcher's hard budget stop.

    KPLAN_POLICIES=kplan/examples/policies/budget.py:BudgetGuard kplan launch ...
"""

from __future__ import annotations

from kplan.runtime.policy import Actions, Monitor, Policy


class BudgetGuard(Policy):
    """Stop when spend + usd_per_hour x horizon_s / 3600 reaches the budget."""

    horizon_s = 120.0

    def after_step(self, m: Monitor, act: Actions) -> None:
        if m.spend_usd is None or m.budget_usd is None or m.usd_per_hour is None:
            return  # no launcher, or no budget set
        ahead = m.spend_usd + m.usd_per_hour * self.horizon_s / 3600.0
        if ahead >= m.budget_usd:
            act.stop(
                f"budget: ${m.spend_usd:.2f} spent, ${ahead:.2f} in {self.horizon_s:.0f} s "
                f">= ${m.budget_usd:.2f}"
            )
