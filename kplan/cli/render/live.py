"""What ``kplan launch`` prints while the job runs, and ``kplan status --watch``'s live view.

Four views of the same stream (launcher events as they happen, progress snapshots from
:class:`kplan.launcher.progress.ProgressTracker`):

- :class:`LiveView` (stdout is a terminal): a panel redrawn in place (rich ``Live``): nodes and
  their state, step, epoch, loss, samples/s, ETA, spend against the budget and the prediction,
  the last event; launcher events scroll above it.
- :class:`PlainView` (stdout is a file or a pipe): one line per launcher event and a progress
  line every ``interval`` seconds (30) while the training moves.
- :class:`QuietView` (``--quiet``): nothing; errors and the final summary are printed by the
  command.
- :class:`JsonView` (``--json``): one JSON object per line, ``{"event": ...}``: ``started``,
  ``node`` (a node's state changed), ``progress``, ``preempted``, ``launcher`` (any other
  launcher event) and ``finished`` (the outcome, printed by the command).

:class:`Watcher` drives a view from a thread of its own (its own read-only database connection)
while ``run_job`` runs in the main thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from kplan.cli.render.text import safe
from kplan.core.text import clean

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from kplan.launcher.lifecycle import JobOutcome
    from kplan.launcher.progress import Progress
    from kplan.launcher.state import EventRecord
    from kplan.launcher.storage import Storage

MAX_NODE_ROWS = 8  # nodes listed in the live panel; the rest are counted


# --- formatting -------------------------------------------------------------------------------


def money(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}" if abs(x) >= 0.1 or x == 0 else f"${x:,.4f}"  # cents; below 10c, 4


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(max(seconds, 0.0))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _epoch(p: Progress) -> str:
    if p.epoch is None:
        return "-"
    return f"{p.epoch + 1}/{p.epochs}" if p.epochs else str(p.epoch + 1)


def spend_text(p: Progress) -> str:
    """``$0.42 of $5.00 budget (predicted $1.10)``."""
    text = f"{money(p.spend_usd)} of {money(p.budget_usd)} budget"
    if p.predicted_cost_usd is not None:
        text += f" (predicted {money(p.predicted_cost_usd)})"
    return text


def training_text(p: Progress, with_share: bool = True) -> str:
    """``step 412  epoch 2/3  loss 0.123  5,120 samples/s  ETA 0:00:40  62%``."""
    if p.step is None:
        return "training: no step yet"
    parts = [
        f"step {p.step}",
        f"epoch {_epoch(p)}",
        f"loss {_loss(p.loss)}",
        f"{_rate(p.samples_per_s)} samples/s",
        f"ETA {duration(p.eta_s)}",
    ]
    if with_share and p.fraction is not None:
        parts.append(f"{p.fraction:.0%} done")
    return "  ".join(parts)


def nodes_text(p: Progress) -> str:
    """``nodes 2: 2 running`` (the count of each state)."""
    counts: dict[str, int] = {}
    for n in p.nodes:
        counts[n.state] = counts.get(n.state, 0) + 1
    states = ", ".join(f"{c} {s}" for s, c in counts.items()) or "none yet"
    return f"nodes {len(p.nodes)}: {states}"


def progress_line(p: Progress) -> str:
    """One plain line of progress (files, pipes, logs)."""
    return clean(
        f"{clock(p.time)} progress     {p.status}; {training_text(p)}; "
        f"spent {spend_text(p)}; {nodes_text(p)}"
    )


def event_line(event: EventRecord) -> str:
    return clean(f"{clock(event.time)} {event.kind:<12} {event.message}")


def progress_panel(p: Progress, title: str = "kplan launch") -> RenderableType:
    """The live panel of one snapshot."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    status = safe(p.status) + (f" ({safe(p.reason)})" if p.reason else "")
    head = Text.from_markup(
        f"[bold]{safe(p.job_id)}[/bold]  {status}  elapsed {duration(p.elapsed_s)}"
        + (
            ""
            if p.predicted_hours is None
            else f" (predicted {duration(p.predicted_hours * 3600)})"
        )
        + (f"  [red]{p.preemptions} preemption(s)[/red]" if p.preemptions else "")
    )
    train = Text(clean(training_text(p, with_share=False)))
    bar = _bar(p.fraction, 30)
    share = Text(f"{bar} {p.fraction:.0%} done" if bar and p.fraction is not None else "")
    over = p.budget_usd > 0 and p.spend_usd > p.budget_usd * 0.9
    spend = Text(clean("spend " + spend_text(p)), style="yellow" if over else "")
    nodes = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1))
    for col in ("node", "instance", "state", "type", "market", "$/h"):
        nodes.add_column(col, no_wrap=True, overflow="ellipsis")
    for n in p.nodes[:MAX_NODE_ROWS]:
        colour = {"running": "green", "preempted": "red", "pending": "yellow"}.get(n.state, "")
        state = f"[{colour}]{safe(n.state)}[/{colour}]" if colour else safe(n.state)
        nodes.add_row(
            str(n.rank), safe(n.instance), state, safe(n.type), safe(n.market),
            f"{n.usd_per_hour:.4f}",
        )  # fmt: skip
    more = len(p.nodes) - MAX_NODE_ROWS
    parts: list[RenderableType] = [head, train, *([share] if share else []), spend]
    parts.append(nodes if p.nodes else Text("nodes: none yet"))
    if more > 0:
        parts.append(Text(f"... and {more} more node(s)"))
    if p.last_event is not None:
        e = p.last_event
        last = Text(clean(f"last event {clock(e.time)} {e.kind}: {e.message}"))
        last.no_wrap, last.overflow = True, "ellipsis"
        parts.append(last)
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


