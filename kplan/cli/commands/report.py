"""``kplan report JOB|--all``: predicted against actual time, cost and step time of jobs."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kplan.core.errors import InputError, KplanError

if TYPE_CHECKING:
    from kplan.launcher.report import JobReport
    from kplan.launcher.statcost import StepsAgainst
    from kplan.launcher.state import JobRecord, StateDB
    from kplan.launcher.storage import Storage


def _storage(rec: JobRecord) -> tuple[Storage | None, str]:
    """The job's storage (its metrics), or None and why it cannot be reached."""
    from kplan.cli.commands.jobs import _backend
    from kplan.launcher.jobspec import JobSpec

    try:
        spec = JobSpec.from_dict(rec.spec)
        return _backend(rec.cloud, rec.region, spec.storage_uri).storage, ""
    except KplanError as err:
        return None, f"n/a: metrics unreachable ({err.message})"


def build(db: StateDB, rec: JobRecord, profile: Path | None) -> JobReport:
    from kplan.app.naive_plan import naive_planner
    from kplan.launcher.report import build_report, catalog_on_demand

    storage, note = _storage(rec)
    return build_report(
        db,
        rec,
        time.time(),
        storage=storage,
        storage_note=note,
        on_demand_price=None if rec.cloud == "local" else catalog_on_demand(),
        naive=naive_planner(None if profile is None else str(profile)),
    )


def report_command(
    job: Annotated[
        str | None, typer.Argument(help="Job id, a unique prefix of one, or `last` (the newest).")
    ] = None,
    all_jobs: Annotated[bool, typer.Option("--all", help="Every job in the database.")] = False,
    profile: Annotated[
        Path | None,
        typer.Option("--profile", help="The job's profile, for the naive-plan comparison."),
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained HTML page.")
    ] = None,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            metavar="DENSE_JOB",
            help="A dense job of the same training: measure this compressed job's statistical "
            "cost, its samples to the dense job's final training loss / the dense job's, and "
            "print the `kplan estimate --compression-steps` flag that plans with it.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    from kplan.cli.commands.jobs import _db, _job_or_fail, sync_job

    if (job is None) == (not all_jobs):
        raise InputError("give a job id or --all", hint="kplan report kp-... or kplan report --all")
    if against is not None and job is None:
        raise InputError(
            "--against compares one job with a dense one, not --all",
            hint="kplan report COMPRESSED_JOB --against DENSE_JOB",
        )
    if profile is not None:
        from kplan.app.planning import load_profile

        load_profile(profile)  # a bad file is an error here, not a note in the report
    if html is not None:
        from kplan.core.extras import require_extra
        from kplan.core.files import check_writable

        require_extra("report --html", "report")  # matplotlib draws the plots
        check_writable(html, "--html", [] if profile is None else [("the --profile", profile)])
    if job is not None:  # the detached controller's rows first (kplan/launcher/snapshot.py)
        import time

        age = sync_job(job, time.time())
        if age is not None and not as_json:
            typer.echo(age)
    with _db(readonly=True) as db:
        records = [_job_or_fail(db, job)] if job is not None else db.jobs()
        measured = (
            None if against is None else _steps_against(records[0], _job_or_fail(db, against))
        )
        reports = [build(db, rec, profile) for rec in records]
    if html is not None:
        from kplan.core.files import write_atomic
        from kplan.launcher.report_html import render_html

        write_atomic(html, render_html(reports), "--html")
    if as_json:
        docs = [r.to_dict() for r in reports]
        if measured is not None:
            docs[0]["steps_against"] = {
                **asdict(measured),
                "estimate_flag": measured.estimate_flag(),
            }
        typer.echo(json.dumps(docs[0] if job is not None else docs, indent=1))
    else:
        from kplan.cli.render.report import render_report
        from kplan.planner.compstats import MAX_MEASURED, MIN_MEASURED

        for r in reports:
            render_report(r)
        if measured is not None:
            typer.echo(f"statistical cost ({measured.compression}): {measured.note}")
            flag = measured.estimate_flag()
            if flag:
                typer.echo(f"plan with it: kplan estimate ... {flag}")
            elif measured.multiplier is None:
                typer.echo("nothing to plan with: the job stopped before the dense job's loss")
            else:
                typer.echo(
                    f"nothing to plan with: x{measured.multiplier:.3g} is outside the "
                    f"{MIN_MEASURED:g}-{MAX_MEASURED:g} that --compression-steps takes "
                    "(did the two jobs train the same thing?)"
                )
        if html is not None:
            typer.echo(f"wrote {html}")


def _steps_against(rec: JobRecord, dense: JobRecord) -> StepsAgainst:
    """``rec``'s statistical cost against ``dense`` from both jobs' step records."""
    from kplan.launcher.metrics_read import read_records
    from kplan.launcher.statcost import curve, steps_against

    curves = []
    for r in (rec, dense):
        storage, note = _storage(r)
        if storage is None:
            raise InputError(f"job {r.id}: {note}", hint="check the job's storage (kplan logs)")
        curves.append(curve(read_records(storage, r.id), r.id))
    return steps_against(rec.id, curves[0], dense.id, curves[1])


def register(app: typer.Typer) -> None:
    app.command("report", help="Predicted vs actual time, cost and step time of a job.")(
        report_command
    )
