"""``kplan launch`` as a library call: from the user's flags to a validated ``JobSpec``.

A cloud job takes its nodes, batch and predictions from a Plan: a file written by
``kplan estimate --out`` (``--plan``) or a search run now from a profile (``--profile`` or
``--example``), restricted to the cloud and market asked for and to the budget and
deadline. A local job runs ``--nodes`` worker groups of ``--workers-per-node`` workers on this
machine, free or at ``--price`` USD/h for the machine; with a profile (or a local plan) it is
predicted first (``kplan/app/local_plan.py``) so that ``kplan report`` compares prediction and run.
"""

from __future__ import annotations

import math
import socket
import sys
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kplan.core.errors import DataFileError, InputError, SchemaVersionError
from kplan.core.files import read_json
from kplan.core.precision import check_precision
from kplan.launcher.jobspec import (
    CLOUDS,
    JobSpec,
    NodeSpec,
    ZoneOffer,
    check_job_id,
    nodes_from_plan_row,
)
from kplan.planner.plan import PLAN_SCHEMA


@dataclass(frozen=True)
class LaunchRequest:
    script: Path
    budget_usd: float
    args: tuple[str, ...] = ()
    cloud: str | None = None  # None: the plan's cloud, else local
    deadline_h: float | None = None
    spot: bool | None = None  # None: both markets
    plan_file: Path | None = None
    profile: Path | None = None
    example_profile: str | None = None
    region: str | None = None
    # Several --cloud / --region: the places a plan made now chooses from (cli/launch_flags.py)
    clouds: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    storage_uri: str | None = None
    nodes: int = 1  # local only
    workers_per_node: int = 1  # local only
    allow_on_demand: bool = False
    check_interval_s: float | None = None
    max_restarts: int | None = None
    job_id: str | None = None
    adapt: bool = False
    explore: bool = False
    max_nodes: int | None = None
    policies: tuple[str, ...] = ()
    explore_trials: int | None = None
    replan_interval_s: float | None = None
    checkpoint_interval_s: float | None = None
    max_replacements: int | None = None  # None: the plan's (kplan/planner/spotplan.py), else 20
    capacity_wait_s: float | None = None  # None: the plan's, else 900 s
    image: str | None = None  # clouds: the nodes' boot image
    pip_index_url: str | None = None  # clouds: the nodes' pip --index-url
    install_deps: bool = True  # clouds: False when the image already has torch etc.
    network: str | None = None  # gcp: VPC network
    subnet: str | None = None  # gcp: subnetwork
    service_account: str | None = None  # gcp: the instances' service account
    external_ip: bool = True  # gcp: False gives the instances no public IP
    # Pins for planning now (as in kplan estimate; --plan-nodes is estimate's --nodes)
    instance_types: tuple[str, ...] = ()
    plan_nodes: str | None = None  # "4" or "2-8"
    global_batch: int | None = None
    max_global_batch: int | None = None
    fixed_batch: bool = False
    precision: str | None = None
    # Gradient compression (core/compression_spec.py) and SelSync (runtime/selsync.py): what the
    # workers run; a plan made now is searched with the compression pinned
    compression: str | None = None
    sync_policy: str | None = None
    # The work to plan for (kplan estimate's --epochs / --dataset-size; default: the profile's)
    epochs: float | None = None
    dataset_size: int | None = None
    price_usd_per_hour: float | None = None  # local: this machine's price (None: free)


def _check_common(req: LaunchRequest) -> None:
    if not req.script.is_file():
        raise InputError(f"training script not found: {req.script}", hint="check the path")
    if not req.budget_usd >= 0:
        raise InputError(f"--budget {req.budget_usd} must be >= 0", hint="USD, e.g. --budget 20")
    if req.deadline_h is not None and not req.deadline_h > 0:
        raise InputError(f"--deadline {req.deadline_h} must be > 0", hint="hours, e.g. 12")
    if req.cloud is not None and req.cloud not in CLOUDS:
        raise InputError(f"unknown cloud {req.cloud!r}", hint=f"one of: {', '.join(CLOUDS)}")
    if req.job_id is not None:
        check_job_id(req.job_id)
    _check_numbers(req)
    _check_comm_options(req)
    given = [x for x in (req.plan_file, req.profile, req.example_profile) if x is not None]
    if len(given) > 1:
        raise InputError(
            "give at most one of --plan, --profile and --example",
            hint="--plan reuses a saved plan; the others plan now",
        )


