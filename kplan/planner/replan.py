"""Re-planning a running job: is another configuration worth a restart? (pure)

``replan`` weighs every candidate configuration against the current one with
``kplan.planner.online.evaluate`` (time and cost to finish), the switch's penalty (downtime,
added nodes' boot), the budget and the deadline (at the p90, or with a fallback from the next
re-plan), and switches only when the best is better by more than a margin (hysteresis against
model noise). No I/O, no clock: everything comes in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kplan.core.errors import InputError
from kplan.planner.online import Array, Config, Evaluation, evaluate, objective_kind
from kplan.planner.perfmodel import PerfParams
from kplan.planner.profile import GnsPoint


@dataclass(frozen=True)
class Decision:
    switch: bool
    best: Config  # the best candidate found (the current config when there is none)
    current_value: float  # USD or seconds to finish, as the objective says
    best_value: float  # including the restart penalty
    gain: float  # (current_value - best_value) / current_value
    reason: str  # one line for a human


def switch_penalty(
    current: Config, configs: Sequence[Config], *, restart_s: float, boot_s: float = 0.0
) -> tuple[Array, Array]:
    """(downtime seconds, boot USD) of switching from ``current`` to each config (added nodes
    boot while the job still runs on the old cluster: billed, not downtime)."""
    down = np.array([0.0 if current.same_cluster(c) else restart_s for c in configs])
    boot = np.array(
        [
            0.0
            if current.same_cluster(c)
            else boot_s / 3600.0 * c.usd_per_hour / c.nodes * max(c.nodes - _kept(current, c), 0)
            for c in configs
        ]
    )
    return down, boot


def _kept(current: Config, c: Config) -> int:
    """Nodes of ``current`` that ``c`` can keep (same instance type and market)."""
    if (current.instance_type, current.market) != (c.instance_type, c.market):
        return 0
    return min(current.nodes, c.nodes)


def _deadline_chance(ev: Evaluation, restart_s: Array, deadline_left_s: float) -> Array:
    """P(finishing within ``deadline_left_s``) of each config: log-normal training time with
    the step time's and the GNS forecast's sigmas, plus the fixed restart downtime."""
    train = ev.seconds - restart_s
    sigma = (
        ev.log_sigma if ev.steps_log_sigma is None else np.hypot(ev.log_sigma, ev.steps_log_sigma)
    )
    room = deadline_left_s - restart_s
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(np.maximum(room, 1e-9) / train) / np.maximum(sigma, 1e-6)
    z = np.where((room > 0) & np.isfinite(train) & (train > 0), z, -np.inf)
    out: Array = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    return np.where(np.isfinite(z), out, np.where(z > 0, 1.0, 0.0))


def deadline_safe(
    configs: Sequence[Config],
    ev: Evaluation,
    down: Array,
    deadline_left_s: float,
    *,
    hold_share: Array | None,
    restart_s: float,
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """(alone, with a fallback): which configs keep the deadline at their p90.

    ``alone``: the config finishes the remaining work by the deadline at its p90 (the step
    time's and the GNS forecast's spread), its switch downtime ``down`` included.

    ``with a fallback``: the config is only run until the next re-plan, which re-reads the
    noise scale with a narrower forecast. It is safe to run when its expected time meets the
    deadline and, should the forecast then turn out wrong, some config (the *fallback*) can
    still finish the rest at its p90 from there: the config's switch downtime, its share
    ``hold_share`` of the remaining work at its p90 (a hold that is the whole rest of the job
    has no re-plan after it: then only ``alone`` counts), the fallback's switch
    (``restart_s`` of downtime: added nodes boot while the job runs, as ``switch_penalty``)
    and the rest at the fallback's p90 all within the time left. The p90 is today's (the
    forecast only narrows as points come in), so the guard is conservative. Without
    ``hold_share`` (no re-plan to rely on) only ``alone`` counts.
    """
    alone: NDArray[np.bool_] = ev.seconds_p90 <= deadline_left_s
    if hold_share is None or len(configs) < 2:
        return alone, alone.copy()
    share = np.clip(np.asarray(hold_share, dtype=float), 0.0, 1.0)
    train90 = ev.seconds_p90 - down
    _, same = _same(configs)
    penalty = np.where(same, 0.0, restart_s)  # [from, to]: added nodes boot meanwhile
    rest = penalty + (1.0 - share)[:, None] * np.where(np.isfinite(train90), train90, np.inf)
    fallback = down + share * train90 + np.min(rest, axis=1)  # the hold at its p90 too
    ok: NDArray[np.bool_] = (ev.seconds <= deadline_left_s) & (fallback <= deadline_left_s)
    return alone, alone | ok


def _same(configs: Sequence[Config]) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """[from, to] matrices: same instance type and market; same cluster (no restart)."""
    kinds: dict[tuple[str, str], int] = {}
    code = np.array([kinds.setdefault((c.instance_type, c.market), len(kinds)) for c in configs])
    nodes = np.array([c.nodes for c in configs])
    workers = np.array([c.workers for c in configs])
    same_kind: NDArray[np.bool_] = code[:, None] == code[None, :]
    same: NDArray[np.bool_] = (
        same_kind & (nodes[:, None] == nodes[None, :]) & (workers[:, None] == workers[None, :])
    )
    return same_kind, same


def _fallback_chance(
    configs: Sequence[Config],
    ev: Evaluation,
    down: Array,
    deadline_left_s: float,
    share: Array,
    *,
    restart_s: float,
) -> Array:
    """P(meeting the deadline) of running each config for its ``share`` of the remaining work,
    then the best config for the rest (itself included): log-normal training times with the
    step time's and the GNS forecast's sigmas, the switch downtimes fixed."""
    sigma = (
        ev.log_sigma if ev.steps_log_sigma is None else np.hypot(ev.log_sigma, ev.steps_log_sigma)
    )
    sigma = np.maximum(sigma, 1e-6)
    train = ev.seconds - down
    _, same = _same(configs)
    room = deadline_left_s - down - share * train  # after the hold on each config
    left = room[:, None] - np.where(same, 0.0, restart_s)
    need = (1.0 - share)[:, None] * train[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(np.maximum(left, 1e-9) / need) / sigma[None, :]
    z = np.where((left > 0) & np.isfinite(need) & (need > 0), z, -np.inf)
    z = np.where(np.isfinite(need) & (need <= 0) & (left >= 0), np.inf, z)  # nothing left
    best = np.max(z, axis=1)
    out: Array = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in best])
    return out


def _contingent_value(
    configs: Sequence[Config],
    ev: Evaluation,
    down: Array,
    boot_usd: Array,
    deadline_left_s: float,
    share: Array,
    *,
    objective: str,
    restart_s: float,
    boot_s: float,
) -> Array:
    """The expected value of running each config with its fallback: with the chance ``P`` that
    it meets the deadline alone (``_deadline_chance``), its own value; otherwise its share of
    the work until the next re-plan, then a switch to the fallback and the rest there. The
    fallback is the cheapest config (by ``objective``) that then still finishes the rest by
    the deadline at its p90, or the soonest one when none does: a config a little too slow
    falls back on one a little faster, not on the fastest. A config that is safe only by its
    fallback then pays for the fallback as often as it is likely to need it."""
    n = len(configs)
    chance = _deadline_chance(ev, down, deadline_left_s)
    price = np.array([c.usd_per_hour for c in configs]) / 3600.0
    train = ev.seconds - down
    train90 = np.where(np.isfinite(ev.seconds_p90 - down), ev.seconds_p90 - down, np.inf)
    same_kind, same = _same(configs)
    nodes = np.array([c.nodes for c in configs], dtype=float)
    pause = np.where(same, 0.0, restart_s)  # [from, to]
    finish90 = pause + (1.0 - share)[:, None] * train90[None, :]
    room = deadline_left_s - down - share * train  # after the hold on each config
    if objective == "cost":
        kept = np.where(same_kind, np.minimum(nodes[:, None], nodes[None, :]), 0.0)
        added = np.maximum(nodes[None, :] - kept, 0.0)
        after = (
            pause * price[None, :]
            + boot_s * (price / nodes)[None, :] * added
            + (1.0 - share)[:, None] * (train * price)[None, :]
        )
        hold = down * price + boot_usd + share * train * price
    else:
        after = pause + (1.0 - share)[:, None] * train[None, :]
        hold = down + share * train
    ok = finish90 <= room[:, None]
    f = np.where(
        ok.any(axis=1),
        np.argmin(np.where(ok, after, np.inf), axis=1),
        np.argmin(finish90, axis=1),
    )
    own = ev.value(objective)
    out: Array = chance * own + (1.0 - chance) * (hold + after[np.arange(n), f])
    return np.where(np.isfinite(out), out, own)


def _how(alone: bool) -> str:
    return "" if alone else " (the deadline kept by a fallback from the next re-plan)"


def _hold_share(
    train: Array, done_fraction: float, recheck_s: float | None, recheck_fraction: float | None
) -> Array | None:
    """The share of the remaining work each config does before the next re-plan (None: no
    re-plan to rely on)."""
    if recheck_s is None and recheck_fraction is None:
        return None
    share = np.ones_like(train)
    if recheck_s is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.minimum(share, np.where(train > 0, recheck_s / train, 1.0))
    if recheck_fraction is not None:
        left = max(1.0 - min(max(done_fraction, 0.0), 1.0), 1e-9)
        share = np.minimum(share, recheck_fraction / left)
    out: Array = np.clip(np.nan_to_num(share, nan=1.0), 0.0, 1.0)
    return out


@dataclass(frozen=True)
class _Scored:
    """Every config (the current one first) evaluated against the budget and the deadline."""

    configs: list[Config]
    ev: Evaluation
    down: Array  # switch downtime
    value: Array  # USD or seconds to finish (with the fallback where only it keeps the deadline)
    fits: NDArray[np.bool_]  # within the budget and the deadline rules
    in_budget: NDArray[np.bool_]
    alone: NDArray[np.bool_]  # keeps the deadline at its p90 without a fallback
    share: Array | None  # each config's share of the rest before the next re-plan
    contingent: Array | None  # each config's value with its fallback (deadline rules)


def replan(
    params: PerfParams,
    current: Config,
    candidates: Sequence[Config],
    *,
    remaining_progress: float,
    base_batch: float,
    gns: Sequence[GnsPoint],
    objective: str,
    restart_s: float,
    margin: float = 0.1,
    budget_left_usd: float | None = None,
    deadline_left_s: float | None = None,
    boot_s: float = 0.0,
    done_fraction: float = 0.0,
    forecast: bool = False,
    recheck_s: float | None = None,
    recheck_fraction: float | None = None,
) -> Decision:
    """Switch to another configuration only when it is better by more than ``margin``.

    The candidates pay ``restart_s`` of downtime at their price (and ``boot_s`` for each node
    added) unless they differ from ``current`` only in the
    batch. A candidate must fit the budget at its p90 and keep the deadline: at its p90, or,
    when the caller re-plans again after ``recheck_s`` seconds or ``recheck_fraction`` of the
    whole job (whichever comes first), at its expected time with a fallback that still meets
    the deadline at its p90 from the next re-plan (``deadline_safe``): an early, wide forecast
    then does not lock the job into the fastest, dearest cluster, and as the forecast
    narrows the cheapest safe config is re-chosen. A current configuration that breaks the
    budget or the deadline is left for the best one that fits, whatever the margin; when none
    fits, the one with the best chance of meeting the deadline.
    """
    objective_kind(objective)
    if not 0.0 <= margin < 1.0:
        raise InputError(f"margin={margin} must be in [0, 1)", hint="e.g. 0.1")
    others = [c for c in candidates if c != current]
    configs = [current, *others]
    down, boot = switch_penalty(current, configs, restart_s=restart_s, boot_s=boot_s)
    ev = evaluate(
        params,
        configs,
        remaining_progress=remaining_progress,
        base_batch=base_batch,
        gns=gns,
        restart_s=down,
        extra_usd=boot,
        done_fraction=done_fraction,
        forecast=forecast,
    )
    s = _score(
        configs,
        ev,
        down,
        boot,
        objective=objective,
        restart_s=restart_s,
        boot_s=boot_s,
        budget_left_usd=budget_left_usd,
        deadline_left_s=deadline_left_s,
        share=None
        if deadline_left_s is None
        else _hold_share(ev.seconds - down, done_fraction, recheck_s, recheck_fraction),
    )
    if deadline_left_s is not None and len(configs) > 1 and not s.fits.any():
        late = _late(s, deadline_left_s, margin=margin, restart_s=restart_s)
        if late is not None:
            return late
    return _best_fit(s, objective=objective, margin=margin)


def _score(
    configs: list[Config],
    ev: Evaluation,
    down: Array,
    boot: Array,
    *,
    objective: str,
    restart_s: float,
    boot_s: float,
    budget_left_usd: float | None,
    deadline_left_s: float | None,
    share: Array | None,
) -> _Scored:
    """Which configs fit the budget (at the p90) and the deadline (alone or with a fallback),
    and each one's value (the value with its fallback where only the fallback keeps it)."""
    value = ev.value(objective)
    fits = np.isfinite(value)
    if budget_left_usd is not None:
        fits &= ev.cost_p90_usd <= budget_left_usd
    in_budget = fits.copy()
    alone = np.ones(len(configs), dtype=bool)
    contingent: Array | None = None
    if deadline_left_s is not None:
        alone, safe = deadline_safe(
            configs,
            ev,
            down,
            deadline_left_s,
            hold_share=share,
            restart_s=restart_s,
        )
        fits &= safe
        if share is not None:
            by_fallback = safe & ~alone
            contingent = _contingent_value(
                configs,
                ev,
                down,
                boot,
                deadline_left_s,
                share,
                objective=objective,
                restart_s=restart_s,
                boot_s=boot_s,
            )
            value = np.where(by_fallback, contingent, value)
    return _Scored(configs, ev, down, value, fits, in_budget, alone, share, contingent)


