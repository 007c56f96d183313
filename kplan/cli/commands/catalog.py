"""``kplan catalog``: browse the instance, GPU and price catalog."""

from __future__ import annotations

from pathlib import Path

import typer

from kplan.catalogs.current import load_current
from kplan.catalogs.listing import OfferFilter, select_offers

app = typer.Typer(
    help="Browse the catalog of GPU instance types, prices and spot rates.",
    no_args_is_help=True,
)


@app.command("list")
def list_offers(
    cloud: str | None = typer.Option(None, "--cloud", help="aws or gcp."),
    region: str | None = typer.Option(None, "--region", help="e.g. us-east-1, us-central1."),
    gpu: str | None = typer.Option(None, "--gpu", help="e.g. T4, A100-80GB (any case)."),
    instance_type: str | None = typer.Option(
        None, "--instance-type", help="e.g. g4dn.12xlarge, n1-standard-8+1xT4."
    ),
    market: str | None = typer.Option(None, "--market", help="on-demand or spot."),
    max_price: float | None = typer.Option(None, "--max-price", help="Most USD per hour."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
    catalog_dir: Path | None = typer.Option(
        None,
        "--catalog",
        help="A catalog directory to use instead of the current one (the newest from "
        "`kplan catalog update`, else the shipped one).",
    ),
    show_notes: bool = typer.Option(
        False, "--notes", help="List the rows the loader dropped or doubted."
    ),
) -> None:
    """List offers (instance type, GPUs and their memory, zone, market, price), cheapest
    first."""
    from kplan.core import flags

    flags.text("--cloud", cloud, hint="aws or gcp")
    flags.text("--region", region, hint="e.g. us-east-1")
    flags.text("--gpu", gpu, hint="e.g. T4")
    flags.text("--instance-type", instance_type, hint="e.g. g4dn.xlarge")
    flags.text("--market", market, hint="on-demand or spot")
    flags.number("--max-price", max_price, low_open=False, high=1e6, hint="USD per hour, e.g. 3")
    if catalog_dir is not None:
        _check_catalog_dir(catalog_dir)
    else:
        from kplan.catalogs.current import current_catalog_dir
        from kplan.core.files import check_folder_files

        check_folder_files(current_catalog_dir(), "catalog")
    catalog = load_current(catalog_dir)
    wanted = OfferFilter(cloud, region, gpu, instance_type, market, max_price)
    rows = select_offers(catalog, wanted)
    from kplan.cli.render import catalog as render

    if as_json:
        typer.echo(render.offers_json(rows, catalog.gpus))
    else:
        render.print_offers(
            rows,
            version=catalog.version,
            notes=catalog.notes,
            show_notes=show_notes,
            gpus=catalog.gpus,
        )


def _check_catalog_dir(folder: Path) -> None:
    """A catalog folder holds regular files of bounded size (no FIFO, device or giant file)."""
    from kplan.core.errors import InputError
    from kplan.core.files import check_folder_files

    if folder.exists() and not folder.is_dir():
        raise InputError(f"--catalog {folder} is not a folder", hint="give a catalog directory")
    check_folder_files(folder, "catalog")


@app.command("update")
def update(
    cloud: str = typer.Option(..., "--cloud", help="aws or gcp: the cloud to refresh."),
    region: list[str] = typer.Option(
        [], "--region", help="Region to refresh, repeatable (default: the catalog's regions)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
) -> None:
    """Refresh a cloud's instance types and prices from its APIs into a new current catalog.

    AWS: EC2 DescribeInstanceTypes, DescribeInstanceTypeOfferings, DescribeSpotPriceHistory and
    the Price List API (credentials as for the AWS CLI). GCP: the Compute API and the Cloud
    Billing Catalog API (KPLAN_GCP_PROJECT, Application Default Credentials). The new catalog
    goes to $KPLAN_HOME/catalogs/<date>/ and becomes current only once it validates.
    """
    from kplan.catalogs.update import Fetch, update_catalog
    from kplan.core import flags
    from kplan.core.errors import InputError

    flags.texts("--region", region, hint="e.g. us-east-1")
    name = cloud.strip().lower()
    fetch: Fetch
    if name == "aws":
        from kplan.launcher.providers.aws_catalog import fetch_aws

        fetch = fetch_aws
    elif name == "gcp":
        from kplan.launcher.providers.gcp_catalog import fetch_gcp

        fetch = fetch_gcp
    else:
        raise InputError(f"unknown cloud {cloud!r}", hint="--cloud aws or --cloud gcp")
    result = update_catalog(name, tuple(region), fetch)
    from kplan.cli.render import catalog as render

    if as_json:
        typer.echo(render.update_json(result))
    else:
        typer.echo(render.update_text(result))
