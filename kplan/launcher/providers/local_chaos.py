"""Injected spot interruptions for the local provider (chaos).

A preemption of a local instance plays a spot interruption: a **notice** first (SIGTERM to the
instance's bootstrap, which forwards it to torchrun and the workers: the runtime checkpoints on
SIGTERM), then, ``notice_s * notice_factor`` seconds later, SIGKILL of every process of the
instance. The real notice is 120 s on AWS (30 s on GCP); tests shorten it with
``notice_factor``. With ``notice_factor = 0`` the instance is killed without a notice.

When preemptions happen (both may be combined):

- ``at_s``: explicit times, in seconds after the job's first instance was launched (the job's
  chaos clock). Each time preempts one running instance: of node rank ``targets[i]`` when
  given (null: any), and of ``nodes`` when given. An event whose time passes while no such
  instance runs hits the next one to run.
- ``rate_per_hour``: random preemptions, a Poisson process per instance-hour; each instance's
  lifetime is drawn from a generator seeded by ``seed`` and the instance id (reproducible).

Capacity outages (``outages``): a list of ``{"from_s", "until_s", "zone", "market"}`` (times on
the same chaos clock; ``until_s`` null: to the end; ``zone`` / ``market`` null: every zone /
market). While one covers a launch's zone and market, ``run_instances`` refuses it with a
``CapacityError``, like a cloud with no capacity there (the launcher then tries another zone,
on demand, or waits: ``kplan/launcher/LIFECYCLE.md``). The clock starts at the job's first launch.

``max_preemptions`` caps the preemptions of the job. Each preemption is claimed by creating a
file with ``O_EXCL`` in the job's chaos folder, so the supervisors of several instances (separate
processes) never take the same event twice.

Configure with the ``KPLAN_LOCAL_CHAOS`` environment variable (JSON) or ``ChaosConfig(...)``::

    KPLAN_LOCAL_CHAOS='{"at_s": [20, 40, 60], "notice_factor": 0.05, "seed": 1}'
    KPLAN_LOCAL_CHAOS='{"at_s": [20], "outages": [{"from_s": 19, "until_s": 80}]}'
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from kplan.core.errors import InputError
from kplan.runtime.private import make_dirs, open_private

ENV_VAR = "KPLAN_LOCAL_CHAOS"
SPOT_NOTICE_S = 120.0  # AWS's spot interruption notice
REASON = "spot interruption"
_KEYS = (
    "at_s",
    "targets",
    "nodes",
    "rate_per_hour",
    "seed",
    "max_preemptions",
    "notice_s",
    "notice_factor",
    "outages",
)
_OUTAGE_KEYS = ("from_s", "until_s", "zone", "market")
_STAGGER_S = 0.5  # untargeted events: instances wait a seeded share of this before claiming
_EXAMPLE = '{"at_s": [20, 40], "notice_factor": 0.05}'


def _bad(message: str) -> InputError:
    return InputError(
        f"chaos: {message}",
        f"set {ENV_VAR} to JSON with keys {', '.join(_KEYS)}, e.g. {_EXAMPLE}",
    )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class OutageDoc(TypedDict):
    """An outage in the JSON form ``Outage.from_dict`` reads."""

    from_s: float
    until_s: float | None
    zone: str | None
    market: str | None


class ChaosDoc(TypedDict):
    """The chaos configuration in the JSON form ``ChaosConfig.from_dict`` reads."""

    at_s: list[float]
    targets: list[int | None] | None
    nodes: list[int] | None
    rate_per_hour: float
    seed: int
    max_preemptions: int | None
    notice_s: float
    notice_factor: float
    outages: list[OutageDoc]


@dataclass(frozen=True)
class Outage:
    """No capacity for ``zone`` / ``market`` (None: any) from ``from_s`` until ``until_s``."""

    from_s: float = 0.0
    until_s: float | None = None  # None: until the end of the job
    zone: str | None = None
    market: str | None = None

    def __post_init__(self) -> None:
        ends = (self.from_s,) if self.until_s is None else (self.from_s, self.until_s)
        if not all(_number(t) and math.isfinite(t) and t >= 0 for t in ends):
            raise _bad(f"outage times {self.from_s!r}..{self.until_s!r} must be seconds >= 0")
        if self.until_s is not None and self.until_s < self.from_s:
            raise _bad(f"outage until_s {self.until_s} is before its from_s {self.from_s}")
        for name in ("zone", "market"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise _bad(f"outage {name}={value!r} must be a name or null")

    def covers(self, zone: str, market: str, t_s: float) -> bool:
        """Does this outage refuse a launch in ``zone`` / ``market`` at chaos time ``t_s``?"""
        if self.zone is not None and self.zone != zone:
            return False
        if self.market is not None and self.market != market:
            return False
        return self.from_s <= t_s and (self.until_s is None or t_s < self.until_s)

    def to_dict(self) -> OutageDoc:
        return {
            "from_s": self.from_s,
            "until_s": self.until_s,
            "zone": self.zone,
            "market": self.market,
        }

    @classmethod
    def from_dict(cls, data: object) -> Outage:
        if not isinstance(data, dict):
            raise _bad(f"an outage must be an object with keys {', '.join(_OUTAGE_KEYS)}")
        unknown = sorted(set(data) - set(_OUTAGE_KEYS))
        if unknown:
            raise _bad(f"unknown outage keys {unknown}")
        return cls(
            from_s=data.get("from_s", 0.0),
            until_s=data.get("until_s"),
            zone=data.get("zone"),
            market=data.get("market"),
        )


@dataclass(frozen=True)
class ChaosConfig:
    """When and how the local provider preempts instances (see the module docstring)."""

    at_s: tuple[float, ...] = ()
    targets: tuple[int | None, ...] | None = None  # per at_s: the node rank to hit (None: any)
    nodes: tuple[int, ...] | None = None  # node ranks that may be hit; None: any
    rate_per_hour: float = 0.0
    seed: int = 0
    max_preemptions: int | None = None
    notice_s: float = SPOT_NOTICE_S
    notice_factor: float = 1.0
    outages: tuple[Outage, ...] = ()  # capacity refused (see the module docstring)

    def __post_init__(self) -> None:
        for t in self.at_s:
            if not _number(t) or not math.isfinite(t) or t < 0:
                raise _bad(f"at_s holds {t!r}, not a number of seconds >= 0")
        if self.targets is not None and (
            len(self.targets) != len(self.at_s)
            or not all(t is None or (_whole(t) and t >= 0) for t in self.targets)
        ):
            raise _bad(
                f"targets={list(self.targets)!r} must give one node rank (or null) per at_s time"
            )
        if self.nodes is not None and (
            not self.nodes or not all(_whole(n) and n >= 0 for n in self.nodes)
        ):
            raise _bad(f"nodes={list(self.nodes)!r} must list node ranks >= 0")
        checks: list[tuple[str, object, bool]] = [
            ("rate_per_hour", self.rate_per_hour, _number(self.rate_per_hour)),
            ("notice_s", self.notice_s, _number(self.notice_s)),
            ("notice_factor", self.notice_factor, _number(self.notice_factor)),
        ]
        for name, value, ok in checks:
            if not ok or not math.isfinite(float(value)) or float(value) < 0:  # type: ignore[arg-type]
                raise _bad(f"{name}={value!r} must be a number >= 0")
        if not _whole(self.seed):
            raise _bad(f"seed={self.seed!r} must be an integer")
        if self.max_preemptions is not None and (
            not _whole(self.max_preemptions) or self.max_preemptions < 0
        ):
            raise _bad(f"max_preemptions={self.max_preemptions!r} must be an integer >= 0")

    @property
    def enabled(self) -> bool:
        return bool(self.at_s or self.rate_per_hour > 0) and self.max_preemptions != 0

    def out_of_capacity(self, zone: str, market: str, t_s: float) -> Outage | None:
        """The outage that refuses a launch in ``zone`` / ``market`` at chaos time ``t_s``."""
        return next((o for o in self.outages if o.covers(zone, market, t_s)), None)

    @property
    def notice(self) -> float:
        """Seconds between the notice (SIGTERM) and the kill (SIGKILL)."""
        return self.notice_s * self.notice_factor

    def hits(self, node_rank: int) -> bool:
        """May chaos preempt instances of ``node_rank`` at all?"""
        return self.nodes is None or node_rank in self.nodes

    def event_hits(self, event: int, node_rank: int) -> bool:
        """May event ``event`` (an index into ``at_s``) preempt an instance of ``node_rank``?"""
        target = None if self.targets is None else self.targets[event]
        return self.hits(node_rank) and (target is None or target == node_rank)

    def lifetime(self, instance_id: str) -> float | None:
        """Random mode: seconds after its start at which ``instance_id`` is preempted."""
        if self.rate_per_hour <= 0:
            return None
        return random.Random(f"{self.seed}:{instance_id}").expovariate(self.rate_per_hour / 3600)

    def stagger(self, event: int, node_rank: int) -> float:
        """Delay before an instance claims untargeted event ``event``: seeded, per node rank."""
        return _STAGGER_S * random.Random(f"{self.seed}:{event}:{node_rank}").random()

    def to_dict(self) -> ChaosDoc:
        return {
            "at_s": list(self.at_s),
            "targets": None if self.targets is None else list(self.targets),
            "nodes": None if self.nodes is None else list(self.nodes),
            "rate_per_hour": self.rate_per_hour,
            "seed": self.seed,
            "max_preemptions": self.max_preemptions,
            "notice_s": self.notice_s,
            "notice_factor": self.notice_factor,
            "outages": [o.to_dict() for o in self.outages],
        }

    @classmethod
    def from_dict(cls, data: object) -> ChaosConfig:
        if not isinstance(data, dict):
            raise _bad(f"expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise _bad(f"unknown keys {unknown}")
        at_s = data.get("at_s", [])
        targets = data.get("targets")
        nodes = data.get("nodes")
        if not isinstance(at_s, list):
            raise _bad(f"at_s={at_s!r} must be a list of seconds")
        if targets is not None and not isinstance(targets, list):
            raise _bad(f"targets={targets!r} must be a list of node ranks (or nulls)")
        if nodes is not None and not isinstance(nodes, list):
            raise _bad(f"nodes={nodes!r} must be a list of node ranks")
        outages = data.get("outages", [])
        if not isinstance(outages, list):
            raise _bad(f"outages={outages!r} must be a list of objects")
        return cls(
            at_s=tuple(at_s),
            targets=None if targets is None else tuple(targets),
            nodes=None if nodes is None else tuple(nodes),
            rate_per_hour=data.get("rate_per_hour", 0.0),
            seed=data.get("seed", 0),
            max_preemptions=data.get("max_preemptions"),
            notice_s=data.get("notice_s", SPOT_NOTICE_S),
            notice_factor=data.get("notice_factor", 1.0),
            outages=tuple(Outage.from_dict(o) for o in outages),
        )

    @classmethod
    def from_json(cls, text: str) -> ChaosConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise _bad(f"not JSON ({err.msg}): {text!r}") from None
        return cls.from_dict(data)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChaosConfig | None:
        """The configuration in ``KPLAN_LOCAL_CHAOS``; None when it is unset or blank."""
        raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
        return cls.from_json(raw) if raw else None


def claim(folder: Path, name: str, owner: str) -> bool:
    """Atomically take ``folder/name`` (first caller wins, across processes)."""
    make_dirs(folder)
    try:
        fd = open_private(folder / name, os.O_WRONLY | os.O_EXCL)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(owner)
    return True


def claim_preemption(config: ChaosConfig, folder: Path, owner: str) -> bool:
    """Take one of the job's ``max_preemptions`` slots (always True without a cap)."""
    if config.max_preemptions is None:
        return True
    return any(claim(folder, f"slot-{i}", owner) for i in range(config.max_preemptions))