def _check_numbers(req: LaunchRequest) -> None:
    """Every numeric launch flag finite and below a sane bound (issue 10: --budget inf, --nodes
    100000 on this machine); ``JobSpec`` checks the lower bounds with its own messages."""
    from kplan.core import flags

    lowest = -(2**62)

    flags.number("--budget", req.budget_usd, low_open=False, high=flags.MAX_USD, hint="USD")
    flags.number("--deadline", req.deadline_h, low=-math.inf, high=flags.MAX_HOURS, hint="hours")
    local = req.cloud in (None, "local") and req.plan_file is None
    flags.integer(
        "--nodes",
        req.nodes,
        low=lowest,
        high=flags.MAX_LOCAL_NODES if local else flags.MAX_NODES,
        hint="worker groups on this machine" if local else "",
    )
    flags.integer(
        "--workers-per-node",
        req.workers_per_node,
        low=lowest,
        high=flags.MAX_LOCAL_WORKERS if local else 1024,
        hint="workers (processes) per group",
    )
    flags.integer("--max-nodes", req.max_nodes, low=lowest, high=flags.MAX_NODES)
    flags.integer("--max-restarts", req.max_restarts, low=lowest, high=10_000)
    flags.integer("--explore-trials", req.explore_trials, low=lowest, high=1000)
    flags.integer("--max-replacements", req.max_replacements, low=0, high=100_000, hint="e.g. 40")
    flags.number(
        "--capacity-wait", req.capacity_wait_s, low_open=False, high=30 * 86400.0, hint="seconds"
    )
    for flag, seconds in (
        ("--check-interval", req.check_interval_s),
        ("--replan-interval", req.replan_interval_s),
        ("--checkpoint-interval", req.checkpoint_interval_s),
    ):
        flags.number(flag, seconds, low=-math.inf, high=flags.MAX_SECONDS, hint="seconds")
    for flag, value in (("--region", req.region), ("--storage", req.storage_uri)):
        flags.text(flag, value)
    flags.text("--example", req.example_profile)
    flags.number(
        "--price", req.price_usd_per_hour, low_open=False, high=flags.MAX_USD,
        hint="USD per hour for this machine, e.g. --price 0.5",
    )  # fmt: skip
    flags.number("--epochs", req.epochs, high=flags.MAX_EPOCHS, hint="e.g. --epochs 5")
    flags.integer("--dataset-size", req.dataset_size, high=flags.MAX_SAMPLES, hint="samples")


