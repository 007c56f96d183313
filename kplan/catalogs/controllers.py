"""The small instances a job's controller runs on when it runs in the cloud.

``kplan launch --detach`` on a cloud runs the job's controller on a controller instance of its
own (kplan/launcher/controller_node.py). ``data/controllers.csv`` lists one small on-demand type
per cloud and region with its price and where that price is stated (``source``), as the
catalog's other files do: the plan, the dry run, the guard and the ledger take the price from
here, never from a constant in code.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

from kplan.core.errors import InputError


@dataclass(frozen=True)
class ControllerOffer:
    """A controller instance type in one region, on-demand."""

    cloud: str
    region: str
    instance_type: str
    vcpus: int
    memory_gb: float
    usd_per_hour: float
    source: str


@cache
def controller_offers() -> tuple[ControllerOffer, ...]:
    """``data/controllers.csv``, read once."""
    text = resources.files("kplan.catalogs.data").joinpath("controllers.csv").read_text()
    return tuple(
        ControllerOffer(
            row["cloud"],
            row["region"],
            row["instance_type"],
            int(row["vcpus"]),
            float(row["memory_gb"]),
            float(row["usd_per_hour"]),
            row["source"],
        )
        for row in csv.DictReader(text.splitlines())
    )


def controller_offer(cloud: str, region: str) -> ControllerOffer:
    """The controller instance of ``cloud`` in ``region`` (``InputError``: the catalog has none)."""
    for offer in controller_offers():
        if (offer.cloud, offer.region) == (cloud, region):
            return offer
    have = sorted({o.region for o in controller_offers() if o.cloud == cloud})
    raise InputError(
        f"no controller instance type for {cloud} in {region} in the catalog "
        f"(kplan/catalogs/data/controllers.csv has {', '.join(have) or 'none'})",
        hint="run the controller on this machine: `kplan launch --detach --controller here`, "
        "or --foreground",
    )
