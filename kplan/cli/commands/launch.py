"""``kplan launch``: run a plan and keep it alive within its budget and deadline.

The command parses its flags (``kplan/cli/launch_options.py``: ``LAUNCH_FLAGS``), calls
``kplan.app.launching.build_spec`` for the job, and renders: a dry run's requests, or the job run
in the foreground with its live view. ``kplan status``, ``logs`` and ``down`` are in
``kplan/cli/commands/jobs.py``.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer

from kplan.cli.commands.jobs import _backend, _db, _home
from kplan.cli.launch_flags import launch_request
from kplan.cli.launch_options import LAUNCH_FLAGS, takes_flags
from kplan.core.errors import InputError, JobError

if TYPE_CHECKING:
    from kplan.app.controlling import Detached
    from kplan.catalogs.images import ImagePython
    from kplan.cli.render.live import Started
    from kplan.launcher.controller_node import ControllerSite
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.providers import Backend
    from kplan.launcher.providers.aws import AwsTarget
    from kplan.launcher.providers.gcp import GcpTarget

_LAUNCH_HELP = (
    "Launch SCRIPT on a cluster and keep it alive within --budget and --deadline.\n\n"
    "The training script's own flags go after `--`. On aws/gcp the cluster comes from a plan: "
    "--plan FILE (from `kplan estimate --out`), or a search now from --profile or --example "
    "(several --cloud/--region: the search picks among them). --cloud local (the default) runs "
    "--nodes worker groups on this machine, free unless --price; --budget is needed only for a "
    "cost. "
    "The job's controller replaces preempted spot instances, accrues the ledger, stops the job "
    "(with a checkpoint) before the budget or the deadline would be crossed, and always tears "
    "down. A cloud job is detached by default: its controller runs on a small instance of its "
    "own (--controller), the command returns at once and the laptop may close (follow the job "
    "with `kplan status/logs/down/report JOB`); --foreground keeps it in this command. A local "
    "job's controller stays in the foreground unless --detach."
)
_CONTROLLER_HELP = (
    "Run (restart) the controller of a launched job whose controller died, from its durable "
    "state: the state database, the launch journal and JOB/controller.json in the job's storage "
    "(on a machine without the job's database, give --cloud, --region and --storage). It adopts "
    "what the cloud runs, bills no instance twice, and goes on where the job was. Refused while "
    "the job's controller is alive."
)


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


@takes_flags(LAUNCH_FLAGS)
def launch_command(**given: Any) -> None:
    from kplan.app.launching import build_spec

    spec = build_spec(launch_request(given))
    as_json, quiet = bool(given["as_json"]), bool(given["quiet"])
    if spec.cloud == "local" and spec.plan is not None and not (as_json or quiet):
        from kplan.app.local_plan import prediction_line

        typer.echo(prediction_line(spec.plan))
        for note in spec.plan.notes:  # what it extrapolates or cannot know, said before it runs
            typer.echo(f"note: {note}")
    _say_if_plain(spec, as_json or quiet)
    if spec.cloud != "local" and not (as_json or quiet):
        typer.echo(f"image: {_image(spec).summary()}")
    site = _site(spec, _detach(spec, given), given["controller"])
    if site is not None and not (as_json or quiet):
        typer.echo(site.summary())
    if given["dry_run"]:  # offline: no provider, no cloud SDK, no credentials (placeholders)
        _dry_run(spec, as_json, site)
        return
    _start(spec, as_json, quiet, explore=bool(given["explore"]), site=site)


def _detach(spec: JobSpec, given: dict[str, Any]) -> bool:
    """--detach, --foreground, else the default: cloud jobs detach, local jobs do not."""
    if given["detach"] and given["foreground"]:
        raise InputError("--detach and --foreground contradict", hint="give one of them")
    if given["detach"] or given["foreground"]:
        return bool(given["detach"])
    return spec.cloud != "local"


def _site(spec: JobSpec, detach: bool, asked: str | None) -> ControllerSite | None:
    """Where the detached job's controller runs (None: in the foreground, here)."""
    from kplan.launcher.controller_node import choose_site

    if not detach:
        if asked is not None:
            raise InputError(
                f"--controller {asked} places a detached job's controller",
                hint="add --detach, or drop --controller",
            )
        return None
    return choose_site(spec, asked)


