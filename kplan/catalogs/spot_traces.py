"""Spot trace files: kplan's trace CSV (read and written) and the shared traces' converters.

The format (``docs/spot_traces.md``) is a CSV with a header ``time_s,event,node`` (optional fourth
column ``zone``), one row per event, sorted by time; ``# end_s=<seconds>`` gives the end of
observation; other ``#`` lines are comments. The shared Bamboo traces (``time_ms,add|remove,
nodeN``) and GCP running-VM counts convert to a trace (``from_bamboo_csv``, ``from_gcp_counts``).
What a trace means, and what the model reads from it, is ``kplan.planner.spottrace`` (pure);
this module is the I/O. Bad files raise ``DataFileError``: one line and a hint.

Bounds: a file is at most 64 MiB (``kplan.core.files``); a trace file or a Bamboo trace at most
``MAX_TRACE_EVENTS`` events; a GCP counts file at most ``MAX_COUNT_EVENTS`` (refused before any
event is made when its first count, rises and falls add up to more), each count at most
``MAX_GCP_COUNT`` VMs.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kplan.core.errors import DataFileError, InputError
from kplan.core.files import read_user_text, write_atomic
from kplan.planner.spottrace import ADD, REMOVE, SpotTrace

MAX_TRACE_EVENTS = 2_000_000  # a trace file is at most 64 MiB too (kplan.core.files)
MAX_GCP_COUNT = 1_000_000  # running VMs in one row of a GCP counts file
# Events a GCP counts file may convert to (the shared files make a few thousand): each is a
# Python step with a seeded draw, so this bounds the conversion to seconds.
MAX_COUNT_EVENTS = 200_000
HEADER = ("time_s", "event", "node")
_END = re.compile(r"#\s*end_s\s*=\s*(\S+)\s*$")
_FORMAT = "the header is time_s,event,node[,zone]; events add|remove|alive (docs/spot_traces.md)"


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


# --- kplan's trace CSV ----------------------------------------------------------------------


@dataclass
class _TraceRows:
    """A trace CSV being read: the events so far and what the checks need."""

    path: Path
    end_s: float | None = None
    times: list[float] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    zones: list[str] = field(default_factory=list)
    unknown: set[str] = field(default_factory=set)
    alive: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    header: list[str] | None = None

    def line(self, line: int, raw: str) -> None:
        """One line of the file (blank lines skipped by the caller)."""
        path = self.path
        if raw.lstrip().startswith("#"):
            m = _END.match(raw.strip())
            if m:
                self.end_s = _number(m.group(1), path, line, "end_s")
            return
        try:
            cells = [c.strip() for c in next(csv.reader([raw]))]
        except csv.Error as err:
            raise _bad(path, line, f"cannot read CSV ({err})", _FORMAT) from None
        if self.header is None:
            if tuple(cells[:3]) != HEADER or cells[3:] not in ([], ["zone"]):
                shown = ",".join(cells)[:60]
                raise _bad(path, line, f"header {shown!r} is not time_s,event,node[,zone]", _FORMAT)
            self.header = cells
            return
        if len(cells) != len(self.header):
            raise _bad(
                path, line, f"{len(cells)} cells, the header has {len(self.header)}", "fix the row"
            )
        if len(self.times) >= MAX_TRACE_EVENTS:
            raise _bad(path, line, f"more than {MAX_TRACE_EVENTS:,} events", "split the trace")
        self.event(line, cells)

    def event(self, line: int, cells: list[str]) -> None:
        """One event row, checked against the rows above."""
        path = self.path
        t = _number(cells[0], path, line, "time_s")
        if self.times and t < self.times[-1]:
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
            if node in self.seen:
                raise _bad(
                    path, line, f"node {node[:40]!r} is added twice", "give a replacement a new id"
                )
            if event == "alive":
                if t != 0:
                    raise _bad(
                        path, line, "an 'alive' row must be at time 0", "use 'add' after time 0"
                    )
                self.unknown.add(node)
            self.seen.add(node)
            self.alive.add(node)
            self.kinds.append(ADD)
        elif event == "remove":
            if node not in self.alive:
                raise _bad(
                    path,
                    line,
                    f"remove of node {node[:40]!r}, which is not alive",
                    "each remove needs an earlier add of the same node",
                )
            self.alive.discard(node)
            self.kinds.append(REMOVE)
        else:
            raise _bad(
                path, line, f"unknown event {cells[1][:20]!r}", "event is add, remove or alive"
            )
        self.times.append(t)
        self.nodes.append(node)
        if len(self.header or ()) == 4:
            self.zones.append(cells[3])

    def trace(self) -> SpotTrace:
        """The trace read, once every line is in."""
        path = self.path
        if self.header is None:
            raise _bad(path, 0, "no header", _FORMAT)
        if not self.times:
            raise _bad(path, 0, "no events", "a trace needs at least one add")
        last = self.times[-1]
        end_s = last if self.end_s is None else self.end_s
        if end_s < last:
            raise _bad(
                path,
                0,
                f"end_s={end_s:g} is before the last event ({last:g} s)",
                "fix the '# end_s=' line",
            )
        return SpotTrace(
            name=path.stem,
            source=str(path),
            times_s=np.array(self.times, dtype=float),
            kinds=np.array(self.kinds, dtype=np.int8),
            nodes=tuple(self.nodes),
            end_s=float(end_s),
            zones=tuple(self.zones) if len(self.header) == 4 and any(self.zones) else (),
            unknown_age=frozenset(self.unknown),
        )


def read_trace(path: Path) -> SpotTrace:
    """A trace CSV (the documented format): bad files raise ``DataFileError``, one line + hint."""
    path = Path(path)
    rows = _TraceRows(path)
    for line, raw in enumerate(_read_text(path, "spot trace").splitlines(), start=1):
        if raw.strip():
            rows.line(line, raw)
    return rows.trace()


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
        if len(times) >= MAX_TRACE_EVENTS:
            raise _bad(path, line, f"more than {MAX_TRACE_EVENTS:,} events", "split the trace")
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
    churn. Counts whose rises and falls make more than ``MAX_COUNT_EVENTS`` events are refused
    before any is made."""
    if removal not in ("random", "youngest", "oldest"):
        raise ValueError(f"removal {removal!r} is not random, youngest or oldest")
    path = Path(path)
    rows = _count_rows(path, _read_text(path, "GCP count trace"))
    if not rows:
        raise _bad(path, 0, "no rows", "give a GCP count trace")
    counts = [count for _, count in rows]
    adds = counts[0] + sum(max(b - a, 0) for a, b in itertools.pairwise(counts))
    events = counts[0] + sum(abs(b - a) for a, b in itertools.pairwise(counts))
    if events > MAX_COUNT_EVENTS:
        raise _bad(
            path,
            0,
            f"its rises and falls make {events:,} events, more than {MAX_COUNT_EVENTS:,}",
            "split the counts file, or check its counts (running VMs of one pool)",
        )
    rng = np.random.default_rng(seed)
    pick = {"youngest": -1, "oldest": 0}.get(removal)
    pool = _Alive(adds)
    t0 = rows[0][0]
    last_t = 0.0
    times: list[float] = []
    kinds: list[int] = []
    nodes: list[str] = []
    for k, (when, count) in enumerate(rows):
        t = (when - t0).total_seconds()
        last_t = max(last_t, t)
        change = count - (counts[k - 1] if k else 0)
        if k and not change:
            continue
        if k:
            t = max(t, times[-1] if times else 0.0)  # a change never goes back in time
        for _ in range(max(change, 0)):
            times.append(t)
            kinds.append(ADD)
            nodes.append(f"vm{pool.add()}")
        for _ in range(max(-change, 0)):
            times.append(t)
            kinds.append(REMOVE)
            i = int(rng.integers(pool.size)) if pick is None else pick % pool.size
            nodes.append(f"vm{pool.remove(i)}")
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
        unknown_age=frozenset(f"vm{i}" for i in range(1, counts[0] + 1)),
    )


