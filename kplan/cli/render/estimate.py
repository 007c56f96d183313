"""Rich tables for ``kplan estimate``: the assumptions, the plans, the frontier, the next step.

The default layout fits 80 columns (each plan takes two or three lines, never wrapped); ``--wide``
adds prices per hour, zones, preemptions and throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kplan.cli.render.text import safe
from kplan.planner import fmt
from kplan.planner.compression import DEFAULT_OPTIONS
from kplan.planner.plan import Plan, PlanRow

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from kplan.app.planning import Assumptions, ExampleRow


@dataclass(frozen=True)
class NextStep:
    """The `kplan launch` line for the chosen plan, and where the plan was saved (None: not)."""

    command: str
    saved_to: Path | None
    placeholder_script: bool  # the command names train.py for want of the profile's script


def _batch(r: PlanRow, lines: bool = False) -> str:
    """``256 (32)``: global batch (per-GPU batch of each group, x accumulation steps)."""
    local = "/".join(str(g.local_batch) for g in r.groups)
    acc = f" x{r.accum_steps}" if r.accum_steps > 1 else ""
    return f"{r.global_batch}" + ("\n" if lines else " ") + f"({local}{acc})"


def _markets(r: PlanRow) -> str:
    return "+".join(dict.fromkeys(g.market for g in r.groups))


def _gpus(r: PlanRow) -> str:
    """GPUs of each group (a line each, beside its instances), then the market."""
    lines = [f"{g.nodes * g.gpus_per_node} {g.gpu}" for g in r.groups]
    return safe("\n".join([*lines, _markets(r)]))


def _zone_line(r: PlanRow) -> str | None:
    if r.zone_type == "local-zone":
        return f"Local Zone {r.zone}"
    if r.zone_type == "wavelength-zone":
        return f"Wavelength Zone {r.zone}"
    return None


def _cluster(r: PlanRow, wide: bool) -> str:
    """One line per group of instances, then where (dimmed), then an opt-in zone."""
    lines = [f"{g.nodes} x {g.instance_type}" for g in r.groups]
    lines[1:] = [f"+ {x}" for x in lines[1:]]
    place = f"{r.cloud} {r.region}"
    zone = _zone_line(r)
    if wide and zone is None:
        place += f" ({r.zone})"
    tail = f"\n[dim]{safe(zone)}[/dim]" if zone else ""
    return safe("\n".join(lines)) + f"\n[dim]{safe(place)}[/dim]" + tail


def _table(title: str, gap: int = 2) -> Table:
    """A borderless table; ``gap``: spaces between columns (1 or 2)."""
    from rich import box
    from rich.table import Table

    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, gap - 1, 0, 0),  # and the one-space column divider
        show_edge=False,
    )


def render_plan(
    plan: Plan,
    assumed: Assumptions,
    catalog_version: str,
    step: NextStep,
    *,
    wide: bool = False,
    console: Console | None = None,
) -> None:
    from rich.console import Console

    console = console or Console()
    console.print(_assumptions(assumed))
    console.print()
    _print_table(console, _plans(plan, assumed.profile, wide), wide)
    if plan.order:
        console.print(f"order: {safe(plan.order)}", style="dim", highlight=False)
    console.print()
    _print_table(console, _frontier(plan, wide), wide)
    console.print(f"[bold]chosen:[/bold] {safe(plan.reason)}")
    sched = schedule_line(plan.chosen)
    if sched:
        console.print(safe(sched), highlight=False)
    if plan.chosen.compression_why:
        console.print(safe(f"compression: {plan.chosen.compression_why}"), highlight=False)
    extras = extras_line(plan.chosen)
    if extras and (wide or plan.chosen.extras.data_gb > 0):
        console.print(f"[dim]{safe(extras)}[/dim]")
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
    console.print()
    _next(console, step)


def _assumptions(a: Assumptions) -> Table:
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    src = a.source
    what = f"{a.profile} (built-in example)" if src.startswith("example ") else f"{src}"
    if not src.startswith("example ") and a.profile not in src:
        what = f"{a.profile} (profile {src})"
    if a.model:
        what += f": {a.model}"
    grid.add_row(
        "workload",
        safe(
            f"{what}; {a.dataset_size:,} samples x {a.epochs:g} epochs, "
            f"base batch B0 = {a.base_batch:,}"
            + ("" if a.gns else " (kept: no gradient noise scale)")
        ),
    )
    if a.epochs_basis is not None:
        grid.add_row("epochs", safe(a.epochs_basis.text))
    prec = a.precision + ("" if a.precision_basis == "measured" else f" ({a.precision_basis})")
    grid.add_row(
        "measured",
        safe(
            f"on {a.measured_on}, up to {a.measured_gpus} GPUs on "
            f"{a.measured_nodes} node(s), in {a.profile_precision}; planned in {prec}"
        ),
    )
    if a.compute_basis != "device model":  # a CPU profile: say how it reached the GPU
        grid.add_row("compute", safe(a.compute_basis))
    s = a.search
    parts = [
        ", ".join(s.clouds),
        ", ".join(s.regions) if s.regions else "every region",
        " and ".join(s.markets),
    ]
    if s.gpus:
        parts.append("GPUs " + ", ".join(s.gpus))
    if s.instance_types:
        parts.append(", ".join(s.instance_types))
    lo, hi = s.nodes
    parts.append(f"{lo} node(s)" if lo == hi else f"{lo}-{hi} nodes")
    b_lo, b_hi = s.global_batch
    parts.append(f"global batch {b_lo}" if b_lo == b_hi else f"global batch {b_lo}-{b_hi}")
    a_lo, a_hi = s.accum_steps
    parts.append(f"accumulation {a_lo}-{a_hi}" if a_lo != a_hi else f"accumulation {a_lo}")
    if s.mixed:
        parts.append("two-type mixes")
    comp = s.compression
    if comp is not None:
        parts.append("dense" if comp == "none" else f"compression {comp}")
    elif hi >= 2:
        parts.append("multi-node also " + ", ".join(DEFAULT_OPTIONS))
    for spec, mult, sigma in s.compression_steps:
        parts.append(f"{spec} measured at x{mult:g} dense's steps (sigma {sigma:g})")
    parts.append(
        "opt-in zones included"
        if s.opt_in_zones
        else "no opt-in zones (AWS Local/Wavelength: --opt-in-zones)"
    )
    grid.add_row("searched", safe("; ".join(parts)))
    goal = {
        "cost": "the cheapest plan",
        "time": "the fastest plan",
        "knee": "the knee of the time/cost frontier",
    }[s.objective]
    limits = []
    if s.budget_usd is not None:
        limits.append(f"p90 cost within {fmt.money(s.budget_usd)}")
    if s.deadline_hours is not None:
        limits.append(f"p90 time within {s.deadline_hours:g} h")
    goal += (" with " + " and ".join(limits)) if limits else ""
    tie = fmt.percent(s.tie_tolerance)
    grid.add_row("choosing", safe(f"{goal}; times within {tie} are tied: the cheaper wins"))
    return grid


def _print_table(console: Console, table: Table, wide: bool) -> None:
    """``--wide`` into a pipe or a file prints each table whole, however wide (rich would cut
    every cell to 80 columns); on a terminal, and without ``--wide``, the console's width."""
    if not (wide and not console.is_terminal):
        console.print(table)
        return
    width = console.width
    roomy = console.options.update(max_width=1000)
    console.width = max(width, console.measure(table, options=roomy).maximum)
    try:
        console.print(table)
    finally:
        console.width = width