def _image(spec: JobSpec) -> ImagePython:
    """The nodes' boot image (--image, else KPLAN_<CLOUD>_IMAGE, else the cloud's default)
    and what the catalog or its name says of its Python (kplan/catalogs/images.py)."""
    from kplan.catalogs.images import default_image, image_python
    from kplan.launcher.providers.envvars import setting

    given = spec.install.image or setting(f"KPLAN_{spec.cloud.upper()}_IMAGE")
    return image_python(spec.cloud, given) if given else default_image(spec.cloud)


def _image_doc(spec: JobSpec) -> dict[str, object]:
    info = _image(spec)
    python = None if info.python is None else ".".join(map(str, info.python))
    return {"image": info.image, "os": info.os, "python": python, "python_source": info.source,
            "fits": info.fits}  # fmt: skip


def _say_if_plain(spec: JobSpec, silent: bool) -> None:
    """A script without the kplan runtime runs as plain torchrun: say so before it starts."""
    from kplan.launcher.plainscript import PLAIN_NOTE, uses_runtime

    if not silent and uses_runtime(spec.script) is False:
        typer.echo(f"note: {PLAIN_NOTE}")


def _dry_run(spec: JobSpec, as_json: bool, site: ControllerSite | None) -> None:
    from kplan.launcher.dryrun import dry_run as plan_requests
    from kplan.launcher.ledger import billing_for

    cloud = None if spec.cloud == "local" else _cloud_target(spec)
    target: LocalTarget | AwsTarget | GcpTarget = (
        {"storage_uri": _backend("local", spec.region, spec.storage_uri).storage.uri}
        if cloud is None
        else cloud
    )
    run = plan_requests(spec, target["storage_uri"], billing_for(spec.cloud), site)
    if as_json:
        image = None if cloud is None else _image_doc(spec)
        typer.echo(json.dumps({**run.to_dict(), "target": target, "image": image}, indent=1))
        return
    from kplan.cli.render.launch import render_dry_run

    render_dry_run(run)
    if cloud is not None:
        _echo_target(spec.cloud, cloud)


def _start(
    spec: JobSpec, as_json: bool, quiet: bool, *, explore: bool, site: ControllerSite | None
) -> None:
    from kplan.core.extras import require_extra, require_torch
    from kplan.launcher.dryrun import first_check
    from kplan.launcher.ledger import billing_for

    if spec.cloud == "local":
        require_torch("launch")  # before any worker starts: they run torchrun on this machine
    if explore:
        require_extra("launch --explore", "fit")  # its Bayesian optimisation runs here
    backend = _backend(spec.cloud, spec.region, spec.storage_uri)  # checks credentials first
    # Only the guard's answer: the code is packed once, by run_job, after the guard agrees.
    extra = [] if site is None or site.usd_per_hour == 0 else [site.usd_per_hour]
    first = first_check(spec, billing_for(spec.cloud), extra)
    if first.stop and first.reason == "deadline":
        raise InputError(
            f"--deadline {spec.deadline_h:g} cannot start this cluster: {first.message}",
            hint="raise --deadline (hours from now)",
        )
    if first.stop:
        raise InputError(
            f"--budget {spec.budget_usd:g} cannot start this cluster: {first.message}",
            hint=f"the cluster costs ${spec.usd_per_hour:,.2f}/h; raise --budget",
        )
    if site is not None and site.where == "instance":
        from kplan.app.controller_instance import start_on_instance

        with _db() as db:
            iid = start_on_instance(spec, backend, db, site)
            _echo_on_instance(spec.job_id, iid, site, as_json)
        return
    if site is not None:
        from kplan.app.controlling import start_detached

        with _db() as db:
            _echo_detached(start_detached(spec, backend, db), as_json)
        return
    _run(spec, backend, as_json, quiet)


def _echo_detached(started: Detached, as_json: bool) -> None:
    if as_json:
        doc = {**asdict(started), "commands": started.commands()}
        typer.echo(json.dumps(doc, indent=1))
        return
    typer.echo(
        f"job {started.job_id} started; its controller runs detached (pid "
        f"{started.controller_pid}, log {started.log})"
    )
    for line in started.commands():
        typer.echo(f"  {line}")


