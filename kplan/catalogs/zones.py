"""Zone types: which zones of an offer are opt-in (AWS Local Zones and Wavelength Zones).

An AWS account must opt into a Local Zone or a Wavelength Zone before it can launch there
(``DescribeAvailabilityZones`` reports ``ZoneType`` local-zone / wavelength-zone with
``OptInStatus`` not-opted-in), and those zones hold few GPU instances; ``kplan estimate`` leaves
them out unless asked (``--opt-in-zones``).

The catalog marks them in ``zones.csv`` (``cloud, region, zone, zone_type, source``). A zone that
file does not list (a catalog from ``kplan catalog update``, or an older one without the file)
takes its type from the form of its AWS zone id, as AWS documents it:

- availability zone: ``<region code>-az<n>`` (``use1-az1``);
- Local Zone: ``<region code>-<location><n>-az<n>`` (``usw2-lax1-az1``, ``use1-atl2-az1``; zone
  names ``us-west-2-lax-1a``), docs.aws.amazon.com/local-zones/latest/ug/available-local-zones.html;
- Wavelength Zone: ``<region code>-wl1-<location>-wlz<n>`` (names ``us-east-1-wl1-bos-wlz-1``),
  docs.aws.amazon.com/AWSEC2/latest/APIReference/API_AvailabilityZone.html.

Every GCP zone is a standard zone.
"""

from __future__ import annotations

import re
from typing import cast

from kplan.catalogs.csvfile import Row, check_shape
from kplan.planner.catalog import CLOUDS, ZONE_TYPES, ZoneType

ZONE_FILE = "zones.csv"
ZONE_COLUMNS = ("cloud", "region", "zone", "zone_type", "source")
AWS_ZONE_ID_SOURCE = (
    "AWS zone id form (docs.aws.amazon.com/local-zones/latest/ug/available-local-zones.html; "
    "EC2 API AvailabilityZone.ZoneType)"
)
GCP_ZONE_SOURCE = "GCP zone (cloud.google.com/compute/docs/regions-zones): no opt-in zones"

_WAVELENGTH = re.compile(r"-wl\d+-|-wlz-?\d+$")
_LOCAL_ID = re.compile(r"[a-z]+\d+-[a-z]+\d+-az\d+")
_LOCAL_NAME = re.compile(r"[a-z]{2}-[a-z]+-\d+-[a-z]+-\d+[a-z]")


def zone_type_from_id(cloud: str, zone: str) -> ZoneType:
    """The zone's type from the form of its id or name (see the module docstring)."""
    if cloud != "aws":
        return "availability-zone"
    z = zone.strip().lower()
    if _WAVELENGTH.search(z):
        return "wavelength-zone"
    if _LOCAL_ID.fullmatch(z) or _LOCAL_NAME.fullmatch(z):
        return "local-zone"
    return "availability-zone"


def zone_source(cloud: str) -> str:
    """The source written beside a zone type the build script derived from the zone id."""
    return AWS_ZONE_ID_SOURCE if cloud == "aws" else GCP_ZONE_SOURCE


def parse_zone(row: Row) -> tuple[str, str, ZoneType]:
    """(cloud, zone, zone_type) of one zones.csv row (region and source required too)."""
    check_shape(row)
    cloud = row.choice("cloud", CLOUDS)
    zone = row.text("zone")
    row.text("region")
    row.text("source")
    return cloud, zone, cast(ZoneType, row.choice("zone_type", ZONE_TYPES))


ZONE_TYPE_LABELS: dict[str, str] = {
    "availability-zone": "zone",
    "local-zone": "Local Zone",
    "wavelength-zone": "Wavelength Zone",
}