def _late(
    s: _Scored, deadline_left_s: float, *, margin: float, restart_s: float
) -> Decision | None:
    """Nothing keeps the deadline at its p90: the choice by the chance of meeting it (None:
    no config's chance is worth a move; the ordinary rules decide)."""
    configs, ev, down, value = s.configs, s.ev, s.down, s.value
    current, cur = configs[0], float(value[0])
    if s.share is not None:
        # Nothing keeps the deadline at its p90, even with a fallback. The chance of meeting
        # it with a config is that of running it until the next re-plan, then its fallback
        # (which an early forecast's spread narrows by then). Keep the cheapest config (the
        # expected value with its fallback) whose chance is within the margin (in
        # probability) of the best: another re-plan interval on it costs little chance, the
        # fastest cluster a lot of money. As the slack runs out, holding a slow config eats
        # the fallback's chance, and the fastest configs are all that remain.
        chance = _fallback_chance(configs, ev, down, deadline_left_s, s.share, restart_s=restart_s)
        chance = np.where(s.in_budget, chance, -1.0)
        near = s.in_budget & (chance >= float(chance.max()) - margin) & (chance > 0)
        if near.any() and s.contingent is not None:  # valued above (share is set)
            pick = np.where(near, s.contingent, np.inf)
            j = int(np.argmin(pick))
            gain = (pick[0] - pick[j]) / pick[0] if near[0] and pick[0] > 0 else 1.0
            why = (
                f"no configuration meets the deadline at its p90; the cheapest within "
                f"{margin:.0%} of the best chance of meeting it ({float(chance.max()):.0%}, "
                f"with a fallback from the next re-plan)"
            )
            if j != 0 and gain > margin:
                label = configs[j].label
                return Decision(
                    True, configs[j], cur, float(value[j]), gain, f"switch to {label}: {why}"
                )
            return Decision(
                False, configs[j], cur, float(value[j]), 0.0, f"stay on {current.label}: {why}"
            )
    # Nothing meets the deadline at its p90: take the best chance of meeting it, the
    # largest z = log(time left / predicted) / sigma (log-normal time; within the budget),
    # when its chance beats staying's by more than the margin (in probability).
    chance = _deadline_chance(ev, down, deadline_left_s)
    chance = np.where(s.in_budget, chance, -1.0)
    j = int(np.argmax(chance))
    if j != 0 and chance[j] > chance[0] + margin:
        gain = (cur - float(value[j])) / cur if cur > 0 and math.isfinite(cur) else 0.0
        return Decision(
            True,
            configs[j],
            cur,
            float(value[j]),
            gain,
            f"switch to {configs[j].label}: no configuration meets the deadline at its p90; "
            f"this one has the best chance ({chance[j]:.0%} against {chance[0]:.0%})",
        )
    return None