def _options(req: LaunchRequest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if req.check_interval_s is not None:
        out["check_interval_s"] = req.check_interval_s
    if req.max_restarts is not None:
        out["max_restarts"] = req.max_restarts
    if req.job_id is not None:
        out["job_id"] = req.job_id
    if req.storage_uri is not None:
        out["storage_uri"] = req.storage_uri
    out["adapt"] = req.adapt
    for name in ("network", "subnet", "service_account"):  # gcp only (_check_gcp_placement)
        if getattr(req, name) is not None:
            out[name] = getattr(req, name)
    if not req.external_ip:
        out["external_ip"] = False
    out["explore"] = req.explore
    if req.sync_policy is not None:
        out["sync_policy"] = req.sync_policy
    out["policies"] = tuple(policy_paths(req.policies, req.script, req.cloud or "local"))
    for name in (
        "max_nodes",
        "explore_trials",
        "replan_interval_s",
        "checkpoint_interval_s",
        "max_replacements",
        "capacity_wait_s",
    ):
        value = getattr(req, name)
        if value is not None:
            out[name] = value
    return out


def policy_paths(specs: tuple[str, ...], script: Path, cloud: str) -> list[str]:
    """``--policy`` values as the workers will see them: a ``FILE.py:Class`` is checked here
    and made absolute (local) or relative to the script's folder, which is what clouds ship."""
    out = []
    for spec in specs:
        where, sep, name = spec.rpartition(":")
        if not sep or not where.endswith(".py"):
            dotted = where.split(".") if sep else [spec]
            if not all(p.isidentifier() for p in dotted) or (sep and not name.isidentifier()):
                raise InputError(
                    f"--policy {spec[:80]!r} is not a name, FILE.py:Class or module:Class",
                    hint="e.g. --policy goodput or --policy policies.py:Plateau",
                )
            out.append(spec)  # a built-in name or module:Class, checked by the runtime
            continue
        path = Path(where).resolve()
        if not path.is_file():
            raise InputError(f"--policy {spec}: no file {where}", hint="give FILE.py:ClassName")
        if cloud == "local":
            out.append(f"{path}:{name}")
            continue
        folder = script.resolve().parent
        if folder not in path.parents:
            raise InputError(
                f"--policy {spec}: the file is outside {folder}, which is what the nodes get",
                hint="put the policy file beside the training script",
            )
        out.append(f"{path.relative_to(folder)}:{name}")
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (plus the next few, for later generations: best effort)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_spec(req: LaunchRequest) -> JobSpec:
    """The job to launch, validated; plans now when the cloud is aws or gcp without --plan."""
    _check_common(req)
    plan_doc = read_plan(req.plan_file) if req.plan_file is not None else None
    cloud = req.cloud or (plan_doc["chosen"]["cloud"] if plan_doc else "local")
    if req.clouds:  # several: the plan made now picks one; checks run for the first until then
        cloud = req.clouds[0]
    _check_pins(req, plans_now=cloud != "local" and plan_doc is None, local=cloud == "local")
    _check_work(req, plans_now=plan_doc is None and (req.profile or req.example_profile))
    if cloud == "local":
        prediction = local_prediction(req, plan_doc)
        if req.region not in (None, "local"):
            raise InputError(f"the local cloud has no region {req.region!r}", hint="drop --region")
        if req.image is not None or req.pip_index_url is not None or not req.install_deps:
            raise InputError(
                "--image, --pip-index-url and --no-install-deps are for --cloud aws or gcp",
                hint="a local job runs this machine's own Python and kplan",
            )
        _check_gcp_placement(req, cloud)
        options = _options(req)
        options.setdefault("rdzv_port", free_port())
        if req.precision is not None:
            options["precision"] = check_precision(req.precision)
        if req.compression is not None:
            options["compression"] = req.compression
        nodes, workers = req.nodes, req.workers_per_node
        if prediction is not None:
            row = prediction["chosen"]
            nodes, workers = int(row["nodes"]), int(row["groups"][0]["gpus_per_node"])
            options["global_batch"] = int(row["global_batch"])
            options.update(
                predicted_hours=float(row["hours"]),
                predicted_cost_usd=float(row["cost_usd"]),
                predicted_cost_p90_usd=float(
                    row.get("batch_schedule_cost_p90_usd") or row["cost_p90_usd"]
                ),
                plan=prediction,
            )
        spec = JobSpec.local(
            str(req.script.resolve()),
            req.args,
            nodes=nodes,
            workers_per_node=workers,
            budget_usd=req.budget_usd,
            deadline_h=req.deadline_h,
            python=sys.executable,
            **options,
        )
        price = req.price_usd_per_hour or 0.0
        if price > 0:  # the machine's price, shared by its worker groups
            priced = tuple(replace(n, usd_per_hour=price / nodes) for n in spec.nodes)
            spec = replace(spec, nodes=priced)
        return spec
    if req.price_usd_per_hour is not None:
        raise InputError(
            f"--price is for a local job; {cloud} prices come from the catalog",
            hint="drop --price (kplan catalog update refreshes the catalog's prices)",
        )
    _check_node_install(req)
    _check_gcp_placement(req, cloud)
    if plan_doc is None:
        plan_doc = plan_now(req, cloud)
        cloud = plan_doc["chosen"]["cloud"] if req.clouds else cloud
    return with_node_install(spec_from_plan(req, plan_doc, cloud), req)


def _check_work(req: LaunchRequest, *, plans_now: object) -> None:
    given = [
        flag
        for flag, value in (("--epochs", req.epochs), ("--dataset-size", req.dataset_size))
        if value is not None
    ]
    if given and not plans_now:
        raise InputError(
            f"{', '.join(given)}: only for a plan made now from --profile or --example",
            hint="a saved --plan carries its own work (kplan estimate --epochs ... --out)",
        )


def local_prediction(req: LaunchRequest, plan_doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The local job's plan: a local plan file as given, or one made now from the profile
    (``kplan/app/local_plan.py``); None without either (the job runs unpredicted)."""
    from kplan.app import planning
    from kplan.app.local_plan import local_plan

    price = req.price_usd_per_hour or 0.0
    if plan_doc is not None:
        row = plan_doc["chosen"]
        if row.get("cloud") != "local":
            raise InputError(
                f"the plan is for {row.get('cloud')!r}; a local job runs on this machine",
                hint="give --profile p.json (kplan profile) to predict the local run, or drop "
                "--cloud local to run the plan",
            )
        if req.price_usd_per_hour is not None and price != float(row.get("usd_per_hour", 0.0)):
            raise InputError(
                f"--price {price:g}: the local plan was priced at ${row.get('usd_per_hour')}/h",
                hint="drop --price, or make the plan again with it",
            )
        from kplan.core import flags

        group = row["groups"][0]
        if len(row["groups"]) != 1 or int(row["nodes"]) > flags.MAX_LOCAL_NODES:
            raise DataFileError(
                f"{req.plan_file}: a local plan has one group of at most "
                f"{flags.MAX_LOCAL_NODES} nodes",
                hint="make it again with kplan launch --profile",
            )
        if int(group["gpus_per_node"]) > flags.MAX_LOCAL_WORKERS:
            raise DataFileError(
                f"{req.plan_file}: {group['gpus_per_node']} workers per group is more than "
                f"{flags.MAX_LOCAL_WORKERS}",
                hint="make it again with kplan launch --profile",
            )
        return plan_doc
    if req.profile is None and req.example_profile is None:
        return None
    if req.nodes < 1 or req.workers_per_node < 1:
        return None  # JobSpec.local refuses them with its own message
    from kplan.profiler.examples import EXAMPLES

    if req.example_profile in EXAMPLES and req.example_profile not in planning.example_names():
        raise InputError(
            f"--example {req.example_profile}: a job `kplan profile --example` measures, not a "
            "built-in profile",
            hint=f"kplan profile --example {req.example_profile} --out p.json, then --profile "
            "p.json (it measures this machine in about half a minute)",
        )
    prof = (
        planning.load_example(req.example_profile)
        if req.example_profile is not None
        else planning.load_profile(req.profile)  # type: ignore[arg-type]
    )
    return local_plan(
        prof,
        nodes=req.nodes,
        workers_per_node=req.workers_per_node,
        usd_per_hour=price,
        epochs=req.epochs,
        dataset_size=req.dataset_size,
        precision=req.precision,
    )


def _check_gcp_placement(req: LaunchRequest, cloud: str) -> None:
    """--network, --subnet, --service-account and --no-external-ip: GCP only, well formed."""
    given = [
        flag
        for flag, value in (
            ("--network", req.network),
            ("--subnet", req.subnet),
            ("--service-account", req.service_account),
        )
        if value is not None
    ] + ([] if req.external_ip else ["--no-external-ip"])
    if given and cloud != "gcp":
        raise InputError(
            f"{', '.join(given)}: for --cloud gcp only",
            hint="on AWS set KPLAN_AWS_VPC, KPLAN_AWS_SUBNET and KPLAN_AWS_INSTANCE_PROFILE",
        )
    from kplan.launcher.providers.gcp_config import check_network, check_service_account

    if req.network is not None or req.subnet is not None:
        check_network(req.network or "default", req.subnet)
    if req.service_account is not None:
        check_service_account(req.service_account)


def _check_node_install(req: LaunchRequest) -> None:
    from kplan.launcher.wheel import check_index_url

    if req.pip_index_url is not None:
        check_index_url(req.pip_index_url)
    image = req.image
    if image is not None and not (
        0 < len(image) <= 1024 and all(c.isprintable() and not c.isspace() for c in image)
    ):
        raise InputError(
            f"--image {image[:80]!r} is not an image name",
            hint="an AMI id (ami-...) or resolve:ssm:<parameter>; a GCP image or family path",
        )


def with_node_install(spec: JobSpec, req: LaunchRequest) -> JobSpec:
    """``spec`` with what its nodes install: the wheel of this kplan (built now or reused from
    the cache, kplan/launcher/wheel.py) and the dependencies pinned to this machine's versions."""
    from kplan.launcher.wheel import build_wheel, node_requirements

    wheel = build_wheel()
    return replace(
        spec,
        kplan_wheel=str(wheel.path),
        kplan_wheel_sha256=wheel.sha256,
        node_requirements=node_requirements(),
        pip_index_url=req.pip_index_url,
        install_deps=req.install_deps,
        image=req.image or spec.image,
    )


def read_plan(path: Path) -> dict[str, Any]:
    doc = read_json(path, "plan")
    source = str(path)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith("kplan.plan/"):
        raise DataFileError(
            f"{source}: not a kplan plan (schema {schema!r})",
            hint="write one with kplan estimate ... --out plan.json",
        )
    major = schema.partition("/")[2].split(".")[0]
    if major != PLAN_SCHEMA.partition("/")[2].split(".")[0]:
        raise SchemaVersionError(
            f"{source}: plan schema {schema} is not supported",
            hint=f"this kplan reads {PLAN_SCHEMA}",
        )
    if not isinstance(doc.get("chosen"), dict):
        raise DataFileError(f"{source}: the plan has no chosen row", hint="re-run kplan estimate")
    check_plan_row(doc["chosen"], source)
    return dict(doc)


def check_plan_row(row: dict[str, Any], source: str) -> None:
    """The chosen row's counts are bounded integers that agree (a plan of 10**7 nodes, a bool
    batch or a group list that is not one are refused before anything loops over them)."""
    from kplan.core import flags

    def count(where: dict[str, Any], key: str, high: int, name: str) -> int:
        value = where.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise DataFileError(
                f"{source}: the plan's {name} {str(value)[:40]!r} is not an integer in [1, {high}]",
                hint="re-create the plan with kplan estimate --out",
            )
        return value

    groups = row.get("groups")
    if not isinstance(groups, list) or not 1 <= len(groups) <= 64:
        raise DataFileError(
            f"{source}: the plan's chosen.groups is not a list of 1 to 64 groups",
            hint="re-create the plan with kplan estimate --out",
        )
    total = 0
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise DataFileError(f"{source}: chosen.groups[{i}] is not an object", hint="")
        total += count(g, "nodes", flags.MAX_NODES, f"chosen.groups[{i}].nodes")
        count(g, "gpus_per_node", 64, f"chosen.groups[{i}].gpus_per_node")
        price = g.get("usd_per_hour")
        if isinstance(price, bool) or not isinstance(price, int | float) or not price >= 0:
            raise DataFileError(
                f"{source}: chosen.groups[{i}].usd_per_hour {str(price)[:40]!r} is not a price",
                hint="re-create the plan with kplan estimate --out",
            )
    if count(row, "nodes", flags.MAX_NODES, "chosen.nodes") != total:
        raise DataFileError(
            f"{source}: chosen.nodes {row['nodes']} is not the sum of its groups' ({total})",
            hint="re-create the plan with kplan estimate --out",
        )
    count(row, "global_batch", flags.MAX_BATCH, "chosen.global_batch")
    count(row, "accum_steps", flags.MAX_BATCH, "chosen.accum_steps")


def _check_comm_options(req: LaunchRequest) -> None:
    """``--compression`` and ``--sync-policy`` are parsed as the workers will parse them; a
    saved plan keeps the compression it was priced with."""
    from kplan.core.compression_spec import parse_compression
    from kplan.runtime.selsync import parse_sync_policy

    if req.compression is not None:
        parse_compression(req.compression, "--compression")
        if req.plan_file is not None:
            raise InputError(
                "--compression: a saved --plan runs the compression it was priced with",
                hint="re-plan with kplan estimate --compression ... --out plan.json",
            )
    if req.sync_policy is not None:
        parse_sync_policy(req.sync_policy, "--sync-policy")


def _check_pins(req: LaunchRequest, *, plans_now: bool, local: bool) -> None:
    """The pinning flags are checked like kplan estimate's, and only where launch plans. On a
    local job ``--precision`` is what the workers train in, not a pin: checked, not refused."""
    from kplan.app import pins
    from kplan.core import flags
    from kplan.core.precision import check_precision

    given = [
        name
        for name, on in (
            ("--instance-type", bool(req.instance_types)),
            ("--plan-nodes", req.plan_nodes is not None),
            ("--global-batch", req.global_batch is not None),
            ("--max-global-batch", req.max_global_batch is not None),
            ("--fixed-batch", req.fixed_batch),
            ("--precision", req.precision is not None and not local),
        )
        if on
    ]
    if req.precision is not None:
        check_precision(req.precision)
    if not given:
        return
    flags.texts("--instance-type", req.instance_types, hint="e.g. p3.16xlarge")
    pins.node_range(req.plan_nodes, "--plan-nodes")
    pins.check_batches(req.global_batch, req.max_global_batch, req.fixed_batch)
    if not plans_now:
        raise InputError(
            f"{', '.join(given)}: only for a plan made now, and this launch makes none",
            hint="use them with --cloud aws|gcp and --profile or --example, or in "
            "kplan estimate --out plan.json",
        )


def plan_now(req: LaunchRequest, cloud: str) -> dict[str, Any]:
    """Search now (``kplan estimate``) for a plan on ``cloud``."""
    from kplan.app import pins, planning
    from kplan.core.precision import check_precision
    from kplan.planner.search import SearchOptions, default_objective

    if req.example_profile is None and req.profile is None:
        raise InputError(
            f"--cloud {cloud} needs a plan: --plan FILE, --profile FILE or --example NAME",
            hint="e.g. kplan estimate --profile p.json --cloud aws --out plan.json",
        )
    prof = (
        planning.load_example(req.example_profile)
        if req.example_profile is not None
        else planning.load_profile(req.profile)  # type: ignore[arg-type]
    )
    markets: tuple[str, ...] = ("on-demand", "spot")
    if req.spot is not None:
        markets = ("spot",) if req.spot else ("on-demand",)
    node_pin = pins.node_range(req.plan_nodes, "--plan-nodes")
    options = SearchOptions(
        clouds=req.clouds or (cloud,),
        regions=req.regions or ((req.region,) if req.region else ()),
        markets=markets,
        budget_usd=req.budget_usd if req.budget_usd > 0 else None,
        deadline_hours=req.deadline_h,
        objective=default_objective(req.budget_usd or None, req.deadline_h),
        mixed=False,
        instance_types=req.instance_types,
        global_batch=req.global_batch,
        max_global_batch=req.max_global_batch,
        fixed_global_batch=req.fixed_batch,
        min_local_batch=pins.FIXED_BATCH_MIN_LOCAL if req.fixed_batch else 1,
        precision=check_precision(req.precision) if req.precision is not None else None,
        compression=req.compression,
        min_nodes=node_pin[0] if node_pin else 1,
        max_nodes=node_pin[1] if node_pin else 64,
        allow_on_demand=req.allow_on_demand,
    )
    result = planning.estimate(prof, options, epochs=req.epochs, dataset_size=req.dataset_size)
    doc = result.plan.to_dict()
    doc["profile"] = prof.name
    doc["catalog"] = result.catalog.version
    return doc


def _offers(
    cloud: str, region: str, types: set[str], zones: Collection[str] = ()
) -> tuple[ZoneOffer, ...]:
    """The zones the launcher may replace nodes in: the region's offers of the plan's types,
    less opt-in zones (AWS Local/Wavelength: the account may not have opted in) unless the
    plan itself runs in one (``zones``)."""
    from kplan.catalogs import load_catalog

    out = []
    for o in load_catalog().offers:
        if o.cloud == cloud and o.region == region and o.instance_type in types:
            if o.opt_in and o.zone not in zones:
                continue
            out.append(ZoneOffer(o.instance_type, o.zone, o.market, o.usd_per_hour))
    return tuple(out)


def spec_from_plan(req: LaunchRequest, plan: dict[str, Any], cloud: str) -> JobSpec:
    row = plan["chosen"]
    if row.get("cloud") != cloud:
        raise InputError(
            f"the plan is for {row.get('cloud')!r}, not --cloud {cloud}",
            hint="drop --cloud or plan for that cloud",
        )
    if req.region is not None and req.region != row.get("region"):
        raise InputError(
            f"the plan is for region {row.get('region')!r}, not --region {req.region}",
            hint="drop --region or plan for that region",
        )
    try:
        _check_prices(row)
        region = str(row["region"])
        nodes, price_notes = reprice_from_catalog(nodes_from_plan_row(row), cloud, region)
        if req.spot is not None:
            want = "spot" if req.spot else "on-demand"
            bad = [n.node_rank for n in nodes if n.market != want]
            if bad:
                raise InputError(
                    f"the plan puts node(s) {bad} on the other market than --{want}",
                    hint="plan with the same market flag (kplan estimate --spot/--on-demand)",
                )
        opts = {k: v for k, v in _options(req).items() if k != "job_id"}
        opts.setdefault("checkpoint_interval_s", float(row["checkpoint_interval_s"]) or None)
        # the recovery rules the plan was priced with (plans before them: the launcher's)
        if "max_replacements" in row and row.get("market") != "on-demand":
            opts.setdefault("max_replacements", int(row["max_replacements"]))
            opts.setdefault("capacity_wait_s", float(row["capacity_wait_s"]))
        return JobSpec(
            job_id=req.job_id or _new_id(),
            cloud=cloud,
            region=region,
            script=str(req.script.resolve()),
            args=req.args,
            nodes=nodes,
            budget_usd=req.budget_usd,
            deadline_h=req.deadline_h,
            allow_on_demand=req.allow_on_demand or bool(row.get("allow_on_demand", False)),
            offers=_offers(
                cloud, region, {n.instance_type for n in nodes}, {n.zone for n in nodes}
            ),
            global_batch=int(row["global_batch"]),
            accum_steps=int(row["accum_steps"]),
            # the plan's global-batch schedule (kplan/planner/batchsched.py): the workers run it and
            # the prediction is its own
            batch_schedule=_plan_schedule(row),
            predicted_hours=float(row.get("batch_schedule_hours") or row["hours"]),
            predicted_cost_usd=float(row.get("batch_schedule_cost_usd") or row["cost_usd"]),
            predicted_cost_p90_usd=float(
                row.get("batch_schedule_cost_p90_usd") or row["cost_p90_usd"]
            ),
            plan=plan,
            price_notes=price_notes,
            # what the plan was made for: the workers train in it (KPLAN_PRECISION)
            precision=_plan_precision(row, plan),
            # the plan's gradient compression (kplan/planner/compression.py) runs in the workers
            compression=str(row.get("compression") or "none"),
            **opts,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise DataFileError(
            f"the plan's chosen row is malformed ({type(err).__name__}: {err})",
            hint="re-create it with kplan estimate --out",
        ) from None


def _plan_schedule(row: dict[str, Any]) -> str | None:
    """The chosen row's batch schedule as ``KPLAN_BATCH_SCHEDULE`` JSON (None: none)."""
    import json

    from kplan.runtime.batch_schedule import parse

    entries = row.get("batch_schedule")
    if entries is None:
        return None
    text = json.dumps(entries)
    try:
        return parse(text, "chosen.batch_schedule").to_json()
    except InputError as err:
        raise DataFileError(
            f"the plan's {err.message}", hint="re-create it with kplan estimate --out"
        ) from None


def _plan_precision(row: dict[str, Any], plan: dict[str, Any]) -> str:
    """The chosen row's precision (plans before precision existed: fp32)."""
    value = row.get("precision", plan.get("precision", "fp32"))
    try:
        return check_precision(value, "chosen.precision")
    except InputError as err:
        raise DataFileError(
            f"the plan's {err.message}", hint="re-create it with kplan estimate --out"
        ) from None


def _check_prices(row: dict[str, Any]) -> None:
    """The plan row's money and time fields are finite and >= 0 (the nodes' are checked by
    ``NodeSpec``)."""
    for name in ("usd_per_hour", "cost_usd", "cost_p90_usd", "hours"):
        value = row.get(name)
        if value is None:
            continue
        number = float(value) if isinstance(value, (int, float)) else math.nan
        if isinstance(value, bool) or not (math.isfinite(number) and number >= 0):
            raise DataFileError(
                f"the plan's {name} {value!r} is not a finite number >= 0",
                hint="re-create the plan with kplan estimate --out",
            )


def reprice_from_catalog(
    nodes: tuple[NodeSpec, ...], cloud: str, region: str
) -> tuple[tuple[NodeSpec, ...], tuple[str, ...]]:
    """The plan's nodes at the higher of the current catalog's and the plan's price
    (``kplan/launcher/pricing.py``), and a note for each price that differs by more than 5%."""
    from kplan.launcher.pricing import catalog_prices, reprice

    offers, version = catalog_prices(cloud, region)
    return reprice(nodes, cloud, region, offers, version)


def _new_id() -> str:
    from kplan.launcher.jobspec import new_job_id

    return new_job_id()
