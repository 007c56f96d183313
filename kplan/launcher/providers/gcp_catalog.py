"""Fetch GCP machine types and prices for ``kplan catalog update --cloud gcp``.

The cloud half of the update: :func:`fetch_gcp` is the ``Fetch`` that ``kplan.catalogs.update``
calls; that module merges the rows, writes and validates the new catalog.

- Machine and accelerator types: the Compute Engine API (``machineTypes`` and
  ``acceleratorTypes`` aggregated lists), which say which zone has which. A catalog type is
  either a machine type with bundled GPUs (``a2-highgpu-1g``, ``g2-standard-8``) or an N1 host
  with attached GPUs, named ``n1-standard-<vCPUs>+<count>x<GPU>``; the latter is offered in a
  zone that has both the machine type and the accelerator type.
- Prices: the Cloud Billing Catalog API's Compute Engine SKUs (service ``6F81-5844-456A``),
  read with plain HTTPS. A VM costs vCPUs x the family's core SKU + GiB x its RAM SKU + GPUs x
  the GPU SKU, per region; ``usageType`` OnDemand gives the on-demand offer, Preemptible the spot
  offer. SKUs are named like "A2 Instance Core running in Americas", "N1 Predefined Instance Ram
  running in Americas", "Nvidia Tesla T4 GPU running in Americas" ("Spot Preemptible " before
  the spot ones); a GPU SKU matches an accelerator type when their words agree ("Tesla" and
  "GPU" aside): ``nvidia-tesla-a100`` is "Nvidia Tesla A100 GPU".
- Network bandwidth and the GPU link are not in these APIs: carried over from the current row.

Endpoints: ``KPLAN_GCP_ENDPOINT`` (Compute, as for the launcher), ``KPLAN_GCP_BILLING_ENDPOINT``
(default ``https://cloudbilling.googleapis.com``); the Billing API takes ``KPLAN_GCP_API_KEY``
if set, else Application Default Credentials. ``KPLAN_GCP_ANONYMOUS=1`` sends no credentials
(a local test server).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from kplan.catalogs.update import Record, Refresh, offer_record
from kplan.core.errors import CloudError

COMPUTE_SERVICE = "6F81-5844-456A"
BILLING_ENDPOINT = "https://cloudbilling.googleapis.com"
N1_HOST = re.compile(r"(n1-standard-\d+)\+(\d+)x(.+)")
# The catalog's GPU name -> the accelerator type attached to N1 hosts.
N1_ACCELERATORS = {"T4": "nvidia-tesla-t4", "V100": "nvidia-tesla-v100"}
_IGNORED_WORDS = {"tesla", "gpu"}
MARKETS = {"OnDemand": "on-demand", "Preemptible": "spot"}


@dataclass(frozen=True)
class Shape:
    """What a catalog type is made of: a machine type, its GPUs, and an attached accelerator
    type (N1 hosts) or None (bundled GPUs)."""

    machine_type: str
    vcpus: int
    memory_gib: float
    gpu_type: str
    gpu_count: int
    attached: bool


# (SKU component words, market, region) -> USD per unit-hour
SkuPrices = dict[tuple[frozenset[str], str, str], float]


def fetch_gcp(tables: dict[str, list[Record]], regions: tuple[str, ...], today: dt.date) -> Refresh:
    """Instance rows and offers of the catalog's GCP types in ``regions``, from the APIs."""
    base = {r["name"]: r for r in tables["instances.csv"] if r["cloud"] == "gcp"}
    machines, accelerators = compute_inventory(regions)
    skus = billing_skus()
    return build_refresh(base, machines, accelerators, skus, regions, today)


class MachineType(TypedDict):
    """A Compute API machine type, as the refresh uses it."""

    zones: set[str]
    vcpus: int
    memory_gib: float
    gpu_type: str  # "" without GPUs
    gpu_count: int


