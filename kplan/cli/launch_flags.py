"""``kplan launch`` flags that take more than one spelling or value, resolved to one request.

- ``--example`` (as in ``kplan estimate`` and ``kplan profile``); ``--example-profile`` is its
  old name, still read, hidden from the help (no note: an error then stays one line + hint).
- ``--cloud`` and ``--region`` are repeatable, as in ``kplan estimate``: one value names where
  the job runs (as before); several are the places a plan made now may choose from.
- ``--budget`` may be left out of a free local run (it spends nothing: budget $0); a cloud
  launch, or a local machine given a ``--price``, must name one.

``LAUNCH_FLAGS`` is the table of every ``kplan launch`` flag (name, type, default, typer's
option); ``takes_flags`` gives the command that signature and ``launch_request`` turns the
parsed values into the application's ``LaunchRequest``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer

from kplan.core.errors import InputError

if TYPE_CHECKING:
    from kplan.app.launch_request import LaunchRequest

F = TypeVar("F", bound=Callable[..., Any])


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


@dataclass(frozen=True)
class Flag:
    """One command-line parameter: its Python name, type, default and typer declaration."""

    name: str
    kind: Any
    default: Any
    info: Any  # typer.Option(...) or typer.Argument(...)

    def parameter(self, kind: inspect._ParameterKind) -> inspect.Parameter:
        annotation = cast(Any, Annotated)[self.kind, self.info]
        return inspect.Parameter(self.name, kind, default=self.default, annotation=annotation)


def takes_flags(flags: tuple[Flag, ...]) -> Callable[[F], F]:
    """The decorated ``command(**given)`` presents ``flags`` to typer as its signature (the first
    one positional, the others keyword-only)."""

    def wrap(command: F) -> F:
        params = [
            f.parameter(
                inspect.Parameter.POSITIONAL_OR_KEYWORD
                if i == 0
                else inspect.Parameter.KEYWORD_ONLY
            )
            for i, f in enumerate(flags)
        ]
        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        return command

    return wrap


def launch_request(f: dict[str, Any]) -> LaunchRequest:
    """The ``LaunchRequest`` of ``kplan launch``'s parsed flags (``LAUNCH_FLAGS``' names)."""
    from kplan.app.launch_request import GcpPlacement, LaunchRequest, NodeInstall, PlanPins

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


# Every ``kplan launch`` flag, in --help's order.
LAUNCH_FLAGS: tuple[Flag, ...] = (
    Flag(
        "argv",
        list[str] | None,
        None,
        typer.Argument(metavar="SCRIPT [-- ARGS...]", help="Training script and its arguments."),
    ),
    Flag(
        "budget",
        float | None,
        None,
        typer.Option(
            "--budget",
            help="Budget in USD (hard limit). Needed on aws/gcp and for a priced local machine "
            "(default: none for a free local run).",
        ),
    ),
    Flag(
        "deadline",
        float | None,
        None,
        typer.Option("--deadline", help="Deadline in hours from now (hard limit)."),
    ),
    Flag(
        "cloud",
        list[str] | None,
        None,
        typer.Option(
            "--cloud",
            help="local, aws or gcp; repeat (aws and gcp) to let a plan made now choose "
            "(default: the plan's, else local).",
        ),
    ),
    Flag(
        "spot",
        bool | None,
        None,
        typer.Option("--spot/--on-demand", help="Plan only spot or on-demand."),
    ),
    Flag(
        "plan",
        Path | None,
        None,
        typer.Option("--plan", help="Plan JSON from `kplan estimate --out`."),
    ),
    Flag(
        "example",
        str | None,
        None,
        typer.Option("--example", "-e", help="Plan from a built-in profile (kplan estimate's)."),
    ),
    Flag(
        "example_profile",
        str | None,
        None,
        typer.Option("--example-profile", hidden=True, help="Old name of --example."),
    ),
    Flag(
        "profile",
        Path | None,
        None,
        typer.Option("--profile", help="Plan from a profile (kplan profile)."),
    ),
    Flag(
        "region",
        list[str] | None,
        None,
        typer.Option("--region", help="Region to run or plan in (repeatable when planning now)."),
    ),
    Flag(
        "storage",
        str | None,
        None,
        typer.Option("--storage", help="s3://bucket/prefix or gs://bucket/prefix."),
    ),
    Flag("nodes", int, 1, typer.Option("--nodes", help="Local: worker groups.")),
    Flag(
        "workers_per_node",
        int,
        1,
        typer.Option("--workers-per-node", help="Local: workers per group."),
    ),
    Flag(
        "allow_on_demand",
        bool,
        False,
        typer.Option("--allow-on-demand", help="Replace lost spot nodes with on-demand ones."),
    ),
    Flag(
        "check_interval",
        float | None,
        None,
        typer.Option("--check-interval", help="Seconds between monitor checks."),
    ),
    Flag(
        "max_restarts",
        int | None,
        None,
        typer.Option("--max-restarts", help="torchrun --max-restarts per node."),
    ),
    Flag("job_id", str | None, None, typer.Option("--job-id", help="Job id (default: new).")),
    Flag(
        "adapt",
        bool,
        False,
        typer.Option(
            "--adapt/--no-adapt",
            help="Refit the model from the running job and resize when another node count or "
            "batch is better by a margin (checkpointed restart, inside the budget).",
        ),
    ),
    Flag(
        "explore",
        bool,
        False,
        typer.Option(
            "--explore",
            help="First run short trials of candidate configurations chosen by Bayesian "
            "optimisation, then continue on the best one measured.",
        ),
    ),
    Flag(
        "max_nodes",
        int | None,
        None,
        typer.Option("--max-nodes", help="Most nodes a resize may use."),
    ),
    Flag(
        "instance_type",
        list[str] | None,
        None,
        typer.Option("--instance-type", help="Planning now: only this type (repeatable)."),
    ),
    Flag(
        "plan_nodes",
        str | None,
        None,
        typer.Option(
            "--plan-nodes",
            help="Planning now: exactly N nodes (4) or a range (2-8); kplan estimate's --nodes.",
        ),
    ),
    Flag(
        "global_batch",
        int | None,
        None,
        typer.Option("--global-batch", help="Planning now: exactly this batch."),
    ),
    Flag(
        "max_global_batch",
        int | None,
        None,
        typer.Option("--max-global-batch", help="Planning now: the largest global batch."),
    ),
    Flag(
        "fixed_batch",
        bool,
        False,
        typer.Option(
            "--fixed-batch",
            help="Planning now: keep the profile's global batch, >= 8 samples per GPU.",
        ),
    ),
    Flag(
        "precision",
        str | None,
        None,
        typer.Option(
            "--precision",
            help="fp32, tf32, bf16 or fp16: what a local job trains in; on aws/gcp what the "
            "plan made now is for (a saved --plan carries its own). The workers run in it.",
        ),
    ),
    Flag(
        "compression",
        str | None,
        None,
        typer.Option(
            "--compression",
            metavar="SPEC",
            help="Gradient compression the workers run: none, fp16, bf16, powersgd:RANK, "
            "topk:RATIO[:ar|ag|auto][:wSTEPS] (wSTEPS: sparsity warm-up) or adaptive[:MIN:MAX] "
            "(docs/runtime.md). A plan made "
            "now is searched with it pinned; a saved --plan runs its own.",
        ),
    ),
    Flag(
        "sync_policy",
        str | None,
        None,
        typer.Option(
            "--sync-policy",
            metavar="SPEC",
            help="every, or selective:DELTA[:AVG_EVERY] (SelSync: skip the all-reduce on "
            "steps whose update is insignificant, average parameters every AVG_EVERY steps).",
        ),
    ),
    Flag(
        "epochs",
        float | None,
        None,
        typer.Option(
            "--epochs",
            help="Planning now: epochs to predict for (default: the profile's; a local launch "
            "predicts the script's own --epochs after --).",
        ),
    ),
    Flag(
        "dataset_size",
        int | None,
        None,
        typer.Option(
            "--dataset-size", help="Planning now: samples per epoch (default: the profile's)."
        ),
    ),
    Flag(
        "price",
        float | None,
        None,
        typer.Option(
            "--price",
            help="Local: what this machine costs, USD per hour (default: 0, free); the ledger, "
            "the guard and the prediction use it.",
        ),
    ),
    Flag(
        "policy",
        list[str] | None,
        None,
        typer.Option(
            "--policy",
            help="Runtime policy: goodput, straggler, FILE.py:Class or module:Class "
            "(repeatable; docs/policies.md).",
        ),
    ),
    Flag(
        "explore_trials",
        int | None,
        None,
        typer.Option("--explore-trials", help="Most trials of --explore (default: 6)."),
    ),
    Flag(
        "replan_interval",
        float | None,
        None,
        typer.Option("--replan-interval", help="Seconds between re-plans (default: 60)."),
    ),
    Flag(
        "checkpoint_interval",
        float | None,
        None,
        typer.Option(
            "--checkpoint-interval", help="Seconds between checkpoints (default: the plan's)."
        ),
    ),
    Flag(
        "max_replacements",
        int | None,
        None,
        typer.Option(
            "--max-replacements",
            help="Lost spot nodes replaced before the job fails (default: the plan's, set "
            "above its simulated p99; 20 without a plan).",
        ),
    ),
    Flag(
        "capacity_wait",
        float | None,
        None,
        typer.Option(
            "--capacity-wait",
            help="Seconds lost nodes wait for capacity anywhere in the region before the job "
            "fails (default: the plan's, else 900).",
        ),
    ),
    Flag(
        "data_gb",
        float,
        0.0,
        typer.Option(
            "--data-gb",
            help="A plan made now: GB of training data, priced as kplan estimate --data-gb "
            "does (storage for the job's hours, egress from --data-region).",
        ),
    ),
    Flag(
        "data_region",
        str | None,
        None,
        typer.Option(
            "--data-region",
            help="A plan made now: the region the data is stored in (default: the plan's).",
        ),
    ),
    Flag(
        "lease_minutes",
        float | None,
        None,
        typer.Option(
            "--lease-minutes",
            help="aws/gcp/local: a node whose lease the launcher has not renewed for this "
            "long ends itself, so a dead launcher costs at most budget + this much of the "
            "cluster (default 15).",
        ),
    ),
    Flag(
        "idle_minutes",
        float | None,
        None,
        typer.Option(
            "--idle-minutes",
            help="End the cluster when its workers have written no step record for this "
            "long, or this long after a node finished while the rest run on (default: "
            "never). Counted from the first step record: a script without the kplan runtime "
            "is ended only when it finishes.",
        ),
    ),
    Flag(
        "image",
        str | None,
        None,
        typer.Option(
            "--image",
            help="aws/gcp: the nodes' boot image (AMI id or resolve:ssm:NAME; GCP image or "
            "family path). Default: the cloud's Deep Learning image.",
        ),
    ),
    Flag(
        "pip_index_url",
        str | None,
        None,
        typer.Option(
            "--pip-index-url",
            help="aws/gcp: the index (pip --index-url; http(s):// or file://, no password in "
            "it) the nodes install torch and kplan's dependencies from. kplan itself always "
            "comes from the job's bucket, built from this kplan.",
        ),
    ),
    Flag(
        "install_deps",
        bool,
        True,
        typer.Option(
            "--install-deps/--no-install-deps",
            help="aws/gcp: install torch and kplan's dependencies on the nodes, pinned to this "
            "machine's versions; --no-install-deps when --image already has them.",
        ),
    ),
    Flag(
        "network",
        str | None,
        None,
        typer.Option("--network", help="gcp: VPC network (default: default)."),
    ),
    Flag(
        "subnet",
        str | None,
        None,
        typer.Option("--subnet", help="gcp: subnetwork of --network in the region."),
    ),
    Flag(
        "service_account",
        str | None,
        None,
        typer.Option(
            "--service-account",
            help="gcp: email of the nodes' service account (default: the project's default "
            "one); they get only the storage and logging scopes.",
        ),
    ),
    Flag(
        "external_ip",
        bool,
        True,
        typer.Option(
            "--external-ip/--no-external-ip",
            help="gcp: give nodes a public IP; without one the subnet needs Cloud NAT and "
            "Private Google Access for the bootstrap.",
        ),
    ),
    Flag(
        "dry_run",
        bool,
        False,
        typer.Option(
            "--dry-run",
            help="Print every request it would send; send none (offline: no credentials or "
            "cloud SDK needed).",
        ),
    ),
    Flag(
        "detach",
        bool,
        False,
        typer.Option(
            "--detach",
            help="Run the job's controller (recovery, guard, ledger, teardown) away from this "
            "command and return at once with the job id; the shell may exit. The default for "
            "cloud jobs (see --controller). `kplan controller JOB` restarts one that died.",
        ),
    ),
    Flag(
        "foreground",
        bool,
        False,
        typer.Option(
            "--foreground",
            "--no-detach",
            help="Keep the job's controller in this command until the job ends (the default "
            "for local jobs); Ctrl-C stops the job.",
        ),
    ),
    Flag(
        "controller",
        str | None,
        None,
        typer.Option(
            "--controller",
            help="Where a detached job's controller runs: `instance` (its own small on-demand "
            "instance, priced from the catalog and billed in the ledger; the default for cloud "
            "jobs) or `here` (a daemon on this machine; the default for local jobs).",
        ),
    ),
    Flag(
        "quiet",
        bool,
        False,
        typer.Option(
            "--quiet", "-q", help="No progress while it runs: errors and the final summary only."
        ),
    ),
    Flag(
        "as_json",
        bool,
        False,
        typer.Option(
            "--json",
            help="JSON: with --dry-run one document; else one event per line (started, node, "
            "progress, preempted, launcher, finished with the outcome).",
        ),
    ),
)
