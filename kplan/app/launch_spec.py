"""From a typed ``Plan`` to the ``JobSpec`` of a cloud job (``spec_from_plan``), a plan made now
for it (``plan_now``), and what both need: the monitor's options from the flags, the zones a
replacement may go to and the catalog's prices (``kplan/launcher/pricing.py``), taken from the
catalog the plan was priced with (``kplan/app/plan_files.py``: shipped or the user's)."""

from __future__ import annotations

import socket
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, TypedDict

from kplan.core.errors import InputError
from kplan.launcher.jobspec import JobSpec, NodeSpec, nodes_from_plan_row
from kplan.launcher.move_spec import MoveRegion, ZoneOffer
from kplan.planner.catalog import Catalog
from kplan.planner.plan import Plan, PlanRow

if TYPE_CHECKING:
    from kplan.app.launch_request import LaunchRequest


class SpecOptions(TypedDict, total=False):
    """``JobSpec`` keyword arguments the flags set; the rest keep ``JobSpec``'s defaults."""

    check_interval_s: float
    max_restarts: int
    storage_uri: str
    adapt: bool
    explore: bool
    network: str
    subnet: str
    service_account: str
    external_ip: bool
    sync_policy: str
    policies: tuple[str, ...]
    max_nodes: int
    explore_trials: int
    replan_interval_s: float
    checkpoint_interval_s: float | None
    max_replacements: int
    capacity_wait_s: float
    lease_s: float
    idle_s: float
    move_regions: tuple[MoveRegion, ...]
    checkpoint_gb: float
    copy_gbps: float


def options(req: LaunchRequest) -> SpecOptions:
    """The ``JobSpec`` keyword arguments the flags set."""
    from kplan.app.launch_checks import policy_paths

    out = SpecOptions(
        adapt=req.adapt,
        explore=req.explore,
        policies=tuple(policy_paths(req.policies, req.script, req.cloud or "local")),
    )
    if req.check_interval_s is not None:
        out["check_interval_s"] = req.check_interval_s
    if req.max_restarts is not None:
        out["max_restarts"] = req.max_restarts
    if req.storage_uri is not None:
        out["storage_uri"] = req.storage_uri
    g = req.gcp  # gcp only (check_gcp_placement)
    if g.network is not None:
        out["network"] = g.network
    if g.subnet is not None:
        out["subnet"] = g.subnet
    if g.service_account is not None:
        out["service_account"] = g.service_account
    if not g.external_ip:
        out["external_ip"] = False
    if req.sync_policy is not None:
        out["sync_policy"] = req.sync_policy
    if req.max_nodes is not None:
        out["max_nodes"] = req.max_nodes
    if req.explore_trials is not None:
        out["explore_trials"] = req.explore_trials
    if req.replan_interval_s is not None:
        out["replan_interval_s"] = req.replan_interval_s
    if req.checkpoint_interval_s is not None:
        out["checkpoint_interval_s"] = req.checkpoint_interval_s
    if req.max_replacements is not None:
        out["max_replacements"] = req.max_replacements
    if req.capacity_wait_s is not None:
        out["capacity_wait_s"] = req.capacity_wait_s
    if req.lease_minutes is not None:
        out["lease_s"] = req.lease_minutes * 60
    if req.idle_minutes is not None:
        out["idle_s"] = req.idle_minutes * 60
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (plus the next few, for later generations: best effort)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plan_now(req: LaunchRequest, cloud: str) -> Plan:
    """Search now (``kplan estimate``) for a plan on ``cloud``."""
    from kplan.app import pins, planning
    from kplan.app.local_plan import epochs_to_run
    from kplan.core.precision import check_precision
    from kplan.planner.extra_costs import DataSpec
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
    p = req.pins
    node_pin = pins.node_range(p.plan_nodes, "--plan-nodes")
    opts = SearchOptions(
        clouds=req.clouds or (cloud,),
        regions=req.regions or ((req.region,) if req.region else ()),
        markets=markets,
        budget_usd=req.budget_usd if req.budget_usd > 0 else None,
        deadline_hours=req.deadline_h,
        objective=default_objective(req.budget_usd or None, req.deadline_h),
        mixed=False,
        instance_types=p.instance_types,
        global_batch=p.global_batch,
        max_global_batch=p.max_global_batch,
        fixed_global_batch=p.fixed_batch,
        min_local_batch=pins.FIXED_BATCH_MIN_LOCAL if p.fixed_batch else 1,
        precision=check_precision(req.precision) if req.precision is not None else None,
        compression=req.compression,
        min_nodes=node_pin[0] if node_pin else 1,
        max_nodes=node_pin[1] if node_pin else 64,
        allow_on_demand=req.allow_on_demand,
        data=DataSpec(req.data_gb, req.data_region),
    )
    # the epochs the script will run: its own --epochs after `--`, read as a local launch reads
    # them (kplan/app/local_plan.py), else kplan's --epochs, else the profile's, said in a note
    notes: list[str] = []
    epochs, _ = epochs_to_run(prof, req.epochs, req.args, notes)
    result = planning.estimate(prof, opts, epochs=epochs, dataset_size=req.dataset_size)
    plan = result.plan
    return replace(
        plan, profile=prof.name, catalog=result.catalog.version, notes=(*plan.notes, *notes)
    )


