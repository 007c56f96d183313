"""Instance types and offers of the shipped catalog, from the skypilot subset, gcp-prices, moto's
copy of AWS describe-instance-types and ``scripts.catalog_facts``; used by
``scripts/build_catalogs.py`` (see its docstring and docs/catalogs.md).
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.catalog_facts import (
    AWS_EXTRA,
    AWS_LIST_REGIONS,
    AWS_LIST_SRC,
    AWS_P3,
    AWS_P3_SRC,
    G2,
    GCP_BUNDLED,
    GCP_DOC,
    GCP_NET_DOC,
    GCP_NETWORK,
    GPUS,
    LINK_BY_GPU,
    LINKS,
    N1_NET_SRC,
    N1_RATES,
    N1_SHAPES,
    N1_SRC,
    UP_TO_BASELINE,
)

SKY = Path("catalogs") / "skypilot-v9"
SKY_SRC = "skypilot-catalog v9 {cloud}/vms_gpu_us_subset.csv"
GCPP = Path("spot") / "gcp-prices" / "gcp_gpu_instance_price_changes_2022-2026.csv"
FRESH_DAYS = 365  # a gcp-prices pool older than this (vs. the file's last snapshot) is stale
AGREE = 0.05  # skypilot host+accelerator sum vs gcp-prices: relative difference tolerated
AWS_DATA = "AWS describe-instance-types (moto 5.2 copy)"


@dataclass(frozen=True)
class Where:
    """An offer's location."""

    cloud: str
    region: str
    zone: str


@dataclass
class Build:
    """Rows of the five files, and the report of decisions."""

    gpus: list[list[Any]] = field(default_factory=list)
    instances: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    prices: list[list[Any]] = field(default_factory=list)
    spot_rates: list[list[Any]] = field(default_factory=list)
    report: list[str] = field(default_factory=list)

    def instance(self, cloud: str, name: str, gpu: str, count: int, **shape: Any) -> None:
        """``shape``: vcpus, mem, net (Gbit/s), net_src, src (where vCPUs and memory come from)."""
        gbps = 0 if count == 1 else LINK_BY_GPU[gpu]
        kind, link_src = ("none", "one GPU") if count == 1 else LINKS[gbps]
        source = f"{shape['src']}; network: {shape['net_src']}; GPU link: {link_src}"
        self.instances[(cloud, name)] = [
            cloud,
            name,
            gpu,
            count,
            shape["vcpus"],
            shape["mem"],
            shape["net"],
            kind,
            gbps,
            source,
        ]

    def offer(self, where: Where, name: str, market: str, usd: float, source: str) -> None:
        self.prices.append(
            [where.cloud, name, where.region, where.zone, market, round(usd, 6), source]
        )


def _num(text: str) -> float | None:
    return float(text) if text.strip() else None


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _aws_network(perf: str, baseline: float | None) -> tuple[float, str]:
    """Gbit/s from AWS's NetworkPerformance; for "Up to N", the published baseline."""
    src = f"NetworkPerformance {perf!r}"
    if m := re.fullmatch(r"(\d+)x (\d+) Gigabit", perf):
        return float(int(m[1]) * int(m[2])), src
    if m := re.fullmatch(r"(\d+) Gigabit", perf):
        return float(m[1]), src
    if m := re.fullmatch(r"Up to (\d+) Gigabit", perf):
        if baseline is not None:
            return baseline, f"{src}, its published baseline {baseline:g} Gbit/s"
        guess = float(m[1]) * UP_TO_BASELINE
        return guess, f"{src}; no published baseline: assumed {UP_TO_BASELINE:g} x the burst"
    raise SystemExit(f"unknown NetworkPerformance {perf!r}")


