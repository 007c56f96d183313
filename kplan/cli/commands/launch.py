"""``kplan launch``, ``status``, ``logs`` and ``down``: run a plan and keep an eye on it."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kplan.core.errors import InputError, JobError

if TYPE_CHECKING:
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.providers import Backend
    from kplan.launcher.state import JobRecord, StateDB

_LAUNCH_HELP = (
    "Launch SCRIPT on a cluster and keep it alive within --budget and --deadline.\n\n"
    "The training script's own flags go after `--`. On aws/gcp the cluster comes from a plan: "
    "--plan FILE (from `kplan estimate --out`), or a search now from --profile or --example "
    "(several --cloud/--region: the search picks among them). --cloud local (the default) runs "
    "--nodes worker groups on this machine, free unless --price; --budget is needed only for a "
    "cost. "
    "The launcher stays in the foreground: it replaces preempted spot instances, accrues the "
    "ledger, stops the job (with a checkpoint) before the budget or the deadline would be "
    "crossed, and always tears down."
)


def _home() -> Path:
    from kplan.core.paths import kplan_home

    return kplan_home()


def _backend(cloud: str, region: str | None, storage: str | None) -> Backend:
    from kplan.launcher.providers import ProviderSettings, get_backend

    return get_backend(cloud, ProviderSettings(_home(), region, storage))


def _db(readonly: bool = False) -> StateDB:
    """The state database; ``readonly`` for the commands that only read (status, logs)."""
    from kplan.launcher.state import StateDB

    return StateDB.open(readonly=readonly)


def _job_or_fail(db: StateDB, job_id: str) -> JobRecord:
    """The job ``job_id`` names (an id, a unique prefix of one, or ``last``); exit 2 if none."""
    rec = db.job(db.resolve_job_id(job_id))
    if rec is None:
        raise InputError(f"no job {job_id!r} in {db.path}", hint="`kplan status` lists the jobs")
    return rec


class _Interrupts:
    """SIGINT/SIGTERM while launching: the first stops the job (checkpoint, teardown); later
    ones are ignored so that the teardown itself is never cut short."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.seen += 1
        if self.seen == 1:
            raise KeyboardInterrupt
        typer.echo("tearing down; wait for it (or run `kplan down JOB` elsewhere)", err=True)


