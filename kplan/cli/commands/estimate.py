"""``kplan estimate``: which cluster, how many workers, what batch, what it costs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kplan.app.pins import FIXED_BATCH_MIN_LOCAL
from kplan.core.errors import InputError

if TYPE_CHECKING:
    from kplan.core.precision import Precision
    from kplan.planner.searchopts import SearchOptions

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


_EXAMPLE = typer.Option(None, "--example", "-e", help="Built-in profile (see --list-examples).")

_PROFILE = typer.Option(
    [],
    "--profile",
    "-p",
    help="Profile JSON written by `kplan profile`. Twice: one job on one GPU in fp32/tf32 "
    "and in fp16/bf16; its measured speed-up tells the device model its compute share.",
)

_LIST_EXAMPLES = typer.Option(
    False, "--list-examples", help="List the built-in examples (with --json: as JSON)."
)

_EPOCHS = typer.Option(
    None,
    help="Epochs to train (default: the profile's). With --global-batch: passes over the data "
    "at that batch; else epochs at the profile's base batch, other batches scaled by "
    "statistical efficiency.",
)

_DATASET_SIZE = typer.Option(
    None, "--dataset-size", help="Samples per epoch (default: the profile's)."
)

_BUDGET = typer.Option(None, help="Budget in USD (the plan's p90 cost).")

_DEADLINE = typer.Option(None, help="Deadline in hours (the plan's p90 time).")

_CLOUD = typer.Option([], "--cloud", help="aws or gcp (repeatable).")

_REGION = typer.Option([], "--region", help="Region (repeatable).")

_GPU = typer.Option([], "--gpu", help="GPU type, e.g. T4, A100 (repeatable).")

_SPOT = typer.Option(
    None, "--spot/--on-demand", help="Only spot or only on-demand (default: both)."
)

_INSTANCE_TYPE = typer.Option(
    [], "--instance-type", "-t", help="Only this instance type, e.g. p3.16xlarge (repeatable)."
)

_NODES = typer.Option(
    None, "--nodes", help="Exactly N instances (--nodes 4) or a range (--nodes 2-8)."
)

_MAX_NODES = typer.Option(
    None, "--max-nodes", help="Most instances in one plan, as --nodes 1-N (default: 64)."
)

_OBJECTIVE = typer.Option(
    None,
    help="cost (cheapest within the deadline), time (fastest within the budget) or knee "
    "(of the frontier). Default: cost with --deadline, time with --budget alone, else knee.",
)

_GLOBAL_BATCH = typer.Option(
    None, "--global-batch", help="Plan exactly this global batch (samples per step)."
)

_MAX_GLOBAL_BATCH = typer.Option(
    None, "--max-global-batch", help="Largest global batch to try (default 32 x the profile's)."
)

_FIXED_BATCH = typer.Option(
    False,
    "--fixed-batch",
    help=f"Keep the profile's global batch; use only configurations that give every GPU at "
    f"least {FIXED_BATCH_MIN_LOCAL} samples per step (fewer GPUs, not tiny per-GPU batches).",
)

_PRECISION = typer.Option(
    None, "--precision", help="fp32, tf32, bf16 or fp16 (default: the profile's)."
)

_ALLOW_ON_DEMAND = typer.Option(
    False,
    "--allow-on-demand",
    help="Price spot plans with the launcher's on-demand fallback (a lost node goes on "
    "demand when the region has no spot capacity, and back to spot when it returns); refused "
    "with --on-demand, as --capacity-wait is.",
)

_CAPACITY_WAIT = typer.Option(
    None,
    "--capacity-wait",
    help="Seconds a spot job waits for capacity before it fails (default: twice the "
    "spot model's longest outage, at least 3600).",
)

_MIXED = typer.Option(True, "--mixed/--no-mixed", help="Also consider two-type clusters.")

_OPT_IN_ZONES = typer.Option(
    False,
    "--opt-in-zones",
    help="Also plan in AWS Local Zones and Wavelength Zones (your account must opt in).",
)

_DATA_GB = typer.Option(
    0.0,
    "--data-gb",
    help="Size of the training data in GB: its object storage for the job's hours, and its "
    "egress once when --data-region is another region or cloud (default 0).",
)

_DATA_REGION = typer.Option(
    None,
    "--data-region",
    help="Region the data is stored in (default: each plan's own region, no egress).",
)

_TOP = typer.Option(10, help="How many plans to show.")

_OUT = typer.Option(
    None, "--out", "-o", help="Write the plan JSON here (for `kplan launch --plan`)."
)

_WIDE = typer.Option(
    False,
    "--wide",
    help="More per plan: zone, price per hour, preemptions, step p90, samples/s, and the "
    "dollars of its disks, storage and egress, which its cost includes (about 130 columns).",
)

_COMPRESSION = typer.Option(
    None,
    "--compression",
    help="Gradient compression: none, fp16, bf16, powersgd:RANK or topk:RATIO[:ar|ag|auto] "
    "pins it on every plan (default: multi-node plans also consider fp16, powersgd:4 and "
    "topk:0.01 where one saves more than 5% of the time; the choice says why).",
)

_COMPRESSION_STEPS = typer.Option(
    [],
    "--compression-steps",
    metavar="SPEC=MULT[/SIGMA]",
    help="A measured statistical cost: the steps an option took to dense's loss, as a "
    "multiple of dense's, 0.25-100 (e.g. topk:0.01=1.3, from a run of each); it updates the "
    "option's prior by inverse variance (SIGMA: its log-space uncertainty, default 0.2, the "
    "spread of one pair of runs measured on the example MLP). Repeatable.",
)

_AS_JSON = typer.Option(False, "--json", help="Print JSON instead of tables.")


def estimate_command(
    example: str | None = _EXAMPLE,
    profile: list[Path] = _PROFILE,
    list_examples: bool = _LIST_EXAMPLES,
    epochs: float | None = _EPOCHS,
    dataset_size: int | None = _DATASET_SIZE,
    budget: float | None = _BUDGET,
    deadline: float | None = _DEADLINE,
    cloud: list[str] = _CLOUD,
    region: list[str] = _REGION,
    gpu: list[str] = _GPU,
    spot: bool | None = _SPOT,
    instance_type: list[str] = _INSTANCE_TYPE,
    nodes: str | None = _NODES,
    max_nodes: int | None = _MAX_NODES,
    objective: str | None = _OBJECTIVE,
    global_batch: int | None = _GLOBAL_BATCH,
    max_global_batch: int | None = _MAX_GLOBAL_BATCH,
    fixed_batch: bool = _FIXED_BATCH,
    precision: str | None = _PRECISION,
    allow_on_demand: bool = _ALLOW_ON_DEMAND,
    capacity_wait: float | None = _CAPACITY_WAIT,
    mixed: bool = _MIXED,
    opt_in_zones: bool = _OPT_IN_ZONES,
    data_gb: float = _DATA_GB,
    data_region: str | None = _DATA_REGION,
    top: int = _TOP,
    out: Path | None = _OUT,
    wide: bool = _WIDE,
    compression: str | None = _COMPRESSION,
    compression_steps: list[str] = _COMPRESSION_STEPS,
    as_json: bool = _AS_JSON,
) -> None:
    _run(_Args(**locals()))


@dataclass(frozen=True)
class _Args:
    """The flags of one `kplan estimate` call."""

    example: str | None
    profile: list[Path]
    list_examples: bool
    epochs: float | None
    dataset_size: int | None
    budget: float | None
    deadline: float | None
    cloud: list[str]
    region: list[str]
    gpu: list[str]
    spot: bool | None
    instance_type: list[str]
    nodes: str | None
    max_nodes: int | None
    objective: str | None
    global_batch: int | None
    max_global_batch: int | None
    fixed_batch: bool
    precision: str | None
    allow_on_demand: bool
    capacity_wait: float | None
    mixed: bool
    opt_in_zones: bool
    data_gb: float
    data_region: str | None
    top: int
    out: Path | None
    wide: bool
    compression: str | None
    compression_steps: list[str]
    as_json: bool


def _run(a: _Args) -> None:
    from kplan.app import planning
    from kplan.planner.workload import pick_source

    checked = _check_flags(a)
    if a.list_examples:
        planned = [f for f, on in (("--example", a.example is not None),
                                   ("--profile", bool(a.profile)), ("--out", a.out is not None))
                   if on]  # fmt: skip
        if planned:
            raise InputError(
                f"--list-examples lists the examples and plans nothing: {', '.join(planned)} "
                "would be unused",
                hint="run `kplan estimate --list-examples` alone, then plan one with --example",
            )
        rows = planning.example_rows()
        if a.as_json:
            typer.echo(json.dumps([asdict(r) for r in rows], indent=1))
        else:
            from kplan.cli.render.estimate import render_examples

            render_examples(rows)
        return
    if (a.example is None) == (not a.profile):
        raise InputError(
            "give exactly one of --example or --profile",
            hint=f"e.g. kplan estimate --example imagenet-resnet50 "
            f"(examples: {', '.join(planning.example_names())})",
        )
    if a.example:
        profiles = [planning.load_example(a.example)]
    else:
        profiles = [planning.load_profile(p) for p in a.profile]
    prof, other = pick_source(profiles, checked.precision)
    options = _options(a, checked)
    result = planning.estimate(
        prof, options, epochs=a.epochs, dataset_size=a.dataset_size, other=other
    )
    source = f"example {a.example}" if a.example else ", ".join(str(p) for p in a.profile)
    plan_file = a.out if a.out is not None else Path("plan.json")
    launch = planning.launch_command(
        result.plan, planning.script_for(prof), plan_file, a.budget, a.deadline
    )
    doc = result.plan.to_dict()
    doc["profile"] = prof.name
    doc["catalog"] = result.catalog.version
    assumed = planning.assumptions(result, options, source)
    doc["assumptions"] = asdict(assumed)  # tuples write as JSON lists
    doc["next_command"] = launch
    if a.out is not None:
        from kplan.core.files import write_json

        write_json(a.out, doc)
    if a.as_json:
        typer.echo(json.dumps(doc, indent=1))
        return
    from kplan.cli.render.estimate import NextStep, render_plan

    step = NextStep(launch, a.out, planning.script_for(prof) is None)
    render_plan(result.plan, assumed, result.catalog.version, step, wide=a.wide)


@dataclass(frozen=True)
class _Checked:
    """What the flag checks parsed: the node range, the precision, the measured costs."""

    node_pin: tuple[int, int] | None
    precision: Precision | None
    measured: tuple[tuple[str, float, float], ...]


def _check_flags(a: _Args) -> _Checked:
    """Every flag checked (one line and a hint on bad input) before anything is read."""
    from kplan.app import pins
    from kplan.core import flags
    from kplan.core.precision import check_precision
    from kplan.planner.compression import parse_measured

    flags.number("--epochs", a.epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 90")
    flags.integer(
        "--dataset-size", a.dataset_size, high=flags.MAX_SAMPLES, hint="samples per epoch"
    )
    flags.number("--budget", a.budget, high=flags.MAX_USD, hint="USD, e.g. --budget 50")
    flags.number("--deadline", a.deadline, high=flags.MAX_HOURS, hint="hours, e.g. --deadline 12")
    flags.integer("--max-nodes", a.max_nodes, high=1024, hint="e.g. --max-nodes 16")
    node_pin = pins.node_range(a.nodes)
    if node_pin is not None and a.max_nodes is not None:
        raise InputError(
            "give --nodes or --max-nodes, not both", hint="--nodes 1-16 is --max-nodes 16"
        )
    pins.check_batches(a.global_batch, a.max_global_batch, a.fixed_batch)
    prec = check_precision(a.precision) if a.precision is not None else None
    flags.texts("--instance-type", a.instance_type, hint="e.g. p3.16xlarge")
    flags.integer("--top", a.top, high=10_000, hint="e.g. --top 10")
    flags.number(
        "--data-gb", a.data_gb, high=flags.MAX_DATA_GB, low_open=False, hint=flags.DATA_HINT
    )
    flags.text("--data-region", a.data_region, hint="e.g. us-east-1 (kplan catalog list)")
    flags.number("--capacity-wait", a.capacity_wait, high=30 * 86400.0, hint="seconds, e.g. 3600")
    flags.text("--objective", a.objective, hint="cost, time or knee")
    flags.texts("--cloud", a.cloud, hint="aws or gcp")
    flags.texts("--region", a.region, hint="e.g. us-east-1")
    flags.texts("--gpu", a.gpu, hint="e.g. T4, A100")
    flags.text("--example", a.example, hint="see --list-examples")
    flags.text("--compression", a.compression, hint="e.g. powersgd:4 or topk:0.01")
    flags.texts("--compression-steps", a.compression_steps, hint="e.g. topk:0.01=1.3")
    measured = tuple(parse_measured(t) for t in a.compression_steps)
    if a.out is not None:
        from kplan.core.files import check_writable

        check_writable(a.out, "--out", [("the --profile", p) for p in a.profile])
    return _Checked(node_pin, prec, measured)


def _options(a: _Args, checked: _Checked) -> SearchOptions:
    """The search the flags ask for."""
    from kplan.planner.extra_costs import DataSpec
    from kplan.planner.search import SearchOptions, default_objective

    node_pin, prec, measured = checked.node_pin, checked.precision, checked.measured
    markets = ("on-demand", "spot") if a.spot is None else (("spot",) if a.spot else ("on-demand",))
    objective = a.objective if a.objective is not None else default_objective(a.budget, a.deadline)
    return SearchOptions(
        clouds=tuple(c.lower() for c in a.cloud),
        regions=tuple(a.region),
        gpus=tuple(a.gpu),
        markets=markets,
        instance_types=tuple(a.instance_type),
        min_nodes=node_pin[0] if node_pin else 1,
        max_nodes=node_pin[1] if node_pin else (a.max_nodes or 64),
        global_batch=a.global_batch,
        max_global_batch=a.max_global_batch,
        min_local_batch=FIXED_BATCH_MIN_LOCAL if a.fixed_batch else 1,
        precision=prec,
        budget_usd=a.budget,
        deadline_hours=a.deadline,
        objective=objective,  # type: ignore[arg-type]
        fixed_global_batch=a.fixed_batch,
        mixed=a.mixed,
        opt_in_zones=a.opt_in_zones,
        top=a.top,
        allow_on_demand=a.allow_on_demand,
        capacity_wait_s=a.capacity_wait,
        compression=a.compression,
        compression_stats=measured,
        data=DataSpec(a.data_gb, a.data_region),
    )