def _echo_on_instance(job_id: str, iid: str, site: ControllerSite, as_json: bool) -> None:
    from kplan.app.controlling import Detached

    commands = Detached(job_id, 0, "").commands()[:-1]
    if as_json:
        offer = site.offer
        doc = {
            "job_id": job_id,
            "controller_instance": iid,
            "instance_type": None if offer is None else offer.instance_type,
            "usd_per_hour": site.usd_per_hour,
            "reason": site.reason,
            "commands": commands,
        }
        typer.echo(json.dumps(doc, indent=1))
        return
    typer.echo(f"job {job_id} started; its controller runs on instance {iid}")
    for line in commands:
        typer.echo(f"  {line}")


def controller_command(
    job: Annotated[str, typer.Argument(help="Job id, a unique prefix of one, or `last`.")],
    detach: Annotated[
        bool, typer.Option("--detach", help="Run it as its own process and return at once.")
    ] = False,
    cloud: Annotated[
        str | None, typer.Option("--cloud", help="Cloud of a job missing from the database.")
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", help="Region of a job missing from the database.")
    ] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="Storage of a job missing from the database.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the final summary.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON event per line.")] = False,
    mode: Annotated[str, typer.Option("--mode", hidden=True)] = "restarted",
) -> None:
    from kplan.app.controlling import check_not_running, detach_controller
    from kplan.launcher.jobspec import JobSpec, check_job_id

    with _db() as db:
        job_id = check_job_id(db.resolve_job_id(job, known_only=False))
        rec = db.job(job_id)
        if rec is not None and rec.terminal:
            raise InputError(
                f"job {job_id} already ended ({rec.status}): there is nothing to control",
                hint=f"`kplan status {job_id}` shows how it ended",
            )
        if rec is not None:
            known = (rec.cloud, rec.region, JobSpec.from_dict(rec.spec).storage_uri)
            _same_as_database(job_id, known, (cloud, region, storage))
            cloud, region, storage = known
        elif cloud is None:
            raise InputError(
                f"no job {job_id!r} in {db.path}",
                hint="give its --cloud, --region and --storage to take it over from its storage",
            )
        backend = _backend(cloud, region, storage)
        if mode != "detached":  # a detached one was started by the command that checked
            check_not_running(db, backend, job_id)
        if detach:
            if rec is None:
                raise InputError(
                    "--detach needs the job in this machine's database",
                    hint=f"run `kplan controller {job_id} --cloud ...` in the foreground once",
                )
            _echo_detached(detach_controller(db, job_id, cloud), as_json)
            return
    from kplan.launcher.controller_node import OWN_ENV

    own = os.environ.get(OWN_ENV) or None  # set on a controller node (controller_node.py)
    if own is not None:
        from kplan.app.controller_instance import wait_for_own

        wait_for_own(backend.storage, job_id, own)
    spec = _resumed_spec(job_id, backend)
    if rec is None and cloud == spec.cloud and spec.region != region:
        # a job that moved (kplan/launcher/region_move.py) runs where its spec says: the
        # region given for a job missing from the database may be the one it started in
        backend = _backend(cloud, spec.region, storage)
    _run(spec, backend, as_json, quiet, resume=mode, own=own)


def _same_as_database(
    job_id: str, known: tuple[str, str, str | None], given: tuple[str | None, ...]
) -> None:
    """--cloud, --region and --storage name a job missing from the database; for one in it they
    must agree with it (``--cloud azure`` was ignored without a word). An empty one is no value:
    a local controller instance runs ``--storage ''`` (controller_node.controller_argv) on this
    machine's database."""
    for flag, have, want in zip(("--cloud", "--region", "--storage"), known, given, strict=True):
        if want and want != have:
            raise InputError(
                f"{flag} {want[:80]!r}: job {job_id} is in this machine's database with "
                f"{flag[2:]} {have!r}",
                hint="drop --cloud, --region and --storage: they are for a job missing from the "
                "database",
            )