def launch_command(
    argv: Annotated[
        list[str] | None,
        typer.Argument(metavar="SCRIPT [-- ARGS...]", help="Training script and its arguments."),
    ] = None,
    *,
    budget: Annotated[
        float | None,
        typer.Option(
            "--budget",
            help="Budget in USD (hard limit). Needed on aws/gcp and for a priced local machine "
            "(default: none for a free local run).",
        ),
    ] = None,
    deadline: Annotated[
        float | None, typer.Option("--deadline", help="Deadline in hours from now (hard limit).")
    ] = None,
    cloud: Annotated[
        list[str] | None,
        typer.Option(
            "--cloud",
            help="local, aws or gcp; repeat (aws and gcp) to let a plan made now choose "
            "(default: the plan's, else local).",
        ),
    ] = None,
    spot: Annotated[
        bool | None, typer.Option("--spot/--on-demand", help="Plan only spot or on-demand.")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Plan JSON from `kplan estimate --out`.")
    ] = None,
    example: Annotated[
        str | None,
        typer.Option("--example", "-e", help="Plan from a built-in profile (kplan estimate's)."),
    ] = None,
    example_profile: Annotated[
        str | None, typer.Option("--example-profile", hidden=True, help="Old name of --example.")
    ] = None,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="Plan from a profile (kplan profile).")
    ] = None,
    region: Annotated[
        list[str] | None,
        typer.Option("--region", help="Region to run or plan in (repeatable when planning now)."),
    ] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="s3://bucket/prefix or gs://bucket/prefix.")
    ] = None,
    nodes: Annotated[int, typer.Option("--nodes", help="Local: worker groups.")] = 1,
    workers_per_node: Annotated[
        int, typer.Option("--workers-per-node", help="Local: workers per group.")
    ] = 1,
    allow_on_demand: Annotated[
        bool,
        typer.Option("--allow-on-demand", help="Replace lost spot nodes with on-demand ones."),
    ] = False,
    check_interval: Annotated[
        float | None, typer.Option("--check-interval", help="Seconds between monitor checks.")
    ] = None,
    max_restarts: Annotated[
        int | None, typer.Option("--max-restarts", help="torchrun --max-restarts per node.")
    ] = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="Job id (default: new).")] = None,
    adapt: Annotated[
        bool,
        typer.Option(
            "--adapt/--no-adapt",
            help="Refit the model from the running job and resize when another node count or "
            "batch is better by a margin (checkpointed restart, inside the budget).",
        ),
    ] = False,
    explore: Annotated[
        bool,
        typer.Option(
            "--explore",
            help="First run short trials of candidate configurations chosen by Bayesian "
            "optimisation, then continue on the best one measured.",
        ),
    ] = False,
    max_nodes: Annotated[
        int | None, typer.Option("--max-nodes", help="Most nodes a resize may use.")
    ] = None,
    instance_type: Annotated[
        list[str] | None,
        typer.Option("--instance-type", help="Planning now: only this type (repeatable)."),
    ] = None,
    plan_nodes: Annotated[
        str | None,
        typer.Option(
            "--plan-nodes",
            help="Planning now: exactly N nodes (4) or a range (2-8); kplan estimate's --nodes.",
        ),
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="Planning now: exactly this batch.")
    ] = None,
    max_global_batch: Annotated[
        int | None,
        typer.Option("--max-global-batch", help="Planning now: the largest global batch."),
    ] = None,
    fixed_batch: Annotated[
        bool,
        typer.Option(
            "--fixed-batch",
            help="Planning now: keep the profile's global batch, >= 8 samples per GPU.",
        ),
    ] = False,
    precision: Annotated[
        str | None,
        typer.Option(
            "--precision",
            help="fp32, tf32, bf16 or fp16: what a local job trains in; on aws/gcp what the "
            "plan made now is for (a saved --plan carries its own). The workers run in it.",
        ),
    ] = None,
    compression: Annotated[
        str | None,
        typer.Option(
            "--compression",
            metavar="SPEC",
            help="Gradient compression the workers run: none, fp16, bf16, powersgd:RANK, "
            "topk:RATIO[:ar|ag|auto][:wSTEPS] (wSTEPS: sparsity warm-up) or adaptive[:MIN:MAX] "
            "(docs/runtime.md). A plan made "
            "now is searched with it pinned; a saved --plan runs its own.",
        ),
    ] = None,
    sync_policy: Annotated[
        str | None,
        typer.Option(
            "--sync-policy",
            metavar="SPEC",
            help="every, or selective:DELTA[:AVG_EVERY] (SelSync: skip the all-reduce on "
            "steps whose update is insignificant, average parameters every AVG_EVERY steps).",
        ),
    ] = None,
    epochs: Annotated[
        float | None,
        typer.Option(
            "--epochs", help="Planning now: epochs to predict for (default: the profile's)."
        ),
    ] = None,
    dataset_size: Annotated[
        int | None,
        typer.Option(
            "--dataset-size", help="Planning now: samples per epoch (default: the profile's)."
        ),
    ] = None,
    price: Annotated[
        float | None,
        typer.Option(
            "--price",
            help="Local: what this machine costs, USD per hour (default: 0, free); the ledger, "
            "the guard and the prediction use it.",
        ),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            help="Runtime policy: goodput, straggler, FILE.py:Class or module:Class "
            "(repeatable; docs/policies.md).",
        ),
    ] = None,
    explore_trials: Annotated[
        int | None, typer.Option("--explore-trials", help="Most trials of --explore (default: 6).")
    ] = None,
    replan_interval: Annotated[
        float | None,
        typer.Option("--replan-interval", help="Seconds between re-plans (default: 60)."),
    ] = None,
    checkpoint_interval: Annotated[
        float | None,
        typer.Option(
            "--checkpoint-interval", help="Seconds between checkpoints (default: the plan's)."
        ),
    ] = None,
    max_replacements: Annotated[
        int | None,
        typer.Option(
            "--max-replacements",
            help="Lost spot nodes replaced before the job fails (default: the plan's, set "
            "above its simulated p99; 20 without a plan).",
        ),
    ] = None,
    capacity_wait: Annotated[
        float | None,
        typer.Option(
            "--capacity-wait",
            help="Seconds lost nodes wait for capacity anywhere in the region before the job "
            "fails (default: the plan's, else 900).",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            help="aws/gcp: the nodes' boot image (AMI id or resolve:ssm:NAME; GCP image or "
            "family path). Default: the cloud's Deep Learning image.",
        ),
    ] = None,
    pip_index_url: Annotated[
        str | None,
        typer.Option(
            "--pip-index-url",
            help="aws/gcp: the index (pip --index-url; http(s):// or file://, no password in "
            "it) the nodes install torch and kplan's dependencies from. kplan itself always "
            "comes from the job's bucket, built from this kplan.",
        ),
    ] = None,
    install_deps: Annotated[
        bool,
        typer.Option(
            "--install-deps/--no-install-deps",
            help="aws/gcp: install torch and kplan's dependencies on the nodes, pinned to this "
            "machine's versions; --no-install-deps when --image already has them.",
        ),
    ] = True,
    network: Annotated[
        str | None, typer.Option("--network", help="gcp: VPC network (default: default).")
    ] = None,
    subnet: Annotated[
        str | None, typer.Option("--subnet", help="gcp: subnetwork of --network in the region.")
    ] = None,
    service_account: Annotated[
        str | None,
        typer.Option(
            "--service-account",
            help="gcp: email of the nodes' service account (default: the project's default "
            "one); they get only the storage and logging scopes.",
        ),
    ] = None,
    external_ip: Annotated[
        bool,
        typer.Option(
            "--external-ip/--no-external-ip",
            help="gcp: give nodes a public IP; without one the subnet needs Cloud NAT and "
            "Private Google Access for the bootstrap.",
        ),
    ] = True,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print every request it would send; send none (offline: no credentials or "
            "cloud SDK needed).",
        ),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="No progress while it runs: errors and the final summary only."
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="JSON: with --dry-run one document; else one event per line (started, node, "
            "progress, preempted, launcher, finished with the outcome).",
        ),
    ] = False,
) -> None:
    from kplan.app.launching import (
        GcpPlacement,
        LaunchRequest,
        NodeInstall,
        PlanPins,
        build_spec,
    )
    from kplan.cli.launch_flags import budget_or_default, example_name, places
    from kplan.launcher.dryrun import dry_run as plan_requests
    from kplan.launcher.dryrun import first_check
    from kplan.launcher.ledger import billing_for

    args = list(argv or [])
    if not args:
        raise InputError("give the training script", hint="kplan launch train.py")
    example_profile = example_name(example, example_profile)
    where = places(
        cloud or [],
        region or [],
        plans_now=plan is None and (profile or example_profile) is not None,
    )
    req = LaunchRequest(
        script=Path(args[0]),
        args=tuple(args[1:]),
        budget_usd=budget_or_default(budget, where.cloud, where.clouds, plan, price),
        deadline_h=deadline,
        cloud=where.cloud,
        clouds=where.clouds,
        spot=spot,
        plan_file=plan,
        profile=profile,
        example_profile=example_profile,
        region=where.region,
        regions=where.regions,
        storage_uri=storage,
        nodes=nodes,
        workers_per_node=workers_per_node,
        allow_on_demand=allow_on_demand,
        check_interval_s=check_interval,
        max_restarts=max_restarts,
        job_id=job_id,
        adapt=adapt,
        explore=explore,
        max_nodes=max_nodes,
        policies=tuple(policy or ()),
        explore_trials=explore_trials,
        replan_interval_s=replan_interval,
        checkpoint_interval_s=checkpoint_interval,
        max_replacements=max_replacements,
        capacity_wait_s=capacity_wait,
        node_install=NodeInstall(image, pip_index_url, install_deps),
        gcp=GcpPlacement(network, subnet, service_account, external_ip),
        pins=PlanPins(
            tuple(instance_type or ()), plan_nodes, global_batch, max_global_batch, fixed_batch
        ),
        precision=precision,
        compression=compression,
        sync_policy=sync_policy,
        epochs=epochs,
        dataset_size=dataset_size,
        price_usd_per_hour=price,
    )
    spec = build_spec(req)
    if spec.cloud == "local" and spec.plan is not None and not (as_json or quiet):
        from kplan.app.local_plan import prediction_line

        typer.echo(prediction_line(spec.plan))
    billing = billing_for(spec.cloud)
    if dry_run:  # offline: no provider, no cloud SDK, no credentials (placeholders instead)
        target = _offline_target(spec)
        doc = plan_requests(spec, target["storage_uri"], billing)
        doc["target"] = target
        if as_json:
            typer.echo(json.dumps(doc, indent=1))
        else:
            from kplan.cli.render.launch import render_dry_run

            render_dry_run(doc)
            _echo_target(spec.cloud, target)
        return
    from kplan.core.extras import require_extra, require_torch

    if spec.cloud == "local":
        require_torch("launch")  # before any worker starts: they run torchrun on this machine
    if explore:
        require_extra("launch --explore", "fit")  # its Bayesian optimisation runs here
    backend = _backend(spec.cloud, spec.region, spec.storage_uri)  # checks credentials first
    # Only the guard's answer: the code is packed once, by run_job, after the guard agrees.
    first = first_check(spec, billing)
    if first.stop:
        raise InputError(
            f"--budget {spec.budget_usd:g} cannot start this cluster: {first.message}",
            hint=f"the cluster costs ${spec.usd_per_hour:,.2f}/h; raise --budget",
        )
    _run(spec, backend, as_json, quiet)


