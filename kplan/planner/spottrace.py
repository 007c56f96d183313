"""Spot availability traces: what a pool of spot nodes did, event by event.

A trace is a CSV with a header ``time_s,event,node`` (optional fourth column ``zone``), one row
per event, sorted by time:

- ``add``: the cloud granted a spot node (capacity was there at that moment);
- ``remove``: the cloud preempted that node;
- ``alive``: (time 0 only) the node was already running when the observation began; its age is
  not known, so it counts as present but not as a lifetime (it is left-truncated).

Time is in seconds from the start of the observation; a node never removed lived at least to the
end (``# end_s=<seconds>`` on a comment line gives the end; else the last event's time). Other
``#`` lines are comments. The shared Bamboo traces (``time_ms,add|remove,nodeN``) and GCP
running-VM counts convert to this format. Reading, writing and converting trace files is
``kplan.catalogs.spot_traces``; this module is pure: the parsed trace and what it means.

What the model reads from a trace (``node_lives``, ``loss_events``; the fit in
``scripts/fit_spot_model.py`` and the replay in ``spotsim`` use these same definitions):

- a node's **lifetime** is its ``remove`` time less its ``add`` time, right-censored at the end
  of observation when it is never removed; ``alive`` nodes (age unknown) are not lifetimes;
- a **loss event** is a run of removals within ``LOSS_WINDOW_S`` of the run's first removal
  (the shared traces are stamped to the minute, so two removals one stamp apart may be seconds
  apart; and a second loss during a restart is recovered by the same restart);
- after a loss event the pool **waits** from the event's first removal until its next ``add``
  at or after the event's last removal (capacity granted again). The wait is an **outage**
  when it is longer than the restart (300 s); an event that comes during an earlier event's
  outage *continues* it and has no wait of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from kplan.planner.spot import SpotRisk

ADD = 1
REMOVE = -1
LOSS_WINDOW_S = 60.0  # removals this close to a loss event's first removal belong to it


@dataclass(frozen=True)
class SpotTrace:
    """Events of one pool (one cloud, instance type, zone or region), sorted by time."""

    name: str
    source: str  # where it came from (file, converter)
    times_s: NDArray[np.float64]  # event times, seconds from the start, non-decreasing
    kinds: NDArray[np.int8]  # ADD or REMOVE
    nodes: tuple[str, ...]  # node id of each event
    end_s: float  # end of observation (>= the last event)
    zones: tuple[str, ...] = ()  # zone of each event ("" or empty: unknown / one zone)
    unknown_age: frozenset[str] = field(default_factory=frozenset)  # added at 0, age unknown

    def __post_init__(self) -> None:
        n = len(self.times_s)
        if len(self.kinds) != n or len(self.nodes) != n or (self.zones and len(self.zones) != n):
            raise ValueError("trace columns differ in length")
        if n and (np.any(np.diff(self.times_s) < 0) or self.times_s[0] < 0):
            raise ValueError("trace times must be >= 0 and sorted")
        if n and self.end_s < self.times_s[-1]:
            raise ValueError("trace end is before its last event")

    @property
    def hours(self) -> float:
        return self.end_s / 3600.0

    def window(self, start_s: float, end_s: float) -> SpotTrace:
        """The events in ``[start_s, end_s)`` (to the trace's end inclusive), times shifted to
        start at 0; nodes alive at ``start_s`` appear as ``add`` events at time 0 (their age
        before is not known: they are in ``unknown_age``)."""
        start_s = max(float(start_s), 0.0)
        end_s = min(float(end_s), self.end_s)
        if not end_s > start_s:
            raise ValueError(f"empty window [{start_s}, {end_s})")
        before = self.times_s < start_s
        alive = _alive_nodes(self, int(np.count_nonzero(before)))
        inside = np.flatnonzero(~before & ((self.times_s < end_s) | (end_s >= self.end_s)))
        zone_of = dict(zip(self.nodes, self.zones, strict=True)) if self.zones else {}
        times = np.concatenate([np.zeros(len(alive)), self.times_s[inside] - start_s])
        kinds = np.concatenate([np.full(len(alive), ADD), self.kinds[inside]]).astype(np.int8)
        nodes = (*alive, *(self.nodes[i] for i in inside))
        zones = (*(zone_of[a] for a in alive), *(self.zones[i] for i in inside)) if zone_of else ()
        return SpotTrace(
            name=f"{self.name}[{start_s:.0f}s:{end_s:.0f}s]",
            source=f"{self.source}; window {start_s:.0f}-{end_s:.0f} s",
            times_s=times,
            kinds=kinds,
            nodes=nodes,
            end_s=end_s - start_s,
            zones=zones,
            unknown_age=frozenset(alive) | (self.unknown_age & frozenset(nodes)),
        )

    def alive_at(self, t_s: float) -> int:
        """Nodes alive just after every event at times ``<= t_s``."""
        k = int(np.searchsorted(self.times_s, t_s, side="right"))
        return int(self.kinds[:k].astype(np.int64).sum())

    @cached_property
    def _alive_after(self) -> NDArray[np.int64]:
        """``alive_at`` of each event's time (every event at that time counted)."""
        alive = np.cumsum(self.kinds.astype(np.int64))
        last = np.searchsorted(self.times_s, self.times_s, side="right") - 1
        out: NDArray[np.int64] = alive[last]
        return out

    def first_with(self, nodes: int, t_s: float) -> float:
        """``t_s`` when ``nodes`` nodes are alive then, else the first event time after ``t_s``
        when they are, else ``t_s`` (the pool never has them). One vectorised pass per call
        (the counts are computed once per trace), not one pass per later event."""
        if self.alive_at(t_s) >= nodes:
            return t_s
        k = int(np.searchsorted(self.times_s, t_s, side="right"))
        hits = np.flatnonzero(self._alive_after[k:] >= nodes)
        return float(self.times_s[k + int(hits[0])]) if len(hits) else t_s

    def node_hours(self) -> float:
        """Node-hours observed (every node, those of unknown age included)."""
        dt = np.diff(np.append(self.times_s, self.end_s))
        alive = np.cumsum(self.kinds.astype(np.int64))
        return float(np.dot(alive, dt)) / 3600.0

    @property
    def removals(self) -> int:
        return int(np.count_nonzero(self.kinds == REMOVE))


def _alive_nodes(trace: SpotTrace, k: int) -> tuple[str, ...]:
    """The nodes alive after the first ``k`` events, in the order they were added."""
    alive: dict[str, None] = {}
    for kind, node in zip(trace.kinds[:k], trace.nodes[:k], strict=True):
        if kind == ADD:
            alive[node] = None
        else:
            alive.pop(node, None)
    return tuple(alive)


# --- what the model reads from a trace ------------------------------------------------------


@dataclass(frozen=True)
class NodeLives:
    """One row per node that was added during the observation (``alive`` nodes excluded)."""

    nodes: tuple[str, ...]
    start_s: NDArray[np.float64]  # add time
    stop_s: NDArray[np.float64]  # remove time, or the end of observation
    removed: NDArray[np.bool_]  # False: right-censored

    @property
    def life_h(self) -> NDArray[np.float64]:
        out: NDArray[np.float64] = (self.stop_s - self.start_s) / 3600.0
        return out


def node_lives(trace: SpotTrace) -> NodeLives:
    """Each node's lifetime: ``remove - add``, censored at ``end_s`` if never removed."""
    start: dict[str, float] = {}
    stop: dict[str, float] = {}
    for t, kind, node in zip(trace.times_s.tolist(), trace.kinds, trace.nodes, strict=True):
        if kind == ADD:
            start[node] = t
        else:
            stop[node] = t
    names = tuple(n for n in start if n not in trace.unknown_age)
    return NodeLives(
        nodes=names,
        start_s=np.array([start[n] for n in names], dtype=float),
        stop_s=np.array([stop.get(n, trace.end_s) for n in names], dtype=float),
        removed=np.array([n in stop for n in names], dtype=bool),
    )


@dataclass(frozen=True)
class LossEvents:
    """The pool's loss events (``LOSS_WINDOW_S``), one row each."""

    start_s: NDArray[np.float64]  # first removal
    size: NDArray[np.int64]  # nodes removed (b)
    pool: NDArray[np.int64]  # nodes that could have been removed: alive before, plus adds inside
    wait_s: NDArray[np.float64]  # from start_s to the next add at or after its last removal
    censored: NDArray[np.bool_]  # no add followed before the end: wait_s is a lower bound
    continues: NDArray[np.bool_]  # came during an earlier event's outage: not an outage of its own

    def __len__(self) -> int:
        return len(self.start_s)


def loss_events(
    trace: SpotTrace, window_s: float = LOSS_WINDOW_S, restart_s: float = 300.0
) -> LossEvents:
    """Group the removals into loss events and measure the wait for capacity after each.
    An event is an outage when its wait is longer than ``restart_s``."""
    times, kinds = trace.times_s, trace.kinds
    alive = np.cumsum(kinds.astype(np.int64))  # after each event
    add_times = times[kinds == ADD]
    starts: list[float] = []
    lasts: list[float] = []
    sizes: list[int] = []
    pools: list[int] = []
    i, n = 0, len(times)
    while i < n:
        if kinds[i] != REMOVE:
            i += 1
            continue
        t0 = float(times[i])
        before = int(alive[i - 1]) if i else 0
        b, last, j = 0, i, i
        while j < n and times[j] <= t0 + window_s:
            if kinds[j] == REMOVE:
                b += 1
                last = j
            j += 1
        adds = int(np.count_nonzero(kinds[i : last + 1] == ADD))
        starts.append(t0)
        lasts.append(float(times[last]))
        sizes.append(b)
        pools.append(before + adds)
        i = last + 1
    start = np.array(starts, dtype=float)
    k = np.searchsorted(add_times, np.array(lasts, dtype=float), side="left")
    censored = k >= len(add_times)
    padded = np.append(add_times, trace.end_s)
    grant = np.where(censored, trace.end_s, padded[k])
    # continues: an earlier event's outage (a wait beyond the restart) was still on
    out_until = np.where(grant - start > restart_s, grant, -np.inf)
    prev = np.maximum.accumulate(out_until) if len(out_until) else out_until
    continues = np.zeros(len(start), dtype=bool)
    continues[1:] = prev[:-1] > start[1:]
    return LossEvents(
        start_s=start,
        size=np.array(sizes, dtype=np.int64),
        pool=np.array(pools, dtype=np.int64),
        wait_s=grant - start,
        censored=censored,
        continues=continues,
    )


# --- a trace drawn from the model -----------------------------------------------------------


def synthetic_trace(risk: SpotRisk, *, pool: int, hours: float, seed: int) -> SpotTrace:
    """A trace of one cluster of ``pool`` spot nodes drawn from ``risk`` with the model's
    semantics (``kplan.planner.spot``), so that a replay of a ``pool``-node plan on it
    reproduces the model:

    - the cluster has ``pool`` slots, each holding a node or empty. Each slot runs a loss
      clock: Weibull(shape, ``scale_h * (1 + co_loss * (pool - 1))``), drawn when the slot is
      filled after its clock fired (and at time 0). The stretch keeps each node's loss rate at
      ``1 / mean life`` once the losses it shares with the others are counted, for any shape;
    - when a slot's clock fires and the slot holds a node: a loss event at that instant; the
      node goes, and each other slot's node with probability ``co_loss``. A co-lost slot's
      clock goes on (its replacement inherits it); a clock that fires on an empty slot is
      drawn again when the slot is filled;
    - unless the cluster is already in an outage, with probability ``outage.prob`` the
      capacity is out for a wait drawn from ``outage.durations_h`` (the whole wait; the fitted
      ones are longer than ``restart_s``): every slot emptied until then is refilled at its
      end; otherwise the lost nodes are replaced at once (capacity granted at the loss);
    - zone failover is not represented (one pool: ``region_prob`` = 1).
    """
    if pool < 1 or not hours > 0:
        raise ValueError(f"pool {pool} must be >= 1 and hours {hours} > 0")
    end = hours * 3600.0
    c = _Cluster(risk, pool, np.random.default_rng(seed))
    c.fill(0.0, list(range(pool)))
    back_at = math.inf  # end of the outage under way
    while True:
        i = int(np.argmin(c.fire))
        t = float(c.fire[i])
        if back_at <= t:
            if back_at >= end:
                break
            c.fill(back_at, [j for j in range(pool) if c.held[j] is None])
            back_at = math.inf
            continue
        if t >= end:
            break
        c.fire[i] = math.inf
        if c.held[i] is None:
            continue
        lost = c.lose(i, t)
        if math.isinf(back_at):
            if c.durations.size and c.rng.random() < risk.outage.prob:
                back_at = t + float(c.rng.choice(c.durations))
            else:
                c.fill(t, lost)
    return SpotTrace(
        name=f"synthetic-{risk.cloud}-{risk.family}-{risk.region}",
        source=(
            f"synthetic_trace(pool={pool}, hours={hours:g}, seed={seed}) from the "
            f"{risk.cloud}/{risk.family}/{risk.region} model"
        ),
        times_s=np.array(c.times, dtype=float),
        kinds=np.array(c.kinds, dtype=np.int8),
        nodes=tuple(c.nodes),
        end_s=end,
    )


class _Cluster:
    """``synthetic_trace``'s cluster: each slot's node and loss clock, and the events so far."""

    def __init__(self, risk: SpotRisk, pool: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.co_loss = risk.co_loss
        self.shape = risk.lifetime.shape
        self.scale_s = risk.lifetime.scale_h * 3600.0 * (1.0 + risk.co_loss * (pool - 1))
        self.durations = np.asarray(risk.outage.durations_h, dtype=float) * 3600.0
        self.times: list[float] = []
        self.kinds: list[int] = []
        self.nodes: list[str] = []
        self.held: list[str | None] = [None] * pool
        self.fire = np.full(pool, math.inf)  # each slot's next clock time (inf: drawn when filled)
        self.made = 0

    def fill(self, t: float, slots: list[int]) -> None:
        """A new node in each of ``slots`` at ``t``; a slot whose clock fired draws a new one."""
        for i in slots:
            self.made += 1
            self.held[i] = f"n{self.made}"
            self.times.append(t)
            self.kinds.append(ADD)
            self.nodes.append(f"n{self.made}")
            if math.isinf(self.fire[i]):
                self.fire[i] = t + self.scale_s * self.rng.weibull(self.shape)

    def lose(self, i: int, t: float) -> list[int]:
        """Slot ``i``'s clock fired at ``t``: its node goes, each other node with ``co_loss``."""
        pool = len(self.held)
        draws = self.rng.random(pool)
        lost = [i]
        lost += [
            j
            for j in range(pool)
            if j != i and self.held[j] is not None and draws[j] < self.co_loss
        ]
        for j in lost:
            self.times.append(t)
            self.kinds.append(REMOVE)
            self.nodes.append(str(self.held[j]))
            self.held[j] = None
        return lost
