"""Terminal rendering for ``kplan launch``, ``status``, ``logs`` and ``down`` (rich)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import typer

from kplan.cli.render.text import safe
from kplan.core.text import clean
from kplan.launcher.jobspec import place

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console, RenderableType

    from kplan.launcher.down import DownResult
    from kplan.launcher.dryrun import DryRun, RunInstances, WheelPut
    from kplan.launcher.lifecycle import JobOutcome
    from kplan.launcher.summary import JobSummary


def _money(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}" if x >= 1 or x == 0 else f"${x:,.4f}"


def _hours(h: float | None) -> str:
    return "-" if h is None else (f"{h:,.1f} h" if h >= 10 else f"{h:.2f} h")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def render_dry_run(run: DryRun) -> None:
    from rich.console import Console

    from kplan.cli.render.code_upload import code_lines
    from kplan.launcher.dryrun import CodePut, Prepare, WheelPut

    console = Console()
    console.print(
        f"[bold]dry run[/bold] of job {safe(run.job)} on "
        f"{safe(place(run.cloud, run.region))}: "
        f"{len(run.requests)} request(s), none sent"
    )
    for i, req in enumerate(run.requests, 1):
        if isinstance(req, CodePut):
            console.print(
                f"{i}. storage.put_bytes {safe(req.key)} ({req.packed.archive_bytes:,} bytes)"
            )
            for line in code_lines(req.packed):  # what that upload holds (kplan.launcher.packing)
                console.print(line, highlight=False, soft_wrap=True)
        elif isinstance(req, WheelPut):
            _wheel_lines(console, i, req)
        elif isinstance(req, Prepare):
            c = req.cluster
            console.print(
                f"{i}. provider.prepare job={safe(c.job_id)} region={safe(c.region)} "
                f"ports={safe(c.ports)} placement_group={safe(c.placement_group)}"
            )
        else:
            _instance_lines(console, i, req)
    hours = run.budget_hours
    console.print(
        f"cost {_money(run.usd_per_hour)}/h; budget {_money(run.budget_usd)}"
        + ("" if hours is None else f" = {_hours(hours)} of this cluster")
        + f"; guard: {safe(run.guard)}"
    )
    _hard_stop_line(console, run)
    if run.notice_stop_s is not None:
        console.print(
            f"spot notice: each spot node watches for the cloud's interruption notice; its "
            f"workers stop with a checkpoint {run.notice_stop_s:.0f} s before the preemption",
            highlight=False,
        )
    _controller_line(console, run)
    _move_lines(console, run)
    for note in run.price_notes:
        console.print(f"[yellow]price:[/yellow] {safe(note)}", highlight=False)


def _hard_stop_line(console: Console, run: DryRun) -> None:
    """What ends the nodes if every kplan process dies (kplan/launcher/hardstop.py)."""
    minutes = run.lease_s / 60
    cap = "" if run.max_run_s is None else f"; each node's cap {_hours(run.max_run_s / 3600)}"
    if run.cloud == "local":
        console.print(
            f"hard stop: a node ends itself {minutes:g} min after its lease was last renewed",
            highlight=False,
        )
        return
    console.print(
        f"hard stop: lease {minutes:g} min{cap}; if every kplan process dies the job costs at "
        f"most {_money(run.worst_case_usd)} (budget + {run.outlives_s / 60:g} min of this "
        "cluster: the lease and the watchdog's polls)",
        highlight=False,
    )


def _move_lines(console: Console, run: DryRun) -> None:
    """The regions the job may move to when its spot pool runs dry, and each move's price."""
    for m in run.moves:
        pays = (
            "never pays (spot there is no cheaper than on demand here)"
            if m.break_even_s is None
            else f"pays after {m.break_even_s / 60:.1f} min of the whole cluster on demand in a "
            "dry spell"
        )
        console.print(
            f"move to {safe(m.region)}: {_money(m.egress_usd)} egress, {m.copy_s:.0f} s copy; "
            f"{pays}",
            highlight=False,
        )


def _controller_line(console: Console, run: DryRun) -> None:
    """A detached job's controller: where, its price and source, and its cost over the plan."""
    c = run.controller
    if c is None or c.where != "instance" or c.instance_type is None:
        return
    over = (
        "the plan gives no hours to price it over"
        if c.predicted_usd is None or c.predicted_hours is None
        else f"{_money(c.predicted_usd)} over the plan's {_hours(c.predicted_hours)}"
    )
    console.print(
        f"controller: {safe(c.instance_type)} on-demand {_money(c.usd_per_hour)}/h ({over}; "
        f"price: {safe(c.price_source)}); billed in the ledger and counted by the guard",
        highlight=False,
    )


def _wheel_lines(console: Console, i: int, req: WheelPut) -> None:
    """kplan's wheel for the nodes (kplan.launcher.wheel): its upload and how pip installs it."""
    up = req.upload
    size = "?" if up["bytes"] is None else f"{up['bytes']:,}"
    console.print(f"{i}. {up['call']} {safe(up['key'])} ({size} bytes)")
    if up["sha256"]:
        index = up["pip_index_url"] or "the node's default index"
        console.print(
            f"   kplan for the nodes, sha256 {safe(up['sha256'])}; pip installs it with "
            f"{safe(' '.join(up['installs_with']) or 'nothing')} from {safe(index)}",
            highlight=False,
        )