def build_refresh(
    base: dict[str, Record],
    machines: dict[str, MachineType],
    accelerators: dict[str, set[str]],
    skus: SkuPrices,
    regions: tuple[str, ...],
    today: dt.date,
) -> Refresh:
    """``machines``: machine type -> {"zones", "vcpus", "memory_gib", "gpu_type", "gpu_count"};
    ``accelerators``: accelerator type -> zones."""
    remarks: list[str] = []
    instances: list[Record] = []
    offers: list[Record] = []
    for name in sorted(base):
        shape, zones = _shape(name, base[name], machines, accelerators)
        if shape is None:
            remarks.append(f"gcp {name}: not listed by the Compute API; rows carried over")
            continue
        instances.append(_instance_row(base[name], shape, today))
        for region in regions:
            in_region = sorted(z for z in zones if z.startswith(region + "-"))
            if not in_region:
                continue
            for market in ("on-demand", "spot"):
                usd, missing = _price(shape, skus, market, region)
                if usd is None:
                    remarks.append(f"gcp {name} {region} {market}: no SKU for {missing}; no offer")
                    continue
                src = f"GCP Cloud Billing Catalog SKUs {today} ({_recipe(shape)})"
                offers += [_offer(name, region, z, market, usd, src) for z in in_region]
    return Refresh(instances, offers, regions, remarks)


def _shape(
    name: str,
    base: Record,
    machines: dict[str, MachineType],
    accelerators: dict[str, set[str]],
) -> tuple[Shape | None, set[str]]:
    if m := N1_HOST.fullmatch(name):
        host, acc = machines.get(m[1]), N1_ACCELERATORS.get(m[3])
        if host is None or acc is None or acc not in accelerators:
            return None, set()
        shape = Shape(m[1], host["vcpus"], host["memory_gib"], acc, int(m[2]), True)
        return shape, set(host["zones"]) & accelerators[acc]
    info = machines.get(name)
    if info is None or not info["gpu_type"]:
        return None, set()
    shape = Shape(
        name, info["vcpus"], info["memory_gib"], info["gpu_type"], info["gpu_count"], False
    )
    return shape, set(info["zones"])


def _instance_row(base: Record, shape: Shape, today: dt.date) -> Record:
    how = "machine type + accelerator type" if shape.attached else "machine type"
    return {
        **base,
        "gpu_count": str(shape.gpu_count),
        "vcpus": str(shape.vcpus),
        "memory_gb": f"{shape.memory_gib:g}",
        "source": f"GCP Compute API {how} {today} ({shape.machine_type}, {shape.gpu_type}); "
        "network and GPU link carried over from the previous catalog",
    }


def _family(machine_type: str) -> str:
    prefix = machine_type.split("-", 1)[0].upper()
    return "N1 Predefined" if prefix == "N1" else prefix


def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in re.split(r"[\s\-_]+", text.lower()) if w) - _IGNORED_WORDS


def _price(shape: Shape, skus: SkuPrices, market: str, region: str) -> tuple[float | None, str]:
    family = _family(shape.machine_type)
    parts = [
        (f"{family} Instance Core", shape.vcpus),
        (f"{family} Instance Ram", shape.memory_gib),
        (shape.gpu_type, shape.gpu_count),
    ]
    total = 0.0
    for component, amount in parts:
        rate = skus.get((_words(component), market, region))
        if rate is None:
            return None, repr(component)
        total += rate * amount
    return round(total, 6), ""


def _recipe(shape: Shape) -> str:
    family = _family(shape.machine_type)
    return (
        f"{shape.vcpus} x '{family} Instance Core' + {shape.memory_gib:g} GiB x "
        f"'{family} Instance Ram' + {shape.gpu_count} x {shape.gpu_type}"
    )


def _offer(name: str, region: str, zone: str, market: str, usd: float, src: str) -> Record:
    return offer_record("gcp", name, region, zone, market, usd, src)


# --- Compute API ---------------------------------------------------------------------------


def compute_inventory(
    regions: tuple[str, ...],
) -> tuple[dict[str, MachineType], dict[str, set[str]]]:
    """Machine types with GPUs (and N1 standard hosts), and accelerator types, by zone."""
    from kplan.launcher.clock import SystemClock
    from kplan.launcher.providers.gcp_api import ComputeApi
    from kplan.launcher.providers.gcp_config import GcpConfig

    credentials = None
    if os.environ.get("KPLAN_GCP_ANONYMOUS") == "1":
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    api = ComputeApi(GcpConfig.from_env(), credentials, SystemClock())
    wanted = tuple(r + "-" for r in regions)
    machines: dict[str, MachineType] = {}
    pages = api.call(
        lambda: list(
            api.client("MachineTypesClient").aggregated_list(
                request={"project": api.project, "filter": 'name eq "(a[0-9]|g2|n1-standard).*"'},
                retry=None,
            )
        ),
        "list machine types",
    )
    for scope, scoped in pages:
        for mt in scoped.machine_types:
            zone = scope.rsplit("/", 1)[-1]
            if not zone.startswith(wanted):
                continue
            gpus = list(mt.accelerators)
            entry = machines.setdefault(
                mt.name,
                {
                    "zones": set(),
                    "vcpus": int(mt.guest_cpus),
                    "memory_gib": mt.memory_mb / 1024,
                    "gpu_type": gpus[0].guest_accelerator_type if gpus else "",
                    "gpu_count": sum(int(g.guest_accelerator_count) for g in gpus),
                },
            )
            entry["zones"].add(zone)
    accelerators: dict[str, set[str]] = {}
    acc_pages = api.call(
        lambda: list(
            api.client("AcceleratorTypesClient").aggregated_list(
                request={"project": api.project}, retry=None
            )
        ),
        "list accelerator types",
    )
    for scope, scoped in acc_pages:
        zone = scope.rsplit("/", 1)[-1]
        if zone.startswith(wanted):
            for acc in scoped.accelerator_types:
                accelerators.setdefault(acc.name, set()).add(zone)
    return machines, accelerators


