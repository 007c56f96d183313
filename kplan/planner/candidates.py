"""The candidates of a search: the cheapest zone of each (cloud, region, instance type, market)
that fits the job, with its prediction, spot risk and billing; and the global batches to try."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import InputError
from kplan.planner import compression, spotplan
from kplan.planner.catalog import Catalog, InstanceType, Offer
from kplan.planner.compression import StatCost
from kplan.planner.devices import DeviceModel
from kplan.planner.extra_costs import ExtraRates, rates_for
from kplan.planner.searchopts import SearchOptions
from kplan.planner.spot import SpotRisk
from kplan.planner.workload import InstancePrediction, Workload, for_instance


@dataclass(frozen=True)
class Candidate:
    """The cheapest zone for one (cloud, region, instance type, market)."""

    offer: Offer
    inst: InstanceType
    pred: InstancePrediction
    preempt_per_hour: float
    billing_min_s: float
    billing_increment_s: float
    risk: SpotRisk | None = None  # the spot model's row (None: on demand)
    on_demand_usd_per_hour: float | None = None  # the same type's on-demand price in the region
    compression: str = (
        "none"  # the gradient compression its rows run (kplan/planner/compression.py)
    )
    compression_stat: StatCost | None = None  # its samples multiplier (None: dense)
    # its region's disk, storage and egress rates (kplan/planner/extra_costs.py)
    extras: ExtraRates = field(default_factory=ExtraRates)


def candidates(
    workload: Workload, catalog: Catalog, dm: DeviceModel, opts: SearchOptions
) -> tuple[list[Candidate], list[str]]:
    """Filter the catalog and keep the cheapest zone per (cloud, region, type, market)."""
    notes: list[str] = []
    _check_filters(catalog, opts)
    gpus_wanted = {g.lower() for g in opts.gpus}
    types_wanted = {t.lower() for t in opts.instance_types}
    best: dict[tuple[str, str, str, str], Offer] = {}
    for o in catalog.offers:
        if o.opt_in and not opts.opt_in_zones:
            continue
        if opts.clouds and o.cloud not in opts.clouds:
            continue
        if opts.regions and o.region not in opts.regions:
            continue
        if o.market not in opts.markets:
            continue
        if types_wanted and o.instance_type.lower() not in types_wanted:
            continue
        inst = catalog.instances.get((o.cloud, o.instance_type))
        if inst is None or (gpus_wanted and inst.gpu.lower() not in gpus_wanted):
            continue
        key = (o.cloud, o.region, o.instance_type, o.market)
        if key not in best or o.usd_per_hour < best[key].usd_per_hour:
            best[key] = o
    preds: dict[tuple[str, str], InstancePrediction] = {}
    out: list[Candidate] = []
    model = opts.spot_model or (catalog.spot_model if "spot" in opts.markets else None)
    if model is None and "spot" in opts.markets:
        raise ValueError("a spot search needs a spot model: kplan.catalogs loads the catalog's")
    od_price: dict[tuple[str, str, str], float] = {
        (o.cloud, o.region, o.instance_type): o.usd_per_hour
        for o in sorted(catalog.offers, key=lambda o: -o.usd_per_hour)
        if o.market == "on-demand" and (opts.opt_in_zones or not o.opt_in)
    }
    for (cloud, _region, itype, market), offer in sorted(best.items()):
        inst = catalog.instances[(cloud, itype)]
        if (cloud, itype) not in preds:
            preds[(cloud, itype)] = for_instance(
                workload, inst, catalog.gpus[inst.gpu], dm, precision=opts.precision
            )
            if preds[(cloud, itype)].max_local_batch < 1:
                notes.append(f"{itype}: the job does not fit in {inst.gpu} memory")
        pred = preds[(cloud, itype)]
        if pred.max_local_batch < 1:
            continue
        risk = None
        if market == "spot" and model is not None:
            sr = catalog.spot_rate(cloud, itype)
            risk = spotplan.risk_for(model, cloud, itype, offer.region, sr.per_hour, sr.family)
        bill = catalog.billing[cloud]
        out.append(
            Candidate(
                offer,
                inst,
                pred,
                risk.rate_per_hour if risk is not None else 0.0,
                bill.minimum_s,
                bill.increment_s,
                risk,
                od_price.get((cloud, offer.region, itype)),
                extras=rates_for(
                    catalog.storage, cloud, offer.region, opts.data, workload.gradient_bytes
                ),
            )
        )
    return out, notes


def with_compression(cands: list[Candidate], opts: SearchOptions) -> list[Candidate]:
    """The candidates each compression option runs on: pinned, every candidate runs it; by
    default (with multi-node configurations) the dense candidates, then each default option's."""
    pinned = opts.compression is not None and opts.compression != "none"
    if not (pinned or (opts.compression is None and opts.max_nodes >= 2)):
        return cands
    specs = [opts.compression] if pinned else list(compression.DEFAULT_OPTIONS)
    comps = [compression.parse(str(o)) for o in specs]
    stats = [compression.stat_for(cc, opts.compression_stats) for cc in comps]
    # built field by field (every field: tests/test_search_speed.py): ``dataclasses.replace``
    # for its 1,500 copies took about a twentieth of a refused request's time
    variants = [
        Candidate(
            c.offer,
            c.inst,
            c.pred,
            c.preempt_per_hour,
            c.billing_min_s,
            c.billing_increment_s,
            c.risk,
            c.on_demand_usd_per_hour,
            spec,
            st,
            c.extras,
        )
        for spec, st in zip([cc.spec() for cc in comps], stats, strict=True)
        for c in cands
    ]
    return variants if pinned else [*cands, *variants]