def _plans(plan: Plan, name: str, wide: bool) -> Table:
    table = _table(f"{safe(name)}: the best plan of each instance type", gap=1)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("cluster", no_wrap=True)
    table.add_column("GPUs", justify="right", no_wrap=True)
    table.add_column("batch\n/GPU", justify="right", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    if wide:
        table.add_column("step\np90", justify="right", no_wrap=True)
        table.add_column("samples\n/s", justify="right", no_wrap=True)
        table.add_column("price\n/h", justify="right", no_wrap=True)
        table.add_column("pre-\nempt.", justify="right", no_wrap=True)
        table.add_column("disk", justify="right", no_wrap=True)
        table.add_column("stor-\nage", justify="right", no_wrap=True)
        table.add_column("egress", justify="right", no_wrap=True)
    table.add_column("time\n(p90)", justify="right", no_wrap=True)
    table.add_column("cost\n(p90)", justify="right", no_wrap=True)
    for i, r in enumerate(plan.plans, 1):
        t, t90 = fmt.duration(r.hours), fmt.duration(r.hours_p90)
        extra = (
            [
                fmt.step(r.step_time_p90_s),
                f"{r.throughput_samples_s:,.0f}",
                fmt.money(r.usd_per_hour),
                f"{r.expected_preemptions:.1f}",
                fmt.money(r.extras.disk_usd),
                fmt.money(r.extras.storage_usd),
                fmt.money(r.extras.egress_usd),
            ]
            if wide
            else []
        )
        table.add_row(
            str(i),
            _cluster(r, wide),
            _gpus(r),
            _batch(r, lines=True),
            fmt.step(r.step_time_s),
            *extra,
            f"{t}\n({t90})",
            f"{fmt.money(r.cost_usd)}\n({fmt.money(r.cost_p90_usd)})",
            style="bold green" if r is plan.chosen else None,
        )
    return table


def _frontier(plan: Plan, wide: bool) -> Table:
    front = _table("frontier: no other plan is both faster and cheaper")
    front.add_column("time", justify="right", no_wrap=True)
    front.add_column("cost", justify="right", no_wrap=True)
    front.add_column("cluster", no_wrap=True)
    front.add_column("where", no_wrap=True)
    front.add_column("batch (/GPU)", justify="right", no_wrap=True)
    shown = list(plan.frontier) if len(plan.frontier) <= 12 else _thin(plan.frontier, 12)
    times = fmt.durations([r.hours for r in shown])
    for r, t, usd in zip(shown, times, fmt.moneys([r.cost_usd for r in shown]), strict=True):
        cluster = "\n+ ".join(f"{g.nodes} x {g.instance_type} {g.market}" for g in r.groups)
        place = f"{r.cloud} {r.region}"
        zone = _zone_line(r)
        if zone or wide:
            place += f"\n{zone or r.zone}"
        front.add_row(t, usd, safe(cluster), safe(place), _batch(r))
    return front


def _next(console: Console, step: NextStep) -> None:
    if step.saved_to is not None:
        console.print(f"[bold]plan saved to[/bold] {safe(str(step.saved_to))}; launch it with:")
    else:
        console.print("[bold]to launch it[/bold], save the plan (add --out plan.json), then run:")
    console.print(f"  {safe(step.command)}", soft_wrap=True, highlight=False)
    if step.placeholder_script:
        console.print(
            "[dim](train.py: your training script, written with kplan.runtime; "
            "see docs/launch.md)[/dim]"
        )
    if "--budget BUDGET" in step.command:
        console.print(
            "[dim](BUDGET: what you will spend at most; this plan's p90 cost has no bound: "
            "at a busier market than the median its runs would not end)[/dim]"
        )


def extras_line(r: PlanRow) -> str | None:
    """What the row's cost holds besides its instances (kplan/planner/extra_costs.py), e.g.
    ``besides the instances, the cost holds: disks $0.41 (75 GB per node), ...``; else None."""
    x = r.extras
    if x.total_usd <= 0:
        return None
    parts = [f"disks {fmt.money(x.disk_usd)} ({x.disk_gb:g} GB per node)"]
    if x.checkpoints_kept:
        parts.append(
            f"checkpoints {fmt.money(x.checkpoint_usd)} ({x.checkpoints_kept} x "
            f"{x.checkpoint_gb:.3g} GB in object storage)"
        )
    if x.data_gb > 0:
        parts.append(f"data {fmt.money(x.data_usd)} ({x.data_gb:g} GB in {x.data_region})")
    if x.egress != "none":
        parts.append(f"egress {fmt.money(x.egress_usd)} ({x.data_gb:g} GB {x.egress})")
    move = ""
    if x.move_usd > 0:
        move = (
            f"; a move to another region (kplan simulate --trace POOL=FILE) would add "
            f"{fmt.money(x.move_usd)} egress and {x.move_copy_s:.0f} s of copy"
        )
    return (
        "besides the instances, the cost holds: "
        + ", ".join(parts)
        + f" at the expected hours; {x.source}; given the hours these are exact, the p90 cost "
        "counts them at the p90 hours" + move
    )


def schedule_line(r: PlanRow) -> str | None:
    """The line for a row with a global-batch schedule (kplan/planner/batchsched.py), e.g. ``batch
    schedule: 256 until 20%, 512 until 60%, 1,024 after; saves 9% (1.2 h, $14; p90 1.6 h,
    $19)``; else None."""
    sched = r.schedule
    if sched is None:
        return None
    from kplan.planner.batchsched import describe

    text = f"batch schedule: {describe(sched.entries(), sched.saving)}"
    text += f" ({fmt.duration(sched.hours)}, {fmt.money(sched.cost_usd)}"
    text += f"; p90 {fmt.duration(sched.hours_p90)}, {fmt.money(sched.cost_p90_usd)})"
    return text


def _spot_line(r: PlanRow) -> str:
    """The recovery rules a spot plan was priced with (the launcher runs the same)."""
    s, rec = r.spot, r.spot.recovery
    if r.market == "on-demand" or rec is None:
        return ""
    wait = rec.capacity_wait_s / 3600.0
    fallback = "falls back to on-demand" if rec.allow_on_demand else f"waits up to {wait:.1f} h"
    if rec.deadline_s is not None:  # kplan/planner/deadline.py
        fallback = (
            f"waits while the slack allows, else on demand; deadline-safe: on demand once the "
            f"slack no longer covers a preemption, so it ends by {rec.deadline_s / 3600:g} h"
        )
    notice = (
        f" and {rec.notice_stop_s:.0f} s before a preemption on the cloud's notice"
        if rec.notice_stop_s is not None
        else ""
    )
    return (
        f"spot: {s.basis}; checkpoint every {r.checkpoint_interval_s / 60:.0f} min{notice}, "
        f"up to {rec.max_replacements} lost nodes replaced, with no capacity it {fallback}; "
        f"{s.fail_prob:.1%} of {'simulated ' if s.simulated else ''}runs fail; "
        "same cluster on demand: "
        + (
            f"{fmt.duration(s.on_demand_hours)}, {fmt.money(s.on_demand_cost_usd)}"
            if s.on_demand_hours is not None and s.on_demand_cost_usd is not None
            else "not offered"
        )
    )


def render_examples(rows: list[ExampleRow], console: Console | None = None) -> None:
    """``--list-examples``: one line per built-in profile."""
    from rich.console import Console

    console = console or Console()
    table = _table("built-in examples (kplan estimate --example NAME)", gap=1)
    table.add_column("name", no_wrap=True)
    table.add_column("model / dataset\n[dim]what it is[/dim]", no_wrap=True)
    table.add_column("epochs", justify="right", no_wrap=True)
    table.add_column("B0", justify="right", no_wrap=True)
    table.add_column("measured on", no_wrap=True)
    for r in rows:
        table.add_row(
            safe(r.name),
            safe(r.model) + f"\n[dim]{safe(r.description)}[/dim]",
            f"{r.epochs:g}",
            str(r.base_batch),
            safe(r.measured_on),
        )
    console.print(table)


def _thin(rows: tuple[PlanRow, ...], n: int) -> list[PlanRow]:
    step = (len(rows) - 1) / (n - 1)
    return [rows[round(i * step)] for i in range(n)]