def _offline_target(spec: JobSpec) -> dict[str, Any]:
    """Where a dry run says the job would go, without a provider: the cloud module's
    ``offline_target`` (marked placeholders for the account, project or bucket it cannot know
    offline), or the local backend's own storage."""
    import importlib

    from kplan.launcher.bootstrap import cluster_spec
    from kplan.launcher.providers import ProviderSettings

    if spec.cloud == "local":
        return {"storage_uri": _backend("local", spec.region, spec.storage_uri).storage.uri}
    module = importlib.import_module(f"kplan.launcher.providers.{spec.cloud}")
    settings = ProviderSettings(_home(), spec.region, spec.storage_uri)
    target: dict[str, Any] = module.offline_target(settings, cluster_spec(spec, ""))
    return target


def _echo_target(cloud: str, target: dict[str, Any]) -> None:
    def text(value: Any) -> str:
        if isinstance(value, bool):
            return "yes" if value else "no"
        return ", ".join(value) if isinstance(value, list) else str(value)

    skip = ("placeholders", "needs")
    shown = [
        f"{k.replace('_', ' ')} {text(v)}"
        for k, v in target.items()
        if k not in skip and v is not None
    ]
    if cloud != "local":
        typer.echo(f"{cloud}: " + "; ".join(shown))
    if target.get("placeholders"):
        typer.echo("placeholders, not real values: " + ", ".join(target["placeholders"]))
    if target.get("needs"):
        typer.echo(f"a real launch needs: {target['needs']}")