def _check_cloud_regions(catalog: Catalog, opts: SearchOptions) -> None:
    """Pinned clouds and regions of which none go together (``--cloud aws --region
    us-central1``): one line naming whose regions they are, not "no instance type matches"."""
    if not (opts.clouds and opts.regions):
        return
    theirs = {o.region for o in catalog.offers if o.cloud in opts.clouds}
    if any(r in theirs for r in opts.regions):
        return
    owners = sorted({o.cloud for o in catalog.offers if o.region in opts.regions})
    clouds = ", ".join(opts.clouds)
    raise InputError(
        f"--region {', '.join(opts.regions)} is not a region of --cloud {clouds} (the "
        f"catalog has it on {', '.join(owners)})",
        hint=f"{clouds} regions in the catalog: {', '.join(sorted(theirs))}",
    )


def _check_filters(catalog: Catalog, opts: SearchOptions) -> None:
    clouds = {o.cloud for o in catalog.offers}
    for c in opts.clouds:
        if c not in clouds:
            raise InputError(f"unknown cloud {c!r}", hint=f"use one of {', '.join(sorted(clouds))}")
    regions = {o.region for o in catalog.offers}
    for r in opts.regions:
        if r not in regions:
            raise InputError(
                f"unknown region {r!r}",
                hint=f"regions in the catalog: {', '.join(sorted(regions))}",
            )
    _check_cloud_regions(catalog, opts)
    if opts.data.region is not None and opts.data.region not in {r for _, r in catalog.storage}:
        raise InputError(
            f"unknown data region {opts.data.region!r} (not in the catalog's storage prices)",
            hint="regions with storage prices: "
            + ", ".join(sorted({r for _, r in catalog.storage})),
        )
    known = {g.lower(): g for g in catalog.gpus}
    for g in opts.gpus:
        if g.lower() not in known:
            raise InputError(
                f"unknown GPU {g!r}", hint=f"known GPUs: {', '.join(sorted(catalog.gpus))}"
            )
    types = sorted({t for (_c, t) in catalog.instances})
    folded = {t.lower() for t in types}
    for t in opts.instance_types:
        if t.lower() not in folded:
            import difflib

            close = difflib.get_close_matches(t, types, n=4, cutoff=0.5)
            if close:
                hint = f"did you mean {', '.join(close)}?"
            else:
                hint = f"e.g. {', '.join(types[:4])} (all: `kplan catalog list`)"
            raise InputError(f"unknown instance type {t!r}", hint=hint)


def batch_grid(workload: Workload, opts: SearchOptions) -> NDArray[np.int64]:
    """Global batches to try: the pinned one; B0 alone (--fixed-batch, or no GNS); else
    B0 * 2^(i/2) up to ``max_global_batch`` (default ``max_batch_multiple`` x B0)."""
    b0 = workload.base_batch
    if opts.global_batch is not None:
        return np.array([opts.global_batch], dtype=np.int64)
    if opts.fixed_global_batch or not workload.gns:
        return np.array([b0], dtype=np.int64)
    top = (
        opts.max_global_batch if opts.max_global_batch is not None else opts.max_batch_multiple * b0
    )
    if top < b0:
        return np.array([int(top)], dtype=np.int64)
    steps = math.floor(2 * math.log2(top / b0) + 1e-9) + 1
    rounded = np.round(b0 * 2.0 ** (np.arange(steps) / 2.0)).astype(np.int64)
    # distinct and sorted (np.unique would import numpy.ma: start-up time of a refused request)
    grid = np.array(sorted(set(rounded.tolist())), dtype=np.int64)
    return grid[grid <= top]


def capacity_wait(risk: SpotRisk, opts: SearchOptions) -> float:
    """The capacity wait the launcher allows: the pinned one, else the model's default."""
    if opts.capacity_wait_s is not None:
        return opts.capacity_wait_s
    return spotplan.default_capacity_wait_s(risk)
