"""The launcher's adaptation loop (kplan/launcher/adapt.py) on recorded metrics, without workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kplan.core.records import StepRecord, parse_lenient
from kplan.launcher.adapt import (
    Action,
    Adapter,
    batch_grid,
    candidates,
    finish_value,
    gns_view,
)
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.measure import (
    GNS_HISTORY,
    JobView,
    MetricsFeed,
    Observer,
    PolicyRequest,
    _remember,
)
from kplan.launcher.storage import LocalStorage
from kplan.planner.online import Config
from kplan.planner.profile import GnsPoint


def _spec(**options: Any) -> JobSpec:
    return JobSpec.local("train.py", job_id="kp-test-adapt", **options)


def _step(step: int, world: int, batch: int, t: float, **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "rank": 0,
        "world_size": world,
        "local_batch": batch // world,
        "global_batch": batch,
        "accum_steps": 1,
        "step_time": t,
        "compute_time": 0.8 * t,
        "sync_time": 0.2 * t,
        "progress": step * batch / 32,
        "gns": 400.0,
        "time": 1000.0 + step,
        **extra,
    }


def _append(root: Path, job: str, rank: int, records: list[dict[str, Any]]) -> None:
    path = root / job / "metrics" / f"rank-{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_feed_reads_only_new_whole_lines(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    feed = MetricsFeed(storage, "kp-test-adapt")
    assert feed.poll() == []
    _append(tmp_path, "kp-test-adapt", 0, [_step(0, 1, 32, 0.1)])
    path = tmp_path / "kp-test-adapt" / "metrics" / "rank-0.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 1, "rank"')  # a line being written
    got = feed.poll()
    assert [r.step for r in got if isinstance(r, StepRecord)] == [0]
    with open(path, "a") as f:
        f.write(': 0, "world_size": 1}\n')
    assert [r.step for r in feed.poll() if isinstance(r, StepRecord)] == [1]
    assert feed.poll() == []


def test_segments_split_on_config_and_generation() -> None:
    obs = Observer()
    obs.new_generation(0, 1)
    obs.feed(parse_lenient([_step(s, 1, 32, 0.10) for s in range(12)]))
    obs.feed(parse_lenient([_step(s, 1, 64, 0.15) for s in range(12, 30)]))
    obs.new_generation(1, 2)
    obs.feed(parse_lenient([_step(s, 2, 64, 0.09) for s in range(30, 40)]))
    keys = [s.key for s in obs.segments]
    assert keys == [(1, 1, 32, 1), (1, 1, 64, 1), (2, 2, 64, 1)]
    m = obs.segments[1].measurement()
    assert m is not None and m.step_time == pytest.approx(0.15)
    assert m.local_batch == 64 and m.sync_time == pytest.approx(0.03)
    # too few steady steps (3 warm-up steps are left out): no measurement yet
    short = Observer()
    short.feed(parse_lenient([_step(s, 1, 32, 0.1) for s in range(7)]))
    assert short.segments[0].measurement() is None


def test_policy_events_become_requests_and_view_tracks_target() -> None:
    obs = Observer()
    obs.feed(
        parse_lenient(
            [
                {"event": "epochs", "rank": 0, "target_progress": 500.0, "base_batch": 32},
                {
                    "event": "policy",
                    "rank": 0,
                    "action": "resize",
                    "nodes": 2,
                    "policy": "P",
                    "reason": "more",
                    "step": 3,
                },
                {"event": "policy", "rank": 1, "action": "stop", "policy": "P"},  # not rank 0
                {"event": "policy", "rank": 0, "action": "bogus"},
                _step(4, 1, 32, 0.1),
            ]
        )
    )
    reqs = obs.take_requests()
    assert reqs == [PolicyRequest("resize", "P", "more", 3, nodes=2)]
    assert obs.take_requests() == []
    assert obs.view.remaining_progress == pytest.approx(500.0 - 4.0)
    assert obs.view.base_batch == 32 and obs.view.gns == 400.0


def test_batch_grid_and_candidates_respect_memory_and_nodes() -> None:
    assert batch_grid(32, 48, None)[:3] == [32, 48, 64]
    assert max(batch_grid(32, None, 256)) == 256
    spec = _spec(nodes=1, workers_per_node=2, max_local_batch=64, max_nodes=3)
    cands = candidates(spec, 32, 32, 3)
    assert {c.nodes for c in cands} == {1, 2, 3}
    for c in cands:
        assert c.global_batch <= 64 * c.workers and c.global_batch >= c.workers


def test_finish_value_counts_statistical_efficiency() -> None:
    gns = (GnsPoint(0.0, 100.0),)
    cfg32 = Config(nodes=1, workers=1, global_batch=32)
    cfg320 = Config(nodes=1, workers=1, global_batch=320)
    kw: dict[str, Any] = {"remaining_progress": 1000.0, "base_batch": 32, "objective": "time"}
    t32 = finish_value(0.1, cfg32, gns=gns, **kw)
    t320 = finish_value(0.1, cfg320, gns=gns, **kw)
    assert t32 == pytest.approx(100.0)
    # 10x the batch at the same step time: 10x fewer steps, but (100+320)/(100+32) more samples
    assert t320 == pytest.approx(100.0 / 10 * (420 / 132))


def test_the_jobs_gns_history_feeds_the_forecast_at_its_fraction_of_the_job() -> None:
    view = JobView()
    assert gns_view(view).gns == ()
    view.gns, view.progress = 50.0, 10.0
    # no target yet: the latest value, held (the old behaviour)
    assert gns_view(view).gns == (GnsPoint(0.0, 50.0),) and not gns_view(view).forecast
    view.target_progress = 1000.0
    for i in range(1, 301):
        _remember(view.gns_history, float(i), 10.0 + i)  # one record per base-batch step
    view.progress, view.gns = 300.0, 310.0
    g = gns_view(view)
    assert g.forecast and g.done_fraction == pytest.approx(0.3)
    # one point per 1% of the job, the newest of each, at its fraction
    assert len(g.gns) == 31 and g.gns[-1] == GnsPoint(0.3, 310.0)
    assert all(0 <= p.progress <= 0.3 for p in g.gns)
    assert [p.progress for p in g.gns] == sorted(p.progress for p in g.gns)
    # a forecast from a growing GNS asks fewer steps of a large batch than holding it does
    cfg = Config(nodes=1, workers=1, global_batch=320)
    kw: dict[str, Any] = {"remaining_progress": 700.0, "base_batch": 32, "objective": "time"}
    held = finish_value(0.1, cfg, gns=(GnsPoint(0.0, 310.0),), **kw)
    assert finish_value(0.1, cfg, **g.kwargs(), **kw) < held
    # a long job keeps a bounded history, newest point kept; a resume repeats progress
    h: list[tuple[float, float]] = []
    for i in range(5 * GNS_HISTORY):
        _remember(h, float(i), float(i))
    assert len(h) <= GNS_HISTORY and h[-1] == (5 * GNS_HISTORY - 1, 5 * GNS_HISTORY - 1)
    _remember(h, 3.0, 7.0)  # resumed from an early checkpoint
    assert h[-1] == (3.0, 7.0) and all(x < 3.0 for x, _ in h[:-1])


def test_gns_points_are_filed_at_the_progress_their_moving_average_refers_to() -> None:
    """The runtime's GNS is an EMA about gns_window_steps old (start event): the launcher files
    each point that many steps back, at the progress a step makes (debiased start: the mean age
    of n samples, about n/2 while n << window); without the start event, at the progress now."""
    obs = Observer()
    obs.feed(parse_lenient([{"event": "start", "rank": 0, "gns_window_steps": 99.0}]))
    # batch 64 over B0 32: two base-batch steps of progress per step
    obs.feed(parse_lenient([_step(s, 1, 64, 0.1) for s in range(2000)]))
    (p_last, _) = obs.view.gns_history[-1]
    assert obs.view.progress == pytest.approx(2 * 1999)
    assert p_last == pytest.approx(2 * 1999 - 2 * 99.0, rel=1e-6)  # full window: 99 steps back
    early = Observer()
    early.feed(parse_lenient([{"event": "start", "rank": 0, "gns_window_steps": 99.0}]))
    early.feed(parse_lenient([_step(s, 1, 64, 0.1) for s in range(11)]))
    p10 = early.view.gns_history[-1][0]
    assert 2 * 10 - 2 * 5.5 < p10 < 2 * 10 - 2 * 4.5  # 11 samples: a mean age of about 5 steps
    plain = Observer()  # an older runtime (no window in its start event): filed where it is
    plain.feed(parse_lenient([_step(s, 1, 64, 0.1) for s in range(50)]))
    assert plain.view.gns_history[-1][0] == pytest.approx(2 * 49)


def test_a_noise_scale_that_leaves_the_forecast_band_triggers_a_replan(tmp_path: Path) -> None:
    from kplan.planner.gnsforecast import forecast

    events: list[tuple[str, str, dict[str, Any]]] = []
    adapter = Adapter(_spec(), LocalStorage(tmp_path), lambda k, m, d: events.append((k, m, d)), 0)
    v = adapter.obs.view
    v.target_progress = 1000.0
    points = [GnsPoint(p, 200.0 * (p / 0.05) ** 0.8) for p in (0.01, 0.02, 0.03, 0.04, 0.05)]
    adapter.gns_forecast = forecast(points)
    lo, hi = adapter.gns_forecast.band(0.10, 0.9)
    assert lo < 200.0 * 2**0.8 < hi  # the line's own continuation is inside
    v.progress, v.gns = 100.0, 200.0 * 2**0.8
    assert not adapter._gns_left_forecast()
    # ten times above the band: a surprise once it stays out over 1% of the job
    v.gns = 10 * hi
    assert not adapter._gns_left_forecast()
    v.progress = 105.0
    assert not adapter._gns_left_forecast()
    v.progress = 111.0
    assert adapter._gns_left_forecast()
    assert events[-1][0] == "gns" and "left the forecast's 90% band" in events[-1][1]
    assert adapter.gns_forecast is None  # the re-plan makes a new one
    assert not adapter._gns_left_forecast()


def test_adapter_reports_model_error_and_writes_control(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    events: list[tuple[str, str, dict[str, Any]]] = []
    spec = _spec()
    adapter = Adapter(spec, storage, lambda k, m, d: events.append((k, m, d)), 0.0)
    job = spec.job_id
    _append(tmp_path, job, 0, [_step(s, 1, 32, 0.05 + 0.001 * (s % 2)) for s in range(12)])
    assert adapter.tick(1.0, 0.0, 0.0) is None
    control = json.loads((tmp_path / job / "control.json").read_text())
    assert control["schema"] == "kplan.control/1" and control["global_batch"] is None
    _append(tmp_path, job, 0, [_step(s, 1, 128, 0.14) for s in range(12, 24)])
    adapter.tick(2.0, 0.0, 0.0)
    models = [d for k, _, d in events if k == "model"]
    assert len(models) == 2
    assert models[0]["error"] is None  # nothing to predict from yet
    assert models[1]["error"] is not None and models[1]["global_batch"] == 128


def test_exploring_with_a_deadline_no_trial_meets_hands_over_to_the_replanner(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from kplan.launcher.jobspec import NodeSpec

    events: list[tuple[str, str, dict[str, Any]]] = []
    priced = (NodeSpec(0, "local", "on-demand", "local", 1, 3.0),)
    spec = replace(_spec(explore=True, adapt=True), nodes=priced, deadline_h=1e-3)
    adapter = Adapter(spec, LocalStorage(tmp_path), lambda k, m, d: events.append((k, m, d)), 0.0)
    replans: list[float] = []

    def replan(now: float, spend_usd: float) -> Action | None:
        replans.append(now)
        return None

    adapter._replan = replan  # type: ignore[method-assign]
    epochs = {"event": "epochs", "target_progress": 10_000.0, "base_batch": 32}
    _append(tmp_path, spec.job_id, 0, [epochs, *(_step(s, 1, 32, 0.05) for s in range(12))])
    adapter.tick(1.0, 0.0, 3.0)  # the first trial (the running config) is measured at once
    assert adapter.explorer is not None
    assert adapter.explorer.limit == pytest.approx(3.6 - 1.0)  # the deadline left, in seconds
    # 2.6 s left for ~500 s of work: no trial can meet it, so the re-planner
    # (planner.replan.replan, as bench/online_sim.py) chooses, not the trial closest to it
    assert adapter.explorer.feasible(adapter.explorer.best()) is False
    assert any(k == "explore" for k, _, _ in events)
    assert replans == [1.0] and not adapter.explore
