"""``kplan report --html``: one self-contained page per report (inline CSS, plots as embedded PNG
data URIs, no external URL, no script), drawn with matplotlib's Agg backend.

Each job gets a header (status, where it ran, the command, dates, budget and spend), predicted
against actual (every prediction with its p90), the plan, full-width plots (cumulative spend
against the budget and the predicted spend; step time against the predicted step time and its
band; throughput; loss; per-worker batches; GNS) with preemptions marked on each timeline, the
spend by instance, the preemptions and the savings.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
from collections.abc import Sequence
from typing import Any

from kplan.core.errors import KplanError
from kplan.core.text import clean
from kplan.launcher.jobspec import place
from kplan.launcher.report import Comparison, JobReport

Z90 = 1.2815515655446004  # standard normal 90th percentile (planner.costs.Z90)
WIDTH_IN, HEIGHT_IN, DPI = 11.0, 3.3, 110  # plots: 1210 x 363 px, shown at the page's width
MEASURED, PREDICTED, BUDGET, PREEMPT = "#1f5fa8", "#d9661f", "#b3261e", "#7b3fa0"


def money(x: float | None) -> str:
    """Dollars as every view of the report prints them: cents from $1 up, three significant
    digits below (the exact float is in the JSON and the page's ``data-total-usd``)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "$0.00"
    if abs(x) >= 1:
        return f"${x:,.2f}"
    decimals = min(6, max(2, 2 - math.floor(math.log10(abs(x)))))
    return f"${x:,.{decimals}f}"


def _opt(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _png(fig: Any, title: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="plot" alt="{html.escape(title)}" src="data:image/png;base64,{data}">'


def _figure() -> tuple[Any, Any]:
    try:
        import matplotlib
    except ImportError:
        raise KplanError(
            "--html needs matplotlib, which is not installed",
            hint="scripts/setup.sh report (or, in kplan's folder, pip install -e '.[report]')",
        ) from None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN))
    # Fixed margins (not a layout engine) so every plot's axes line up on the page; the
    # legend goes in the right margin.
    fig.subplots_adjust(left=0.07, right=0.77, bottom=0.15, top=0.96)
    ax = fig.subplots()
    ax.grid(True, color="#e3e3e3", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def _legend(ax: Any) -> None:
    """The legend beside the plot, so it never hides the data or the budget line."""
    import textwrap

    handles, labels = ax.get_legend_handles_labels()
    labels = [textwrap.fill(label, 34) for label in labels]
    ax.legend(
        handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
    )


def _rolling_median(values: Sequence[float]) -> list[float]:
    """A centred running median (window ~1/20 of the series, at least 5): the trend of noisy
    step times without one slow step pulling it."""
    import statistics

    n = len(values)
    half = max(2, n // 40)
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(n)]


def _step_at(r: JobReport, t: float) -> float | None:
    """The step rank 0 was at at unix time ``t`` (None before the first step record)."""
    clock = r.metrics.step_clock
    if not clock or t < clock[0][1]:
        return None
    last = clock[0][0]
    for step, when in clock:
        if when > t:
            break
        last = step
    return float(last)


def _mark_preemptions(ax: Any, r: JobReport, *, steps: bool) -> None:
    """Vertical lines at each preemption (by step, or by minutes since the job started)."""
    labelled = False
    for p in r.preemptions:
        x = _step_at(r, p.time) if steps else (p.time - r.created_at) / 60.0
        if x is None:
            continue
        node = "?" if p.node_rank is None else str(p.node_rank)
        ax.axvline(
            x, color=PREEMPT, ls=":", lw=1.6, label=None if labelled else "preemption / lost node"
        )
        ax.annotate(
            f"{p.kind} node {node}", (x, 1.0), xycoords=("data", "axes fraction"),
            xytext=(3, -12), textcoords="offset points", color=PREEMPT, fontsize=8,
        )  # fmt: skip
        labelled = True


def _band(step: float, p90: float | None) -> tuple[float, float] | None:
    """The 80% interval (p10, p90) of a log-normal prediction given its median and p90."""
    if p90 is None or not step > 0 or not p90 >= step:
        return None
    return step * step / p90, p90


def _spend_plot(r: JobReport) -> tuple[str, str] | None:
    fig, ax = _figure()
    free = (
        r.total_usd == 0
        and not (r.predicted_cost_usd or 0)
        and not any(s.usd_per_hour for s in r.instances)
    )
    t0 = r.created_at
    top = 0.0
    if r.cost_curve:
        xs = [0.0] + [(t - t0) / 60 for t, _ in r.cost_curve]
        ys = [0.0] + [u for _, u in r.cost_curve]
        # each ledger row's dollars accrue evenly over its life: straight lines between points
        ax.plot(xs, ys, color=MEASURED, lw=2.2, label="actual spend (ledger)")
        top = max(ys)
    for hours, usd, ls, lw, name in (
        (r.predicted_hours, r.predicted_cost_usd, "-", 1.8, "predicted"),
        (r.predicted_hours_p90, r.predicted_cost_p90_usd, "--", 1.2, "predicted p90"),
    ):
        if hours is None or usd is None:
            continue
        label = f"{name}: {money(usd)} in {hours * 60:.1f} min"
        ax.plot([0, hours * 60], [0, usd], ls=ls, color=PREDICTED, lw=lw, label=label)
        top = max(top, usd)
    budget = r.budget_usd
    if free:
        top = budget if budget > 0 else 0.01
        ax.text(0.5, 0.5, "free: this machine is priced at $0/h (kplan launch --price sets one)",
                transform=ax.transAxes, ha="center", va="center", fontsize=11,
                color="#555", bbox={"fc": "white", "ec": "#ccc", "boxstyle": "round"})  # fmt: skip
    if budget > 0 and (free or budget <= 4 * max(top, 1e-12)):
        ax.axhline(budget, color=BUDGET, ls="-.", lw=1.4, label=f"budget {money(budget)}")
        top = max(top, budget)
    elif budget > 0:
        ax.plot([], [], " ", label=f"budget {money(budget)} (off the scale: "
                f"{r.total_usd / budget:.1%} used)")  # fmt: skip
    ax.set_ylim(0, (top or 0.01) * 1.12)
    ax.set_xlim(left=0)
    _mark_preemptions(ax, r, steps=False)
    ax.set_xlabel("minutes since the job started")
    ax.set_ylabel("USD, cumulative")
    _legend(ax)
    title = "Spend against the budget" + (": free" if free else "")
    return title, _png(fig, title)


def _prediction_lines(
    ax: Any, value: float | None, band: tuple[float, float] | None, what: str, fmt: str
) -> None:
    if value is None:
        return
    ax.axhline(value, color=PREDICTED, lw=1.8, label=f"predicted {what} {format(value, fmt)}")
    if band is not None:
        lo, hi = band
        label = f"predicted 80% band ({format(lo, fmt)} to {format(hi, fmt)})"
        ax.axhspan(lo, hi, color=PREDICTED, alpha=0.13, lw=0, label=label)


def _series_plot(
    r: JobReport,
    points: Sequence[tuple[int, float]],
    *,
    title: str,
    ylabel: str,
    label: str,
    predicted: float | None = None,
    band: tuple[float, float] | None = None,
    what: str = "",
    fmt: str = ".4g",
    log: bool = False,
) -> tuple[str, str]:
    fig, ax = _figure()
    xs = [s for s, _ in points]
    ys = [v for _, v in points]
    ax.plot(xs, ys, ".", ms=3, color=MEASURED, alpha=0.3, label=label)
    if len(ys) >= 10:
        ax.plot(xs, _rolling_median(ys), color=MEASURED, lw=2, label="running median")
    _prediction_lines(ax, predicted, band, what, fmt)
    if log and ys and min(ys) > 0 and max(ys) / min(ys) > 20:
        ax.set_yscale("log")
    else:
        ordered = sorted(ys)
        high = ordered[min(len(ordered) - 1, math.ceil(0.98 * len(ordered)))] if ordered else 0
        top = max(high, band[1] if band else 0.0, predicted or 0.0)
        clipped = sum(1 for y in ys if y > top * 1.15)
        ax.set_ylim(0, top * 1.15 or 1.0)
        if clipped:
            ax.plot([], [], " ", label=f"{clipped} point(s) above the axis")
    _mark_preemptions(ax, r, steps=True)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    _legend(ax)
    return title, _png(fig, title)


def plots(r: JobReport) -> list[tuple[str, str]]:
    """(title, <img>) for each plot that has data."""
    out: list[tuple[str, str]] = []
    spend = _spend_plot(r)
    if spend is not None:
        out.append(spend)
    m = r.metrics
    if m.step_times:
        step = r.predicted_step_s
        out.append(
            _series_plot(
                r, m.step_times, title="Step time: predicted vs measured",
                ylabel="seconds per step", label="measured (rank 0)", predicted=step,
                band=_band(step, r.predicted_step_p90_s) if step else None, what="step",
                fmt=".4f",
            )
        )  # fmt: skip
    if m.throughput:
        step, p90 = r.predicted_step_s, r.predicted_step_p90_s
        batch = m.global_batch[0][1] if m.global_batch else None
        pred = batch / step if batch and step else None
        band = _band(step, p90) if step else None
        tband = (batch / band[1], batch / band[0]) if batch and band else None
        out.append(
            _series_plot(
                r, m.throughput, title="Throughput", ylabel="samples per second",
                label="measured (global batch / step time)", predicted=pred, band=tband,
                what="throughput", fmt=",.0f",
            )
        )  # fmt: skip
    if m.loss:
        out.append(
            _series_plot(
                r, m.loss, title="Training loss", ylabel="loss (all workers)",
                label="loss (mean over the global batch)", log=True,
            )
        )  # fmt: skip
    if m.local_batch:
        fig, ax = _figure()
        for rank, pts in m.local_batch.items():
            ax.step([s for s, _ in pts], [b for _, b in pts], where="post", label=f"rank {rank}")
        _mark_preemptions(ax, r, steps=True)
        ax.set_xlabel("step")
        ax.set_ylabel("samples per worker")
        ax.set_ylim(bottom=0)
        _legend(ax)
        out.append(("Per-worker batch sizes", _png(fig, "Per-worker batch sizes")))
    if m.gns:
        fig, ax = _figure()
        ax.plot([s for s, _ in m.gns], [g for _, g in m.gns], color=MEASURED, lw=1.8)
        _mark_preemptions(ax, r, steps=True)
        ax.set_xlabel("step")
        ax.set_ylabel("gradient noise scale (samples)")
        out.append(("Gradient noise scale", _png(fig, "Gradient noise scale")))
    return out


def _esc(text: str) -> str:
    """User and job text for HTML: control characters stripped, then HTML-escaped."""
    return html.escape(clean(text))


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cmp(c: Comparison) -> str:
    head = "" if c.usd is None else f"{money(c.usd)} (savings {money(c.savings_usd)}): "
    return head + c.note


def _ratio(actual: float | None, predicted: float | None) -> str:
    if actual is None or predicted is None or not predicted > 0:
        return ""
    return f"{actual / predicted:.2f}x"


def where(r: JobReport) -> str:
    """Where the job ran, in words: "this machine (local)" or "aws us-east-1"."""
    return place(r.cloud, r.region)


def budget_text(r: JobReport) -> str:
    """The budget, or "none" for a free local run launched without one."""
    return money(r.budget_usd) if r.budget_usd > 0 else "none"


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _hours(hours: float | None) -> str:
    return "n/a" if hours is None else _duration(hours * 3600)


SUMMARY_HEADER = ["", "predicted", "p90", "actual", "actual/pred."]


def summary_rows(r: JobReport) -> list[list[str]]:
    """predicted / p90 / actual / actual over predicted, for time, cost, step time, start,
    training and steps (shared with the terminal view; ``summary_note`` says what each actual
    is)."""
    st = r.metrics.step_time
    step = "n/a" if st is None else f"{st.median_s:.4f} (p90 {st.p90_s:.4f})"
    steps = "n/a" if r.predicted_steps is None else str(r.predicted_steps)
    return [
        ["time", _hours(r.predicted_hours), _hours(r.predicted_hours_p90),
         _hours(r.actual_hours), _ratio(r.actual_hours, r.predicted_hours)],
        ["cost", money(r.predicted_cost_usd), money(r.predicted_cost_p90_usd),
         money(r.total_usd), _ratio(r.total_usd, r.predicted_cost_usd)],
        ["step time (s)", _opt(r.predicted_step_s, ".4f"), _opt(r.predicted_step_p90_s, ".4f"),
         step, _ratio(st.median_s if st else None, r.predicted_step_s)],
        ["start (s)", _opt(r.predicted_start_s, ".1f"), "", _opt(r.actual_start_s, ".1f"),
         _ratio(r.actual_start_s, r.predicted_start_s)],
        ["training (s)", _opt(r.predicted_train_s, ".1f"), _opt(r.predicted_train_p90_s, ".1f"),
         _opt(r.actual_train_s, ".1f"), _ratio(r.actual_train_s, r.predicted_train_s)],
        ["steps", steps, "", str(r.metrics.steps) if r.measured else "not measured",
         _ratio(float(r.metrics.steps), r.predicted_steps) if r.measured else ""],
    ]  # fmt: skip


def metrics_line(r: JobReport) -> str:
    """Where the metrics came from and what they hold; only the note when nothing was
    measured (a plain script's report says so instead of "0 steps")."""
    m = r.metrics
    if not r.measured:
        return m.note
    return f"{m.note}; {m.steps} steps, {m.checkpoints} checkpoints, {m.resumes} resumes"


def summary_note(r: JobReport) -> str:
    """What the actual column measures."""
    return (
        f"actual: time on the wall clock; cost from the ledger ({r.billed_seconds:,.0f} billed "
        "s); step time: rank 0's median (p90); start: job created to rank 0's first step; "
        "training: its first to last step"
        + ("" if r.plan is not None else "; no plan: nothing was predicted")
        + ("" if r.measured else "; steps not measured (no step records: see metrics)")
    )


def _plan_block(r: JobReport) -> str:
    p = r.plan
    if p is None:
        return (
            "<p class='muted'>No plan: the job was launched without a profile or a plan, so "
            "nothing was predicted (give <code>--profile</code> or <code>--plan</code>).</p>"
        )
    items = [
        ("configuration", p.config),
        ("profile", p.profile or "n/a"),
        ("work predicted", p.work or "n/a"),
        ("precision", p.precision or "n/a"),
        ("why", p.reason),
        ("uncertainty", p.uncertainty),
        *(("note", n) for n in p.notes),
    ]
    m = r.metrics
    if m.epochs is not None and m.dataset_size is not None:
        items.append(
            ("work run", f"{m.dataset_size:,} samples per epoch x {m.epochs:g} epochs "
             f"({m.samples:,.0f} samples trained)")
        )  # fmt: skip
    rows = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in items if v)
    return f"<dl class='plan'>{rows}</dl>"


def section(r: JobReport) -> str:
    e = _esc
    summary = _table(SUMMARY_HEADER, summary_rows(r), "summary")
    summary += f"<p class='muted small'>{e(summary_note(r))}</p>"
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
        for name, d in (("kind", r.by_kind), ("market", r.by_market), ("zone", r.by_zone))
    )
    pre = _table(
        ["time", "node", "kind", "reason", "work lost s", "downtime s", "lost USD", "boot USD"],
        [
            [f"+{p.time - r.created_at:.1f} s", str(p.node_rank), p.kind, p.reason or "-",
             _opt(p.work_lost_s, ".1f"), _opt(p.downtime_s, ".1f"), money(p.lost_usd),
             money(p.replacement_boot_usd)]
            for p in r.preemptions
        ],
    ) if r.preemptions else "<p class='muted'>none</p>"  # fmt: skip
    figs = "".join(f"<figure><figcaption>{e(t)}</figcaption>{img}</figure>" for t, img in plots(r))
    used = f" ({r.total_usd / r.budget_usd:.0%} of it)" if r.budget_usd > 0 else ""
    facts = [
        ("where", where(r)),
        ("workers", f"{r.workers} in {len({s.node_rank for s in r.instances}) or '?'} node(s)"),
        ("started", _when(r.created_at)),
        ("ended" if r.status in _TERMINAL else "now", _when(r.ended_at)),
        ("took", _duration(max(r.ended_at - r.created_at, 0.0))),
        ("budget", budget_text(r) + (f", deadline {r.deadline_h:g} h" if r.deadline_h else "")),
    ]  # fmt: skip
    facts_html = "".join(f"<div><span>{e(k)}</span>{e(v)}</div>" for k, v in facts)
    reason = f"<p class='reason'>{e(r.reason)}</p>" if r.reason else ""
    return (
        f'<section id="{e(r.id)}"><header><h2>{e(r.id)} '
        f'<span class="badge {e(r.status)}">{e(r.status)}</span></h2>{reason}'
        f"<pre class='cmd'>{e(r.command)}</pre><div class='facts'>{facts_html}</div>"
        f'<p class="total" data-total-usd="{r.total_usd!r}">total spend (ledger): '
        f"<b>{money(r.total_usd)}</b>{e(used)}</p></header>"
        f"<h3>Predicted vs actual</h3>{summary}<h3>Plan</h3>{_plan_block(r)}"
        f"<h3>Timelines</h3>{figs}"
        f"<h3>Spend by instance</h3>{spend}{groups}"
        f"<h3>Preemptions</h3>{pre}<h3>Savings</h3>"
        f"<p>against on-demand: {e(_cmp(r.on_demand))}</p>"
        f"<p>against the naive plan: {e(_cmp(r.naive))}</p>"
        f"<p class='muted'>metrics: {e(metrics_line(r))}</p>"
        + (
            ""
            if r.metrics.communication is None
            else f"<p class='muted'>communication: {e(r.metrics.communication.summary())}</p>"
        )
        + "</section>"
    )


