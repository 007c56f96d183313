"""Online adaptation in the launcher: what to do about what the running job measures.

Each monitor tick the launcher reads the runtime's new metrics records and turns them into
segments, measured configurations and the job's view (measure.py). A measured configuration
feeds :class:`kplan.planner.online.OnlineModel`: its error on each new configuration, predicted
before the configuration was measured, is recorded as a ``model`` event (``kplan status`` shows
it), and the model is refitted.

Three behaviours decide what to change, as actions the lifecycle carries out:

- the runtime's policies (``runtime/policy.py``) ask for a resize, a node replacement or a stop
  through ``policy`` events in the metrics stream;
- :class:`Replan`, the launcher's own policy: with the refitted model, the measured GNS and the
  work left, the best configuration (node count, global batch) against the current one, with
  hysteresis and a restart penalty (``planner.replan.replan``);
- :class:`Explore` (``kplan launch --explore``): short trials chosen by Bayesian optimisation
  (``planner.explore.Explorer``) before the job commits to a configuration.

A batch change alone goes to the runtime through the control file (no restart); a change of the
node count or instance type is a checkpointed restart with the new nodes (the lifecycle's
``_resize``), always through the budget guard.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from kplan.launcher.bootstrap import job_key
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.measure import (
    JobView,
    MetricsFeed,
    Observer,
    PolicyRequest,
    Segment,
)
from kplan.launcher.storage import Storage
from kplan.planner.explore import Explorer
from kplan.planner.fit import fit_perf_params
from kplan.planner.gnsforecast import GnsForecast
from kplan.planner.gnsforecast import forecast as forecast_gns
from kplan.planner.online import Config, OnlineModel, evaluate, steps_to_finish
from kplan.planner.profile import GnsPoint, Measurement
from kplan.planner.replan import replan

CONTROL_KEY = "control.json"
CONTROL_SCHEMA = "kplan.control/1"
BATCH_GRID = (1, 2, 4, 8, 16, 32, 64)  # global batches considered: B0 times these


# --- the control file (launcher -> runtime) -------------------------------------------------


class GnsKwargs(TypedDict):
    """The noise-scale arguments of a re-plan (``GnsView.kwargs``)."""

    gns: tuple[GnsPoint, ...]
    done_fraction: float
    forecast: bool


class ControlDoc(TypedDict):
    """The control file the workers read (``kplan.runtime.env``'s ``CONTROL_SCHEMA``)."""

    schema: str
    seq: int
    time: float
    spend_usd: float
    budget_usd: float | None
    usd_per_hour: float
    deadline_time: float | None
    global_batch: int | None
    stop: str | None


@dataclass
class Control:
    """The launcher's side of the control file; ``write`` bumps ``seq`` when a request changes."""

    budget_usd: float | None
    deadline_time: float | None
    seq: int = 0
    global_batch: int | None = None
    stop: str | None = None

    def request_batch(self, batch: int) -> None:
        self.global_batch = batch
        self.seq += 1

    def doc(self, now: float, spend_usd: float, usd_per_hour: float) -> ControlDoc:
        return {
            "schema": CONTROL_SCHEMA,
            "seq": self.seq,
            "time": now,
            "spend_usd": spend_usd,
            "budget_usd": self.budget_usd,
            "usd_per_hour": usd_per_hour,
            "deadline_time": self.deadline_time,
            "global_batch": self.global_batch,
            "stop": self.stop,
        }


def write_control(storage: Storage, job_id: str, doc: ControlDoc) -> None:
    storage.put_bytes(job_key(job_id, CONTROL_KEY), json.dumps(doc).encode())


# --- candidate configurations ---------------------------------------------------------------


def batch_grid(base: int, current: int | None, max_global: int | None, accum: int = 1) -> list[int]:
    """Global batches to consider: ``base`` times powers of two, plus the current one."""
    out = {base * m for m in BATCH_GRID}
    if current:
        out.add(current)
    if max_global is not None:
        out = {b for b in out if b <= max_global}
    return sorted(b for b in out if b >= 1 and b % accum == 0) or [base]


def candidates(
    spec: JobSpec, base_batch: int, current_batch: int | None, max_nodes: int
) -> list[Config]:
    """Node counts 1..max_nodes of the job's first node type, times the batch grid."""
    node = spec.nodes[0]
    accum = spec.batch.accum_steps or 1
    out = []
    for n in range(1, max_nodes + 1):
        workers = n * node.gpus
        cap = spec.batch.max_local_batch * workers * accum if spec.batch.max_local_batch else None
        for b in batch_grid(base_batch, current_batch, cap, accum):
            if b < workers * accum:
                continue
            out.append(
                Config(
                    nodes=n,
                    workers=workers,
                    global_batch=b,
                    accum_steps=accum,
                    instance_type=node.instance_type,
                    market=node.market,
                    usd_per_hour=n * node.usd_per_hour,
                )
            )
    return out


GNS_BAND = 0.9  # a measured noise scale outside this central band of the forecast is a surprise
GNS_OFF_SPAN = 0.01  # ... once it stays out over this fraction of the job (it is an average)
MAX_REEXPLORE = 1  # with --explore, explorations started again by such a surprise


@dataclass(frozen=True)
class GnsView:
    """The planner's GNS arguments: the job's points at their fraction of the job, how much
    is done, and whether to forecast the rest (``planner.online``)."""

    gns: tuple[GnsPoint, ...]
    done_fraction: float = 0.0
    forecast: bool = False

    def kwargs(self) -> GnsKwargs:
        return {"gns": self.gns, "done_fraction": self.done_fraction, "forecast": self.forecast}


def gns_view(view: JobView) -> GnsView:
    """With the job's target known, its measured noise scale at each point's fraction of the
    job and the forecast after the latest (the noise scale grows 10-100x over training; holding
    the latest value plans too small a batch). Without a target: the latest value, held."""
    if view.gns is None:
        return GnsView(())
    total = view.target_progress
    if total is None or total <= 0 or view.progress is None or not view.gns_history:
        return GnsView((GnsPoint(progress=0.0, noise_scale=view.gns),))
    points: dict[int, GnsPoint] = {}
    for progress, gns in view.gns_history:
        frac = min(max(progress / total, 0.0), 1.0)
        points[int(frac * 100)] = GnsPoint(progress=frac, noise_scale=gns)  # one per 1%
    done = min(max(view.progress / total, 0.0), 1.0)
    return GnsView(tuple(points[k] for k in sorted(points)), done, forecast=True)


def gns_trajectory(view: JobView) -> tuple[GnsPoint, ...]:
    """The points of :func:`gns_view` (fractions of the job, or one held point)."""
    return gns_view(view).gns


def finish_value(
    step_time: float,
    config: Config,
    *,
    remaining_progress: float,
    base_batch: int,
    gns: Sequence[GnsPoint],
    objective: str,
    done_fraction: float = 0.0,
    forecast: bool = False,
) -> float:
    """Seconds (objective ``time``) or USD (``cost``) to finish at a measured step time
    (``planner.online.steps_to_finish``; without a usable GNS, full statistical efficiency)."""
    b = config.global_batch
    steps = float(
        steps_to_finish(
            b,
            remaining_progress=remaining_progress,
            base_batch=base_batch,
            gns=gns,
            done_fraction=done_fraction,
            forecast=forecast,
        )
    )
    if not math.isfinite(steps):
        steps = remaining_progress * base_batch / b
    seconds = steps * step_time
    if objective == "cost":
        return seconds * config.usd_per_hour / 3600.0
    return seconds


@dataclass(frozen=True)
class Action:
    """What the launcher should change now (the lifecycle carries it out)."""

    kind: str  # resize (checkpointed restart), batch (control file), replace, stop
    source: str  # replan, explore, or the runtime policy's class name
    reason: str
    nodes: int | None = None
    global_batch: int | None = None
    node_rank: int | None = None


def objective_for(spec: JobSpec) -> str:
    """As ``kplan estimate``: the cheapest within a deadline, else the fastest within the budget
    (free machines: always the fastest)."""
    priced = any(n.usd_per_hour > 0 for n in spec.nodes)
    return "cost" if priced and spec.deadline_h is not None else "time"


EventFn = Callable[[str, str, Mapping[str, object]], None]


class TrialRecord(TypedDict):
    """One exploration trial, as the ``explored`` event reports it."""

    config: str
    step_time_s: float
    value: float
    seconds: float


@dataclass
class Trial:
    index: int
    config: Config
    started: float
    first_step: int | None = None


class Adapter:
    """The launcher's adaptation loop, one ``tick`` per monitor check (see the module doc)."""

    def __init__(self, spec: JobSpec, storage: Storage, event: EventFn, now: float) -> None:
        self.spec = spec
        self.storage = storage
        self.event = event
        self.feed = MetricsFeed(storage, spec.job_id)
        self.obs = Observer()
        self.obs.new_generation(0, len(spec.nodes))
        deadline = None if spec.deadline_h is None else now + spec.deadline_h * 3600
        self.control = Control(spec.budget_usd, deadline)
        self.model: OnlineModel | None = None
        self.objective = objective_for(spec)
        self.last_replan = now
        self.max_nodes = max(spec.adaptation.max_nodes or len(spec.nodes), len(spec.nodes))
        self.restart_s = spec.restart_estimate_s
        self.restart_asked: float | None = None
        self.pending: Action | None = None  # an action carried out, waiting for its first step
        self.measured: dict[tuple[int, int, int, int], Measurement] = {}
        self.explore = spec.adaptation.explore
        self.explorer: Explorer | None = None
        self.trial: Trial | None = None
        self.trial_seconds = 0.0
        self.trials: list[TrialRecord] = []
        self.explore_started = now
        self.configs: list[Config] = []
        # the GNS forecast of the last re-plan, and since when (job fraction) the measured
        # noise scale has been outside its band (re-plan, and re-explore, when it stays out)
        self.gns_forecast: GnsForecast | None = None
        self.gns_off_since: float | None = None
        self.reexplored = 0

    # --- the loop -------------------------------------------------------------------------

    def tick(self, now: float, spend_usd: float, usd_per_hour: float) -> Action | None:
        grown = self.obs.feed(self.feed.poll())
        if self.restart_asked is not None and self.obs.view.steps_in_generation > 0:
            took = now - self.restart_asked
            self.restart_s = 0.5 * self.restart_s + 0.5 * took
            self.event("restarted", f"training again {took:.0f} s after the change", {"s": took})
            self.restart_asked = None
        for seg in grown:
            self._measure(seg)
        write_control(
            self.storage, self.spec.job_id, self.control.doc(now, spend_usd, usd_per_hour)
        )
        for req in self.obs.take_requests():
            action = self._request(req)
            if action is not None:
                return action
        if self.restart_asked is not None:
            return None  # a change is under way
        if self.explore:
            return self._explore_step(now, spend_usd)
        if self.spec.adaptation.enabled and self._gns_left_forecast():
            self.last_replan = now
            if self.spec.adaptation.explore and self.reexplored < MAX_REEXPLORE:
                self.reexplored += 1
                self.explore, self.explorer, self.trial = True, None, None
                self.trial_seconds, self.explore_started = 0.0, now
                return self._explore_step(now, spend_usd)
            return self._replan(now, spend_usd)
        if (
            self.spec.adaptation.enabled
            and now - self.last_replan >= self.spec.adaptation.replan_interval_s
        ):
            self.last_replan = now
            return self._replan(now, spend_usd)
        return None

    def changed(self, action: Action, now: float, generation: int, nodes: int) -> None:
        """The lifecycle carried out ``action`` (a new generation when it restarted)."""
        if action.kind == "batch" and action.global_batch is not None:
            self.control.request_batch(action.global_batch)
        if action.kind in ("resize", "replace"):
            self.obs.new_generation(generation, nodes)
            self.restart_asked = now
            if action.global_batch is not None:
                self.control.global_batch = None  # the restart sets the batch itself

    # --- measurements and the model ---------------------------------------------------------

    def _measure(self, seg: Segment) -> None:
        m = seg.measurement()
        if m is None or (seg.reported and seg.steady < 2 * seg.reported):
            return
        seg.reported = seg.steady
        first = seg.key not in self.measured
        self.measured[seg.key] = m
        if self.model is None:
            self.model = OnlineModel(fit_perf_params([m]))
        error = self.model.observe(m)
        self.model.refit()
        if not first:
            return
        err = self.model.error
        predicted = "" if error is None else f" ({error:+.1%} from the model's prediction)"
        summary = (
            ""
            if err.mape is None
            else f"; model error {err.mape:.1%} MAPE over {err.n} new configuration(s)"
        )
        self.event(
            "model",
            f"measured {m.step_time * 1000:.1f} ms/step at {m.nodes} node(s), {m.workers} "
            f"worker(s), batch {seg.global_batch}{predicted}{summary}",
            {
                "nodes": m.nodes,
                "workers": m.workers,
                "global_batch": seg.global_batch,
                "step_time_s": m.step_time,
                "steps": seg.steady,
                "error": error,
                "mape": err.mape,
                "configs": err.n,
            },
        )

    def _current(self) -> Config | None:
        v = self.obs.view
        if v.global_batch is None or v.world_size is None:
            return None
        node = self.spec.nodes[0]
        nodes = self.obs.nodes
        return Config(
            nodes=nodes,
            workers=v.world_size,
            global_batch=v.global_batch,
            accum_steps=self.spec.batch.accum_steps or 1,
            instance_type=node.instance_type,
            market=node.market,
            usd_per_hour=nodes * node.usd_per_hour,
        )

    def _ready(self) -> tuple[Config, float, int] | None:
        v = self.obs.view
        current = self._current()
        left = v.remaining_progress
        base = v.base_batch
        if self.model is None or current is None or left is None or base is None or left <= 0:
            return None
        return current, left, base

    # --- the launcher's policy: re-plan -----------------------------------------------------

    def _replan(self, now: float, spend_usd: float) -> Action | None:
        ready = self._ready()
        if ready is None or self.model is None:
            return None
        current, left, base = ready
        cands = candidates(self.spec, base, current.global_batch, self.max_nodes)
        budget_left = self.spec.budget_usd - spend_usd if self.spec.budget_usd > 0 else None
        deadline_left = (
            None if self.control.deadline_time is None else self.control.deadline_time - now
        )
        gv = gns_view(self.obs.view)
        self.gns_forecast = forecast_gns(gv.gns) if gv.forecast and gv.gns else None
        self.gns_off_since = None
        decision = replan(
            self.model.params,
            current,
            cands,
            remaining_progress=left,
            base_batch=base,
            **gv.kwargs(),
            objective=self.objective,
            restart_s=self.restart_s,
            margin=self.spec.adaptation.replan_margin,
            budget_left_usd=budget_left,
            deadline_left_s=deadline_left,
            # the loop re-plans again after this long: a config may keep the deadline by a
            # fallback from then (planner.replan.deadline_safe), as in bench/online_sim.py
            recheck_s=self.spec.adaptation.replan_interval_s,
        )
        if not decision.switch:
            return None
        return self._move(decision.best, "replan", decision.reason, decision.gain)

    def _gns_left_forecast(self) -> bool:
        """Whether the measured noise scale has stayed outside the last re-plan's forecast band
        (GNS_BAND) over GNS_OFF_SPAN of the job: the plan rests on a wrong forecast. Says so."""
        v, fc = self.obs.view, self.gns_forecast
        total = v.target_progress
        if fc is None or v.gns is None or v.progress is None or not total:
            return False
        frac = v.progress / total
        if frac <= fc.now:
            return False
        lo, hi = fc.band(frac, GNS_BAND)
        if lo <= v.gns <= hi:
            self.gns_off_since = None
            return False
        if self.gns_off_since is None:
            self.gns_off_since = frac
        if frac - self.gns_off_since < GNS_OFF_SPAN:
            return False
        self.event(
            "gns",
            f"the noise scale {v.gns:,.0f} left the forecast's {GNS_BAND:.0%} band "
            f"({lo:,.0f} to {hi:,.0f}) at {frac:.0%} of the job: re-planning",
            {"gns": v.gns, "low": lo, "high": hi, "progress": frac},
        )
        self.gns_forecast, self.gns_off_since = None, None
        return True

    def _move(self, best: Config, source: str, reason: str, gain: float | None) -> Action:
        current = self._current()
        same_nodes = current is not None and best.nodes == current.nodes
        kind = "batch" if same_nodes else "resize"
        self.event(
            source,
            f"{kind} to {best.nodes} node(s), batch {best.global_batch}: {reason}",
            {"nodes": best.nodes, "global_batch": best.global_batch, "gain": gain, "kind": kind},
        )
        return Action(kind, source, reason, nodes=best.nodes, global_batch=best.global_batch)

    # --- requests of the runtime's policies -------------------------------------------------

    def _request(self, req: PolicyRequest) -> Action | None:
        who = f"policy {req.policy}"
        if req.action == "stop":
            return Action("stop", req.policy, req.reason or "stopped by a policy")
        if req.action == "replace" and req.node_rank is not None:
            if req.node_rank >= len(self.spec.nodes):
                self.event("policy", f"{who}: no node {req.node_rank} to replace", {})
                return None
            return Action("replace", req.policy, req.reason, node_rank=req.node_rank)
        if req.action == "resize":
            nodes = req.nodes or self.obs.nodes
            if req.instance_type and req.instance_type != self.spec.nodes[0].instance_type:
                self.event(
                    "policy",
                    f"{who}: instance type {req.instance_type} is not offered to this job; "
                    "resizing the node count only",
                    {},
                )
            if not 1 <= nodes <= self.max_nodes:
                self.event(
                    "policy",
                    f"{who}: {nodes} node(s) is outside 1..{self.max_nodes} (--max-nodes)",
                    {},
                )
                return None
            if nodes == self.obs.nodes:
                return None
            return Action("resize", req.policy, req.reason, nodes=nodes)
        return None

    # --- exploration ------------------------------------------------------------------------

    def _explore_step(self, now: float, spend_usd: float = 0.0) -> Action | None:
        ready = self._ready()
        if ready is None or self.model is None:
            return None
        current, left, base = ready
        gns = gns_view(self.obs.view)
        if self.explorer is None:
            self.configs = candidates(self.spec, base, current.global_batch, self.max_nodes)
            prior = evaluate(
                self.model.params,
                self.configs,
                remaining_progress=left,
                base_batch=base,
                **gns.kwargs(),
            )
            values = prior.seconds if self.objective == "time" else prior.cost_usd
            deadline = self.control.deadline_time
            limited = self.objective == "cost" and deadline is not None
            self.explorer = Explorer(
                self.configs,
                values,
                # the cheapest within the deadline: trials that cannot meet it do not count
                constrained=prior.seconds if limited else None,
                limit=None if deadline is None or not limited else max(deadline - now, 1e-9),
            )
            self.explore_started = now
            self.trial = Trial(self._index(current), current, now, self.obs.view.step)
        trial = self.trial
        if trial is not None:
            m = self.measured.get(
                (
                    trial.config.nodes,
                    trial.config.workers,
                    trial.config.global_batch,
                    trial.config.accum_steps,
                )
            )
            if m is None:
                return None  # the trial has not measured enough steps yet
            value = finish_value(
                m.step_time,
                trial.config,
                remaining_progress=left,
                base_batch=base,
                objective=self.objective,
                **gns.kwargs(),
            )
            spent = now - trial.started
            self.trial_seconds += spent
            self.explorer.observe(trial.index, value)
            self.trials.append(
                {
                    "config": trial.config.label,
                    "step_time_s": m.step_time,
                    "value": value,
                    "seconds": spent,
                }
            )
            self.trial = None
        budget_s = self.spec.adaptation.explore_overhead * self._best_value_seconds(left, base, gns)
        nxt = self.explorer.suggest() if self.trial_seconds < budget_s else None
        if nxt is not None and len(self.trials) < self.spec.adaptation.explore_trials:
            cfg = self.configs[nxt]
            self.trial = Trial(nxt, cfg, now)
            if cfg.nodes == current.nodes and cfg.global_batch == current.global_batch:
                return None
            return self._move(cfg, "explore", f"trial {len(self.trials) + 1}", None)
        return self._explore_done(now, current, spend_usd)

    def _index(self, config: Config) -> int:
        for i, c in enumerate(self.configs):
            if (c.nodes, c.global_batch) == (config.nodes, config.global_batch):
                return i
        self.configs.append(config)
        if self.explorer is not None:
            self.explorer.add(config)
        return len(self.configs) - 1

    def _best_value_seconds(self, left: float, base: int, gns: GnsView) -> float:
        if self.model is None or not self.configs:
            return 0.0
        pred = evaluate(
            self.model.params,
            self.configs,
            remaining_progress=left,
            base_batch=base,
            **gns.kwargs(),
        )
        return float(min(pred.seconds))

    def _explore_done(self, now: float, current: Config, spend_usd: float) -> Action | None:
        self.explore = False
        assert self.explorer is not None
        index = self.explorer.best()
        best = self.configs[index]
        wall = now - self.explore_started
        self.event(
            "explore",
            f"explored {len(self.trials)} of {len(self.configs)} configurations in {wall:.0f} s; "
            f"best measured: {best.label}",
            {
                "trials": self.trials,
                "configs": len(self.configs),
                "seconds": wall,
                "best": best.label,
            },
        )
        self.last_replan = now
        if self.explorer.feasible(index) is False:
            # No trial met the deadline: the re-planner chooses now (planner.replan.replan, as
            # bench/online_sim.py), not the trial closest to it.
            return self._replan(now, spend_usd)
        if (best.nodes, best.global_batch) == (current.nodes, current.global_batch):
            return None
        return self._move(best, "explore", "the best configuration measured", None)