def _run(spec: JobSpec, backend: Backend, as_json: bool, quiet: bool = False) -> None:
    """Run the job in the foreground; progress goes to a live panel (a terminal), plain lines
    (a file or pipe), JSON lines (``--json``) or nowhere (``--quiet``), then the summary."""
    from kplan.cli.render.launch import render_outcome
    from kplan.cli.render.live import JsonView, Watcher, choose_view, quietly
    from kplan.launcher.lifecycle import run_job

    db = _db()
    view = choose_view(as_json, quiet)
    handler = _Interrupts()
    # SIGHUP too: a closed terminal stops the job with its teardown instead of orphaning it.
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in sigs}
    # A cloud bucket costs a request per metrics file: read it less often than a local folder.
    metrics_every_s = 1.0 if spec.cloud == "local" else 15.0
    try:
        view.start(_started(spec))
        try:
            with Watcher(spec.job_id, db.path, backend.storage, view, 1.0, metrics_every_s):
                outcome = run_job(spec, backend, db, on_event=quietly(view.on_event))
        finally:
            view.close()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        db.close()
    doc = asdict(outcome)
    if isinstance(view, JsonView):
        view.finished(doc)
    else:
        render_outcome(doc)
    if outcome.status != "succeeded":
        raise JobError(
            f"job {outcome.job_id} {outcome.status}: {outcome.reason}",
            hint=f"see `kplan status {outcome.job_id}` and `kplan logs {outcome.job_id}`",
        )


