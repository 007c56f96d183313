"""Select catalog offers by cloud, region, GPU, instance type, market and price.

``select_offers`` validates each filter against the catalog, so a typo is an ``InputError``
naming the bad value with the known ones as the hint, never an empty, silent result.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from kplan.catalogs.names import resolve_gpu
from kplan.core.errors import InputError
from kplan.planner.catalog import CLOUDS, MARKETS, Catalog, InstanceType, Offer


@dataclass(frozen=True)
class OfferFilter:
    """What to list; None means any. Names are matched case-insensitively."""

    cloud: str | None = None
    region: str | None = None
    gpu: str | None = None
    instance_type: str | None = None
    market: str | None = None
    max_price: float | None = None  # USD per hour


@dataclass(frozen=True)
class Listing:
    """One offer and the instance type it prices."""

    offer: Offer
    instance: InstanceType


def select_offers(catalog: Catalog, wanted: OfferFilter) -> list[Listing]:
    """Offers matching every filter, cheapest first (then by instance, zone, market)."""
    cloud = _pick("cloud", wanted.cloud, CLOUDS)
    market = _pick("market", wanted.market, MARKETS)
    offers = [o for o in catalog.offers if cloud is None or o.cloud == cloud]
    region = _pick("region", wanted.region, sorted({o.region for o in offers}), cloud)
    gpu = resolve_gpu(wanted.gpu, catalog).name if wanted.gpu is not None else None
    names = sorted({o.instance_type for o in offers})
    instance_type = _pick("instance type", wanted.instance_type, names, cloud)
    if wanted.max_price is not None and not wanted.max_price > 0:
        raise InputError(
            f"--max-price {wanted.max_price:g} must be > 0",
            hint="a price in USD per instance-hour, e.g. --max-price 3.5",
        )
    rows = [
        Listing(o, catalog.instances[(o.cloud, o.instance_type)])
        for o in offers
        if (region is None or o.region == region)
        and (market is None or o.market == market)
        and (instance_type is None or o.instance_type == instance_type)
        and (wanted.max_price is None or o.usd_per_hour <= wanted.max_price)
    ]
    if gpu is not None:
        rows = [r for r in rows if r.instance.gpu == gpu]
    rows.sort(
        key=lambda r: (r.offer.usd_per_hour, r.offer.instance_type, r.offer.zone, r.offer.market)
    )
    return rows


def _pick(
    what: str, value: str | None, known: tuple[str, ...] | list[str], cloud: str | None = None
) -> str | None:
    """``value`` as spelled in ``known`` (case-insensitive), or InputError with a hint."""
    if value is None:
        return None
    by_lower = {k.lower(): k for k in known}
    found = by_lower.get(value.strip().lower())
    if found is not None:
        return found
    scope = f" on {cloud}" if cloud else ""
    close = difflib.get_close_matches(value.strip().lower(), list(by_lower), n=3, cutoff=0.6)
    if close:
        hint = "did you mean " + " or ".join(by_lower[c] for c in close) + "?"
    elif len(known) <= 12:
        hint = f"known {what}s{scope}: {', '.join(known)}"
    else:
        hint = f"{len(known)} {what}s{scope}, e.g. {', '.join(known[:6])}; see `kplan catalog list`"
    raise InputError(f"unknown {what} {value!r}{scope}", hint=hint)