def _instance_lines(console: Console, i: int, req: RunInstances) -> None:
    """One batch of instances: each one's place, environment names and bootstrap script."""
    from rich.syntax import Syntax

    console.print(f"{i}. provider.run_instances:")
    for inst in req.instances:
        console.print(
            f"   {safe(inst.name)}: node {inst.node_rank} "
            f"{safe(inst.instance_type)} {safe(inst.market)} {safe(inst.zone)} "
            f"tags={safe(dict(inst.tags))}"
            + ("" if inst.max_run_s is None else f" max_run_s={inst.max_run_s}")
        )
        console.print(f"   env: {safe(', '.join(sorted(inst.env)))}")
        lang = "bash" if inst.user_data.startswith("#!") else "sh"
        console.print(Syntax(clean(inst.user_data), lang, word_wrap=True))


def render_outcome(outcome: JobOutcome) -> None:
    typer.echo(
        f"job {clean(outcome.job_id)}: {clean(outcome.status)} "
        f"({clean(outcome.reason)}); "
        f"spent {_money(outcome.spend_usd)} in {_hours(outcome.seconds / 3600)}, "
        f"{outcome.preemptions} preemption(s)"
    )


def render_jobs(jobs: Sequence[JobSummary]) -> None:
    from rich.console import Console

    if not jobs:
        typer.echo("no jobs")
        return
    Console().print(jobs_view(jobs))


def jobs_view(jobs: Sequence[JobSummary]) -> RenderableType:
    """The table of ``kplan status`` (every job)."""
    from rich.table import Table
    from rich.text import Text

    if not jobs:
        return Text("no jobs")
    table = Table(title="kplan jobs", title_justify="left", pad_edge=False)
    for col in ("job", "status", "cloud", "nodes", "elapsed", "spent", "budget", "predicted"):
        table.add_column(
            col,
            justify="right" if col in ("nodes", "spent", "budget") else "left",
            no_wrap=col in ("job", "status"),
        )
    for j in jobs:
        status = safe(j.status) + (" (launcher gone)" if j.launcher == "gone" else "")
        table.add_row(
            safe(j.id),
            status,
            safe(place(j.cloud, j.region)),
            str(j.nodes),
            _hours(j.elapsed_h),
            _money(j.spend_usd),
            _money(j.budget_usd),
            f"{_hours(j.predicted_hours)} / {_money(j.predicted_cost_usd)}",
        )
    return table


def render_job(j: JobSummary) -> None:
    from rich.console import Console

    Console().print(job_view(j))


def job_view(j: JobSummary) -> RenderableType:
    """One job (``kplan status JOB``): its line, spend, prediction, instances and events."""
    from rich.console import Group
    from rich.table import Table

    console = _Lines()
    gone = (
        f" [red](launcher gone: kplan controller {safe(j.id)} restarts it, kplan down "
        f"{safe(j.id)} ends it)[/red]"
    )
    console.print(
        f"[bold]{safe(j.id)}[/bold] {safe(j.status)}"
        + (f" ({safe(j.reason)})" if j.reason else "")
        + (gone if j.launcher == "gone" else "")
    )
    console.print(
        f"{safe(place(j.cloud, j.region))}, {j.nodes} node(s), {j.workers} "
        "worker(s); "
        f"elapsed {_hours(j.elapsed_h)}; spent {_money(j.spend_usd)} of "
        f"{_money(j.budget_usd)}"
        + ("" if j.deadline_h is None else f"; deadline {_hours(j.deadline_h)}")
        + f"; {j.preemptions} preemption(s)"
    )
    if j.predicted_hours is not None:
        console.print(
            f"predicted {_hours(j.predicted_hours)}, {_money(j.predicted_cost_usd)} "
            f"(p90 {_money(j.predicted_cost_p90_usd)})"
        )
    model = j.model
    if model:
        mape = model["mape"]
        console.print(
            f"online model: {model['configs_measured']} configuration(s) measured; "
            + (
                "error not yet known (one configuration)"
                if mape is None
                else f"prediction error {mape:.1%} MAPE (predicted before measuring)"
            ),
            highlight=False,
        )
    for change in j.changes[-5:]:
        console.print(
            f"{_clock(change.time)} {safe(change.kind):<12} {safe(change.message)}",
            highlight=False,
        )
    table = Table(title="instances", title_justify="left", pad_edge=False)
    for col in ("id", "node", "type", "market", "zone", "state", "$/h", "billed", "reason"):
        table.add_column(col, no_wrap=col == "id")
    billed = {r.instance: r for r in j.ledger}
    for i in j.instances:
        row = billed.get(i.id)
        table.add_row(
            safe(i.id),
            str(i.node_rank),
            safe(i.type),
            safe(i.market),
            safe(i.zone),
            safe(i.state),
            f"{i.price:.4f}",
            "-" if row is None else f"{row.billed_seconds:.0f} s {_money(row.usd)}",
            safe(i.reason or ""),
        )
    console.print(table)
    for e in j.events:
        console.print(f"{_clock(e.time)} {safe(e.kind):<12} {safe(e.message)}", highlight=False)
    return Group(*console.parts)


class _Lines:
    """Collects what would be printed, as renderables (so that a live view can redraw it)."""

    def __init__(self) -> None:
        self.parts: list[RenderableType] = []

    def print(self, item: RenderableType, highlight: bool = True) -> None:
        from rich.highlighter import ReprHighlighter
        from rich.text import Text

        if isinstance(item, str):
            text = Text.from_markup(item)
            self.parts.append(ReprHighlighter()(text) if highlight else text)
        else:
            self.parts.append(item)


def render_down(results: list[DownResult]) -> None:
    if not results:
        typer.echo("nothing to take down")
    for r in results:
        if r.snapshot is not None:  # the controller's latest rows, merged first (or why not)
            typer.echo(clean(f"{r.job_id}: {r.snapshot}"))
        what = f"terminated {', '.join(r.terminated)}" if r.terminated else "nothing running"
        status = f" (job {r.status})" if r.status else ""
        typer.echo(clean(f"{r.job_id}: {what}{status}"))
