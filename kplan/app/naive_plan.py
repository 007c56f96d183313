"""The naive plan that ``kplan report`` prices a job against: the profile's base global batch on
the cheapest single on-demand instance of the job's cloud that fits, as ``kplan estimate`` with
a fixed batch and one node would choose it.

It plans with the application's own estimate (``kplan.app.planning``), so it lives in the app
layer and is handed to the launcher's ``build_report`` as a function.
"""

from __future__ import annotations

from pathlib import Path

from kplan.core.errors import KplanError
from kplan.launcher.report import Comparison, NaivePlanner, no_naive, stored_plan
from kplan.launcher.state import JobRecord


def naive_planner(profile_path: str | None = None) -> NaivePlanner:
    """The naive plan: the profile's base global batch on the cheapest single on-demand instance
    of the job's cloud that fits (``kplan estimate`` with a fixed batch, one node)."""

    def plan(job: JobRecord) -> Comparison:
        from kplan.app import planning  # the planner loads only when a cloud job needs it
        from kplan.planner.search import SearchOptions

        if job.cloud == "local":
            return Comparison(None, None, "n/a: a local job has no cloud to plan on")
        typed = stored_plan(job.plan)
        name = typed.profile if typed is not None else None
        try:
            if profile_path is not None:
                prof = planning.load_profile(Path(profile_path))
            elif isinstance(name, str) and name in planning.example_names():
                prof = planning.load_example(name)
            else:
                return no_naive(job)
            options = SearchOptions(
                clouds=(job.cloud,),
                markets=("on-demand",),
                max_nodes=1,
                fixed_global_batch=True,
                mixed=False,
                objective="cost",
            )
            row = planning.estimate(prof, options).plan.chosen
        except KplanError as err:
            return Comparison(None, None, f"n/a: {err.message}")
        total = None if job.predicted_cost_usd is None else job.predicted_cost_usd
        return Comparison(
            usd=row.cost_usd,
            savings_usd=None,
            note=(
                f"predicted for profile {prof.name}: global batch {row.global_batch} on one "
                f"on-demand {row.instance_type} in {row.region}"
                + ("" if total is None else f"; the job's own plan predicted ${total:,.2f}")
            ),
            hours=row.hours,
            usd_p90=row.cost_p90_usd,
            config=f"1x {row.instance_type} on-demand, batch {row.global_batch}",
        )

    return plan
