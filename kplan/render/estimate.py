"""Rich tables for ``kplan estimate``."""

from __future__ import annotations

from kplan.planner.plan import Plan, PlanRow
from kplan.render.text import safe


def _money(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _hours(h: float) -> str:
    return f"{h:,.1f} h" if h >= 10 else f"{h:.2f} h"


def _config(r: PlanRow) -> str:
    if len(r.groups) == 1:
        return safe(f"{r.nodes} x {r.instance_type} {r.market}")
    return safe(" + ".join(f"{g.nodes} x {g.instance_type} {g.market}" for g in r.groups))


def _batch(r: PlanRow) -> str:
    local = "/".join(str(g.local_batch) for g in r.groups)
    acc = f" x{r.accum_steps}" if r.accum_steps > 1 else ""
    return f"{r.global_batch} ({local}{acc})"


def render_plan(plan: Plan, profile_name: str, catalog_version: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title=f"{safe(profile_name)}: the best plan of each instance type "
        f"(objective: {safe(plan.objective)}; precision {safe(plan.precision)}, "
        f"{safe(plan.precision_basis)})",
        title_justify="left",
        pad_edge=False,
    )
    table.add_column("#", justify="right")
    table.add_column("cluster")
    table.add_column("GPUs", justify="right")
    table.add_column("batch (/GPU)", justify="right")
    table.add_column("step s", justify="right")
    table.add_column("time (p90)", justify="right")
    table.add_column("cost (p90)", justify="right")
    for i, r in enumerate(plan.plans, 1):
        table.add_row(
            str(i),
            f"{_config(r)}\n[dim]{safe(r.cloud)} {safe(r.region)}, ${r.usd_per_hour:,.2f}/h, "
            f"{r.expected_preemptions:.1f} preemptions[/dim]",
            f"{r.workers} {safe(r.gpu)}",
            _batch(r),
            f"{r.step_time_s:.3f}",
            f"{_hours(r.hours)}\n({_hours(r.hours_p90)})",
            f"{_money(r.cost_usd)}\n({_money(r.cost_p90_usd)})",
            style="bold green" if r is plan.chosen else None,
        )
    console.print(table)
    front = Table(
        title="time/cost frontier (no other plan is both faster and cheaper)",
        title_justify="left",
        pad_edge=False,
    )
    front.add_column("time", justify="right")
    front.add_column("cost", justify="right")
    front.add_column("cluster")
    front.add_column("batch (/GPU)", justify="right")
    shown = plan.frontier if len(plan.frontier) <= 12 else _thin(plan.frontier, 12)
    for r in shown:
        front.add_row(_hours(r.hours), _money(r.cost_usd), _config(r), _batch(r))
    console.print(front)
    console.print(f"[bold]chosen:[/bold] {safe(plan.reason)}")
    spot = _spot_line(plan.chosen)
    if spot:
        console.print(f"[dim]{safe(spot)}[/dim]")
    console.print(f"[dim]uncertainty: {safe(plan.uncertainty)}[/dim]")
    console.print(
        f"[dim]{plan.considered:,} configurations evaluated, {plan.feasible:,} feasible; "
        f"catalog {safe(catalog_version)}[/dim]"
    )
    for note in plan.notes:
        console.print(f"[yellow]note:[/yellow] {safe(note)}")


def _spot_line(r: PlanRow) -> str:
    """The recovery rules a spot plan was priced with (the launcher runs the same)."""
    if r.market == "on-demand" or not r.recovery:
        return ""
    wait = r.capacity_wait_s / 3600.0
    fallback = "falls back to on-demand" if r.allow_on_demand else f"waits up to {wait:.1f} h"
    return (
        f"spot: {r.time_cost_basis}; checkpoint every {r.checkpoint_interval_s / 60:.0f} min, "
        f"up to {r.max_replacements} lost nodes replaced, with no capacity it {fallback}; "
        f"{r.fail_prob:.1%} of simulated runs fail; same cluster on demand: "
        + (
            f"{_hours(r.on_demand_hours)}, {_money(r.on_demand_cost_usd)}"
            if r.on_demand_hours is not None and r.on_demand_cost_usd is not None
            else "not offered"
        )
    )


def _thin(rows: tuple[PlanRow, ...], n: int) -> list[PlanRow]:
    step = (len(rows) - 1) / (n - 1)
    return [rows[round(i * step)] for i in range(n)]