def build_aws(
    b: Build, data: Path, moto_types: dict[str, Any], moto_zones: dict[str, set[str]]
) -> None:
    known_gpus = {g.name for g in GPUS}
    types: dict[str, dict[str, str]] = {}
    for r in _read_csv(data / SKY / "aws" / "vms_gpu_us_subset.csv"):
        name, where = r["InstanceType"], Where("aws", r["Region"], r["AvailabilityZone"])
        if r["AcceleratorName"] not in known_gpus:
            b.report.append(
                f"aws {name} {where.zone}: GPU {r['AcceleratorName']} has no spec row; skipped"
            )
            continue
        types.setdefault(name, r)
        for market, col in (("on-demand", "Price"), ("spot", "SpotPrice")):
            if (price := _num(r[col])) is not None:
                b.offer(where, name, market, price, SKY_SRC.format(cloud="aws"))
            else:
                b.report.append(
                    f"aws {name} {where.zone}: no {market} price in the source; no offer"
                )
    for name, r in types.items():
        _aws_instance(b, name, r["AcceleratorName"], moto_types, (r["vCPUs"], r["MemoryGiB"]))
    prices = {(p[1], p[3], p[4]): p[5] for p in b.prices if p[0] == "aws"}
    regions = {p[3]: p[2] for p in b.prices if p[0] == "aws"}
    for name, (list_price, sibling) in AWS_EXTRA.items():
        _aws_instance(b, name, types[sibling]["AcceleratorName"], moto_types, None)
        # moto has no p3 offerings: those take their sibling's zones
        zones = moto_zones.get(name) or {z for (n, z, _m) in prices if n == sibling}
        for zone in sorted(z for z in zones if regions.get(z) in AWS_LIST_REGIONS):
            where = Where("aws", regions[zone], zone)
            b.offer(where, name, "on-demand", list_price, AWS_LIST_SRC)
            od, spot = prices.get((sibling, zone, "on-demand")), prices.get((sibling, zone, "spot"))
            if od and spot:
                b.offer(
                    where,
                    name,
                    "spot",
                    list_price * spot / od,
                    f"estimated: family spot discount in that zone ({sibling} spot/on-demand "
                    f"{spot / od:.3f}) x the on-demand list price",
                )


def _aws_instance(
    b: Build, name: str, gpu: str, moto_types: dict[str, Any], sky: tuple[str, str] | None
) -> None:
    info = moto_types.get(name)
    if info is not None:
        count = info["GpuInfo"]["Gpus"][0]["Count"]
        vcpus, mem = info["VCpuInfo"]["DefaultVCpus"], info["MemoryInfo"]["SizeInMiB"] / 1024
        cards = info["NetworkInfo"].get("NetworkCards") or [{}]
        net, net_src = _aws_network(
            info["NetworkInfo"]["NetworkPerformance"], cards[0].get("BaselineBandwidthInGbps")
        )
        src = AWS_DATA
    else:
        count, vcpus, mem, perf = AWS_P3[name]
        (net, net_src), src = _aws_network(perf, None), AWS_P3_SRC
    if sky is not None and (float(sky[0]), float(sky[1])) != (vcpus, mem):
        b.report.append(
            f"aws {name}: skypilot says {sky[0]} vCPUs, {sky[1]} GiB; AWS data says "
            f"{vcpus}, {mem:g}; AWS data used"
        )
    b.instance("aws", name, gpu, count, vcpus=vcpus, mem=mem, net=net, net_src=net_src, src=src)


@dataclass(frozen=True)
class PoolPrice:
    """A gcp-prices pool's last row: its price on the file's last date (carry-forward)."""

    date: dt.date
    commit: str
    on_demand: float | None
    spot: float | None

    @property
    def source(self) -> str:
        return f"gcp-prices {self.date} snapshot (Cyclenerd pricing.yml @{self.commit})"


def read_gcp_prices(data: Path) -> tuple[dict[tuple[str, str], PoolPrice], dt.date]:
    latest: dict[tuple[str, str], PoolPrice] = {}
    for r in _read_csv(data / GCPP):
        day, key = dt.date.fromisoformat(r["snapshot_date"]), (r["instance_type"], r["region"])
        if key not in latest or latest[key].date <= day:
            latest[key] = PoolPrice(
                day, r["commit"], _num(r["hour_ondemand_usd"]), _num(r["hour_spot_usd"])
            )
    return latest, max(p.date for p in latest.values())


def build_gcp(b: Build, data: Path) -> None:
    rows = _read_csv(data / SKY / "gcp" / "vms_gpu_us_subset.csv")
    acc = {
        (r["AcceleratorName"], int(r["AcceleratorCount"]), r["AvailabilityZone"]): r
        for r in rows
        if not r["InstanceType"]
    }
    pools, last = read_gcp_prices(data)
    fresh = {k: p for k, p in pools.items() if (last - p.date).days <= FRESH_DAYS}
    for host in (r for r in rows if r["InstanceType"]):
        _gcp_bundled(b, host, acc, fresh)
    _build_g2(b, fresh, acc, last)
    _build_n1(b, acc)