def _best_fit(s: _Scored, *, objective: str, margin: float) -> Decision:
    """The best config that fits, against staying (the margin; a current config that does not
    fit is left whatever the margin)."""
    configs, value, fits = s.configs, s.value, s.fits
    current, cur = configs[0], float(value[0])
    unit = "USD" if objective == "cost" else "s"
    if len(configs) == 1 or not fits[1:].any():
        why = "no candidate" if len(configs) == 1 else "no candidate fits the budget/deadline"
        return Decision(False, current, cur, cur, 0.0, f"stay on {current.label}: {why}")
    i = 1 + int(np.nanargmin(np.where(fits[1:], value[1:], np.inf)))
    best, best_value = configs[i], float(value[i])
    if not math.isfinite(cur):
        return Decision(
            False,
            best,
            cur,
            best_value,
            0.0,
            f"stay on {current.label}: its remaining work cannot be predicted (no GNS)",
        )
    gain = (cur - best_value) / cur if cur > 0 else 0.0
    if not fits[0]:
        return Decision(
            True,
            best,
            cur,
            best_value,
            gain,
            f"switch to {best.label}: the current configuration would break the "
            f"budget/deadline; {best_value:.4g} {unit} to finish{_how(s.alone[i])}",
        )
    if gain > margin:
        return Decision(
            True,
            best,
            cur,
            best_value,
            gain,
            f"switch to {best.label}: {best_value:.4g} {unit} to finish against {cur:.4g} "
            f"({gain:.0%} better, restart included; margin {margin:.0%}){_how(s.alone[i])}",
        )
    return Decision(
        False,
        best,
        cur,
        best_value,
        gain,
        f"stay on {current.label}: the best alternative ({best.label}) gains {gain:.1%}, "
        f"not more than the {margin:.0%} margin",
    )
