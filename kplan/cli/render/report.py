"""Terminal rendering for ``kplan report`` (rich)."""

from __future__ import annotations

from kplan.cli.render.text import safe
from kplan.launcher.report import JobReport


def render_report(r: JobReport) -> None:
    from rich.console import Console
    from rich.table import Table

    from kplan.launcher.report_html import (
        SUMMARY_HEADER,
        budget_text,
        metrics_line,
        money,
        summary_note,
        summary_rows,
        where,
    )

    def opt(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    console = Console()
    console.print(
        f"[bold]{safe(r.id)}[/bold] {safe(r.status)} ({safe(r.reason or '-')}) on "
        f"{safe(where(r))}, budget {budget_text(r)}",
        highlight=False,
    )
    console.print(f"command: {safe(r.command)}", highlight=False)
    console.print(f"total spend (ledger): [bold]{money(r.total_usd)}[/bold]", highlight=False)
    t = Table(*SUMMARY_HEADER)
    for row in summary_rows(r):
        t.add_row(*(safe(c) for c in row))
    console.print(t)
    console.print(safe(summary_note(r)), highlight=False)
    if r.plan is None:
        console.print("plan: none (launched without --profile or --plan: nothing predicted)")
    else:
        console.print(f"plan: {safe(r.plan.config)}", highlight=False)
        for label, text in (("work predicted", r.plan.work), ("uncertainty", r.plan.uncertainty)):
            if text:
                console.print(f"  {label}: {safe(text)}", highlight=False)
    s = Table("instance", "type", "market", "zone", "USD/h", "billed s", "USD", title="spend")
    for i in r.instances:
        s.add_row(safe(i.instance), safe(i.type), safe(i.market), safe(i.zone),
                  f"{i.usd_per_hour:.4f}", f"{i.billed_seconds:,.1f}", money(i.usd))  # fmt: skip
    console.print(s)
    for name, groups in (("kind", r.by_kind), ("market", r.by_market), ("zone", r.by_zone)):
        parts = safe(", ".join(f"{k} {money(v)}" for k, v in groups.items()))
        console.print(f"by {name}: {parts or '-'}", highlight=False)
    for p in r.preemptions:
        console.print(
            f"{safe(p.kind)} node {p.node_rank} at +{p.time - r.created_at:.0f} s: work lost "
            f"{opt(p.work_lost_s, '.1f')} s, downtime {opt(p.downtime_s, '.1f')} s, "
            f"lost {money(p.lost_usd)} at {p.cluster_usd_per_hour:.4f} USD/h; "
            f"replacement boot {money(p.replacement_boot_usd)}",
            highlight=False,
        )
    if not r.preemptions:
        console.print("preemptions: none")
    for name, c in (("on-demand", r.on_demand), ("the naive plan", r.naive)):
        head = "" if c.usd is None else f"{money(c.usd)} (savings {money(c.savings_usd)}): "
        console.print(f"against {name}: {head}{safe(c.note)}", highlight=False)
    m = r.metrics
    console.print(
        f"metrics: {safe(metrics_line(r))}" + (f", last GNS {m.gns[-1][1]:.1f}" if m.gns else ""),
        highlight=False,
    )
    if m.communication is not None:
        console.print(f"communication: {safe(m.communication.summary())}", highlight=False)
