"""``kplan launch`` flags that take more than one spelling or value, resolved to one request.

- ``--example`` (as in ``kplan estimate`` and ``kplan profile``); ``--example-profile`` is its
  old name, still read, hidden from the help (no note: an error then stays one line + hint).
- ``--cloud`` and ``--region`` are repeatable, as in ``kplan estimate``: one value names where
  the job runs (as before); several are the places a plan made now may choose from.
- ``--budget`` may be left out of a free local run (it spends nothing: budget $0); a cloud
  launch, or a local machine given a ``--price``, must name one.

``launch_request`` turns the parsed values (the names of ``launch_options.LAUNCH_FLAGS``) into
the application's ``LaunchRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kplan.core.errors import InputError

if TYPE_CHECKING:
    from kplan.app.launch_request import LaunchRequest


@dataclass(frozen=True)
class Places:
    """Where the job runs (``cloud``/``region``, None: the plan's, else local) or, for several
    values, where a plan made now may choose (``clouds``/``regions``)."""

    cloud: str | None
    region: str | None
    clouds: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()


def example_name(example: str | None, old: str | None) -> str | None:
    """``--example``, or its old name ``--example-profile``; not both."""
    if old is None:
        return example
    if example is not None:
        raise InputError(
            "give --example once (--example-profile is its old name)",
            hint="e.g. --example cifar10-resnet18",
        )
    return old


def places(clouds: list[str], regions: list[str], *, plans_now: bool) -> Places:
    """One ``--cloud``/``--region`` each: the job's place. Several: a plan made now (``--profile``
    or ``--example``) searches them all, on aws/gcp only."""
    from kplan.core import flags

    flags.texts("--cloud", clouds, hint="local, aws or gcp")
    flags.texts("--region", regions, hint="e.g. us-east-1")
    cloud_set = list(dict.fromkeys(c.lower() for c in clouds))
    region_set = list(dict.fromkeys(regions))
    several = len(cloud_set) > 1 or len(region_set) > 1
    if not several:
        return Places(cloud_set[0] if cloud_set else None, region_set[0] if region_set else None)
    which = "--cloud" if len(cloud_set) > 1 else "--region"
    if not plans_now:
        raise InputError(
            f"several {which} values are places for a plan made now to choose from: give "
            "--profile or --example (a --plan file names its own place)",
            hint=f"give one {which}, or plan with kplan estimate {which} A {which} B --out "
            "plan.json",
        )
    if "local" in cloud_set or not cloud_set:
        raise InputError(
            f"several {which} values are for aws or gcp; --cloud local is this machine",
            hint="e.g. --cloud aws --cloud gcp --region us-east-1 --region us-central1",
        )
    from kplan.launcher.jobspec import CLOUDS

    unknown = [c for c in cloud_set if c not in CLOUDS]
    if unknown:
        raise InputError(f"unknown cloud {unknown[0]!r}", hint=f"one of: {', '.join(CLOUDS)}")
    return Places(
        cloud_set[0] if len(cloud_set) == 1 else None,
        None,
        tuple(cloud_set) if len(cloud_set) > 1 else (),
        tuple(region_set),
    )


def budget_or_default(
    budget: float | None, cloud: str | None, clouds: tuple[str, ...], plan: Path | None,
    price: float | None,
) -> float:  # fmt: skip
    """``--budget`` as given; left out, 0 for a free local run (nothing to spend), else exit 2:
    a cloud launch (``--cloud``, or a ``--plan`` for a cloud) or a priced machine needs one."""
    if budget is not None:
        return budget
    where = cloud or (clouds[0] if clouds else None)
    plan_price = 0.0
    if where is None and plan is not None:
        from kplan.app.plan_files import read_plan

        row = read_plan(plan).chosen
        where, plan_price = row.cloud, row.usd_per_hour
    where = (where or "local").lower()
    if where in ("aws", "gcp"):  # another name: build_spec says it is unknown
        raise InputError(
            f"a launch on {where} needs --budget (USD; the job stops before it would cross it)",
            hint="e.g. --budget 20; `kplan estimate ... --budget 20` shows what fits",
        )
    if (price or plan_price) > 0:
        raise InputError(
            "this machine is priced (--price or the plan's price): give --budget too",
            hint="e.g. --budget 5 (USD; the job stops before it would cross it)",
        )
    return 0.0


def launch_request(f: dict[str, Any]) -> LaunchRequest:
    """The ``LaunchRequest`` of ``kplan launch``'s parsed flags (``LAUNCH_FLAGS``' names)."""
    from kplan.app.launch_request import (
        GcpPlacement,
        LaunchRequest,
        MoveRequest,
        NodeInstall,
        PlanPins,
    )

    args = list(f["argv"] or [])
    if not args:
        raise InputError("give the training script", hint="kplan launch train.py")
    example_profile = example_name(f["example"], f["example_profile"])
    plans_now = f["plan"] is None and (f["profile"] or example_profile) is not None
    where = places(f["cloud"] or [], f["region"] or [], plans_now=plans_now)
    return LaunchRequest(
        script=Path(args[0]),
        args=tuple(args[1:]),
        budget_usd=budget_or_default(f["budget"], where.cloud, where.clouds, f["plan"], f["price"]),
        deadline_h=f["deadline"],
        cloud=where.cloud,
        clouds=where.clouds,
        spot=f["spot"],
        plan_file=f["plan"],
        profile=f["profile"],
        example_profile=example_profile,
        region=where.region,
        regions=where.regions,
        storage_uri=f["storage"],
        nodes=f["nodes"],
        workers_per_node=f["workers_per_node"],
        allow_on_demand=f["allow_on_demand"],
        check_interval_s=f["check_interval"],
        max_restarts=f["max_restarts"],
        job_id=f["job_id"],
        adapt=f["adapt"],
        explore=f["explore"],
        max_nodes=f["max_nodes"],
        policies=tuple(f["policy"] or ()),
        explore_trials=f["explore_trials"],
        replan_interval_s=f["replan_interval"],
        checkpoint_interval_s=f["checkpoint_interval"],
        max_replacements=f["max_replacements"],
        capacity_wait_s=f["capacity_wait"],
        moves=MoveRequest(tuple(f["move_region"] or ()), f["checkpoint_gb"], f["copy_gbps"]),
        lease_minutes=f["lease_minutes"],
        idle_minutes=f["idle_minutes"],
        node_install=NodeInstall(f["image"], f["pip_index_url"], f["install_deps"]),
        gcp=GcpPlacement(f["network"], f["subnet"], f["service_account"], f["external_ip"]),
        pins=PlanPins(
            tuple(f["instance_type"] or ()),
            f["plan_nodes"],
            f["global_batch"],
            f["max_global_batch"],
            f["fixed_batch"],
        ),
        precision=f["precision"],
        compression=f["compression"],
        sync_policy=f["sync_policy"],
        epochs=f["epochs"],
        dataset_size=f["dataset_size"],
        price_usd_per_hour=f["price"],
        data_gb=f["data_gb"],
        data_region=f["data_region"],
    )