def zone_offers(
    catalog: Catalog, cloud: str, region: str, types: set[str], zones: Collection[str] = ()
) -> tuple[ZoneOffer, ...]:
    """The zones the launcher may replace nodes in: the region's offers of the plan's types,
    less opt-in zones (AWS Local/Wavelength: the account may not have opted in) unless the
    plan itself runs in one (``zones``)."""
    out = []
    for o in catalog.offers:
        if o.cloud == cloud and o.region == region and o.instance_type in types:
            if o.opt_in and o.zone not in zones:
                continue
            out.append(ZoneOffer(o.instance_type, o.zone, o.market, o.usd_per_hour))
    return tuple(out)


def spec_from_plan(
    req: LaunchRequest, plan: Plan, cloud: str, catalog: Catalog | None = None
) -> JobSpec:
    """The cloud job that runs ``plan``'s chosen row: its nodes at the catalog's prices, the
    recovery rules, batch (or batch schedule), precision and compression it was priced with."""
    from kplan.app.plan_files import checked_row, plan_catalog

    row = plan.chosen
    if row.cloud != cloud:
        raise InputError(
            f"the plan is for {row.cloud!r}, not --cloud {cloud}",
            hint="drop --cloud or plan for that cloud",
        )
    if req.region is not None and req.region != row.region:
        raise InputError(
            f"the plan is for region {row.region!r}, not --region {req.region}",
            hint="drop --region or plan for that region",
        )
    catalog = catalog or plan_catalog(plan)
    checked_row(plan, str(req.plan_file or "the plan made now"), None, catalog)
    nodes, price_notes = reprice_from_catalog(nodes_from_plan_row(row), catalog, cloud, row.region)
    if req.spot is not None:
        want = "spot" if req.spot else "on-demand"
        bad = [n.node_rank for n in nodes if n.market != want]
        if bad:
            raise InputError(
                f"the plan puts node(s) {bad} on the other market than --{want}",
                hint="plan with the same market flag (kplan estimate --spot/--on-demand)",
            )
    opts = options(req)
    opts.setdefault("checkpoint_interval_s", row.checkpoint_interval_s or None)
    rec = row.spot.recovery  # the rules the plan was priced with (none simulated: the launcher's)
    if rec is not None and row.market != "on-demand":
        opts.setdefault("max_replacements", rec.max_replacements)
        opts.setdefault("capacity_wait_s", rec.capacity_wait_s)
    import json

    if req.moves.regions and all(n.market != "spot" for n in nodes):  # it was taken, inert
        raise InputError(
            "--move-region: the plan runs every node on demand, which never runs dry",
            hint="plan spot (kplan estimate --spot, or --spot with a plan made now), or drop "
            "--move-region",
        )
    moves = move_regions(req, catalog, cloud, row.region, {n.instance_type for n in nodes})
    if moves:
        opts["move_regions"] = moves
        opts["checkpoint_gb"] = _checkpoint_gb(req, row)
        if req.moves.copy_gbps is not None:
            opts["copy_gbps"] = req.moves.copy_gbps
    disk, storage, egress = job_costs(row)
    return JobSpec.build(
        req.job_id or _new_id(),
        cloud,
        row.region,
        str(req.script.resolve()),
        nodes,
        req.budget_usd,
        req.args,
        deadline_h=req.deadline_h,
        allow_on_demand=req.allow_on_demand or row.spot.allow_on_demand,
        offers=zone_offers(
            catalog, cloud, row.region, {n.instance_type for n in nodes}, {n.zone for n in nodes}
        ),
        global_batch=row.global_batch,
        accum_steps=row.accum_steps,
        # the plan's batch schedule (kplan/planner/batchsched.py): the workers run it and the
        # prediction is its own
        batch_schedule=None if row.schedule is None else json.dumps(row.schedule.entries()),
        predicted_hours=row.predicted_hours,
        predicted_cost_usd=row.predicted_cost_usd,
        predicted_cost_p90_usd=row.predicted_cost_p90_usd,
        plan=plan,
        price_notes=price_notes,
        precision=row.precision,  # what the plan was made for: the workers train in it
        compression=row.compression,  # the plan's gradient compression runs in the workers
        disk_usd_node_h=disk,
        storage_usd_h=storage,
        egress_usd=egress,
        **opts,
    )


