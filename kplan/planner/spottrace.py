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
running-VM counts convert to this format (``from_bamboo_csv``, ``from_gcp_counts``).

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

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import DataFileError, InputError
from kplan.core.files import read_user_text

if TYPE_CHECKING:
    from kplan.planner.spot import SpotRisk

ADD = 1
REMOVE = -1
LOSS_WINDOW_S = 60.0  # removals this close to a loss event's first removal belong to it
MAX_TRACE_EVENTS = 2_000_000  # a trace file is at most 64 MiB too (kplan.core.files)
HEADER = ("time_s", "event", "node")
_END = re.compile(r"#\s*end_s\s*=\s*(\S+)\s*$")


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


# --- reading and writing --------------------------------------------------------------------


def _bad(path: Path, line: int, what: str, hint: str) -> DataFileError:
    where = f"{path}, line {line}" if line else str(path)
    return DataFileError(f"{where}: {what}", hint=hint)


def _read_text(path: Path, what: str) -> str:
    try:
        return read_user_text(Path(path), what)
    except DataFileError:
        raise
    except InputError as err:  # file not found: still a bad data file for this reader
        raise DataFileError(err.message, hint=err.hint) from None


_FORMAT = "the header is time_s,event,node[,zone]; events add|remove|alive (docs/spot_traces.md)"


def read_trace(path: Path) -> SpotTrace:
    """A trace CSV (the documented format): bad files raise ``DataFileError``, one line + hint."""
    path = Path(path)
    text = _read_text(path, "spot trace")
    end_s: float | None = None
    times: list[float] = []
    kinds: list[int] = []
    nodes: list[str] = []
    zones: list[str] = []
    unknown: set[str] = set()
    alive: set[str] = set()
    seen: set[str] = set()
    header: list[str] | None = None
    has_zone = False
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if raw.lstrip().startswith("#"):
            m = _END.match(raw.strip())
            if m:
                end_s = _number(m.group(1), path, line, "end_s")
            continue
        try:
            cells = [c.strip() for c in next(csv.reader([raw]))]
        except csv.Error as err:
            raise _bad(path, line, f"cannot read CSV ({err})", _FORMAT) from None
        if header is None:
            if tuple(cells[:3]) != HEADER or cells[3:] not in ([], ["zone"]):
                shown = ",".join(cells)[:60]
                raise _bad(path, line, f"header {shown!r} is not time_s,event,node[,zone]", _FORMAT)
            header = cells
            has_zone = len(cells) == 4
            continue
        if len(cells) != len(header):
            raise _bad(
                path, line, f"{len(cells)} cells, the header has {len(header)}", "fix the row"
            )
        if len(times) >= MAX_TRACE_EVENTS:
            raise _bad(path, line, f"more than {MAX_TRACE_EVENTS:,} events", "split the trace")
        t = _number(cells[0], path, line, "time_s")
        if times and t < times[-1]:
            raise _bad(
                path,
                line,
                f"time_s {cells[0][:20]} is before the row above",
                "sort the rows by time",
            )
        event, node = cells[1].lower(), cells[2]
        if not node or len(node) > 200:
            raise _bad(path, line, "node id is empty or too long", "name each node")
        if event in ("add", "alive"):
            if node in seen:
                raise _bad(
                    path, line, f"node {node[:40]!r} is added twice", "give a replacement a new id"
                )
            if event == "alive":
                if t != 0:
                    raise _bad(
                        path, line, "an 'alive' row must be at time 0", "use 'add' after time 0"
                    )
                unknown.add(node)
            seen.add(node)
            alive.add(node)
            kinds.append(ADD)
        elif event == "remove":
            if node not in alive:
                raise _bad(
                    path,
                    line,
                    f"remove of node {node[:40]!r}, which is not alive",
                    "each remove needs an earlier add of the same node",
                )
            alive.discard(node)
            kinds.append(REMOVE)
        else:
            raise _bad(
                path, line, f"unknown event {cells[1][:20]!r}", "event is add, remove or alive"
            )
        times.append(t)
        nodes.append(node)
        if has_zone:
            zones.append(cells[3])
    if header is None:
        raise _bad(path, 0, "no header", _FORMAT)
    if not times:
        raise _bad(path, 0, "no events", "a trace needs at least one add")
    last = times[-1]
    if end_s is None:
        end_s = last
    elif end_s < last:
        raise _bad(
            path,
            0,
            f"end_s={end_s:g} is before the last event ({last:g} s)",
            "fix the '# end_s=' line",
        )
    return SpotTrace(
        name=path.stem,
        source=str(path),
        times_s=np.array(times, dtype=float),
        kinds=np.array(kinds, dtype=np.int8),
        nodes=tuple(nodes),
        end_s=float(end_s),
        zones=tuple(zones) if has_zone and any(zones) else (),
        unknown_age=frozenset(unknown),
    )