# --- Cloud Billing Catalog API -----------------------------------------------------------------


def billing_skus() -> SkuPrices:
    """Compute Engine SKU prices by (component words, market, region)."""
    prices: SkuPrices = {}
    for sku in _sku_pages():
        category = sku.get("category", {})
        market = MARKETS.get(str(category.get("usageType", "")))
        description = str(sku.get("description", ""))
        if market is None or " running in " not in description:
            continue
        component = description.split(" running in ", 1)[0].removeprefix("Spot Preemptible ")
        rate = _unit_price(sku.get("pricingInfo") or [])
        if rate is None:
            continue
        for region in sku.get("serviceRegions", []):
            prices.setdefault((_words(component), market, str(region)), rate)
    return prices


def _unit_price(pricing: list[Any]) -> float | None:
    """USD per unit of the first tier (starting at 0) of the SKU's current pricing."""
    if not pricing:
        return None
    rates = pricing[-1].get("pricingExpression", {}).get("tieredRates") or []
    for tier in rates:
        if float(tier.get("startUsageAmount", 0)) == 0:
            price = tier.get("unitPrice", {})
            value = int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
            return value if value > 0 else None
    return None


def _sku_pages() -> Iterator[dict[str, Any]]:
    endpoint = (os.environ.get("KPLAN_GCP_BILLING_ENDPOINT") or BILLING_ENDPOINT).rstrip("/")
    headers = _auth_headers()
    token = ""
    while True:
        query: dict[str, str] = {"pageSize": "5000"}
        if token:
            query["pageToken"] = token
        if key := os.environ.get("KPLAN_GCP_API_KEY"):
            query["key"] = key
        url = f"{endpoint}/v1/services/{COMPUTE_SERVICE}/skus?{urllib.parse.urlencode(query)}"
        doc = _get_json(url, headers)
        yield from doc.get("skus", [])
        token = str(doc.get("nextPageToken") or "")
        if not token:
            return


def _auth_headers() -> dict[str, str]:
    if os.environ.get("KPLAN_GCP_API_KEY") or os.environ.get("KPLAN_GCP_ANONYMOUS") == "1":
        return {}
    try:
        import google.auth
        import google.auth.transport.requests

        creds, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-billing.readonly"]
        )
        creds.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]
    except Exception as exc:  # google.auth raises several unrelated types
        raise CloudError(
            f"GCP credentials for the Cloud Billing API: {type(exc).__name__}: {exc}",
            hint="run `gcloud auth application-default login`, or set KPLAN_GCP_API_KEY",
        ) from exc
    return {"Authorization": f"Bearer {creds.token}"}


def _get_json(url: str, headers: dict[str, str]) -> dict[str, Any]:
    shown = url.split("?", 1)[0]
    request = urllib.request.Request(url, headers={**headers, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            doc = json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read()[:300].decode("utf-8", "replace")
        raise CloudError(
            f"GCP Cloud Billing API GET {shown}: HTTP {err.code}: {detail}",
            hint="check the credentials (or KPLAN_GCP_API_KEY) and that the Cloud Billing API "
            "is enabled for the project",
        ) from err
    except (urllib.error.URLError, TimeoutError, ValueError) as err:
        raise CloudError(
            f"GCP Cloud Billing API GET {shown}: {err}",
            hint="check the network connection (and KPLAN_GCP_BILLING_ENDPOINT, if set)",
        ) from err
    if not isinstance(doc, dict):
        raise CloudError(
            f"GCP Cloud Billing API GET {shown}: not a JSON object",
            hint="retry later; a proxy may have answered instead of the Billing API",
        )
    return doc
