"""Where a job may run: the zones of a region (``ZoneOffer``) and the other regions of its cloud
it may move to when its spot pool runs dry (``Moves``, issue 27 item 3).

``JobSpec.offers`` are the zones of the region the job runs in now; ``Moves.regions`` lists
every region the job may run in (the one it started in among them), each with its zones' offers
and its egress list price to another region of the cloud (``storage_prices.csv``), so that the
launcher prices a move with ``kplan/planner/spotmove.py`` without a catalog. A move
(``kplan/launcher/region_move.py``) changes ``JobSpec.region`` and ``offers``; ``Moves`` stays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kplan.core.errors import InputError
from kplan.core.flags import COPY_HINT, MAX_COPY_GBPS, MIN_COPY_GBPS
from kplan.launcher.provider import Market

# spotmove.DEFAULT_COPY_GBPS (kplan/planner/extra_costs.py MOVE_COPY_GBPS): one copy stream,
# Gbit/s; a test checks they agree (the planner is not imported here: kplan --help stays light)
DEFAULT_COPY_GBPS = 1.0


@dataclass(frozen=True)
class ZoneOffer:
    """A price of an instance type in one zone and market of the job's region."""

    instance_type: str
    zone: str
    market: Market
    usd_per_hour: float


@dataclass(frozen=True)
class MoveRegion:
    """A region the job may run in: its zones' offers of the job's types, its egress price."""

    region: str
    offers: tuple[ZoneOffer, ...]
    egress_usd_gb: float  # from this region to another region of its cloud, USD per GB

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> MoveRegion:
        offers = tuple(ZoneOffer(**o) for o in doc.get("offers", ()))
        return cls(str(doc["region"]), offers, float(doc["egress_usd_gb"]))

    def usd_per_hour(self, instance_type: str, market: Market) -> float | None:
        """The cheapest offer of ``instance_type`` on ``market`` here (None: none)."""
        prices = [
            o.usd_per_hour
            for o in self.offers
            if o.instance_type == instance_type and o.market == market
        ]
        return min(prices) if prices else None

    def mean_usd_per_hour(self, instance_types: Sequence[str], market: Market) -> float | None:
        """The nodes' mean price per node-hour of their types on ``market`` here (None: a type
        has no offer)."""
        prices = [self.usd_per_hour(t, market) for t in instance_types]
        known = [p for p in prices if p is not None]
        return sum(known) / len(known) if known and len(known) == len(prices) else None


@dataclass(frozen=True)
class Moves:
    """The regions a job may move to and the move's inputs (``spotmove.MoveTerms``): the
    checkpoint's size and the copy's bandwidth. No regions: the job never leaves its region."""

    regions: tuple[MoveRegion, ...] = ()
    checkpoint_gb: float = 0.0
    copy_gbps: float = DEFAULT_COPY_GBPS

    def __post_init__(self) -> None:
        # job.json gives the regions as objects: read them back as records
        regions = tuple(
            r if isinstance(r, MoveRegion) else MoveRegion.from_dict(r) for r in self.regions
        )
        object.__setattr__(self, "regions", regions)
        names = [r.region for r in regions]
        if len(set(names)) != len(names):
            raise InputError(f"move regions repeat: {names}", hint="give each region once")
        if not (math.isfinite(self.checkpoint_gb) and self.checkpoint_gb >= 0):
            raise InputError(
                f"--checkpoint-gb {self.checkpoint_gb!r} must be >= 0", hint="GB, e.g. 10"
            )
        if not MIN_COPY_GBPS <= self.copy_gbps <= MAX_COPY_GBPS:  # NaN fails it too
            raise InputError(
                f"--copy-gbps {self.copy_gbps!r} must be in [{MIN_COPY_GBPS:g}, {MAX_COPY_GBPS:g}]",
                hint=COPY_HINT,
            )
        for r in regions:
            if not (math.isfinite(r.egress_usd_gb) and r.egress_usd_gb >= 0):
                raise InputError(
                    f"region {r.region}: egress {r.egress_usd_gb!r} USD/GB must be >= 0",
                    hint="re-create the job from the catalog",
                )

    def region(self, name: str) -> MoveRegion | None:
        return next((r for r in self.regions if r.region == name), None)

    def others(self, name: str) -> tuple[MoveRegion, ...]:
        """The regions the job may move to from ``name``."""
        return tuple(r for r in self.regions if r.region != name) if self.region(name) else ()