_TERMINAL = ("succeeded", "failed", "stopped", "cancelled", "error")

_CSS = """
:root{--fg:#1d232b;--muted:#5d6773;--line:#dde1e6;--bg:#f6f7f9;--card:#fff;--accent:#1f5fa8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
 font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:22px;margin:0 0 16px;color:var(--accent)}
h1 small{color:var(--muted);font-weight:400;font-size:14px;margin-left:8px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;
 padding:20px 24px;margin:0 0 28px;box-shadow:0 1px 2px rgba(0,0,0,.04)}
h2{font-size:20px;margin:0 0 6px;font-family:ui-monospace,SFMono-Regular,Menlo,monospace}
h3{font-size:16px;margin:26px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
.badge{font:600 12px/1 system-ui,sans-serif;padding:4px 9px;border-radius:999px;
 vertical-align:middle;margin-left:8px;background:#e8eaed;color:#333;text-transform:uppercase}
.badge.succeeded{background:#dcf3e3;color:#17622f}.badge.failed,.badge.error{background:#fbe0de;
 color:#8c1d18}.badge.stopped,.badge.cancelled{background:#fdf0d5;color:#7a5200}
.badge.running,.badge.recovering,.badge.provisioning{background:#dde9f8;color:#1f4f8a}
.reason{color:var(--muted);margin:2px 0 8px}
pre.cmd{background:#10161d;color:#e6edf3;padding:10px 14px;border-radius:8px;overflow-x:auto;
 font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace;margin:10px 0}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(210px,1fr));gap:6px 18px;
 margin:8px 0}
.facts span{display:block;color:var(--muted);font-size:12px;text-transform:uppercase;
 letter-spacing:.04em}
.total{font-size:16px;margin:10px 0 0}
table{border-collapse:collapse;width:100%;margin:6px 0 10px;font-size:14px}
th,td{border-bottom:1px solid var(--line);padding:6px 10px;text-align:left;
 font-variant-numeric:tabular-nums}
th{background:#f0f2f5;font-weight:600}
table.summary td:first-child{font-weight:600}
dl.plan{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:6px 0}
dl.plan dt{color:var(--muted)}dl.plan dd{margin:0}
figure{margin:14px 0 18px}
figcaption{font-weight:600;margin:0 0 4px}
img.plot{display:block;width:100%;height:auto;border:1px solid var(--line);border-radius:6px}
.muted{color:var(--muted)}.small{font-size:13px;margin-top:0}
code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace}
"""


def render_html(reports: list[JobReport]) -> str:
    body = "".join(section(r) for r in reports)
    made = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    title = "kplan report" + (f": {reports[0].id}" if len(reports) == 1 else "")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>kplan report<small>{len(reports)} job(s), made {made}</small></h1>"
        f"{body}</main></body></html>\n"
    )
