"""``kplan simulate --plan plan.json --trace FILE``: replay a spot plan against a recorded trace."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kplan.core.errors import InputError
from kplan.planner import fmt
from kplan.planner.spotmove import DEFAULT_COPY_GBPS

if TYPE_CHECKING:
    from kplan.app.simulating import Moves, Replay, Replayed


def register(app: typer.Typer) -> None:
    app.command(
        "simulate",
        help="Replay a spot plan against a spot trace (when the cloud granted and preempted "
        "nodes) with the launcher's recovery rules, and set the distribution of time and cost "
        "against the plan's prediction. With a trace per pool (--trace POOL=FILE, repeated), the "
        "job may move between zones or regions when its pool runs dry, paying the checkpoint's "
        "egress and copy time, set against staying in the first pool. Trace formats: "
        "docs/spot_traces.md. Example: kplan simulate --plan plan.json --example-trace p3 "
        "--runs 500",
    )(simulate_command)


def simulate_command(
    plan: Path = typer.Option(..., "--plan", help="A plan written by kplan estimate --out."),
    trace: list[str] | None = typer.Option(
        None,
        "--trace",
        help="A spot trace file; repeat as --trace POOL=FILE, POOL a region or zone of the "
        "plan's cloud (the first in the plan's region, where the job starts), to replay with "
        "moves between the pools when one runs dry (docs/spot_traces.md).",
    ),
    example_trace: str | None = typer.Option(
        None,
        "--example-trace",
        help="A shipped trace instead: p3 or g4dn (EC2 spot autoscaling groups, 11 h each).",
    ),
    fmt: str = typer.Option(
        "auto", "--format", help="kplan, bamboo, gcp-counts or auto (from the file's first line)."
    ),
    runs: int = typer.Option(500, "--runs", help="Replays, each from a random start time."),
    seed: int = typer.Option(0, "--seed", help="Seed of the start times."),
    row: int | None = typer.Option(
        None, "--row", help="Replay plans[ROW] of the plan file instead of its chosen plan."
    ),
    checkpoint_gb: float | None = typer.Option(
        None,
        "--checkpoint-gb",
        help="GB a move copies between regions (default: the plan's checkpoint size).",
    ),
    copy_gbps: float | None = typer.Option(
        None,
        "--copy-gbps",
        help=f"Bandwidth of a move's checkpoint copy between regions, Gbit/s (default "
        f"{DEFAULT_COPY_GBPS:g}).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    from kplan.app import simulating, simulating_pools
    from kplan.app.plan_files import plan_catalog, read_plan
    from kplan.core import flags

    flags.integer("--runs", runs, high=simulating.MAX_RUNS, hint="e.g. --runs 500")
    flags.integer("--seed", seed, low=0, high=2**31, hint="e.g. --seed 0")
    flags.integer("--row", row, low=0, high=10_000, hint="0 is the best alternative")
    flags.text("--format", fmt, choices=simulating.FORMATS, hint="kplan, bamboo or gcp-counts")
    flags.text("--example-trace", example_trace, hint="p3 or g4dn")
    flags.number("--checkpoint-gb", checkpoint_gb, high=flags.MAX_CHECKPOINT_GB, low_open=False,
                 hint="e.g. 10")  # fmt: skip
    flags.number("--copy-gbps", copy_gbps, low=flags.MIN_COPY_GBPS, low_open=False,
                 high=flags.MAX_COPY_GBPS, hint=flags.COPY_HINT)  # fmt: skip
    if (not trace) == (example_trace is None):
        raise InputError(
            "give exactly one of --trace or --example-trace",
            hint="e.g. kplan simulate --plan plan.json --example-trace p3",
        )
    typed = read_plan(plan)
    catalog = plan_catalog(typed)
    specs = [simulating_pools.split_spec(t) for t in trace or []]
    if len(specs) > 1 or any(name for name, _ in specs):  # several pools: moves
        result = simulating_pools.simulate_pools(
            typed, row, catalog, specs, fmt=fmt, runs=runs, seed=seed,
            checkpoint_gb=checkpoint_gb,
            copy_gbps=DEFAULT_COPY_GBPS if copy_gbps is None else copy_gbps,
        )  # fmt: skip
    else:
        _no_move_flags(checkpoint_gb, copy_gbps)
        job = simulating.job_from_plan(typed, row, catalog)
        tr = (
            simulating.load_trace(specs[0][1], fmt)
            if specs
            else simulating.example_trace(str(example_trace))
        )
        risk = simulating.plan_risk(typed, row, catalog=catalog)
        result = simulating.replay_plan(job, tr, runs=runs, seed=seed, risk=risk)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    _render(result)


def _no_move_flags(checkpoint_gb: float | None, copy_gbps: float | None) -> None:
    """The move's numbers with one trace (no pool to move to) were taken and ignored."""
    given = [f for f, v in (("--checkpoint-gb", checkpoint_gb), ("--copy-gbps", copy_gbps))
             if v is not None]  # fmt: skip
    if given:
        raise InputError(
            f"{', '.join(given)}: only with a trace per pool, which a move goes between",
            hint="e.g. --trace us-east-1=a.csv --trace us-west-2=b.csv (docs/spot_traces.md)",
        )


