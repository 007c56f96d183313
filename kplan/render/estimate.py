"""Rich tables for ``kplan estimate``."""

from __future__ import annotations

from kplan.planner.plan import Plan, PlanRow


def _money(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _hours(h: float) -> str:
    return f"{h:,.1f} h" if h >= 10 else f"{h:.2f} h"


def _config(r: PlanRow) -> str:
    if len(r.groups) == 1:
        return f"{r.nodes} x {r.instance_type}"
    return " + ".join(f"{g.nodes} x {g.instance_type} ({g.market})" for g in r.groups)


def _batch(r: PlanRow) -> str:
    local = "/".join(str(g.local_batch) for g in r.groups)
    acc = f" x{r.accum_steps} acc" if r.accum_steps > 1 else ""
    return f"{r.global_batch} ({local}/GPU{acc})"


def render_plan(plan: Plan, profile_name: str, catalog_version: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title=f"kplan estimate: {profile_name} (best of each instance type, by {plan.objective})",
        title_justify="left",
    )
    for col, justify in (
        ("#", "right"),
        ("cloud / region", "left"),
        ("cluster", "left"),
        ("market", "left"),
        ("GPUs", "right"),
        ("global batch", "right"),
        ("step s", "right"),
        ("time (p90)", "right"),
        ("cost (p90)", "right"),
        ("$/h", "right"),
        ("preempt.", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for i, r in enumerate(plan.plans, 1):
        style = "bold green" if r is plan.chosen else None
        table.add_row(
            str(i),
            f"{r.cloud} {r.region}",
            _config(r),
            r.market,
            f"{r.workers} {r.gpu}",
            _batch(r),
            f"{r.step_time_s:.3f}",
            f"{_hours(r.hours)} ({_hours(r.hours_p90)})",
            f"{_money(r.cost_usd)} ({_money(r.cost_p90_usd)})",
            f"{r.usd_per_hour:,.2f}",
            f"{r.expected_preemptions:.1f}",
            style=style,
        )
    console.print(table)
    front = Table(
        title="time/cost frontier (no plan is both faster and cheaper)", title_justify="left"
    )
    for col in ("time", "cost", "cluster", "market", "global batch"):
        front.add_column(col)
    shown = plan.frontier if len(plan.frontier) <= 12 else _thin(plan.frontier, 12)
    for r in shown:
        front.add_row(_hours(r.hours), _money(r.cost_usd), _config(r), r.market, _batch(r))
    console.print(front)
    console.print(f"[bold]chosen:[/bold] {plan.reason}")
    console.print(f"[dim]uncertainty: {plan.uncertainty}[/dim]")
    console.print(
        f"[dim]{plan.considered:,} configurations evaluated, {plan.feasible:,} "
        f"feasible; catalog {catalog_version}[/dim]"
    )
    for note in plan.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def _thin(rows: tuple[PlanRow, ...], n: int) -> list[PlanRow]:
    step = (len(rows) - 1) / (n - 1)
    return [rows[round(i * step)] for i in range(n)]
