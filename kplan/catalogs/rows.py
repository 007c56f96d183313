"""Turn one catalog row into its typed record, or raise ``RowError`` saying why not.

Each parser checks what a single row can show on its own (required fields, numbers and their
signs, allowed words); checks that span rows or files (duplicates, unknown GPUs, offers of
unknown instances, spot above on-demand) are done by ``kplan.catalogs.loader``.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal, cast

from kplan.catalogs.csvfile import Row, RowError, check_shape
from kplan.planner.catalog import (
    CLOUDS,
    MARKETS,
    Billing,
    Cloud,
    GpuSpec,
    InstanceType,
    Market,
    Offer,
    SpotRate,
    StoragePrice,
)

GPU_COLUMNS = ("name", "memory_gb", "fp32_tflops", "fp16_tflops", "mem_bw_gbs", "source")
INSTANCE_COLUMNS = (
    "cloud",
    "name",
    "gpu",
    "gpu_count",
    "vcpus",
    "memory_gb",
    "network_gbps",
    "interconnect",
    "interconnect_gbps",
    "source",
)
PRICE_COLUMNS = ("cloud", "instance_type", "region", "zone", "market", "usd_per_hour", "source")
SPOT_RATE_COLUMNS = ("cloud", "family", "per_hour", "source")
BILLING_COLUMNS = ("cloud", "minimum_s", "increment_s", "source")
STORAGE_COLUMNS = (
    "cloud",
    "region",
    "object_usd_gb_month",
    "disk_usd_gb_month",
    "egress_region_usd_gb",
    "egress_internet_usd_gb",
    "egress_cloud_usd_gb",
    "source",
    "as_of",
)
# No cloud lists storage or egress near this: the dearest shipped price is 0.12 USD/GB. A price
# above it is a slip (cents, a price per TB) that would otherwise be planned with.
MAX_USD_PER_GB = 5.0
INTERCONNECTS = ("nvlink", "pcie", "none")
# No instance costs near this: the dearest shipped offer (8 x B200) is about 114 USD/h. A price
# above it is a slip (cents, a monthly price, 1e300) that would otherwise be planned with.
MAX_USD_PER_HOUR = 1000.0
Interconnect = Literal["nvlink", "pcie", "none"]


def _cloud(row: Row) -> Cloud:
    return cast(Cloud, row.choice("cloud", CLOUDS))


def parse_gpu(row: Row) -> GpuSpec:
    check_shape(row)
    return GpuSpec(
        name=row.text("name"),
        memory_gb=row.number("memory_gb"),
        fp32_tflops=row.number("fp32_tflops"),
        fp16_tflops=row.number("fp16_tflops"),
        mem_bw_gbs=row.number("mem_bw_gbs"),
        source=row.text("source"),
        tf32_tflops=_optional_number(row, "tf32_tflops"),
        bf16_tflops=_optional_number(row, "bf16_tflops"),
        sm_count=int(n) if (n := _optional_number(row, "sm_count")) is not None else None,
    )


def _optional_number(row: Row, column: str) -> float | None:
    """An optional column (absent from older files, or empty): None, else a number > 0."""
    if not row.fields.get(column, "").strip():
        return None
    return row.number(column)


def parse_instance(row: Row) -> InstanceType:
    check_shape(row)
    gpu_count = row.integer("gpu_count")
    interconnect = row.choice("interconnect", INTERCONNECTS)
    interconnect_gbps = row.number("interconnect_gbps", allow_zero=True)
    if interconnect == "none" and gpu_count > 1:
        raise RowError(
            f"interconnect='none' with gpu_count={gpu_count}: GPUs of one instance need "
            "'nvlink' or 'pcie'"
        )
    if interconnect == "none" and interconnect_gbps != 0:
        raise RowError(f"interconnect='none' needs interconnect_gbps=0, got {interconnect_gbps}")
    if interconnect != "none" and interconnect_gbps == 0:
        raise RowError(f"interconnect={interconnect!r} needs interconnect_gbps > 0")
    return InstanceType(
        cloud=_cloud(row),
        name=row.text("name"),
        gpu=row.text("gpu"),
        gpu_count=gpu_count,
        vcpus=row.integer("vcpus"),
        memory_gb=row.number("memory_gb"),
        network_gbps=row.number("network_gbps"),
        interconnect=cast(Interconnect, interconnect),
        interconnect_gbps=interconnect_gbps,
        source=row.text("source"),
    )


def parse_offer(row: Row) -> Offer:
    check_shape(row)
    cloud = _cloud(row)
    region = row.text("region")
    zone = row.text("zone")
    if cloud == "gcp" and not zone.startswith(region + "-"):
        raise RowError(f"zone {zone!r} is not in region {region!r}")
    price = row.number("usd_per_hour")
    if price > MAX_USD_PER_HOUR:
        raise RowError(
            f"usd_per_hour={price:g} is above {MAX_USD_PER_HOUR:g}, more than any instance "
            "costs (give USD per instance-hour, not cents or a monthly price)"
        )
    return Offer(
        cloud=cloud,
        instance_type=row.text("instance_type"),
        region=region,
        zone=zone,
        market=cast(Market, row.choice("market", MARKETS)),
        usd_per_hour=price,
        source=row.text("source"),
    )


def parse_spot_rate(row: Row) -> SpotRate:
    check_shape(row)
    return SpotRate(
        cloud=_cloud(row),
        family=row.text("family"),
        per_hour=row.number("per_hour", allow_zero=True),
        source=row.text("source"),
    )


def parse_billing(row: Row) -> Billing:
    check_shape(row)
    return Billing(
        cloud=_cloud(row),
        minimum_s=row.number("minimum_s", allow_zero=True),
        increment_s=row.number("increment_s"),
        source=row.text("source"),
    )


def parse_storage(row: Row) -> StoragePrice:
    check_shape(row)
    prices = {}
    for column in STORAGE_COLUMNS[2:7]:
        value = row.number(column, allow_zero=True)
        if value > MAX_USD_PER_GB:
            raise RowError(
                f"{column}={value:g} is above {MAX_USD_PER_GB:g}, more than any cloud lists "
                "(give USD per GB or per GB-month, not cents or per TB)"
            )
        prices[column] = value
    as_of = row.text("as_of")
    try:
        dt.date.fromisoformat(as_of)
    except ValueError:
        raise RowError(f"as_of={as_of!r} is not a date (YYYY-MM-DD)") from None
    return StoragePrice(
        cloud=_cloud(row),
        region=row.text("region"),
        source=row.text("source"),
        as_of=as_of,
        **prices,
    )