def _started(spec: JobSpec) -> dict[str, Any]:
    """The ``started`` event of ``--json``: the job and its cluster."""
    return {
        "job_id": spec.job_id,
        "cloud": spec.cloud,
        "region": spec.region,
        "script": spec.script,
        "args": list(spec.args),
        "nodes": len(spec.nodes),
        "workers": sum(n.gpus for n in spec.nodes),
        "usd_per_hour": spec.usd_per_hour,
        "budget_usd": spec.budget_usd,
        "deadline_h": spec.deadline_h,
    }


def status_command(
    job: Annotated[
        str | None,
        typer.Argument(
            help="Job id, a unique prefix of one, or `last` (the newest job); default: every job."
        ),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Refresh until the job ends (exit 0; Ctrl-C stops watching): redrawn in place "
            "on a terminal, a new block each time otherwise.",
        ),
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    import time

    from kplan.cli.render.launch import render_job, render_jobs
    from kplan.launcher.summary import job_summary

    if not 0 < interval <= 86400:
        raise InputError(f"--interval {interval} must be > 0 and <= 86400", hint="seconds, e.g. 2")
    if job is not None:  # a prefix or `last` names one job for the whole watch
        with _db(readonly=True) as db:
            job = _job_or_fail(db, job).id
    if watch and not as_json and sys.stdout.isatty():
        _watch_live(job, interval)  # redrawn in place until the job ends (or Ctrl-C)
        return
    with _db(readonly=True) as db, contextlib.suppress(KeyboardInterrupt):
        while True:
            now = time.time()
            if job is None:
                docs = [job_summary(db, j, now, events=0) for j in db.jobs()]
                if as_json:
                    typer.echo(json.dumps(docs, indent=1))
                else:
                    render_jobs(docs)
                finished = all(d["status"] not in _ACTIVE for d in docs)
            else:
                doc = job_summary(db, _job_or_fail(db, job), now)
                if as_json:
                    typer.echo(json.dumps(doc, indent=1))
                else:
                    render_job(doc)
                finished = doc["status"] not in _ACTIVE or doc["launcher"] == "gone"
            if not watch or finished:
                return
            time.sleep(interval)


_ACTIVE = ("pending", "provisioning", "running", "recovering", "resizing", "stopping")


def _watch_live(job: str | None, interval: float) -> None:
    """``status --watch`` on a terminal: one view redrawn in place (every job's table, or one
    job's progress panel over its instances and latest events) until it ends; Ctrl-C ends it
    with exit 0."""
    import time

    from kplan.cli.render.launch import job_view, jobs_view
    from kplan.cli.render.live import watch_live
    from kplan.launcher.summary import job_summary

    with _db(readonly=True) as db:
        if job is None:

            def frame() -> tuple[Any, bool]:
                docs = [job_summary(db, j, time.time(), events=0) for j in db.jobs()]
                done = all(d["status"] not in _ACTIVE or d["launcher"] == "gone" for d in docs)
                return jobs_view(docs), done

        else:
            from rich.console import Group

            from kplan.cli.render.live import progress_panel
            from kplan.launcher.progress import ProgressTracker

            tracker = ProgressTracker(job, _storage_or_none(_job_or_fail(db, job)))

            def frame() -> tuple[Any, bool]:
                now = time.time()
                doc = job_summary(db, _job_or_fail(db, job), now, events=5)
                snap = tracker.snapshot(db, now)
                done = doc["status"] not in _ACTIVE or doc["launcher"] == "gone"
                if snap is None:
                    return job_view(doc), done
                return Group(progress_panel(snap, "kplan status"), job_view(doc)), done

        watch_live(frame, interval)


def _storage_or_none(rec: JobRecord) -> Any:
    """The job's storage (its metrics), or None when it cannot be reached from here (a cloud
    without credentials or SDK): the view then shows the job without training numbers."""
    from kplan.core.errors import KplanError
    from kplan.launcher.jobspec import JobSpec

    try:
        return _backend(rec.cloud, rec.region, JobSpec.from_dict(rec.spec).storage_uri).storage
    except (KplanError, ImportError):
        return None


def logs_command(
    job: Annotated[
        str, typer.Argument(help="Job id, a unique prefix of one, or `last` (the newest job).")
    ],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing new lines until the job ends (or its launcher is gone and "
            "nothing of it runs).",
        ),
    ] = False,
    node: Annotated[int | None, typer.Option("--node", help="Only this node rank.")] = None,
) -> None:
    import time

    from kplan.launcher.jobspec import JobSpec

    if node is not None and not 0 <= node < 4096:
        raise InputError(f"--node {node} must be a node rank >= 0", hint="e.g. --node 0")
    with _db(readonly=True) as db:
        rec = _job_or_fail(db, job)
        job = rec.id
        spec = JobSpec.from_dict(rec.spec)
        backend = _backend(rec.cloud, rec.region, spec.storage_uri)
        storage = backend.storage
        prefix = f"{job}/logs/" + ("" if node is None else f"node-{node}.log")
        offsets: dict[str, int] = {}
        shown: str | None = None  # the file whose lines were printed last (its header once)
        changed_at = checked_at = time.monotonic()
        while True:
            current = db.job(job)  # before reading: the lines of a job that just ended are read
            for key in sorted(storage.list_keys(prefix)):
                data = storage.get_bytes(key) or b""
                start = offsets.get(key, 0)
                if len(data) > start:
                    if node is None and key != shown:
                        typer.echo(f"==> {key.rsplit('/', 1)[-1]} <==")
                        shown = key
                    typer.echo(data[start:].decode("utf-8", "replace"), nl=False)
                    offsets[key] = len(data)
                    changed_at = time.monotonic()
            if not follow or current is None or current.terminal:
                if not offsets:
                    _no_logs(current or rec, node)
                return
            if _launcher_gone(current):  # nothing will record an end: stop on our own
                now = time.monotonic()
                idle = now - changed_at >= _LOGS_IDLE_S
                if idle or now - checked_at >= _LOGS_CLOUD_CHECK_S or checked_at == changed_at:
                    checked_at = now
                    if idle or not _cloud_alive(backend, job):
                        typer.echo(
                            f"job {job}: its launcher is gone and "
                            + ("nothing changed for a while" if idle else "nothing is running")
                            + f"; `kplan down {job}` records how it ended",
                            err=True,
                        )
                        return
            time.sleep(1.0)