def _resumed_spec(job_id: str, backend: Backend) -> JobSpec:
    """The job's spec for the live view: from the database, else its controller document."""
    from kplan.launcher.controller import read_controller
    from kplan.launcher.jobspec import JobSpec

    with _db(readonly=True) as db:
        rec = db.job(job_id)
    if rec is not None:
        return JobSpec.from_dict(rec.spec)
    doc = read_controller(backend.storage, job_id)
    if doc is None:
        raise InputError(
            f"no controller state for job {job_id} in {backend.storage.uri}",
            hint="check --cloud, --region and --storage",
        )
    return JobSpec.from_dict(doc.spec)


class LocalTarget(TypedDict):
    """Where a local job would go: the local backend's own storage."""

    storage_uri: str


def _cloud_target(spec: JobSpec) -> AwsTarget | GcpTarget:
    """Where a dry run says a cloud job would go, without a provider: the cloud module's
    ``offline_target`` (marked placeholders for the account, project or bucket it cannot know
    offline)."""
    from kplan.launcher.bootstrap import cluster_spec
    from kplan.launcher.providers import ProviderSettings

    settings = ProviderSettings(_home(), spec.region, spec.storage_uri)
    if spec.cloud == "aws":
        from kplan.launcher.providers import aws

        return aws.offline_target(settings, cluster_spec(spec, ""))
    from kplan.launcher.providers import gcp

    return gcp.offline_target(settings, cluster_spec(spec, ""))


def _echo_target(cloud: str, target: AwsTarget | GcpTarget) -> None:
    """The cloud's line (account or project, storage, identity, network), its placeholders
    and what a real launch needs."""

    def text(value: object) -> str:
        if isinstance(value, bool):
            return "yes" if value else "no"
        return ", ".join(value) if isinstance(value, list) else str(value)

    skip = ("placeholders", "needs")
    shown = [
        f"{k.replace('_', ' ')} {text(v)}"
        for k, v in target.items()
        if k not in skip and v is not None
    ]
    typer.echo(f"{cloud}: " + "; ".join(shown))
    if target["placeholders"]:
        typer.echo("placeholders, not real values: " + ", ".join(target["placeholders"]))
    if target["needs"]:
        typer.echo(f"a real launch needs: {target['needs']}")


def _run(
    spec: JobSpec,
    backend: Backend,
    as_json: bool,
    quiet: bool = False,
    resume: str | None = None,
    own: str | None = None,
) -> None:
    """Run the job in the foreground; progress goes to a live panel (a terminal), plain lines
    (a file or pipe), JSON lines (``--json``) or nowhere (``--quiet``), then the summary.
    ``resume``: take the job over from its durable state (``kplan controller``; the mode)."""
    from kplan.cli.render.launch import render_outcome
    from kplan.cli.render.live import JsonView, Watcher, choose_view, quietly
    from kplan.launcher.controller_resume import resume_job
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
                sink = quietly(view.on_event)
                outcome = (
                    run_job(spec, backend, db, on_event=sink)
                    if resume is None
                    else resume_job(spec.job_id, backend, db, on_event=sink, mode=resume, own=own)
                )
        finally:
            view.close()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        db.close()
    if isinstance(view, JsonView):
        view.finished(outcome)
    else:
        render_outcome(outcome)
    if outcome.status != "succeeded":
        raise JobError(
            f"job {outcome.job_id} {outcome.status}: {outcome.reason}",
            hint=f"see `kplan status {outcome.job_id}` and `kplan logs {outcome.job_id}`",
        )


def _started(spec: JobSpec) -> Started:
    """The ``started`` event of ``--json``: the job and its cluster."""
    from kplan.cli.render.live import Started

    return Started(
        job_id=spec.job_id,
        cloud=spec.cloud,
        region=spec.region,
        script=spec.script,
        args=list(spec.args),
        nodes=len(spec.nodes),
        workers=sum(n.gpus for n in spec.nodes),
        usd_per_hour=spec.usd_per_hour,
        budget_usd=spec.budget_usd,
        deadline_h=spec.deadline_h,
    )


def register(app: typer.Typer) -> None:
    from kplan.cli.commands import jobs

    app.command("launch", help=_LAUNCH_HELP, no_args_is_help=True)(launch_command)
    app.command("controller", help=_CONTROLLER_HELP, no_args_is_help=True)(controller_command)
    jobs.register(app)
