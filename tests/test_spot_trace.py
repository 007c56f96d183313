"""Spot traces: the CSV format, its bad files, the converters of the shared traces, loss events
and the trace drawn from the model (kplan/catalogs/spot_traces.py, kplan/planner/spottrace.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kplan.catalogs.spot_traces import from_bamboo_csv, from_gcp_counts, read_trace, write_trace
from kplan.core.errors import DataFileError
from kplan.planner.spot import Outage, SpotRisk, Weibull
from kplan.planner.spottrace import (
    ADD,
    LOSS_WINDOW_S,
    REMOVE,
    SpotTrace,
    loss_events,
    node_lives,
    synthetic_trace,
)

DATA = Path(
    os.environ.get("KPLAN_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data"
)
TRACES = DATA / "spot" / "bamboo-nsdi23-traces" / "traces"
needs_data = pytest.mark.skipif(not TRACES.is_dir(), reason="shared spot traces not present")


def _trace(rows: list[tuple[float, int, str]], end_s: float, **kw: object) -> SpotTrace:
    return SpotTrace(
        name="t",
        source="test",
        times_s=np.array([r[0] for r in rows], dtype=float),
        kinds=np.array([r[1] for r in rows], dtype=np.int8),
        nodes=tuple(r[2] for r in rows),
        end_s=end_s,
        **kw,  # type: ignore[arg-type]
    )


def _risk(shape: float = 0.7, scale: float = 2.0, co: float = 0.3, p: float = 0.3) -> SpotRisk:
    return SpotRisk(
        "aws", "x", "*", Weibull(shape, scale), co, Outage(p, (0.1, 0.5, 2.0), 1.0), "t"
    )


def _same(a: SpotTrace, b: SpotTrace) -> None:
    np.testing.assert_array_equal(a.times_s, b.times_s)
    np.testing.assert_array_equal(a.kinds, b.kinds)
    assert a.nodes == b.nodes
    assert a.end_s == b.end_s
    assert a.zones == b.zones
    assert a.unknown_age == b.unknown_age


# --- the CSV format ----------------------------------------------------------------------------


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    t = _trace(
        [(0.0, ADD, "a"), (0.0, ADD, "b"), (12.5, REMOVE, "a"), (30.0, ADD, "c")],
        end_s=100.0,
        zones=("z1", "z1", "z1", "z2"),
        unknown_age=frozenset({"a"}),
    )
    write_trace(t, tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text()
    assert "# end_s=100.0" in text and "0.0,alive,a,z1" in text
    _same(read_trace(tmp_path / "t.csv"), t)


def test_round_trip_of_a_synthetic_trace(tmp_path: Path) -> None:
    t = synthetic_trace(_risk(), pool=4, hours=50, seed=3)
    write_trace(t, tmp_path / "s.csv")
    _same(read_trace(tmp_path / "s.csv"), t)


def test_end_defaults_to_the_last_event_and_comments_are_skipped(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text('# a comment, with "quotes\n\ntime_s,event,node\n0,add,a\n5,remove,a\n')
    t = read_trace(f)
    assert t.end_s == 5.0 and t.removals == 1 and t.unknown_age == frozenset()


BAD = {
    "missing": (None, "not found"),
    "header": ("t,event,node\n0,add,a\n", "header"),
    "no header": ("# only a comment\n", "no header"),
    "unsorted": ("time_s,event,node\n5,add,a\n4,add,b\n", "before the row above"),
    "event": ("time_s,event,node\n0,add,a\n1,kill,a\n", "unknown event"),
    "remove dead": ("time_s,event,node\n0,add,a\n1,remove,b\n", "not alive"),
    "remove twice": ("time_s,event,node\n0,add,a\n1,remove,a\n2,remove,a\n", "not alive"),
    "add twice": ("time_s,event,node\n0,add,a\n1,add,a\n", "added twice"),
    "alive late": ("time_s,event,node\n0,add,a\n3,alive,b\n", "time 0"),
    "time nan": ("time_s,event,node\nnan,add,a\n", "not a time"),
    "time negative": ("time_s,event,node\n-1,add,a\n", "not a time"),
    "cells": ("time_s,event,node\n0,add\n", "cells"),
    "end before": ("# end_s=1\ntime_s,event,node\n0,add,a\n5,remove,a\n", "before the last"),
    "empty": ("time_s,event,node\n", "no events"),
    "binary": (b"\xff\xfe\x00garbage", "UTF-8"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_raise_one_line_with_a_hint(tmp_path: Path, case: str) -> None:
    content, match = BAD[case]
    f = tmp_path / "bad.csv"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    with pytest.raises(DataFileError, match=match) as err:
        read_trace(f)
    assert "\n" not in err.value.message and err.value.hint


def test_huge_and_odd_files_are_refused_before_reading(tmp_path: Path) -> None:
    huge = tmp_path / "huge.csv"
    with huge.open("wb") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: no disk used
    with pytest.raises(DataFileError, match="more than"):
        read_trace(huge)
    with pytest.raises(DataFileError, match="folder"):
        read_trace(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(DataFileError, match="FIFO"):
        read_trace(fifo)


def test_converters_refuse_files_of_the_wrong_kind(tmp_path: Path) -> None:
    f = tmp_path / "x.csv"
    f.write_text("time_s,event,node\n0,add,a\n")
    with pytest.raises(DataFileError, match="time_ms,add"):
        from_bamboo_csv(f)
    with pytest.raises(DataFileError, match="date, time, count"):
        from_gcp_counts(f)
    f.write_text("0,add,n1\n60000,remove,n2\n")
    with pytest.raises(DataFileError, match="not alive"):
        from_bamboo_csv(f)


# --- converters on the shared traces (the numbers of kplan/catalogs/data/spot_rates.csv) ----------


@needs_data
@pytest.mark.parametrize(
    ("name", "removals", "node_hours", "nodes"),
    [("p3-trace.csv", 167, 273.1, 177), ("g4dn-trace.csv", 74, 135.7, 79)],
)
def test_bamboo_traces(name: str, removals: int, node_hours: float, nodes: int) -> None:
    t = from_bamboo_csv(TRACES / name)
    assert t.removals == removals
    assert round(t.node_hours(), 1) == node_hours
    lives = node_lives(t)
    assert len(lives.nodes) == nodes and int(lives.removed.sum()) == removals
    assert t.unknown_age == frozenset()  # the group starts empty: every age is known
    assert np.all(lives.life_h > 0)


@needs_data
@pytest.mark.parametrize(
    ("name", "drops", "vm_hours", "at_start"),
    [("a100x1-east1b.txt", 154, 1548, 55), ("v100x1-east1c.txt", 518, 1845, 80)],
)
def test_gcp_counts(name: str, drops: int, vm_hours: int, at_start: int) -> None:
    t = from_gcp_counts(TRACES / "gcloud" / name)
    assert t.removals == drops
    assert round(t.node_hours()) == vm_hours
    assert len(t.unknown_age) == at_start
    assert "synthetic" in t.source and "lower bound" in t.source
    # the count read back from the events is the file's last count
    last = int((TRACES / "gcloud" / name).read_text().split()[-1])
    assert t.alive_at(t.end_s) == last
    # the removal order changes who goes, not how many
    for order in ("youngest", "oldest"):
        assert from_gcp_counts(TRACES / "gcloud" / name, removal=order).removals == drops


def test_gcp_counts_read_in_file_order(tmp_path: Path) -> None:
    # the shared files repeat a count one and two minutes later, past the next change
    f = tmp_path / "c.txt"
    f.write_text(
        "2021-12-10, 13:07:45, 5\n2021-12-10, 13:08:45, 5\n2021-12-10, 13:09:45, 5\n"
        "2021-12-10, 13:08:45, 3\n2021-12-10, 13:09:45, 3\n2021-12-10, 13:20:00, 4\n"
    )
    t = from_gcp_counts(f, removal="youngest")
    assert t.removals == 2 and t.alive_at(t.end_s) == 4
    np.testing.assert_array_equal(t.times_s[t.kinds == REMOVE], [60.0, 60.0])
    assert t.nodes[t.kinds.tolist().index(REMOVE)] == "vm5"  # youngest first
    assert t.times_s[-1] == 735.0 and t.nodes[-1] == "vm6"


# --- window, lives, loss events --------------------------------------------------------------


def test_window_shifts_times_and_marks_nodes_alive_at_its_start() -> None:
    t = _trace(
        [(0, ADD, "a"), (0, ADD, "b"), (50, REMOVE, "a"), (60, ADD, "c"), (150, REMOVE, "b")],
        end_s=200.0,
    )
    w = t.window(100, 200)
    assert w.nodes == ("b", "c", "b") and w.unknown_age == frozenset({"b", "c"})
    np.testing.assert_array_equal(w.times_s, [0, 0, 50])
    assert w.end_s == 100
    first = t.window(0, 100)
    assert first.nodes == ("a", "b", "a", "c")
    assert first.node_hours() + w.node_hours() == pytest.approx(t.node_hours())
    lives = node_lives(w)  # the nodes of unknown age are not lifetimes
    assert lives.nodes == ()
    with pytest.raises(ValueError, match="empty window"):
        t.window(150, 150)


def test_lifetimes_are_censored_at_the_end() -> None:
    t = _trace([(0, ADD, "a"), (0, ADD, "b"), (3600, REMOVE, "a")], end_s=7200.0)
    lives = node_lives(t)
    assert lives.nodes == ("a", "b")
    np.testing.assert_array_equal(lives.life_h, [1.0, 2.0])
    np.testing.assert_array_equal(lives.removed, [True, False])


def test_loss_events_group_removals_and_measure_waits() -> None:
    rows = [(0.0, ADD, f"n{i}") for i in range(6)]
    rows += [
        (1000, REMOVE, "n0"),
        (1000 + LOSS_WINDOW_S, REMOVE, "n1"),  # same event: within the window of the first
        (1100, ADD, "r0"),  # capacity back after 100 s (no outage)
        (5000, REMOVE, "n2"),  # an outage: nothing until 5000 + 3600
        (6000, REMOVE, "n3"),  # during it: continues it
        (8600, ADD, "r1"),
        (9000, REMOVE, "n4"),  # no add before the end: censored
    ]
    ev = loss_events(_trace(rows, end_s=9100.0))
    np.testing.assert_array_equal(ev.start_s, [1000, 5000, 6000, 9000])
    np.testing.assert_array_equal(ev.size, [2, 1, 1, 1])
    np.testing.assert_array_equal(ev.pool, [6, 5, 4, 4])
    np.testing.assert_array_equal(ev.wait_s, [100, 3600, 2600, 100])
    np.testing.assert_array_equal(ev.continues, [False, False, True, False])
    np.testing.assert_array_equal(ev.censored, [False, False, False, True])


# --- the trace drawn from the model ----------------------------------------------------------


def test_synthetic_trace_is_seeded_and_valid() -> None:
    a = synthetic_trace(_risk(), pool=6, hours=200, seed=7)
    b = synthetic_trace(_risk(), pool=6, hours=200, seed=7)
    _same(a, b)
    assert a.alive_at(0.0) == 6 and max(a.alive_at(t) for t in a.times_s) == 6
    c = synthetic_trace(_risk(), pool=6, hours=200, seed=8)
    assert c.removals != a.removals or not np.array_equal(c.times_s, a.times_s)


@pytest.mark.parametrize(("shape", "co", "pool"), [(0.6, 0.12, 8), (0.7, 0.3, 4), (1.0, 0.2, 2)])
def test_synthetic_trace_keeps_each_node_at_the_model_rate(
    shape: float, co: float, pool: int
) -> None:
    # the stretched slot clocks keep a node's loss rate at 1 / mean life with co-losses
    risk = _risk(shape=shape, co=co, p=0.0)
    t = synthetic_trace(risk, pool=pool, hours=20_000 / pool, seed=1)
    rate = t.removals / t.node_hours()
    # ~6,000 removals: relative sd of the count ~ (1/k) / sqrt(6000) < 3%
    assert rate == pytest.approx(risk.rate_per_hour, rel=0.08)
