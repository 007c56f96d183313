"""``kplan report --html``: one self-contained page (inline CSS, plots as embedded PNG data URIs,
no external URL), drawn with matplotlib's Agg backend."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from kplan.errors import KplanError
from kplan.launcher.report import Comparison, JobReport
from kplan.render.text import clean


def money(x: float | None) -> str:
    """Dollars as every view prints them: six decimals, so the total equals the ledger's."""
    return "n/a" if x is None else f"${x:,.6f}"


def _opt(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def plots(r: JobReport) -> list[tuple[str, str]]:
    """(title, <img>) for each plot that has data."""
    try:
        import matplotlib
    except ImportError:
        raise KplanError(
            "--html needs matplotlib, which is not installed",
            hint="pip install 'kplan[report]'",
        ) from None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    out: list[tuple[str, str]] = []
    if r.cost_curve:
        fig = Figure(figsize=(6, 2.6))
        ax = fig.subplots()
        t0 = r.cost_curve[0][0]
        ax.plot([(t - t0) / 60 for t, _ in r.cost_curve], [u for _, u in r.cost_curve])
        ax.set_xlabel("minutes since the first instance")
        ax.set_ylabel("USD (ledger)")
        out.append(("Cost over time (ledger)", _png(fig)))
    m = r.metrics
    if m.step_times:
        fig = Figure(figsize=(6, 2.6))
        ax = fig.subplots()
        ax.plot([s for s, _ in m.step_times], [t for _, t in m.step_times], ".", ms=2,
                label="measured (rank 0)")  # fmt: skip
        if r.predicted_step_s is not None:
            ax.axhline(r.predicted_step_s, color="C1", label="predicted")
        if r.predicted_step_p90_s is not None:
            ax.axhline(r.predicted_step_p90_s, color="C1", ls="--", label="predicted p90")
        ax.set_xlabel("step")
        ax.set_ylabel("step time (s)")
        ax.legend(fontsize=7)
        out.append(("Step time: predicted vs measured", _png(fig)))
    if m.local_batch:
        fig = Figure(figsize=(6, 2.6))
        ax = fig.subplots()
        for rank, pts in m.local_batch.items():
            ax.step([s for s, _ in pts], [b for _, b in pts], where="post", label=f"rank {rank}")
        ax.set_xlabel("step")
        ax.set_ylabel("local batch")
        ax.legend(fontsize=7)
        out.append(("Per-worker batch sizes", _png(fig)))
    if m.gns:
        fig = Figure(figsize=(6, 2.6))
        ax = fig.subplots()
        ax.plot([s for s, _ in m.gns], [g for _, g in m.gns])
        ax.set_xlabel("step")
        ax.set_ylabel("gradient noise scale (samples)")
        out.append(("Gradient noise scale", _png(fig)))
    return out


def _esc(text: str) -> str:
    """User and job text for HTML: control characters stripped, then HTML-escaped."""
    return html.escape(clean(text))


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def measured_step(r: JobReport) -> str:
    st = r.metrics.step_time
    return "n/a" if st is None else f"{st.median_s:.4f} median, {st.p90_s:.4f} p90 (rank 0)"


def _cmp(c: Comparison) -> str:
    head = "" if c.usd is None else f"{money(c.usd)} (savings {money(c.savings_usd)}): "
    return head + c.note


def section(r: JobReport) -> str:
    e = _esc
    summary = _table(
        ["", "predicted", "predicted p90", "actual"],
        [
            ["time (h)", _opt(r.predicted_hours, ".4f"), _opt(r.predicted_hours_p90, ".4f"),
             f"{r.actual_hours:.4f} (wall clock)"],
            ["cost", money(r.predicted_cost_usd), money(r.predicted_cost_p90_usd),
             f"{money(r.total_usd)} (ledger, {r.billed_seconds:,.0f} billed s)"],
            ["step time (s)", _opt(r.predicted_step_s, ".4f"), _opt(r.predicted_step_p90_s, ".4f"),
             measured_step(r)],
        ],
    )  # fmt: skip
    spend = _table(
        ["instance", "type", "market", "zone", "USD/h", "billed s", "USD"],
        [
            [s.instance, s.type, s.market, s.zone, f"{s.usd_per_hour:.4f}",
             f"{s.billed_seconds:,.1f}", money(s.usd)]
            for s in r.instances
        ],
    )  # fmt: skip
    groups = "".join(
        f"<p>by {name}: " + e(", ".join(f"{k} {money(v)}" for k, v in d.items())) + "</p>"
        for name, d in (("market", r.by_market), ("zone", r.by_zone))
    )
    pre = _table(
        ["time", "node", "kind", "work lost s", "downtime s", "lost USD", "boot USD"],
        [
            [f"{p.time - r.created_at:.1f} s", str(p.node_rank), p.kind,
             _opt(p.work_lost_s, ".1f"), _opt(p.downtime_s, ".1f"), money(p.lost_usd),
             money(p.replacement_boot_usd)]
            for p in r.preemptions
        ],
    ) if r.preemptions else "<p>none</p>"  # fmt: skip
    figs = "".join(f"<h3>{e(t)}</h3>{img}" for t, img in plots(r))
    return (
        f'<section id="{e(r.id)}"><h2>{e(r.id)}: {e(r.status)}</h2>'
        f"<p>{e(r.cloud)} {e(r.region)}; reason: {e(r.reason or '-')}; "
        f"budget {money(r.budget_usd)}</p>"
        f'<p class="total" data-total-usd="{r.total_usd!r}">total spend (ledger): '
        f"<b>{money(r.total_usd)}</b></p>{summary}<h3>Spend by instance</h3>{spend}{groups}"
        f"<h3>Preemptions</h3>{pre}<h3>Savings</h3>"
        f"<p>against on-demand: {e(_cmp(r.on_demand))}</p>"
        f"<p>against the naive plan: {e(_cmp(r.naive))}</p>"
        f"<p>metrics: {e(r.metrics.note)}</p>{figs}</section>"
    )


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:60em}"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #bbb;padding:2px 6px;font-size:90%}"
)


def render_html(reports: list[JobReport]) -> str:
    body = "".join(section(r) for r in reports)
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>kplan report</title>'
        f"<style>{_CSS}</style></head><body><h1>kplan report</h1>{body}</body></html>\n"
    )