def _render(r: Replay) -> None:
    from kplan.core.text import clean

    p, rep, so = r.plan, r.replayed, r.spot_only
    typer.echo(f"plan: {clean(r.job)}")
    typer.echo(f"trace: {clean(r.trace)}, {r.trace_hours:.1f} h ({clean(r.trace_source)})")
    typer.echo(
        f"replays: {r.runs} from random start times; {r.truncated} ran past the trace's "
        f"end (left out); {r.failed} failed (no capacity within the wait, or too many lost "
        "nodes)"
    )
    for note in r.notes:
        typer.echo(f"note: {clean(note)}")
    if rep is None:
        typer.echo("no replay finished inside the trace: give a longer trace")
        return
    typer.echo("")
    typer.echo(
        f"{'':16}{'replayed p50':>14}{'replayed p90':>14}{'plan':>11}{'plan p90':>10}"
        f"{'spot-only p90':>15}{'> plan p90':>12}{'> spot-only':>13}"
    )
    typer.echo(
        f"{'hours':16}{rep.hours:>14.2f}{rep.hours_p90:>14.2f}{p.hours:>11.2f}"
        f"{_num(p.hours_p90, 10)}{_num(None if so is None else so.hours_p90, 15)}"
        f"{rep.above_plan_hours_p90:>12.0%}{_pct(rep.above_spot_only_hours_p90, 13)}"
    )
    typer.echo(
        f"{'cost USD':16}{rep.cost_usd:>14.2f}{rep.cost_p90_usd:>14.2f}"
        f"{p.cost_usd:>11.2f}{_num(p.cost_p90_usd, 10)}"
        f"{_num(None if so is None else so.cost_p90_usd, 15)}{rep.above_plan_cost_p90:>12.0%}"
        f"{_pct(rep.above_spot_only_cost_p90, 13)}"
    )
    typer.echo(f"{'loss events':16}{rep.losses:>14.1f}")
    if rep.met_deadline is not None:  # a deadline-safe plan (kplan/planner/deadline.py)
        typer.echo(f"deadline: {rep.met_deadline:.0%} of the replays ended by the plan's deadline")
    if r.moves is not None:
        _render_moves(r.moves, rep)
        return
    if rep.heavy_tail:
        typer.echo(
            f"note: a heavy tail puts the replayed mean ({rep.hours_mean:.2f} h, "
            f"${rep.cost_mean_usd:.2f}) above its p90: a few replays ran much longer"
        )
    typer.echo("")
    typer.echo(
        "p50: the median; 'plan' is the plan's central value (its median run). "
        "The plan's p90 includes the step-time model's error; a replay runs the expected step "
        "time, so 'spot-only p90' (the plan's Monte-Carlo with the step time fixed) is the "
        "like-for-like check: about 10% of replays above it means the spot model is calibrated "
        "for this trace."
    )


def _num(x: float | None, width: int) -> str:
    """``x`` to two decimals; ``-`` for none, ``no bound`` for a p90 without one."""
    text = "-" if x is None else fmt.UNBOUNDED if x == math.inf else f"{x:.2f}"
    return f"{text:>{width}}"


def _pct(x: float | None, width: int) -> str:
    return f"{'-' if x is None else f'{x:.0%}':>{width}}"


def _render_moves(m: Moves, rep: Replayed) -> None:
    """Several pools: what a move costs, how often the rule moved, and against staying."""
    from kplan.core.text import clean

    typer.echo("")
    typer.echo(
        f"pools: {clean(', '.join(m.pools))} (the job starts in the first); a move between "
        f"regions copies {m.checkpoint_gb:g} GB at {m.copy_gbps:g} Gbit/s"
    )
    for p in m.prices:
        pays = (
            "never pays (on demand here is no dearer than spot there)"
            if p.break_even_s is None
            else f"pays after {p.break_even_s / 60:.1f} min of the whole cluster on demand"
        )
        typer.echo(
            f"  {clean(p.from_pool)} -> {clean(p.to_pool)}: {p.kind}, ${p.usd_per_gb:.3f}/GB "
            f"= ${p.egress_usd:.3g} egress, {p.copy_s:.0f} s copy; {pays}"
        )
    typer.echo(
        f"moves: {m.moves_mean:.2f} per replay ({m.moved:.0%} of replays moved), egress "
        f"${m.egress_usd_mean:.3g} per replay (in the cost)"
    )
    typer.echo(f"{'':16}{'with moves':>14}{'staying':>14}{'ratio':>8}")
    typer.echo(
        f"{'hours (mean)':16}{rep.hours_mean:>14.2f}{m.stay_hours_mean:>14.2f}"
        f"{m.hours_vs_stay:>8.2f}"
    )
    typer.echo(
        f"{'cost USD (mean)':16}{rep.cost_mean_usd:>14.2f}{m.stay_cost_mean_usd:>14.2f}"
        f"{m.cost_vs_stay:>8.2f}"
    )
    if m.stay_met_deadline is not None and rep.met_deadline is not None:
        typer.echo(f"{'deadline met':16}{rep.met_deadline:>14.0%}{m.stay_met_deadline:>14.0%}")
    typer.echo(
        "staying: the same starts replayed in the first pool alone (docs/spot_traces.md, "
        "the move rule)"
    )
