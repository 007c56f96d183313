"""Prices are the catalog's, not the plan's: re-price a plan's nodes at launch.

A plan file is user-editable and can be stale, so the price the budget guard and the ledger use
for a node is ``max(catalog, plan)``: an edited (lower) price cannot make a cluster look
cheaper than it is, and a stale higher price stays (the guard errs on the side of stopping).
A node whose instance type, zone and market the catalog does not offer in the plan's region is
rejected: the plan was made for another catalog.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kplan.core.errors import DataFileError
from kplan.launcher.jobspec import NodeSpec

TOLERANCE = 0.05  # prices that differ by more than this fraction are reported


@dataclass(frozen=True)
class CatalogPrice:
    """One catalog offer, as the re-pricing needs it."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    usd_per_hour: float


def differs(plan_usd: float, catalog_usd: float, tolerance: float = TOLERANCE) -> bool:
    """Whether two hourly prices differ by more than ``tolerance`` of the catalog's."""
    if catalog_usd <= 0:
        return plan_usd > 0
    return abs(plan_usd - catalog_usd) > tolerance * catalog_usd


def reprice(
    nodes: Iterable[NodeSpec],
    cloud: str,
    region: str,
    offers: Iterable[CatalogPrice],
    catalog_version: str = "the catalog",
) -> tuple[tuple[NodeSpec, ...], tuple[str, ...]]:
    """The nodes at ``max(catalog, plan)`` price, and one note per group whose prices differ
    by more than 5%. Raises ``DataFileError`` for a node the catalog does not offer."""
    nodes = tuple(nodes)
    if cloud == "local":
        return nodes, ()
    table = {
        (o.zone, o.instance_type, o.market): o.usd_per_hour
        for o in offers
        if o.cloud == cloud and o.region == region
    }
    out: list[NodeSpec] = []
    # (zone, instance type, market, plan price) -> (node ranks, catalog price)
    differing: dict[tuple[str, str, str, float], tuple[list[int], float]] = {}
    for node in nodes:
        catalog_usd = table.get((node.zone, node.instance_type, node.market))
        if catalog_usd is None or not (math.isfinite(catalog_usd) and catalog_usd >= 0):
            raise DataFileError(
                f"the plan puts node {node.node_rank} on {node.instance_type} {node.market} in "
                f"{cloud} {region} zone {node.zone}, which {catalog_version} does not offer",
                hint="re-plan with kplan estimate ... --out plan.json",
            )
        if differs(node.usd_per_hour, catalog_usd):
            key = (node.zone, node.instance_type, node.market, node.usd_per_hour)
            differing.setdefault(key, ([], catalog_usd))[0].append(node.node_rank)
        out.append(replace(node, usd_per_hour=max(node.usd_per_hour, catalog_usd)))
    notes = []
    for (zone, instance_type, market, plan_usd), (ranks, catalog_usd) in differing.items():
        notes.append(
            f"node(s) {', '.join(map(str, ranks))} ({instance_type} {market} {zone}): the plan "
            f"says ${plan_usd:.4f}/h, {catalog_version} ${catalog_usd:.4f}/h; the guard and "
            f"the ledger use the higher, ${max(plan_usd, catalog_usd):.4f}/h"
        )
    return tuple(out), tuple(notes)


def catalog_prices(cloud: str, region: str) -> tuple[tuple[CatalogPrice, ...], str]:
    """The current catalog's offers in one region, and the catalog's version."""
    from kplan.catalogs import load_catalog

    catalog = load_catalog()
    offers = tuple(
        CatalogPrice(o.cloud, o.region, o.zone, o.instance_type, o.market, o.usd_per_hour)
        for o in catalog.offers
        if o.cloud == cloud and o.region == region
    )
    return offers, f"catalog {catalog.version}"
