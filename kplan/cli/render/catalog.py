"""Render catalog listings: a rich table for people, JSON for programs.

rich is imported inside the functions that draw, so importing this module stays cheap.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from kplan.catalogs.listing import Listing
from kplan.catalogs.update import UpdateResult
from kplan.cli.render.text import safe
from kplan.core.text import clean
from kplan.planner.catalog import GpuSpec

NON_TTY_WIDTH = 160  # piped output: wide enough that rows do not wrap


def listing_dict(row: Listing, gpu_memory_gb: float | None = None) -> dict[str, Any]:
    """One listing as a flat JSON object (``gpu_memory_gb``: each GPU's memory, from gpus.csv)."""
    o, i = row.offer, row.instance
    return {
        "cloud": o.cloud,
        "instance_type": o.instance_type,
        "gpu": i.gpu,
        "gpu_count": i.gpu_count,
        "gpu_memory_gb": gpu_memory_gb,
        "vcpus": i.vcpus,
        "memory_gb": i.memory_gb,
        "network_gbps": i.network_gbps,
        "interconnect": i.interconnect,
        "interconnect_gbps": i.interconnect_gbps,
        "market": o.market,
        "region": o.region,
        "zone": o.zone,
        "usd_per_hour": o.usd_per_hour,
        "source": o.source,
    }


def offers_json(rows: list[Listing], gpus: Mapping[str, GpuSpec] | None = None) -> str:
    """The listings as a JSON list of objects; ``gpus`` (the catalog's) gives GPU memory."""
    return json.dumps([listing_dict(r, _memory(r, gpus)) for r in rows], indent=2)


def _memory(row: Listing, gpus: Mapping[str, GpuSpec] | None) -> float | None:
    spec = (gpus or {}).get(row.instance.gpu)
    return None if spec is None else spec.memory_gb


def print_offers(
    rows: list[Listing],
    *,
    version: str,
    notes: tuple[str, ...],
    show_notes: bool,
    gpus: Mapping[str, GpuSpec] | None = None,
) -> None:
    """Print the listings as a table, with the catalog version and its validation notes; the
    "GB/GPU" column is each GPU's memory (from ``gpus``, the catalog's GPU specs)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else NON_TTY_WIDTH)
    table = Table(title=f"catalog {safe(version)}: {len(rows)} offer(s)", title_justify="left")
    right = {"GB/GPU", "vCPU", "RAM GB", "net Gb/s", "$/h"}
    columns = ("instance", "GPU", "GB/GPU", "vCPU", "RAM GB", "net Gb/s", "market", "region/zone")
    for name in (*columns, "$/h"):
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for r in rows:
        o, i = r.offer, r.instance
        table.add_row(
            safe(o.instance_type),
            f"{i.gpu_count}x {safe(i.gpu)}",
            "?" if (memory := _memory(r, gpus)) is None else f"{memory:g}",
            str(i.vcpus),
            f"{i.memory_gb:g}",
            f"{i.network_gbps:g}",
            safe(o.market),
            safe(f"{o.region}/{o.zone}"),
            f"{o.usd_per_hour:.4f}",
        )
    console.print(table if rows else "no offers match these filters")
    if notes and show_notes:
        console.print(f"{len(notes)} validation note(s):", highlight=False)
        for note in notes:
            console.print(f"  {clean(note)}", highlight=False, markup=False)
    elif notes:
        console.print(
            f"{len(notes)} catalog row(s) were dropped or doubted on load; --notes lists them",
            highlight=False,
        )


def update_dict(result: UpdateResult) -> dict[str, Any]:
    """What ``kplan catalog update`` did, as a JSON object."""
    return {
        "directory": str(result.directory),
        "version": result.catalog.version,
        "based_on": result.base,
        "regions": list(result.regions),
        "instances_refreshed": result.instances,
        "offers_refreshed": result.offers,
        "offers_total": len(result.catalog.offers),
        "remarks": result.remarks,
        "notes": list(result.catalog.notes),
    }


def update_json(result: UpdateResult) -> str:
    return json.dumps(update_dict(result), indent=1)


def update_text(result: UpdateResult) -> str:
    """A few lines for people: what was written, what was refreshed, what was not."""
    lines = [
        f"catalog {result.catalog.version} written to {result.directory} (now current)",
        f"refreshed {result.instances} instance types and {result.offers} offers in "
        f"{', '.join(result.regions)}; based on {result.base}; "
        f"{len(result.catalog.offers):,} offers in all, {len(result.catalog.notes)} loader notes",
    ]
    lines += [f"note: {r}" for r in result.remarks]
    return clean("\n".join(lines))
