"""Fetch AWS instance types and prices for ``kplan catalog update --cloud aws``.

The cloud half of the update: :func:`fetch_aws` is the ``Fetch`` that ``kplan.catalogs.update``
calls; that module merges the rows, writes and validates the new catalog.

- Instance types: EC2 ``DescribeInstanceTypes`` for the catalog's AWS types (GPU count, vCPUs,
  memory, ``NetworkPerformance``). Network Gbit/s follows the shipped catalog's rules: "N
  Gigabit" is N, "Kx N Gigabit" is K*N, "Up to N Gigabit" is the published baseline
  (``BaselineBandwidthInGbps``), else a quarter of N. The GPU model and the GPU link are not in
  the API: they are carried over from the current catalog's row.
- Zones: ``DescribeInstanceTypeOfferings`` by zone id (the catalog's zone names).
- Spot: ``DescribeSpotPriceHistory`` (Linux/UNIX), the latest price per type and zone.
- On-demand: the AWS Price List API (``pricing`` in us-east-1, ``GetProducts``), Linux, shared
  tenancy, no pre-installed software, ``capacitystatus`` Used.

boto3 is imported inside the functions; every call goes through ``aws_common.call`` (retries of
transient codes, errors translated to ``CloudError``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from kplan.catalogs.update import Record, Refresh, offer_record
from kplan.launcher.providers.aws_common import AwsConfig, Client, Retry, call, make_client_factory

PRICING_REGION = "us-east-1"  # the Price List API's endpoint region
UP_TO_BASELINE = 0.25  # "Up to N Gigabit" without a published baseline: N times this
LINUX = "Linux/UNIX"
RETRY = Retry(attempts=4)


def ec2_client(region: str) -> Client:
    """An EC2 client in ``region`` (``KPLAN_AWS_ENDPOINT_URL`` for another endpoint)."""
    endpoint = os.environ.get("KPLAN_AWS_ENDPOINT_URL") or None
    return make_client_factory(AwsConfig(region=region, endpoint_url=endpoint))("ec2")


def pricing_client() -> Client:
    """A Price List client (``KPLAN_AWS_PRICING_ENDPOINT_URL`` for another endpoint)."""
    endpoint = os.environ.get("KPLAN_AWS_PRICING_ENDPOINT_URL") or None
    return make_client_factory(AwsConfig(region=PRICING_REGION, endpoint_url=endpoint))("pricing")


def network_gbps(perf: str, baseline: float | None) -> tuple[float, str]:
    """Gbit/s from ``NetworkPerformance`` (see the module docstring), and its explanation."""
    src = f"NetworkPerformance {perf!r}"
    if m := re.fullmatch(r"(\d+)x (\d+) Gigabit", perf):
        return float(int(m[1]) * int(m[2])), src
    if m := re.fullmatch(r"(\d+(?:\.\d+)?) Gigabit", perf):
        return float(m[1]), src
    if m := re.fullmatch(r"Up to (\d+(?:\.\d+)?) Gigabit", perf):
        if baseline is not None:
            return float(baseline), f"{src}, its published baseline {baseline:g} Gbit/s"
        guess = float(m[1]) * UP_TO_BASELINE
        return guess, f"{src}; no published baseline: assumed {UP_TO_BASELINE:g} x the burst"
    raise ValueError(f"unknown NetworkPerformance {perf!r}")


def fetch_aws(
    tables: dict[str, list[Record]],
    regions: tuple[str, ...],
    today: dt.date,
    *,
    ec2: Callable[[str], Client] | None = None,
    pricing: Callable[[], Client] | None = None,
) -> Refresh:
    """Instance rows and offers of the catalog's AWS types in ``regions``, from the APIs
    (clients from ``ec2(region)`` and ``pricing()``; default :func:`ec2_client`,
    :func:`pricing_client`)."""
    ec2 = ec2 or ec2_client
    pricing = pricing or pricing_client
    base = {r["name"]: r for r in tables["instances.csv"] if r["cloud"] == "aws"}
    remarks: list[str] = []
    described = _describe_types(ec2(regions[0]), sorted(base))
    instances: list[Record] = []
    for name in sorted(base):
        info = described.get(name)
        if info is None:
            remarks.append(f"aws {name}: not described by DescribeInstanceTypes; rows carried over")
            continue
        row = _instance_row(base[name], info, today, remarks)
        if row is not None:
            instances.append(row)
    names = [r["name"] for r in instances]
    price_client = pricing()
    offers: list[Record] = []
    for region in regions:
        offers += _region_offers(ec2(region), price_client, region, names, today, remarks)
    return Refresh(instances, offers, regions, remarks)


def _pages(action: str, fn: Callable[..., Any], key: str, **kwargs: Any) -> Iterator[Any]:
    """Items under ``key`` of every page of an EC2/Pricing list call (NextToken paging)."""
    token: str | None = None
    while True:
        page = call(RETRY, action, fn, **kwargs, **({"NextToken": token} if token else {}))
        yield from page.get(key, [])
        token = page.get("NextToken")
        if not token:
            return


def _describe_types(client: Client, names: list[str]) -> dict[str, Any]:
    found = _pages(
        "describe instance types",
        client.describe_instance_types,
        "InstanceTypes",
        Filters=[{"Name": "instance-type", "Values": names}],
    )
    return {str(t["InstanceType"]): t for t in found}


def _instance_row(
    base: Record, info: dict[str, Any], today: dt.date, remarks: list[str]
) -> Record | None:
    name = base["name"]
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus:
        remarks.append(f"aws {name}: DescribeInstanceTypes lists no GPU; rows carried over")
        return None
    net = info.get("NetworkInfo") or {}
    cards = net.get("NetworkCards") or [{}]
    try:
        gbps, net_src = network_gbps(
            str(net.get("NetworkPerformance", "")), cards[0].get("BaselineBandwidthInGbps")
        )
    except ValueError as err:
        remarks.append(f"aws {name}: {err}; rows carried over")
        return None
    return {
        "cloud": "aws",
        "name": name,
        "gpu": base["gpu"],
        "gpu_count": str(sum(int(g.get("Count", 0)) for g in gpus)),
        "vcpus": str(info["VCpuInfo"]["DefaultVCpus"]),
        "memory_gb": f"{info['MemoryInfo']['SizeInMiB'] / 1024:g}",
        "network_gbps": f"{gbps:g}",
        "interconnect": base["interconnect"],
        "interconnect_gbps": base["interconnect_gbps"],
        "source": f"AWS EC2 DescribeInstanceTypes {today}; network: {net_src}; "
        "GPU model and link carried over from the previous catalog",
    }


def _region_offers(
    client: Client,
    price_client: Client,
    region: str,
    names: list[str],
    today: dt.date,
    remarks: list[str],
) -> list[Record]:
    zones = _zone_ids(client)
    where: dict[str, set[str]] = {}
    for o in _pages(
        f"describe instance type offerings in {region}",
        client.describe_instance_type_offerings,
        "InstanceTypeOfferings",
        LocationType="availability-zone-id",
        Filters=[{"Name": "instance-type", "Values": names}],
    ):
        where.setdefault(str(o["InstanceType"]), set()).add(str(o["Location"]))
    spot = _spot_prices(client, region, names, zones)
    on_demand = _on_demand_prices(price_client, region, names)
    od_src = f"AWS Price List API GetProducts {today} (Linux, shared tenancy, on-demand)"
    spot_src = f"AWS EC2 DescribeSpotPriceHistory {today} (Linux/UNIX, latest in the zone)"
    rows: list[Record] = []
    for name in names:
        if name not in where:
            continue
        od = on_demand.get(name)
        if od is None:
            remarks.append(f"aws {name} {region}: no on-demand price in the Price List API")
        for zone in sorted(where[name]):
            if od is not None:
                rows.append(_offer(name, region, zone, "on-demand", od, od_src))
            if (name, zone) in spot:
                rows.append(_offer(name, region, zone, "spot", spot[(name, zone)], spot_src))
    return rows


def _offer(name: str, region: str, zone: str, market: str, usd: float, src: str) -> Record:
    return offer_record("aws", name, region, zone, market, usd, src)


def _zone_ids(client: Client) -> dict[str, str]:
    doc = call(RETRY, "describe availability zones", client.describe_availability_zones)
    return {str(z["ZoneName"]): str(z["ZoneId"]) for z in doc["AvailabilityZones"]}


def _spot_prices(
    client: Client, region: str, names: list[str], zones: dict[str, str]
) -> dict[tuple[str, str], float]:
    """The latest Linux spot price per (type, zone id)."""
    latest: dict[tuple[str, str], tuple[Any, float]] = {}
    for h in _pages(
        f"describe spot price history in {region}",
        client.describe_spot_price_history,
        "SpotPriceHistory",
        InstanceTypes=names,
        ProductDescriptions=[LINUX],
        StartTime=dt.datetime.now(dt.UTC),
    ):
        if not str(h.get("ProductDescription", "")).startswith(LINUX):
            continue
        zone = zones.get(str(h["AvailabilityZone"]))
        if zone is None:
            continue
        key = (str(h["InstanceType"]), zone)
        if key not in latest or h["Timestamp"] > latest[key][0]:
            latest[key] = (h["Timestamp"], float(h["SpotPrice"]))
    return {k: v[1] for k, v in latest.items()}


def _on_demand_prices(client: Client, region: str, names: list[str]) -> dict[str, float]:
    """USD per hour per instance type from the Price List API."""
    match = {
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in match.items()]
    filters.append({"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(names)})
    prices: dict[str, float] = {}
    for item in _pages(
        f"get on-demand prices for {region}",
        client.get_products,
        "PriceList",
        ServiceCode="AmazonEC2",
        Filters=filters,
        FormatVersion="aws_v1",
        MaxResults=100,
    ):
        doc = json.loads(item) if isinstance(item, str) else item
        attrs = doc.get("product", {}).get("attributes", {})
        if any(attrs.get(k, v) != v for k, v in match.items()) or attrs.get("marketoption") not in (
            None,
            "OnDemand",
        ):
            continue
        usd = _hourly_usd(doc.get("terms", {}).get("OnDemand", {}))
        name = str(attrs.get("instanceType", ""))
        if usd is not None and name in names:
            prices.setdefault(name, usd)
    return prices


def _hourly_usd(terms: dict[str, Any]) -> float | None:
    for term in terms.values():
        for dim in term.get("priceDimensions", {}).values():
            if dim.get("unit") == "Hrs" and "USD" in dim.get("pricePerUnit", {}):
                usd = float(dim["pricePerUnit"]["USD"])
                if usd > 0:
                    return usd
    return None