def _number(text: str, path: Path, line: int, col: str) -> float:
    try:
        v = float(text) if len(text) <= 40 else math.nan
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 <= v <= 1e12):
        raise _bad(
            path, line, f"{col}={text[:40]!r} is not a time in seconds (0 to 1e12)", "fix the row"
        )
    return v


def trace_csv(trace: SpotTrace) -> str:
    """The trace in the documented CSV format."""
    out = io.StringIO()
    for part in (trace.name, trace.source):
        for ln in part.splitlines():
            out.write(f"# {ln}\n")
    out.write(f"# end_s={trace.end_s!r}\n")
    out.write(",".join(HEADER) + (",zone" if trace.zones else "") + "\n")
    w = csv.writer(out, lineterminator="\n")
    for i, (t, kind, node) in enumerate(
        zip(trace.times_s.tolist(), trace.kinds, trace.nodes, strict=True)
    ):
        event = "remove" if kind == REMOVE else "alive" if node in trace.unknown_age else "add"
        row = [repr(float(t)), event, node]
        if trace.zones:
            row.append(trace.zones[i])
        w.writerow(row)
    return out.getvalue()


def write_trace(trace: SpotTrace, path: Path) -> None:
    """Write ``trace`` to ``path`` (atomically) in the documented format."""
    from kplan.core.files import write_atomic

    write_atomic(Path(path), trace_csv(trace), flag="trace")


# --- converters for the shared traces -------------------------------------------------------


def from_bamboo_csv(path: Path) -> SpotTrace:
    """A Bamboo autoscaling-group trace (``time_ms,add|remove,nodeN``, no header).

    The group starts empty (its first adds spread over the first minutes are launches), so
    every node's age is known. The end of observation is the last event."""
    path = Path(path)
    text = _read_text(path, "Bamboo trace")
    times: list[float] = []
    kinds: list[int] = []
    nodes: list[str] = []
    alive: set[str] = set()
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        cells = [c.strip() for c in raw.split(",")]
        if len(cells) != 3 or cells[1] not in ("add", "remove"):
            raise _bad(
                path,
                line,
                f"{raw[:60]!r} is not time_ms,add|remove,node",
                "give a Bamboo trace (traces/p3-trace.csv)",
            )
        t = _number(cells[0], path, line, "time_ms") / 1000.0
        if times and t < times[-1]:
            raise _bad(path, line, "time goes backwards", "sort the rows by time")
        if cells[1] == "add":
            if cells[2] in alive:
                raise _bad(path, line, f"node {cells[2][:40]!r} added twice", "fix the row")
            alive.add(cells[2])
        elif cells[2] not in alive:
            raise _bad(
                path, line, f"remove of {cells[2][:40]!r}, which is not alive", "fix the row"
            )
        else:
            alive.discard(cells[2])
        times.append(t)
        kinds.append(ADD if cells[1] == "add" else REMOVE)
        nodes.append(cells[2])
    if not times:
        raise _bad(path, 0, "no events", "give a Bamboo trace")
    return SpotTrace(
        name=path.stem,
        source=f"{path.name} (Bamboo autoscaling-group add/remove events, 1-minute stamps)",
        times_s=np.array(times, dtype=float),
        kinds=np.array(kinds, dtype=np.int8),
        nodes=tuple(nodes),
        end_s=times[-1],
    )


