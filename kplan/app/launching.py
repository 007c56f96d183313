"""``kplan launch`` as a library call: from the user's flags to a validated ``JobSpec``.

A cloud job takes its nodes, batch and predictions from a typed ``Plan``: a file written by
``kplan estimate --out`` (``--plan``, read by ``kplan/app/plan_files.py``) or a search run now
from a profile (``--profile`` or ``--example``), restricted to the cloud and market asked for and
to the budget and deadline (``kplan/app/launch_spec.py``). A local job runs ``--nodes`` worker
groups of ``--workers-per-node`` workers on this machine, free or at ``--price`` USD/h for the
machine; with a profile (or a local plan) it is predicted first (``kplan/app/local_plan.py``) so
that ``kplan report`` compares prediction and run. The flags are checked first
(``kplan/app/launch_checks.py``).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TypedDict

from kplan.app import launch_checks as checks
from kplan.app.launch_request import GcpPlacement, LaunchRequest, NodeInstall, PlanPins
from kplan.app.launch_spec import free_port, options, plan_now, spec_from_plan, with_node_install
from kplan.app.plan_files import read_plan
from kplan.core.errors import DataFileError, InputError
from kplan.core.precision import check_precision
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.plainscript import refuse_runtime_flags
from kplan.launcher.providers.envvars import check_environment
from kplan.planner.plan import Plan

__all__ = [
    "GcpPlacement",
    "LaunchRequest",
    "NodeInstall",
    "PlanPins",
    "build_spec",
    "free_port",
    "plan_now",
    "spec_from_plan",
]


class LocalOptions(TypedDict, total=False):
    """A local job's ``JobSpec`` settings beyond the flags': its rendezvous port, what the
    workers train in, and its local plan's prediction."""

    rdzv_port: int
    precision: str
    compression: str
    global_batch: int
    predicted_hours: float
    predicted_cost_usd: float
    predicted_cost_p90_usd: float
    plan: Plan


def build_spec(req: LaunchRequest) -> JobSpec:
    """The job to launch, validated; plans now when the cloud is aws or gcp without --plan."""
    spec = _build_spec(req)
    # after the flags' own checks: a plain script cannot act on what the runtime reads
    runtime_flags = [f for f, on in (("--adapt", req.adapt), ("--explore", req.explore),
                                      ("--policy", bool(req.policies))) if on]  # fmt: skip
    refuse_runtime_flags(req.script, runtime_flags)
    return spec


def _build_spec(req: LaunchRequest) -> JobSpec:
    checks.check_request(req)
    plan = read_plan(req.plan_file) if req.plan_file is not None else None
    cloud = req.cloud or (plan.chosen.cloud if plan else "local")
    if req.clouds:  # several: the plan made now picks one; checks run for the first until then
        cloud = req.clouds[0]
    checks.check_pins(req, plans_now=cloud != "local" and plan is None, local=cloud == "local")
    checks.check_work(req, plans_now=plan is None and (req.profile or req.example_profile))
    if cloud == "local":
        return _local_spec(req, plan)
    if req.price_usd_per_hour is not None:
        raise InputError(
            f"--price is for a local job; {cloud} prices come from the catalog",
            hint="drop --price (kplan catalog update refreshes the catalog's prices)",
        )
    checks.check_node_install(req)
    if not req.clouds:  # several: the cloud the plan made now picks (below)
        checks.check_image_cloud(req, cloud)
    check_environment(req.clouds or (cloud,))  # KPLAN_AWS_*, KPLAN_GCP_*: before planning
    checks.check_gcp_placement(req, cloud)
    checks.check_moves(req, cloud)
    if plan is None:
        plan = plan_now(req, cloud)
        cloud = plan.chosen.cloud if req.clouds else cloud
        checks.check_image_cloud(req, cloud)
    return with_node_install(spec_from_plan(req, plan, cloud), req)


def _local_spec(req: LaunchRequest, plan: Plan | None) -> JobSpec:
    """A job on this machine, predicted from its local plan (given, or made now) when it has
    one."""
    prediction = local_prediction(req, plan)
    if req.region not in (None, "local"):
        raise InputError(f"the local cloud has no region {req.region!r}", hint="drop --region")
    if req.node_install != NodeInstall():
        raise InputError(
            "--image, --pip-index-url and --no-install-deps are for --cloud aws or gcp",
            hint="a local job runs this machine's own Python and kplan",
        )
    checks.check_gcp_placement(req, "local")
    checks.check_moves(req, "local")
    opts = options(req)
    local = LocalOptions(rdzv_port=free_port())
    if req.precision is not None:
        local["precision"] = check_precision(req.precision)
    if req.compression is not None:
        local["compression"] = req.compression
    nodes, workers = req.nodes, req.workers_per_node
    if prediction is not None:
        row = prediction.chosen
        nodes, workers = row.nodes, row.groups[0].gpus_per_node
        local.update(
            LocalOptions(
                global_batch=row.global_batch,
                predicted_hours=row.hours,
                predicted_cost_usd=row.cost_usd,
                predicted_cost_p90_usd=row.predicted_cost_p90_usd,
                plan=prediction,
            )
        )
    spec = JobSpec.local(
        str(req.script.resolve()),
        req.args,
        nodes=nodes,
        workers_per_node=workers,
        budget_usd=req.budget_usd,
        deadline_h=req.deadline_h,
        python=sys.executable,
        job_id=req.job_id,
        **opts,
        **local,
    )
    price = req.price_usd_per_hour or 0.0
    if price > 0:  # the machine's price, shared by its worker groups
        priced = tuple(replace(n, usd_per_hour=price / nodes) for n in spec.nodes)
        spec = replace(spec, nodes=priced)
    return spec


def local_prediction(req: LaunchRequest, plan: Plan | None) -> Plan | None:
    """The local job's plan: a local plan file as given, or one made now from the profile
    (``kplan/app/local_plan.py``); None without either (the job runs unpredicted)."""
    if plan is not None:
        return _checked_local_plan(req, plan)
    if req.profile is None and req.example_profile is None:
        return None
    if req.nodes < 1 or req.workers_per_node < 1:
        return None  # JobSpec.local refuses them with its own message
    from kplan.app import planning
    from kplan.app.local_plan import local_plan
    from kplan.launcher.jobspec import LOCAL_CHECK_INTERVAL_S
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
        usd_per_hour=req.price_usd_per_hour or 0.0,
        epochs=req.epochs,
        dataset_size=req.dataset_size,
        precision=req.precision,
        script_args=req.args,
        tick_s=LOCAL_CHECK_INTERVAL_S if req.check_interval_s is None else req.check_interval_s,
    )


def _checked_local_plan(req: LaunchRequest, plan: Plan) -> Plan:
    """A saved plan for a local job: made for this machine, at its price, of a size it runs."""
    from kplan.core import flags

    row = plan.chosen
    if row.cloud != "local":
        raise InputError(
            f"the plan is for {row.cloud!r}; a local job runs on this machine",
            hint="give --profile p.json (kplan profile) to predict the local run, or drop "
            "--cloud local to run the plan",
        )
    price = req.price_usd_per_hour
    if price is not None and price != row.usd_per_hour:
        raise InputError(
            f"--price {price:g}: the local plan was priced at ${row.usd_per_hour}/h",
            hint="drop --price, or make the plan again with it",
        )
    if len(row.groups) != 1 or row.nodes > flags.MAX_LOCAL_NODES:
        raise DataFileError(
            f"{req.plan_file}: a local plan has one group of at most {flags.MAX_LOCAL_NODES} nodes",
            hint="make it again with kplan launch --profile",
        )
    return plan
