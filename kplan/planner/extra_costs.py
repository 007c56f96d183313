"""The costs of a plan besides its instances: boot disks, checkpoint and data storage, and the
data's egress when it lives in another region or cloud (issue 27, "every cost counted").

Prices are the catalog's list prices per region (``storage_prices.csv``, each row with its
source and date). For a plan of ``n`` nodes running ``h`` hours (``M = 730`` hours a month):

    disk        n * DISK_GB[cloud] * disk $/GB-month * h / M       billed with each instance
    checkpoint  C * K * object $/GB-month * h / M                   C = F * gradient bytes
    data        D * object $/GB-month (the data's region) * h / M
    egress      D * egress $/GB (the data's region: to another region, or to another cloud)
    a move      C * egress $/GB to another region (the plan's region), C * 8 / 1 Gbit/s copy

A move (``spotmove.py``: the job leaves a pool that ran dry for another region) is priced, not
counted: how many a job makes is the market's (``kplan simulate`` replays them); the plan
states what one costs, its egress and copy time at ``MOVE_COPY_GBPS``.

``F = CHECKPOINT_FACTOR`` (weights plus two Adam moments, the same factor the checkpoint time
uses), ``K = CHECKPOINTS_KEPT`` (the runtime keeps its last two), ``D`` is ``--data-gb``, copied
once to the plan's region. Given the hours these are deterministic: the expected cost adds them
at the expected hours, the p90 at the p90 hours (an upper bound, since both grow with time).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from kplan.planner.catalog import Offer, StoragePrice
from kplan.planner.costs import TimeCost

HOURS_PER_MONTH = 730.0  # the clouds' billing month for GB-month prices
CHECKPOINT_FACTOR = 3.0  # checkpoint bytes / gradient bytes: weights + Adam's two moments
CHECKPOINTS_KEPT = 2  # kplan.runtime.checkpoint keeps the last two
# Boot disk per node, GB: AWS, the Deep Learning Base AMI's root volume (its snapshot's size,
# which the launcher does not change); GCP, the launcher's default (GcpConfig.disk_size_gb).
BOOT_DISK_GB = {"aws": 75.0, "gcp": 200.0}
EGRESS_KINDS = ("none", "inter-region", "cross-cloud")
MOVE_COPY_GBPS = 1.0  # a move's checkpoint copy between regions, Gbit/s: one stream, assumed


class HasExtras(Protocol):
    """A search candidate (kplan/planner/candidates.py), as far as its extras go."""

    @property
    def offer(self) -> Offer: ...
    @property
    def extras(self) -> ExtraRates: ...


@dataclass(frozen=True)
class DataSpec:
    """The training data's size and where it is stored (None: the plan's region)."""

    gb: float = 0.0
    region: str | None = None


@dataclass(frozen=True)
class ExtraRates:
    """A (cloud, region)'s extra costs as rates: USD per node-hour (its disk), per job-hour
    (checkpoints, data) and once (egress), with what they assume."""

    disk_usd_node_h: float = 0.0
    checkpoint_usd_h: float = 0.0
    data_usd_h: float = 0.0
    egress_usd: float = 0.0
    disk_gb: float = 0.0
    checkpoint_gb: float = 0.0
    data_gb: float = 0.0
    data_region: str = ""
    egress: str = "none"
    source: str = ""
    move_usd: float = 0.0
    move_copy_s: float = 0.0

    def per_hour(self, nodes: ArrayLike) -> np.ndarray:
        """USD per hour of a plan with ``nodes`` nodes."""
        n = np.asarray(nodes, dtype=float)
        out: np.ndarray = n * self.disk_usd_node_h + self.checkpoint_usd_h + self.data_usd_h
        return out

    def at(self, nodes: int, hours: float) -> ExtraCosts:
        """The dollars of a plan of ``nodes`` nodes that runs ``hours``."""
        return ExtraCosts(
            disk_usd=nodes * self.disk_usd_node_h * hours,
            checkpoint_usd=self.checkpoint_usd_h * hours,
            data_usd=self.data_usd_h * hours,
            egress_usd=self.egress_usd,
            disk_gb=self.disk_gb,
            checkpoint_gb=self.checkpoint_gb,
            checkpoints_kept=CHECKPOINTS_KEPT if self.checkpoint_gb > 0 else 0,
            data_gb=self.data_gb,
            data_region=self.data_region,
            egress=self.egress,
            source=self.source,
            move_usd=self.move_usd,
            move_copy_s=self.move_copy_s,
        )


@dataclass(frozen=True)
class ExtraCosts:
    """A plan row's extra dollars at its expected hours, and what they assume (JSON ``extras``;
    a plan saved before schema 2.1 loads with zeros)."""

    disk_usd: float = 0.0  # boot disks of all nodes
    checkpoint_usd: float = 0.0  # object storage of the kept checkpoints
    data_usd: float = 0.0  # object storage of the data set
    egress_usd: float = 0.0  # the data copied from its region to the plan's
    disk_gb: float = 0.0  # per node
    checkpoint_gb: float = 0.0  # one checkpoint
    checkpoints_kept: int = 0
    data_gb: float = 0.0
    data_region: str = ""
    egress: str = "none"  # none, inter-region or cross-cloud
    source: str = ""  # the price rows used (source and date)
    # one move of the job to another region (not in the total): the checkpoint's egress and
    # its copy time at MOVE_COPY_GBPS
    move_usd: float = 0.0
    move_copy_s: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.disk_usd + self.checkpoint_usd + self.data_usd + self.egress_usd

    @property
    def storage_usd(self) -> float:
        return self.checkpoint_usd + self.data_usd


def data_home(storage: dict[tuple[str, str], StoragePrice], region: str) -> StoragePrice | None:
    """The price row of the region named ``region`` (region names differ between clouds)."""
    return next((p for p in storage.values() if p.region == region), None)


def rates_for(
    storage: dict[tuple[str, str], StoragePrice],
    cloud: str,
    region: str,
    data: DataSpec,
    gradient_bytes: float,
) -> ExtraRates:
    """The extra-cost rates of a plan in (cloud, region); zero where the catalog has no prices."""
    here = storage.get((cloud, region))
    if here is None:
        return ExtraRates()
    home = data_home(storage, data.region) if data.region else here
    home = home or here  # an unknown data region is refused by the flag check before this
    egress, per_gb = "none", 0.0
    if home.cloud != cloud:
        egress, per_gb = "cross-cloud", home.egress_cloud_usd_gb
    elif home.region != region:
        egress, per_gb = "inter-region", home.egress_region_usd_gb
    ckpt_gb = CHECKPOINT_FACTOR * gradient_bytes / 1e9
    disk_gb = BOOT_DISK_GB.get(cloud, 0.0)
    sources = {f"{p.cloud}:{p.region} {p.as_of}" for p in (here, home)}
    return ExtraRates(
        disk_usd_node_h=disk_gb * here.disk_usd_gb_month / HOURS_PER_MONTH,
        checkpoint_usd_h=ckpt_gb * CHECKPOINTS_KEPT * here.object_usd_gb_month / HOURS_PER_MONTH,
        data_usd_h=data.gb * home.object_usd_gb_month / HOURS_PER_MONTH,
        egress_usd=data.gb * per_gb,
        disk_gb=disk_gb,
        checkpoint_gb=ckpt_gb,
        data_gb=data.gb,
        data_region=home.region,
        egress=egress,
        source="list prices, storage_prices.csv (" + ", ".join(sorted(sources)) + ")",
        move_usd=ckpt_gb * here.egress_region_usd_gb,
        move_copy_s=ckpt_gb * 8.0 / MOVE_COPY_GBPS,
    )


def rates_by_region(cands: Iterable[HasExtras]) -> dict[tuple[str, str], ExtraRates]:
    """The extra-cost rates of each (cloud, region) among the search's candidates."""
    return {(c.offer.cloud, c.offer.region): c.extras for c in cands}


def add_to(tc: TimeCost, per_hour: ArrayLike, fixed: ArrayLike) -> TimeCost:
    """``tc`` with the extras added: ``per_hour`` times the expected (p90) hours plus ``fixed``."""
    rate = np.asarray(per_hour, dtype=float)
    once = np.asarray(fixed, dtype=float)
    return TimeCost(
        hours=tc.hours,
        hours_p90=tc.hours_p90,
        cost_usd=tc.cost_usd + rate * tc.hours + once,
        cost_p90_usd=tc.cost_p90_usd + rate * tc.hours_p90 + once,
        preemptions=tc.preemptions,
        checkpoint_interval_s=tc.checkpoint_interval_s,
    )