def move_regions(
    req: LaunchRequest, catalog: Catalog, cloud: str, home: str, types: set[str]
) -> tuple[MoveRegion, ...]:
    """The regions a job may run in with ``--move-region`` (its own first): each region's
    zones of the job's types and its egress price, from the catalog; () without the flag."""
    if not req.moves.regions:
        return ()
    known = sorted({o.region for o in catalog.offers if o.cloud == cloud})
    out = []
    for region in (home, *dict.fromkeys(req.moves.regions)):
        if region == home and region in req.moves.regions:
            raise InputError(
                f"--move-region {region} is the job's own region",
                hint="give the other regions the job may move to",
            )
        if region not in known:
            raise InputError(
                f"--move-region {region}: {cloud} has no region {region!r} in catalog "
                f"{catalog.version}",
                hint=f"one of: {', '.join(known[:12])}{', ...' if len(known) > 12 else ''}",
            )
        offers = zone_offers(catalog, cloud, region, types)
        missing = sorted(types - {o.instance_type for o in offers if o.market == "spot"})
        price = catalog.storage.get((cloud, region))
        if missing or price is None:
            what = f"no spot offer of {', '.join(missing)}" if missing else "no egress price"
            raise InputError(
                f"--move-region {region}: the catalog has {what} there",
                hint="kplan catalog list shows each region's offers; pick another region",
            )
        out.append(MoveRegion(region, offers, price.egress_region_usd_gb))
    return tuple(out)


def _checkpoint_gb(req: LaunchRequest, row: PlanRow) -> float:
    """``--checkpoint-gb``, else the plan's checkpoint size; a move needs one."""
    gb = req.moves.checkpoint_gb
    gb = row.extras.checkpoint_gb if gb is None else gb
    if not gb > 0:
        raise InputError(
            "--move-region: the size of a checkpoint is unknown (the plan has none)",
            hint="give --checkpoint-gb GB (what one checkpoint of the job weighs)",
        )
    return gb


def reprice_from_catalog(
    nodes: tuple[NodeSpec, ...], catalog: Catalog, cloud: str, region: str
) -> tuple[tuple[NodeSpec, ...], tuple[str, ...]]:
    """The plan's nodes at the higher of ``catalog``'s and the plan's price
    (``kplan/launcher/pricing.py``), and a note for each price that differs by more than 5%."""
    from kplan.launcher.pricing import CatalogPrice, reprice

    offers = tuple(
        CatalogPrice(o.cloud, o.region, o.zone, o.instance_type, o.market, o.usd_per_hour)
        for o in catalog.offers
        if o.cloud == cloud and o.region == region
    )
    return reprice(nodes, cloud, region, offers, f"catalog {catalog.version}")


def with_node_install(spec: JobSpec, req: LaunchRequest) -> JobSpec:
    """``spec`` with what its nodes install: the wheel of this kplan (built now or reused from
    the cache, kplan/launcher/wheel.py) and the dependencies pinned to this machine's versions."""
    from kplan.launcher.wheel import build_wheel, node_requirements

    wheel = build_wheel()
    install = replace(
        spec.install,
        wheel=str(wheel.path),
        wheel_sha256=wheel.sha256,
        requirements=node_requirements(),
        pip_index_url=req.node_install.pip_index_url,
        install_deps=req.node_install.install_deps,
        image=req.node_install.image or spec.install.image,
    )
    return replace(spec, install=install)


def _new_id() -> str:
    from kplan.launcher.jobspec import new_job_id

    return new_job_id()


def job_costs(row: PlanRow) -> tuple[float, float, float]:
    """The launcher's rates of the row's extras (kplan/planner/extra_costs.py: they were priced
    at the row's hours, so dividing by them gives the rates back): disk per node-hour, storage
    per hour, egress once."""
    x, hours = row.extras, row.hours
    return x.disk_usd / (row.nodes * hours), x.storage_usd / hours, x.egress_usd
