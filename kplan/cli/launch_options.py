"""The table of every ``kplan launch`` flag and the decorator that gives the command its signature.

``LAUNCH_FLAGS`` lists each flag (name, type, default, typer's option) in --help's order;
``takes_flags`` presents them to typer as the command's parameters. ``launch_flags.py`` turns the
parsed values into the application's ``LaunchRequest``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer

F = TypeVar("F", bound=Callable[..., Any])


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
        "move_region",
        list[str] | None,
        None,
        typer.Option(
            "--move-region",
            help="Another region of the job's cloud it may move to when its spot pool runs "
            "dry (repeatable): the whole cluster checkpoints and restarts there once staying "
            "has paid the move's egress and copy (kplan simulate's move rule).",
        ),
    ),
    Flag(
        "checkpoint_gb",
        float | None,
        None,
        typer.Option(
            "--checkpoint-gb",
            help="With --move-region: GB of one checkpoint, which a move copies (default: the "
            "plan's).",
        ),
    ),
    Flag(
        "copy_gbps",
        float | None,
        None,
        typer.Option(
            "--copy-gbps",
            help="With --move-region: the checkpoint copy's Gbit/s between regions (default 1).",
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
            "long (at least 1), or this long after a node finished while the rest run on (default: "
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