def _count_rows(path: Path, text: str) -> list[tuple[dt.datetime, int]]:
    """The (time, count) rows of a GCP counts file, in file order."""
    out: list[tuple[dt.datetime, int]] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        cells = [c.strip() for c in raw.split(",")]
        try:
            if len(cells) != 3:
                raise ValueError
            when = dt.datetime.fromisoformat(f"{cells[0]} {cells[1]}")
            count = int(cells[2])
            if count < 0 or count > MAX_GCP_COUNT:
                raise ValueError
        except ValueError:
            raise _bad(
                path,
                line,
                f"{raw[:60]!r} is not 'date, time, count'",
                "give a GCP count trace (traces/gcloud/*.txt)",
            ) from None
        out.append((when, count))
    return out


class _Alive:
    """The alive VMs of a counts file, numbered 1, 2, ... as they are added, oldest first; the
    ``i``-th alive one (in that order) is found and removed in O(log n) (a Fenwick tree), so a
    fall of a million is not a million list deletions."""

    def __init__(self, capacity: int) -> None:
        self._tree = [0] * (capacity + 1)
        self._top = 1 << max(capacity, 1).bit_length()
        self.made = 0
        self.size = 0

    def add(self) -> int:
        """A new VM (the youngest); its number."""
        self.made += 1
        self.size += 1
        i = self.made
        while i < len(self._tree):
            self._tree[i] += 1
            i += i & -i
        return self.made

    def remove(self, index: int) -> int:
        """Remove the ``index``-th alive VM (0: the oldest); its number."""
        pos, left = 0, index + 1
        step = self._top
        while step:
            nxt = pos + step
            if nxt < len(self._tree) and self._tree[nxt] < left:
                pos = nxt
                left -= self._tree[nxt]
            step >>= 1
        found = pos + 1
        i = found
        while i < len(self._tree):
            self._tree[i] -= 1
            i += i & -i
        self.size -= 1
        return found
