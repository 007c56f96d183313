"""``kplan launch``'s flags, checked before anything is planned or started: each numeric flag
finite and bounded, the enums and names well formed, and the flags that only mean something for
one kind of launch (a plan made now, a local job, GCP) refused elsewhere with one line and a
hint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from kplan.core.errors import InputError
from kplan.launcher.jobspec import CLOUDS, check_job_id

if TYPE_CHECKING:
    from kplan.app.launch_request import LaunchRequest


def check_request(req: LaunchRequest) -> None:
    """The checks that hold for every launch."""
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
        _check_new_job_id(req.job_id)
    _check_numbers(req)
    _check_comm_options(req)
    given = [x for x in (req.plan_file, req.profile, req.example_profile) if x is not None]
    if len(given) > 1:
        raise InputError(
            "give at most one of --plan, --profile and --example",
            hint="--plan reuses a saved plan; the others plan now",
        )


def _check_new_job_id(job_id: str) -> None:
    """``--job-id`` names no job of this machine's database: the dry run took one that exists,
    which the launch refuses (kplan/launcher/lifecycle.py ``JobRun._create``)."""
    from kplan.launcher.state import StateDB

    with StateDB.open(readonly=True) as db:
        if db.job(job_id) is not None:
            raise InputError(
                f"--job-id {job_id}: that job already exists",
                hint=f"give a new job id (`kplan status {job_id}` shows the job)",
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
    flags.number("--lease-minutes", req.lease_minutes, high=30 * 1440.0, hint="minutes, e.g. 15")
    flags.number("--idle-minutes", req.idle_minutes, high=30 * 1440.0, hint="minutes, e.g. 30")
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
    flags.number(
        "--data-gb", req.data_gb, low_open=False, high=flags.MAX_DATA_GB, hint=flags.DATA_HINT
    )
    flags.text("--data-region", req.data_region, hint="e.g. us-east-1 (kplan catalog list)")


def check_work(req: LaunchRequest, *, plans_now: object) -> None:
    given = [
        flag
        for flag, value in (
            ("--epochs", req.epochs),
            ("--dataset-size", req.dataset_size),
            ("--data-gb", req.data_gb or None),
            ("--data-region", req.data_region),
        )
        if value is not None
    ]
    if given and not plans_now:
        raise InputError(
            f"{', '.join(given)}: only for a plan made now from --profile or --example",
            hint="a saved --plan carries its own work (kplan estimate --epochs ... --out)",
        )


def check_moves(req: LaunchRequest, cloud: str) -> None:
    """``--move-region`` (kplan/launcher/region_move.py): a cloud job's, with its
    ``--checkpoint-gb`` and ``--copy-gbps`` finite, and an image that boots in every region."""
    from kplan.core import flags

    m = req.moves
    flags.texts("--move-region", m.regions, hint="e.g. us-west-2")
    flags.number("--checkpoint-gb", m.checkpoint_gb, low_open=False, high=flags.MAX_CHECKPOINT_GB,
                 hint="GB of one checkpoint, e.g. --checkpoint-gb 10")  # fmt: skip
    flags.number("--copy-gbps", m.copy_gbps, low=flags.MIN_COPY_GBPS, low_open=False,
                 high=flags.MAX_COPY_GBPS, hint=flags.COPY_HINT)  # fmt: skip
    given = [f for f, v in (("--checkpoint-gb", m.checkpoint_gb), ("--copy-gbps", m.copy_gbps))
             if v is not None]  # fmt: skip
    if given and not m.regions:
        raise InputError(
            f"{', '.join(given)}: only with --move-region", hint="e.g. --move-region us-west-2"
        )
    if not m.regions:
        return
    if cloud == "local":
        raise InputError(
            "--move-region: a local job runs on this machine, it has no other region",
            hint="use it with --cloud aws or gcp",
        )
    if req.region is not None and req.region in m.regions:
        raise InputError(
            f"--move-region {req.region} is the job's own region",
            hint="give the other regions the job may move to",
        )
    import os

    image = req.node_install.image or os.environ.get("KPLAN_AWS_IMAGE", "").strip()
    source = "--image" if req.node_install.image else "KPLAN_AWS_IMAGE"
    if cloud == "aws" and image.startswith("ami-"):
        raise InputError(
            f"--move-region: {source} {image} is an AMI id, which boots only in its own region",
            hint=f"drop {source} (kplan's default image is resolved in each region) or give "
            "resolve:ssm:<parameter>, which EC2 resolves in each region",
        )


def check_gcp_placement(req: LaunchRequest, cloud: str) -> None:
    """--network, --subnet, --service-account and --no-external-ip: GCP only, well formed."""
    given = [
        flag
        for flag, value in (
            ("--network", req.gcp.network),
            ("--subnet", req.gcp.subnet),
            ("--service-account", req.gcp.service_account),
        )
        if value is not None
    ] + ([] if req.gcp.external_ip else ["--no-external-ip"])
    if given and cloud != "gcp":
        raise InputError(
            f"{', '.join(given)}: for --cloud gcp only",
            hint="on AWS set KPLAN_AWS_VPC, KPLAN_AWS_SUBNET and KPLAN_AWS_INSTANCE_PROFILE",
        )
    from kplan.launcher.providers.envvars import check_network, check_service_account

    if req.gcp.network is not None or req.gcp.subnet is not None:
        check_network(req.gcp.network or "default", req.gcp.subnet)
    if req.gcp.service_account is not None:
        check_service_account(req.gcp.service_account)


def check_node_install(req: LaunchRequest) -> None:
    from kplan.launcher.providers.envvars import check_image
    from kplan.launcher.wheel import check_index_url

    if req.node_install.pip_index_url is not None:
        check_index_url(req.node_install.pip_index_url)
    if req.node_install.image is not None:  # the check KPLAN_AWS_IMAGE and KPLAN_GCP_IMAGE get
        check_image(req.node_install.image, "--image")


def check_image_cloud(req: LaunchRequest, cloud: str) -> None:
    """``--image`` is an image of the job's cloud (an AMI on AWS, an image path on GCP)."""
    from kplan.launcher.providers.envvars import check_cloud_image

    if req.node_install.image is not None:
        check_cloud_image(cloud, req.node_install.image, "--image")


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


def check_pins(req: LaunchRequest, *, plans_now: bool, local: bool) -> None:
    """The pinning flags are checked like kplan estimate's, and only where launch plans. On a
    local job ``--precision`` is what the workers train in, not a pin: checked, not refused."""
    from kplan.app import pins
    from kplan.core import flags
    from kplan.core.precision import check_precision

    given = [
        name
        for name, on in (
            ("--instance-type", bool(req.pins.instance_types)),
            ("--plan-nodes", req.pins.plan_nodes is not None),
            ("--global-batch", req.pins.global_batch is not None),
            ("--max-global-batch", req.pins.max_global_batch is not None),
            ("--fixed-batch", req.pins.fixed_batch),
            ("--precision", req.precision is not None and not local),
        )
        if on
    ]
    if req.precision is not None:
        check_precision(req.precision)
    if not given:
        return
    flags.texts("--instance-type", req.pins.instance_types, hint="e.g. p3.16xlarge")
    pins.node_range(req.pins.plan_nodes, "--plan-nodes")
    pins.check_batches(req.pins.global_batch, req.pins.max_global_batch, req.pins.fixed_batch)
    if not plans_now:
        raise InputError(
            f"{', '.join(given)}: only for a plan made now, and this launch makes none",
            hint="use them with --cloud aws|gcp and --profile or --example, or in "
            "kplan estimate --out plan.json",
        )


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
