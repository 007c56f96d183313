"""A local Cloud Billing Catalog API for the catalog-update tests: ``GET
/v1/services/{service}/skus`` answering with the real SKU JSON shape, paged by ``pageSize`` and
``pageToken``, and the API's error body for anything else."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from tests.gcp_http import ApiError, Json, serve_http

COMPUTE = "6F81-5844-456A"


def sku(
    description: str,
    group: str,
    usage: str,
    usd: float,
    regions: list[str],
    unit: str = "h",
) -> Json:
    """One SKU as the API returns it (one tier, starting at 0)."""
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    ident = f"{zlib.crc32(f'{description}|{usage}'.encode()):012X}"
    ident = f"{ident[:4]}-{ident[4:8]}-{ident[8:]}"
    return {
        "name": f"services/{COMPUTE}/skus/{ident}",
        "skuId": ident,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": group,
            "usageType": usage,
        },
        "serviceRegions": regions,
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "displayQuantity": 1,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {
                                "currencyCode": "USD",
                                "units": str(units),
                                "nanos": nanos,
                            },
                        }
                    ],
                    "usageUnitDescription": "hour" if unit == "h" else "gibibyte hour",
                    "baseUnit": "s",
                    "baseUnitDescription": "second",
                    "baseUnitConversionFactor": 3600,
                },
                "currencyConversionRate": 1,
                "effectiveTime": "2026-11-20T08:00:00.000Z",
            }
        ],
        "serviceProviderName": "Google",
        "geoTaxonomy": {"type": "MULTI_REGIONAL", "regions": regions},
    }


class FakeBilling:
    """SKUs of one service; ``fail_next`` makes the next request answer an HTTP error."""

    def __init__(self, skus: list[Json], page_size: int = 3) -> None:
        self.skus = skus
        self.page_size = page_size  # small, so the client must follow nextPageToken
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.errors: list[ApiError] = []

    def respond(
        self, method: str, path: str, query: dict[str, str], raw: bytes
    ) -> tuple[int, bytes, str]:
        self.requests.append((path, query))
        try:
            out = self._handle(method, path, query)
            status = 200
        except ApiError as exc:
            status, out = exc.code, exc.body()
        return status, json.dumps(out).encode(), "application/json; charset=UTF-8"

    def _handle(self, method: str, path: str, query: dict[str, str]) -> Json:
        if self.errors:
            raise self.errors.pop(0)
        if method != "GET" or path != f"/v1/services/{COMPUTE}/skus":
            raise ApiError(404, "notFound", f"No route for {method} {path}")
        size = min(int(query.get("pageSize", "5000")), self.page_size)
        start = int(query.get("pageToken") or 0)
        out: Json = {"skus": self.skus[start : start + size]}
        if start + size < len(self.skus):
            out["nextPageToken"] = str(start + size)
        return out

    @contextmanager
    def serve(self) -> Iterator[str]:
        with serve_http(self.respond) as url:
            yield url