def _no_logs(rec: JobRecord, node: int | None) -> None:
    """Say why there is nothing to print: the job has not written a log yet, or (a job that
    ended) the node never ran."""
    which = "" if node is None else f" node {node}"
    if not rec.terminal:
        typer.echo(f"no logs yet for job {rec.id}{which} ({rec.status})", err=True)
        return
    from kplan.launcher.jobspec import JobSpec

    ranks = len(JobSpec.from_dict(rec.spec).nodes)
    why = "no node of it ran" if node is None else f"node {node} never ran"
    typer.echo(
        f"job {rec.id} {rec.status} and left no log{which}: {why} "
        f"(its nodes: 0-{ranks - 1}; `kplan status {rec.id}` shows what happened)",
        err=True,
    )


_LOGS_IDLE_S = 60.0  # logs -f on a job without a launcher: stop after this long unchanged
_LOGS_CLOUD_CHECK_S = 10.0  # ... or as soon as the cloud shows nothing alive (checked this often)


def _launcher_gone(job: JobRecord) -> bool:
    from kplan.core.procs import read_stat
    from kplan.launcher.summary import launcher_alive

    if job.terminal:
        return False
    if not launcher_alive(job) or job.launcher_pid is None:
        return True
    stat = read_stat(job.launcher_pid)  # a launcher killed but not yet reaped is gone too
    return stat is not None and stat.state in ("Z", "X")


