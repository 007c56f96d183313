"""``kplan check [--cloud aws|gcp]``: credentials, GPU quotas, the job bucket and SDKs, one line
each, before a launch."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    app.command(
        "check",
        help="Check this machine before a launch: the cloud SDKs, credentials (found and valid), "
        "the GPU quotas of the region, the job bucket and torch, one line each with a hint for "
        "each problem. Exit 0 when the cloud asked for (or, without --cloud, at least one "
        "cloud) is ready, 2 otherwise. Example: kplan check --cloud aws --region us-west-2",
    )(check_command)


def check_command(
    cloud: str | None = typer.Option(None, "--cloud", help="aws or gcp (default: both)."),
    region: str | None = typer.Option(
        None,
        "--region",
        help="Region whose GPU quotas to read (default: AWS_REGION/AWS_DEFAULT_REGION or "
        "us-east-1; us-central1 on GCP).",
    ),
    storage: str | None = typer.Option(
        None,
        "--storage",
        help="The job bucket to check, s3://... or gs://... (default: KPLAN_AWS_STORAGE_URI, "
        "KPLAN_GCP_STORAGE_URI); needs --cloud.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
) -> None:
    from kplan.app.checking import CLOUDS, CheckRequest, run_checks
    from kplan.core import flags

    flags.text("--cloud", cloud, choices=CLOUDS, hint="aws or gcp")
    flags.text("--region", region, hint="e.g. us-east-1, us-central1")
    flags.text("--storage", storage, hint="e.g. s3://bucket/kplan or gs://bucket/kplan")
    result = run_checks(CheckRequest(cloud, region, storage))
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        from kplan.cli.render.check import check_lines

        for line in check_lines(result):
            typer.echo(line)
    raise typer.Exit(result.exit_code)
