"""``kplan simulate --plan plan.json --trace FILE``: replay a spot plan against a recorded trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kplan.core.errors import InputError

if TYPE_CHECKING:
    from kplan.app.simulating import Replay


def register(app: typer.Typer) -> None:
    app.command(
        "simulate",
        help="Replay a spot plan against a spot trace (when the cloud granted and preempted "
        "nodes) with the launcher's recovery rules, and set the distribution of time and cost "
        "against the plan's prediction. Trace formats: docs/spot_traces.md. Example: kplan "
        "simulate --plan plan.json --example-trace p3 --runs 500",
    )(simulate_command)


def simulate_command(
    plan: Path = typer.Option(..., "--plan", help="A plan written by kplan estimate --out."),
    trace: Path | None = typer.Option(None, "--trace", help="A spot trace file."),
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
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    from kplan.app import simulating
    from kplan.app.plan_files import plan_catalog, read_plan
    from kplan.core import flags

    flags.integer("--runs", runs, high=simulating.MAX_RUNS, hint="e.g. --runs 500")
    flags.integer("--seed", seed, low=0, high=2**31, hint="e.g. --seed 0")
    flags.integer("--row", row, low=0, high=10_000, hint="0 is the best alternative")
    flags.text("--format", fmt, choices=simulating.FORMATS, hint="kplan, bamboo or gcp-counts")
    flags.text("--example-trace", example_trace, hint="p3 or g4dn")
    if (trace is None) == (example_trace is None):
        raise InputError(
            "give exactly one of --trace or --example-trace",
            hint="e.g. kplan simulate --plan plan.json --example-trace p3",
        )
    typed = read_plan(plan)
    catalog = plan_catalog(typed)
    job = simulating.job_from_plan(typed, row, catalog)
    tr = (
        simulating.load_trace(trace, fmt)
        if trace is not None
        else simulating.example_trace(str(example_trace))
    )
    risk = simulating.plan_risk(typed, row, catalog=catalog)
    result = simulating.replay_plan(job, tr, runs=runs, seed=seed, risk=risk)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=1))
        return
    _render(result)


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
    nan = float("nan")

    def known(x: float | None) -> float:
        return nan if x is None else x

    typer.echo("")
    typer.echo(
        f"{'':16}{'replayed p50':>14}{'replayed p90':>14}{'plan':>11}{'plan p90':>10}"
        f"{'spot-only p90':>15}{'> plan p90':>12}{'> spot-only':>13}"
    )
    typer.echo(
        f"{'hours':16}{rep.hours:>14.2f}{rep.hours_p90:>14.2f}{p.hours:>11.2f}"
        f"{p.hours_p90:>10.2f}{nan if so is None else so.hours_p90:>15.2f}"
        f"{rep.above_plan_hours_p90:>12.0%}"
        f"{known(rep.above_spot_only_hours_p90):>13.0%}"
    )
    typer.echo(
        f"{'cost USD':16}{rep.cost_usd:>14.2f}{rep.cost_p90_usd:>14.2f}"
        f"{p.cost_usd:>11.2f}{p.cost_p90_usd:>10.2f}"
        f"{nan if so is None else so.cost_p90_usd:>15.2f}{rep.above_plan_cost_p90:>12.0%}"
        f"{known(rep.above_spot_only_cost_p90):>13.0%}"
    )
    typer.echo(f"{'loss events':16}{rep.losses:>14.1f}")
    if rep.met_deadline is not None:  # a deadline-safe plan (kplan/planner/deadline.py)
        typer.echo(f"deadline: {rep.met_deadline:.0%} of the replays ended by the plan's deadline")
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