def _cloud_alive(backend: Backend, job_id: str) -> bool:
    """Whether the cloud shows an instance of the job alive (True when it cannot tell)."""
    from kplan.core.errors import KplanError
    from kplan.launcher.state import GONE_STATES

    try:
        return any(i.state not in GONE_STATES for i in backend.provider.query_instances(job_id))
    except KplanError:
        return True


def down_command(
    job: Annotated[
        str | None,
        typer.Argument(help="Job id, a unique prefix of one, or `last` (the newest job)."),
    ] = None,
    all_jobs: Annotated[bool, typer.Option("--all", help="Every job that may still run.")] = False,
    cloud: Annotated[
        str | None,
        typer.Option("--cloud", help="Cloud of a job missing from the state database."),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", help="Region of a job missing from the database.")
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to let a live launcher stop by itself.")
    ] = 60.0,
    forget: Annotated[
        bool,
        typer.Option(
            "--forget",
            help="Remove JOB's record (database rows; its journal keeps what was spent) once "
            "the cloud shows nothing alive tagged with it. Terminates nothing.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    from kplan.cli.render.launch import render_down
    from kplan.launcher.clock import SystemClock
    from kplan.launcher.down import down_job, forget_job, job_location, leftover_jobs
    from kplan.launcher.jobspec import check_job_id
    from kplan.launcher.provider import ClusterSpec

    if (job is None) == (not all_jobs):
        raise InputError("give a job id or --all", hint="kplan down kp-... or kplan down --all")
    if forget and job is None:
        raise InputError("--forget takes one job id, not --all", hint="kplan down --forget kp-...")
    if not 0 <= wait <= 86400:
        raise InputError(f"--wait {wait} must be >= 0 and <= 86400", hint="seconds")
    results = []
    with _db() as db:
        if job is not None:
            # a prefix or `last` names a job of the database; an id it lacks stays as typed
            targets = [check_job_id(db.resolve_job_id(job, known_only=False))]
        else:
            targets = leftover_jobs(db)
        for job_id in targets:
            # The database row, else the job's launch journal (its row was never written).
            found = job_location(db, job_id)
            cluster = None
            where: str | None
            if found is not None:
                which, where, storage = found
                if db.job(job_id) is None and where is not None:
                    cluster = ClusterSpec(job_id=job_id, cloud=which, region=where)
            elif cloud is None:
                raise InputError(
                    f"job {job_id!r} is not in {db.path}",
                    hint="give --cloud (and --region) to find its instances by tag",
                )
            else:
                which, where, storage = cloud.lower(), region, None
                if region is not None:
                    cluster = ClusterSpec(job_id=job_id, cloud=which, region=region)
            backend = _backend(which, where, storage)
            if forget:
                spent = forget_job(job_id, backend, db, SystemClock())
                doc = {"job_id": job_id, "forgotten": True, "spend_usd": spent}
                typer.echo(
                    json.dumps(doc, indent=1)
                    if as_json
                    else f"{job_id}: forgotten (spent ${spent:,.4f}; kept in its journal)"
                )
                return
            result = down_job(
                job_id, backend, db, SystemClock(), wait_launcher_s=wait, cluster=cluster
            )
            results.append(asdict(result))
    if as_json:
        typer.echo(json.dumps(results, indent=1))
    else:
        render_down(results)
    unrecorded = [r for r in results if not r["recorded"]]
    if unrecorded:
        first = unrecorded[0]
        raise JobError(
            f"job {first['job_id']}: its instances are gone but the state database could not "
            f"record it ({first['note']})",
            hint=f"run `kplan down {first['job_id']}` again once the database is writable",
        )


def register(app: typer.Typer) -> None:
    app.command("launch", help=_LAUNCH_HELP, no_args_is_help=True)(launch_command)
    app.command("status", help="Show jobs, or one job's instances, spend and events.")(
        status_command
    )
    app.command("logs", help="Print a job's logs (all nodes, or --node).")(logs_command)
    app.command("down", help="Terminate a job's instances (idempotent; works without a DB).")(
        down_command
    )