def _gcp_bundled(
    b: Build,
    host: dict[str, str],
    acc: dict[tuple[str, int, str], dict[str, str]],
    fresh: dict[tuple[str, str], PoolPrice],
) -> None:
    """A GPU-bundled type (a2, a3, a4) in one zone: host row + accelerator row of the subset,
    unless a fresh gcp-prices pool disagrees on the on-demand price."""
    sky_src = SKY_SRC.format(cloud="gcp")
    name, where = host["InstanceType"], Where("gcp", host["Region"], host["AvailabilityZone"])
    family, size = name.rsplit("-", 1)
    acc_name, gpu = GCP_BUNDLED[family]
    count = int(size.rstrip("g"))
    b.instance(
        "gcp",
        name,
        gpu,
        count,
        vcpus=int(float(host["vCPUs"])),
        mem=float(host["MemoryGiB"]),
        net=GCP_NETWORK[name],
        net_src=GCP_NET_DOC,
        src=f"{GCP_DOC}; vCPUs and memory: {sky_src}",
    )
    a = acc.get((acc_name, count, where.zone))
    if a is None:
        b.report.append(
            f"gcp {name} {where.zone}: no {acc_name} x{count} accelerator row; no offer"
        )
        return
    pool = fresh.get((name, where.region))
    src = f"{sky_src}: host row + {acc_name} x{count} accelerator row"
    od = _sum(host["Price"], a["Price"])
    if od is not None and pool and pool.on_demand and abs(od / pool.on_demand - 1) > AGREE:
        b.report.append(
            f"gcp {name} {where.zone}: on-demand host+accelerator {od:.4f} differs "
            f"from {pool.source} {pool.on_demand:.4f} by more than {AGREE:.0%}; "
            "gcp-prices used"
        )
        b.offer(
            where,
            name,
            "on-demand",
            pool.on_demand,
            f"{pool.source}; the skypilot host+accelerator sum {od:.4f} disagreed",
        )
    elif od is not None and not pool and (_num(a["SpotPrice"]) or 0) > (_num(a["Price"]) or 0):
        b.report.append(
            f"gcp {name} {where.zone}: accelerator spot {a['SpotPrice']} is above "
            f"its on-demand {a['Price']} and no fresh gcp-prices pool checks it: "
            "on-demand price not trusted; no on-demand offer"
        )
    elif od is not None:
        b.offer(where, name, "on-demand", od, src)
    if (spot := _sum(host["SpotPrice"], a["SpotPrice"])) is not None:
        b.offer(where, name, "spot", spot, src)


def _sum(host: str, accelerator: str) -> float | None:
    h, a = _num(host), _num(accelerator)
    return None if h is None or a is None else h + a


def _build_g2(
    b: Build,
    fresh: dict[tuple[str, str], PoolPrice],
    acc: dict[tuple[str, int, str], dict[str, str]],
    last: dt.date,
) -> None:
    l4_zones: dict[str, set[str]] = defaultdict(set)
    for (name, _count, zone), r in acc.items():
        if name == "L4":
            l4_zones[r["Region"]].add(zone)
    for name, (vcpus, mem, count) in G2.items():
        b.instance(
            "gcp",
            name,
            "L4",
            count,
            vcpus=vcpus,
            mem=mem,
            net=GCP_NETWORK[name],
            net_src=GCP_NET_DOC,
            src=GCP_DOC,
        )
        for region in sorted(r for (n, r) in fresh if n == name and r.startswith("us-")):
            pool = fresh[(name, region)]
            if region not in l4_zones:
                b.report.append(f"gcp {name} {region}: no L4 zone in the skypilot subset; no offer")
                continue
            src = (
                f"{pool.source}, carried forward to {last}; zones: L4 zones of the skypilot subset"
            )
            for zone in sorted(l4_zones[region]):
                for market, usd in (("on-demand", pool.on_demand), ("spot", pool.spot)):
                    if usd is not None:
                        b.offer(Where("gcp", region, zone), name, market, usd, src)


def _build_n1(b: Build, acc: dict[tuple[str, int, str], dict[str, str]]) -> None:
    for (gpu, count), shapes in N1_SHAPES.items():
        for vcpus in shapes:
            name = f"n1-standard-{vcpus}+{count}x{gpu}"
            b.instance(
                "gcp",
                name,
                gpu,
                count,
                vcpus=vcpus,
                mem=vcpus * 3.75,
                net=min(2 * vcpus, 32),
                net_src=N1_NET_SRC,
                src=f"n1-standard-{vcpus} ({vcpus} vCPUs, 3.75 GB each) with {count} "
                f"{gpu} attached",
            )
            for (acc_name, n, zone), a in sorted(acc.items()):
                if (acc_name, n) != (gpu, count):
                    continue
                if (rates := N1_RATES.get(a["Region"])) is None:
                    b.report.append(f"gcp {name} {zone}: no n1 rate for {a['Region']}; no offer")
                    continue
                src = (
                    f"host: {N1_SRC} x {vcpus} vCPUs; GPUs: {SKY_SRC.format(cloud='gcp')} "
                    f"{gpu} x{count} row"
                )
                for market, rate, col in (
                    ("on-demand", rates[0], "Price"),
                    ("spot", rates[1], "SpotPrice"),
                ):
                    if (usd := _num(a[col])) is not None:
                        b.offer(
                            Where("gcp", a["Region"], zone), name, market, vcpus * rate + usd, src
                        )