def _bar(fraction: float | None, width: int) -> str:
    if fraction is None:
        return ""
    done = round(fraction * width)
    return "[" + "#" * done + "-" * (width - done) + "]"


# --- views ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The job and its cluster as a run starts (``--json``'s ``started`` event: these fields)."""

    job_id: str
    cloud: str
    region: str
    script: str
    args: list[str]
    nodes: int
    workers: int
    usd_per_hour: float
    budget_usd: float
    deadline_h: float | None


class View(Protocol):
    def start(self, info: Started) -> None: ...

    def on_event(self, event: EventRecord) -> None: ...

    def on_progress(self, p: Progress) -> None: ...

    def close(self) -> None: ...


class QuietView:
    """``--quiet``: nothing while the job runs."""

    def start(self, info: Started) -> None:
        pass

    def on_event(self, event: EventRecord) -> None:
        pass

    def on_progress(self, p: Progress) -> None:
        pass

    def close(self) -> None:
        pass


class PlainView:
    """Lines for a file or a pipe: each launcher event, and a progress line every ``interval``
    seconds while the step moves (and whenever the job's status changes)."""

    def __init__(self, out: IO[str] | None = None, interval: float = 30.0) -> None:
        self.out = out
        self.interval = interval
        self.lock = threading.Lock()
        self.last_at: float | None = None
        self.last_key: tuple[str, int | None] | None = None

    def _write(self, line: str) -> None:
        out = self.out or sys.stdout
        with self.lock:
            out.write(line + "\n")
            out.flush()

    def start(self, info: Started) -> None:
        pass

    def on_event(self, event: EventRecord) -> None:
        self._write(event_line(event))

    def on_progress(self, p: Progress) -> None:
        key = (p.status, p.step)
        status_changed = self.last_key is not None and self.last_key[0] != p.status
        due = self.last_at is None or p.time - self.last_at >= self.interval
        if p.step is None or key == self.last_key or not (due or status_changed):
            return
        self.last_at, self.last_key = p.time, key
        self._write(progress_line(p))

    def close(self) -> None:
        pass


class JsonView:
    """One JSON object per line (``--json``)."""

    def __init__(self, out: IO[str] | None = None, interval: float = 5.0) -> None:
        self.out = out
        self.interval = interval
        self.lock = threading.Lock()
        self.nodes: dict[int, tuple[str, str]] = {}  # rank -> (instance, state)
        self.last_at: float | None = None
        self.last_step: int | None = None

    def emit(self, doc: dict[str, Any]) -> None:
        out = self.out or sys.stdout
        with self.lock:
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")
            out.flush()

    def start(self, info: Started) -> None:
        self.emit({"event": "started", "time": time.time(), **asdict(info)})

    def on_event(self, event: EventRecord) -> None:
        base = {"time": event.time, "kind": event.kind, "message": event.message}
        if event.kind == "preempted":
            self.emit({"event": "preempted", **base, **(event.data or {})})
        else:
            self.emit({"event": "launcher", **base})

    def on_progress(self, p: Progress) -> None:
        for n in p.nodes:
            if self.nodes.get(n.rank) != (n.instance, n.state):
                self.nodes[n.rank] = (n.instance, n.state)
                self.emit(
                    {
                        "event": "node",
                        "time": p.time,
                        "node_rank": n.rank,
                        "instance": n.instance,
                        "state": n.state,
                        "type": n.type,
                        "market": n.market,
                        "usd_per_hour": n.usd_per_hour,
                    }
                )
        due = self.last_at is None or p.time - self.last_at >= self.interval
        if p.step is not None and p.step != self.last_step and due:
            self.last_at, self.last_step = p.time, p.step
            doc = p.to_dict()
            for key in ("nodes", "last_event", "time"):
                doc.pop(key)
            self.emit({"event": "progress", "time": p.time, **doc})

    def finished(self, outcome: JobOutcome) -> None:
        self.emit({"event": "finished", "time": time.time(), **asdict(outcome)})

    def close(self) -> None:
        pass


