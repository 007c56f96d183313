"""``kplan estimate``: which cluster, how many workers, what batch, what it costs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from kplan.app.pins import FIXED_BATCH_MIN_LOCAL
from kplan.core.errors import InputError

_HELP = """Predict step time, time to train and cost for every configuration; pick a plan.

Reads a built-in example (--example) or a profile from `kplan profile` (--profile), searches
every cloud, region, instance type, market, node count, global batch and accumulation (and
two-type mixes), and prints the best plans and the time/cost frontier. Times and costs are
expected values with a p90; plans are filtered by their p90 against --budget and --deadline.
Times within 5% of each other count as tied, and a tie goes to the cheaper plan. It prints what
it assumed (the workload, where it was measured, what it searched) and the `kplan launch` line
that runs the plan saved by --out. AWS Local and Wavelength Zones (opt-in per account) are left
out unless --opt-in-zones. --wide shows prices per hour, zones, preemptions and throughput.

Pin the question: --instance-type (repeatable), --nodes 4 (exact) or --nodes 2-8 (a range),
--global-batch B (exact) or --max-global-batch B (default cap: 32 x the profile's batch),
--fixed-batch (keep the profile's global batch, with at least 8 samples per GPU), and
--precision (default: the profile's; another is projected from it, with a wider p90). Every
plan states its precision and whether it was measured or projected.
"""


def register(app: typer.Typer) -> None:
    app.command("estimate", help=_HELP)(estimate_command)


def estimate_command(
    example: str | None = typer.Option(
        None, "--example", "-e", help="Built-in profile (see --list-examples)."
    ),
    profile: list[Path] = typer.Option(
        [],
        "--profile",
        "-p",
        help="Profile JSON written by `kplan profile`. Twice: one job on one GPU in fp32/tf32 "
        "and in fp16/bf16; its measured speed-up tells the device model its compute share.",
    ),
    list_examples: bool = typer.Option(
        False, "--list-examples", help="List the built-in examples (with --json: as JSON)."
    ),
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
    instance_type: list[str] = typer.Option(
        [], "--instance-type", "-t", help="Only this instance type, e.g. p3.16xlarge (repeatable)."
    ),
    nodes: str | None = typer.Option(
        None, "--nodes", help="Exactly N instances (--nodes 4) or a range (--nodes 2-8)."
    ),
    max_nodes: int | None = typer.Option(
        None, "--max-nodes", help="Most instances in one plan, as --nodes 1-N (default: 64)."
    ),
    objective: str | None = typer.Option(
        None,
        help="cost (cheapest within the deadline), time (fastest within the budget) or knee "
        "(of the frontier). Default: cost with --deadline, time with --budget alone, else knee.",
    ),
    global_batch: int | None = typer.Option(
        None, "--global-batch", help="Plan exactly this global batch (samples per step)."
    ),
    max_global_batch: int | None = typer.Option(
        None, "--max-global-batch", help="Largest global batch to try (default 32 x the profile's)."
    ),
    fixed_batch: bool = typer.Option(
        False,
        "--fixed-batch",
        help=f"Keep the profile's global batch; use only configurations that give every GPU at "
        f"least {FIXED_BATCH_MIN_LOCAL} samples per step (fewer GPUs, not tiny per-GPU batches).",
    ),
    precision: str | None = typer.Option(
        None, "--precision", help="fp32, tf32, bf16 or fp16 (default: the profile's)."
    ),
    allow_on_demand: bool = typer.Option(
        False,
        "--allow-on-demand",
        help="Price spot plans with the launcher's on-demand fallback (a lost node goes on "
        "demand when the region has no spot capacity, and back to spot when it returns).",
    ),
    capacity_wait: float | None = typer.Option(
        None,
        "--capacity-wait",
        help="Seconds a spot job waits for capacity before it fails (default: twice the "
        "spot model's longest outage, at least 3600).",
    ),
    mixed: bool = typer.Option(True, "--mixed/--no-mixed", help="Also consider two-type clusters."),
    opt_in_zones: bool = typer.Option(
        False,
        "--opt-in-zones",
        help="Also plan in AWS Local Zones and Wavelength Zones (your account must opt in).",
    ),
    top: int = typer.Option(10, help="How many plans to show."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write the plan JSON here (for `kplan launch --plan`)."
    ),
    wide: bool = typer.Option(
        False,
        "--wide",
        help="More per plan: zone, price per hour, preemptions, step p90, samples/s "
        "(about 120 columns).",
    ),
    compression: str | None = typer.Option(
        None,
        "--compression",
        help="Gradient compression: none, fp16, bf16, powersgd:RANK or topk:RATIO[:ar|ag|auto] "
        "pins it on every plan (default: multi-node plans also consider fp16, powersgd:4 and "
        "topk:0.01 where one saves more than 5% of the time; the choice says why).",
    ),
    compression_steps: list[str] = typer.Option(
        [],
        "--compression-steps",
        metavar="SPEC=MULT[/SIGMA]",
        help="A measured statistical cost: the steps an option took to dense's loss, as a "
        "multiple of dense's (e.g. topk:0.01=1.3, from a run of each); it updates the option's "
        "prior by inverse variance (SIGMA: its log-space uncertainty, default 0.2, the spread of "
        "one pair of runs measured on the example MLP). Repeatable.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    from kplan.app import pins, planning
    from kplan.core import flags
    from kplan.core.precision import check_precision
    from kplan.planner.search import SearchOptions, default_objective

    flags.number("--epochs", epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 90")
    flags.integer("--dataset-size", dataset_size, high=flags.MAX_SAMPLES, hint="samples per epoch")
    flags.number("--budget", budget, high=flags.MAX_USD, hint="USD, e.g. --budget 50")
    flags.number("--deadline", deadline, high=flags.MAX_HOURS, hint="hours, e.g. --deadline 12")
    flags.integer("--max-nodes", max_nodes, high=1024, hint="e.g. --max-nodes 16")
    node_pin = pins.node_range(nodes)
    if node_pin is not None and max_nodes is not None:
        raise InputError(
            "give --nodes or --max-nodes, not both", hint="--nodes 1-16 is --max-nodes 16"
        )
    pins.check_batches(global_batch, max_global_batch, fixed_batch)
    prec = check_precision(precision) if precision is not None else None
    flags.texts("--instance-type", instance_type, hint="e.g. p3.16xlarge")
    flags.integer("--top", top, high=10_000, hint="e.g. --top 10")
    flags.number("--capacity-wait", capacity_wait, high=30 * 86400.0, hint="seconds, e.g. 3600")
    flags.text("--objective", objective, hint="cost, time or knee")
    flags.texts("--cloud", cloud, hint="aws or gcp")
    flags.texts("--region", region, hint="e.g. us-east-1")
    flags.texts("--gpu", gpu, hint="e.g. T4, A100")
    flags.text("--example", example, hint="see --list-examples")
    flags.text("--compression", compression, hint="e.g. powersgd:4 or topk:0.01")
    flags.texts("--compression-steps", compression_steps, hint="e.g. topk:0.01=1.3")
    from kplan.planner.compression import parse_measured

    measured = tuple(parse_measured(t) for t in compression_steps)
    if out is not None:
        from kplan.core.files import check_writable

        check_writable(out, "--out")
    if list_examples:
        rows = planning.example_rows()
        if as_json:
            typer.echo(json.dumps(rows, indent=1))
        else:
            from kplan.cli.render.estimate import render_examples

            render_examples(rows)
        return
    if (example is None) == (not profile):
        raise InputError(
            "give exactly one of --example or --profile",
            hint=f"e.g. kplan estimate --example imagenet-resnet50 "
            f"(examples: {', '.join(planning.example_names())})",
        )
    from kplan.planner.workload import pick_source

    profiles = (
        [planning.load_example(example)] if example else [planning.load_profile(p) for p in profile]
    )
    prof, other = pick_source(profiles, prec)
    markets = ("on-demand", "spot") if spot is None else (("spot",) if spot else ("on-demand",))
    options = SearchOptions(
        clouds=tuple(c.lower() for c in cloud),
        regions=tuple(region),
        gpus=tuple(gpu),
        markets=markets,
        instance_types=tuple(instance_type),
        min_nodes=node_pin[0] if node_pin else 1,
        max_nodes=node_pin[1] if node_pin else (max_nodes or 64),
        global_batch=global_batch,
        max_global_batch=max_global_batch,
        min_local_batch=FIXED_BATCH_MIN_LOCAL if fixed_batch else 1,
        precision=prec,
        budget_usd=budget,
        deadline_hours=deadline,
        objective=objective if objective is not None else default_objective(budget, deadline),  # type: ignore[arg-type]
        fixed_global_batch=fixed_batch,
        mixed=mixed,
        opt_in_zones=opt_in_zones,
        top=top,
        allow_on_demand=allow_on_demand,
        capacity_wait_s=capacity_wait,
        compression=compression,
        compression_stats=measured,
    )
    result = planning.estimate(prof, options, epochs=epochs, dataset_size=dataset_size, other=other)
    source = f"example {example}" if example else ", ".join(str(p) for p in profile)
    plan_file = out if out is not None else Path("plan.json")
    launch = planning.launch_command(
        result.plan, planning.script_for(prof), plan_file, budget, deadline
    )
    doc = result.plan.to_dict()
    doc["profile"] = prof.name
    doc["catalog"] = result.catalog.version
    doc["assumptions"] = planning.assumptions(result, options, source)
    doc["next_command"] = launch
    if out is not None:
        from kplan.core.files import write_json

        write_json(out, doc)
    if as_json:
        typer.echo(json.dumps(doc, indent=1))
        return
    from kplan.cli.render.estimate import NextStep, render_plan

    step = NextStep(launch, out, planning.script_for(prof) is None)
    render_plan(result.plan, doc["assumptions"], result.catalog.version, step, wide=wide)
