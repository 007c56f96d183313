"""``kplan estimate``: which cluster, how many workers, what batch, what it costs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from kplan.errors import InputError

_HELP = """Predict step time, time to train and cost for every configuration; pick a plan.

Reads a built-in example (--example) or a profile from `kplan profile` (--profile), searches
every cloud, region, instance type, market, node count, global batch and accumulation (and
two-type mixes), and prints the best plans and the time/cost frontier. Times and costs are
expected values with a p90; plans are filtered by their p90 against --budget and --deadline.
"""


def register(app: typer.Typer) -> None:
    app.command("estimate", help=_HELP)(estimate_command)


def estimate_command(
    example: str | None = typer.Option(
        None, "--example", "-e", help="Built-in profile (see --list-examples)."
    ),
    profile: Path | None = typer.Option(
        None, "--profile", "-p", help="Profile JSON written by `kplan profile`."
    ),
    list_examples: bool = typer.Option(False, "--list-examples", help="List built-in examples."),
    epochs: float | None = typer.Option(None, help="Epochs to train (default: the profile's)."),
    dataset_size: int | None = typer.Option(
        None, "--dataset-size", help="Samples per epoch (default: the profile's)."
    ),
    budget: float | None = typer.Option(None, help="Budget in USD (the plan's p90 cost)."),
    deadline: float | None = typer.Option(None, help="Deadline in hours (the plan's p90 time)."),
    cloud: list[str] = typer.Option([], "--cloud", help="aws or gcp (repeatable)."),
    region: list[str] = typer.Option([], "--region", help="Region (repeatable)."),
    gpu: list[str] = typer.Option([], "--gpu", help="GPU type, e.g. T4, A100 (repeatable)."),
    spot: bool | None = typer.Option(
        None, "--spot/--on-demand", help="Only spot or only on-demand (default: both)."
    ),
    max_nodes: int = typer.Option(64, "--max-nodes", help="Most instances in one plan."),
    objective: str | None = typer.Option(
        None,
        help="cost (cheapest within the deadline), time (fastest within the budget) or knee "
        "(of the frontier). Default: cost with --deadline, time with --budget alone, else knee.",
    ),
    fixed_batch: bool = typer.Option(
        False, "--fixed-batch", help="Keep the profile's global batch."
    ),
    mixed: bool = typer.Option(True, "--mixed/--no-mixed", help="Also consider two-type clusters."),
    top: int = typer.Option(10, help="How many plans to show."),
    out: Path | None = typer.Option(None, "--out", help="Write the plan JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    from kplan import flags, planning
    from kplan.planner.search import SearchOptions, default_objective

    flags.number("--epochs", epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 90")
    flags.integer("--dataset-size", dataset_size, high=flags.MAX_SAMPLES, hint="samples per epoch")
    flags.number("--budget", budget, high=flags.MAX_USD, hint="USD, e.g. --budget 50")
    flags.number("--deadline", deadline, high=flags.MAX_HOURS, hint="hours, e.g. --deadline 12")
    flags.integer("--max-nodes", max_nodes, high=flags.MAX_NODES, hint="e.g. --max-nodes 16")
    flags.integer("--top", top, high=10_000, hint="e.g. --top 10")
    flags.text("--objective", objective, hint="cost, time or knee")
    flags.texts("--cloud", cloud, hint="aws or gcp")
    flags.texts("--region", region, hint="e.g. us-east-1")
    flags.texts("--gpu", gpu, hint="e.g. T4, A100")
    flags.text("--example", example, hint="see --list-examples")
    if out is not None:
        from kplan.io import check_writable

        check_writable(out, "--out")
    if list_examples:
        typer.echo("\n".join(planning.example_names()))
        return
    if (example is None) == (profile is None):
        raise InputError(
            "give exactly one of --example or --profile",
            hint=f"e.g. kplan estimate --example imagenet-resnet50 "
            f"(examples: {', '.join(planning.example_names())})",
        )
    prof = planning.load_example(example) if example else planning.load_profile(profile)  # type: ignore[arg-type]
    markets = ("on-demand", "spot") if spot is None else (("spot",) if spot else ("on-demand",))
    options = SearchOptions(
        clouds=tuple(c.lower() for c in cloud),
        regions=tuple(region),
        gpus=tuple(gpu),
        markets=markets,
        max_nodes=max_nodes,
        budget_usd=budget,
        deadline_hours=deadline,
        objective=objective if objective is not None else default_objective(budget, deadline),  # type: ignore[arg-type]
        fixed_global_batch=fixed_batch,
        mixed=mixed,
        top=top,
    )
    result = planning.estimate(prof, options, epochs=epochs, dataset_size=dataset_size)
    doc = result.plan.to_dict()
    doc["profile"] = prof.name
    doc["catalog"] = result.catalog.version
    if out is not None:
        from kplan.io import write_json

        write_json(out, doc)
    if as_json:
        typer.echo(json.dumps(doc, indent=1))
        return
    from kplan.render.estimate import render_plan

    render_plan(result.plan, prof.name, result.catalog.version)
