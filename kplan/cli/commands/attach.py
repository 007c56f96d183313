"""``kplan attach JOB --storage URI``: follow a job launched on another machine."""

from __future__ import annotations

import json
from typing import Annotated

import typer

_HELP = (
    "Follow a job launched on another machine: read its controller's state snapshot "
    "(JOB/state/snapshot.json) from the job's storage with this machine's cloud credentials, "
    "check it, and record the job here (row, spec, instances, ledger, events). Then `kplan "
    "status`, `logs`, `report` and `down` work on it as where it was launched. Run again, or on "
    "a job already here, it merges what is newer and never adds a row twice; a damaged, foreign "
    "or missing snapshot writes nothing (exit 2)."
)


def attach_command(
    job: Annotated[
        str,
        typer.Argument(help="The job's full id (kp-...), as `kplan launch` printed it."),
    ],
    storage: Annotated[
        str,
        typer.Option(
            "--storage",
            help="The job's storage, as its launch used it: s3://BUCKET/PREFIX, "
            "gs://BUCKET/PREFIX or a local folder (the cloud follows from it).",
        ),
    ],
    region: Annotated[
        str | None,
        typer.Option(
            "--region",
            help="Region to reach the storage from (default: the cloud SDK's, e.g. "
            "AWS_DEFAULT_REGION).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    import time

    from kplan.app.attaching import AttachRequest, attach_job
    from kplan.cli.commands.jobs import _backend, _db
    from kplan.core.text import clean

    result = attach_job(AttachRequest(job, storage, region), _db, _backend, time.time())
    done, doc = result.attached, result.summary
    commands = [
        f"kplan status {doc.id} --watch",
        f"kplan logs {doc.id} -f",
        f"kplan report {doc.id}",
        f"kplan down {doc.id}",
    ]
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "job_id": doc.id,
                    "created": done.created,
                    "merged": done.merged,
                    "snapshot_seq": done.seq,
                    "snapshot_written_at": done.written_at,
                    "status": doc.status,
                    "cloud": doc.cloud,
                    "region": doc.region,
                    "alive_instances": doc.alive_instances,
                    "spend_usd": doc.spend_usd,
                    "budget_usd": doc.budget_usd,
                    "commands": commands,
                },
                indent=1,
            )
        )
        return
    how = "attached" if done.created else "already here; merged" if done.merged else "up to date"
    typer.echo(
        clean(
            f"{doc.id}: {how} ({doc.status} on {doc.cloud} {doc.region}; "
            f"{doc.alive_instances} instance(s) alive; spent ${doc.spend_usd:,.4f} of "
            f"${doc.budget_usd:,.2f})"
        )
    )
    if result.age is not None:
        typer.echo(result.age)
    typer.echo("follow it: " + "; ".join(commands))


def register(app: typer.Typer) -> None:
    app.command("attach", help=_HELP, no_args_is_help=True)(attach_command)