class LiveView:
    """A panel redrawn in place (a terminal); launcher events print above it."""

    def __init__(self, console: Console | None = None, title: str = "kplan launch") -> None:
        from rich.console import Console

        self.console = console or Console()
        self.title = title
        self.live: Live | None = None

    def start(self, info: Started) -> None:
        from rich.live import Live
        from rich.text import Text

        self.live = Live(
            Text(f"starting {info.job_id} ..."),
            console=self.console,
            refresh_per_second=2,
            transient=False,
        )
        self.live.start()

    def on_event(self, event: EventRecord) -> None:
        self.console.print(event_line(event), highlight=False, markup=False, soft_wrap=True)

    def on_progress(self, p: Progress) -> None:
        if self.live is not None:
            self.live.update(progress_panel(p, self.title))

    def close(self) -> None:
        if self.live is not None:
            live, self.live = self.live, None
            with contextlib.suppress(OSError, ValueError):  # a terminal that closed
                live.stop()


def quietly(sink: Callable[[EventRecord], None]) -> Callable[[EventRecord], None]:
    """``sink`` that drops what it cannot write (a closed terminal or pipe): the launcher must
    go on to its teardown whatever happens to its output."""

    def call(event: EventRecord) -> None:
        with contextlib.suppress(OSError, ValueError):
            sink(event)

    return call


def choose_view(as_json: bool, quiet: bool, tty: bool | None = None) -> View:
    """``--json`` lines, ``--quiet`` nothing, a live panel on a terminal, else plain lines."""
    if as_json:
        return JsonView()
    if quiet:
        return QuietView()
    if tty is None:  # a dumb terminal cannot move its cursor: lines there too
        tty = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    if tty:
        return LiveView()
    return PlainView()


def watch_live(
    frame: Callable[[], tuple[RenderableType, bool]],
    interval: float,
    console: Console | None = None,
) -> None:
    """Redraw ``frame()`` in place every ``interval`` seconds until it says the job ended (its
    second value), then leave the last frame on screen; Ctrl-C ends it quietly."""
    from rich.console import Console
    from rich.live import Live

    view, done = frame()
    with Live(view, console=console or Console(), auto_refresh=False) as live:
        try:
            while not done:
                time.sleep(interval)
                view, done = frame()
                live.update(view, refresh=True)
        except KeyboardInterrupt:
            pass


# --- the driver -------------------------------------------------------------------------------


class Watcher:
    """Feeds ``view`` a snapshot of ``job_id`` every ``refresh_s`` from a thread of its own.

    The thread opens the state database at ``db_path`` read-only (a connection is not shared
    between threads); the metrics in ``storage`` are read every ``metrics_every_s`` (a cloud
    bucket costs a request per file). Use as a context manager around ``run_job``."""

    def __init__(
        self,
        job_id: str,
        db_path: Path,
        storage: Storage | None,
        view: View,
        refresh_s: float = 1.0,
        metrics_every_s: float = 1.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.job_id = job_id
        self.db_path = db_path
        self.storage = storage
        self.view = view
        self.refresh_s = refresh_s
        self.metrics_every_s = metrics_every_s
        self.now = now
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="kplan-progress", daemon=True)
        self.error: str | None = None
        self.muted = False

    def __enter__(self) -> Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10.0)
        self.muted = True  # a thread still stuck in a slow read prints nothing after this

    def _loop(self) -> None:
        from kplan.core.errors import KplanError
        from kplan.launcher.progress import ProgressTracker
        from kplan.launcher.state import StateDB

        tracker = ProgressTracker(self.job_id, self.storage)
        db: StateDB | None = None
        metrics_at = float("-inf")
        try:
            while True:
                final = self.stop.is_set()  # one last snapshot after the job ended
                try:
                    if db is None:
                        db = StateDB.open(self.db_path, readonly=True)
                    now = self.now()
                    read = final or now - metrics_at >= self.metrics_every_s
                    if read:
                        metrics_at = now
                    snap = tracker.snapshot(db, now, metrics=read)
                    if snap is not None and not self.muted:
                        with contextlib.suppress(OSError, ValueError):  # output closed
                            self.view.on_progress(snap)
                except KplanError as err:  # a database being created or migrated: next time
                    self.error = err.message
                except sqlite3.Error as err:  # a read that met a lock: next time
                    self.error = str(err)
                if final:
                    return
                self.stop.wait(self.refresh_s)
        finally:
            if db is not None:
                db.close()