def from_gcp_counts(path: Path, *, removal: str = "random", seed: int = 0) -> SpotTrace:
    """GCP running spot-VM counts (``date, time, count``) as add/remove events.

    Rows are read in file order (the shared files repeat each count one and two minutes later,
    and those repeats can run past the next change: a repeat is not a change). A rise of ``d``
    is ``d`` adds of new anonymous nodes, a fall of ``d`` is ``d`` removes; the count's first
    value is ``alive`` nodes of unknown age. Which nodes went is not recorded, so the node ids
    are synthetic and ``removal`` says whom a fall takes: ``random`` (default: an alive node
    drawn with ``seed``, whatever its age), ``youngest`` or ``oldest``. Why random: the counts
    carry no age information, and the order decides the lifetime's shape (youngest-first
    forces a falling hazard, oldest-first a rising one: on the shared GCP counts shapes of
    about 0.45-0.6 against 1.3); an age-blind draw assumes neither, keeps the rate at removals
    per node-hour, and agrees with the only traces that do name their nodes (Bamboo p3 and
    g4dn: shapes 1.09 +- 0.07 and 0.94 +- 0.09, no evidence of a hazard that depends on age).
    A node added and removed between two samples is not seen: the counts are a lower bound on
    churn."""
    if removal not in ("random", "youngest", "oldest"):
        raise ValueError(f"removal {removal!r} is not random, youngest or oldest")
    rng = np.random.default_rng(seed)
    import datetime as dt

    path = Path(path)
    text = _read_text(path, "GCP count trace")
    t0: dt.datetime | None = None
    last_t = 0.0
    prev: int | None = None
    times: list[float] = []
    kinds: list[int] = []
    nodes: list[str] = []
    stack: list[str] = []  # alive, oldest first
    made = 0
    unknown: frozenset[str] = frozenset()
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        cells = [c.strip() for c in raw.split(",")]
        try:
            if len(cells) != 3:
                raise ValueError
            when = dt.datetime.fromisoformat(f"{cells[0]} {cells[1]}")
            count = int(cells[2])
            if count < 0 or count > 1_000_000:
                raise ValueError
        except ValueError:
            raise _bad(
                path,
                line,
                f"{raw[:60]!r} is not 'date, time, count'",
                "give a GCP count trace (traces/gcloud/*.txt)",
            ) from None
        if t0 is None:
            t0 = when
        t = (when - t0).total_seconds()
        last_t = max(last_t, t)
        if prev is None:
            for _ in range(count):
                made += 1
                stack.append(f"vm{made}")
                times.append(0.0)
                kinds.append(ADD)
                nodes.append(stack[-1])
            unknown = frozenset(stack)
        elif count != prev:
            t = max(t, times[-1] if times else 0.0)  # a change never goes back in time
            for _ in range(count - prev):
                made += 1
                stack.append(f"vm{made}")
                times.append(t)
                kinds.append(ADD)
                nodes.append(stack[-1])
            for _ in range(prev - count):
                times.append(t)
                kinds.append(REMOVE)
                k = {"youngest": -1, "oldest": 0}.get(removal)
                nodes.append(stack.pop(int(rng.integers(len(stack))) if k is None else k))
        prev = count
    if t0 is None:
        raise _bad(path, 0, "no rows", "give a GCP count trace")
    return SpotTrace(
        name=path.stem,
        source=(
            f"{path.name} (GCP running spot-VM counts; node identities are synthetic, "
            f"a fall removes the {removal} node{'s' if removal != 'random' else ''} "
            f"(seed {seed}); changes between samples are not seen, so churn is a lower bound)"
        ),
        times_s=np.array(times, dtype=float),
        kinds=np.array(kinds, dtype=np.int8),
        nodes=tuple(nodes),
        end_s=max(last_t, times[-1] if times else 0.0),
        unknown_age=unknown,
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
    rng = np.random.default_rng(seed)
    end = hours * 3600.0
    shape = risk.lifetime.shape
    scale_s = risk.lifetime.scale_h * 3600.0 * (1.0 + risk.co_loss * (pool - 1))
    durations = np.asarray(risk.outage.durations_h, dtype=float) * 3600.0
    times: list[float] = []
    kinds: list[int] = []
    nodes: list[str] = []
    held: list[str | None] = [None] * pool
    fire = np.full(pool, math.inf)  # each slot's next clock time (inf: drawn when filled)
    made = 0

    def fill(t: float, slots: list[int]) -> None:
        nonlocal made
        for i in slots:
            made += 1
            held[i] = f"n{made}"
            times.append(t)
            kinds.append(ADD)
            nodes.append(f"n{made}")
            if math.isinf(fire[i]):
                fire[i] = t + scale_s * rng.weibull(shape)

    fill(0.0, list(range(pool)))
    back_at = math.inf  # end of the outage under way
    while True:
        i = int(np.argmin(fire))
        t = float(fire[i])
        if back_at <= t:
            if back_at >= end:
                break
            fill(back_at, [j for j in range(pool) if held[j] is None])
            back_at = math.inf
            continue
        if t >= end:
            break
        fire[i] = math.inf
        if held[i] is None:
            continue
        draws = rng.random(pool)
        lost = [i]
        lost += [
            j for j in range(pool) if j != i and held[j] is not None and draws[j] < risk.co_loss
        ]
        for j in lost:
            times.append(t)
            kinds.append(REMOVE)
            nodes.append(str(held[j]))
            held[j] = None
        if math.isinf(back_at):
            if durations.size and rng.random() < risk.outage.prob:
                back_at = t + float(rng.choice(durations))
            else:
                fill(t, lost)
    return SpotTrace(
        name=f"synthetic-{risk.cloud}-{risk.family}-{risk.region}",
        source=(
            f"synthetic_trace(pool={pool}, hours={hours:g}, seed={seed}) from the "
            f"{risk.cloud}/{risk.family}/{risk.region} model"
        ),
        times_s=np.array(times, dtype=float),
        kinds=np.array(kinds, dtype=np.int8),
        nodes=tuple(nodes),
        end_s=end,
    )
