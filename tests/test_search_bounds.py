"""The lower bounds that let a search refuse an impossible deadline or budget before pricing
(kplan/planner/bounds.py): no row the search ranks is below them (closed form, mixes and the
Monte-Carlo's own prices), a request below them is refused without pricing anything, and a
request any configuration meets is never refused."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kplan.core.errors import InfeasibleError
from kplan.planner import bounds, efficiency, pricing
from kplan.planner import choose as choose_module
from kplan.planner.candidates import batch_grid, candidates, with_compression
from kplan.planner.catalog import Catalog
from kplan.planner.choose import choose
from kplan.planner.devices import DeviceModel
from kplan.planner.plan import Plan
from kplan.planner.search import SearchOptions, search
from kplan.planner.table import Table
from kplan.planner.workload import Workload
from tests.planner_fixtures import catalog, device_model, workload

CASES = {
    "both markets": SearchOptions(max_nodes=16, spot_runs=200),
    "spot, risky": SearchOptions(max_nodes=8, markets=("spot",), spot_runs=200),
    "on demand": SearchOptions(max_nodes=32, markets=("on-demand",)),
    "no mixes": SearchOptions(max_nodes=16, mixed=False, spot_runs=200),
    "pinned batch": SearchOptions(max_nodes=8, global_batch=512, spot_runs=200),
}


def _floor(wl: Workload, cat: Catalog, dm: DeviceModel, opts: SearchOptions) -> bounds.Floor:
    cands = with_compression(candidates(wl, cat, dm, opts)[0], opts)
    return bounds.floor(cands, wl, opts, batch_grid(wl, opts))


def _searched(
    monkeypatch: pytest.MonkeyPatch, wl: Workload, cat: Catalog, opts: SearchOptions
) -> tuple[Plan, Table]:
    """The plan, and the table the choice ranked (after the Monte-Carlo rounds)."""
    seen: list[Table] = []
    real = choose

    def spy(t: Table, *args: object, **kwargs: object) -> Plan:
        plan = real(t, *args, **kwargs)  # type: ignore[arg-type]
        seen.append(t)
        return plan

    monkeypatch.setattr(choose_module, "choose", spy)  # search imports it when it runs
    plan = search(wl, cat, device_model(), opts)
    monkeypatch.undo()
    return plan, seen[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_ranked_row_is_below_the_bounds(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    opts = CASES[name]
    wl, cat = workload(), catalog(spot_rate=2.0 if name == "spot, risky" else 0.5)
    f = _floor(wl, cat, device_model(), opts)
    assert f.hours_p90 > 0 and f.cost_p90_usd > 0
    plan, t = _searched(monkeypatch, wl, cat, opts)
    finite = np.isfinite(t.hours_p90) & np.isfinite(t.cost_p90)
    assert finite.any()
    assert np.all(t.hours_p90[finite] >= f.hours_p90)
    assert np.all(t.cost_p90[finite] >= f.cost_p90_usd)
    # the Monte-Carlo's own prices (the table's may have been held to the bound)
    for r in t.spot.values():
        assert r.hours_p90 >= f.hours_p90 and r.cost_p90_usd >= f.cost_p90_usd
    for row in (*plan.plans, *plan.frontier):
        assert row.hours_p90 >= f.hours_p90 and row.cost_p90_usd >= f.cost_p90_usd


@pytest.mark.parametrize("name", sorted(CASES))
def test_requests_just_inside_what_the_search_reaches_are_never_refused(name: str) -> None:
    opts = CASES[name]
    wl, cat, dm = (
        workload(),
        catalog(spot_rate=2.0 if name == "spot, risky" else 0.5),
        device_model(),
    )
    free = search(wl, cat, dm, opts)
    fastest = min(r.hours_p90 for r in free.frontier)
    cheapest = min(r.cost_p90_usd for r in free.frontier)
    f = _floor(wl, cat, dm, opts)
    assert f.hours_p90 <= fastest and f.cost_p90_usd <= cheapest
    for scale in (1.0001, 1.01, 1.5):
        timed = search(wl, cat, dm, replace(opts, deadline_hours=fastest * scale))
        assert timed.chosen.hours_p90 <= fastest * scale
        priced = search(wl, cat, dm, replace(opts, budget_usd=cheapest * scale))
        assert priced.chosen.cost_p90_usd <= cheapest * scale


@pytest.mark.parametrize("scale", [0.2, 0.9, 0.999])
def test_a_request_below_the_bounds_is_refused_before_any_pricing(
    monkeypatch: pytest.MonkeyPatch, scale: float
) -> None:
    opts = CASES["both markets"]
    wl, cat, dm = workload(), catalog(), device_model()
    f = _floor(wl, cat, dm, opts)

    def no_pricing(*args: object, **kwargs: object) -> None:
        raise AssertionError("priced a request the bounds refuse")

    monkeypatch.setattr(pricing, "price_candidates", no_pricing)
    with pytest.raises(InfeasibleError) as late:
        search(wl, cat, dm, replace(opts, deadline_hours=f.hours_p90 * scale))
    assert late.value.message == f"no plan meets the deadline {f.hours_p90 * scale:g} h"
    assert late.value.hint.startswith("the cheapest plan costs at least $")
    assert "and the fastest takes at least " in late.value.hint
    assert late.value.hint.endswith("(p90); raise --budget or --deadline")
    with pytest.raises(InfeasibleError, match="no plan meets the budget") as dear:
        search(wl, cat, dm, replace(opts, budget_usd=f.cost_p90_usd * scale))
    assert dear.value.hint == late.value.hint
    with pytest.raises(InfeasibleError, match=r"no plan meets the budget .* and deadline") as both:
        search(wl, cat, dm, replace(opts, budget_usd=1e9, deadline_hours=f.hours_p90 * scale))
    assert both.value.hint.endswith(", or drop one of them")


def _example_workloads() -> list[Workload]:
    from kplan.app import planning
    from kplan.catalogs.loader import shipped_catalog
    from kplan.planner.workload import workload_from_profile

    gpus = shipped_catalog().gpus
    return [
        workload_from_profile(planning.load_example(name), gpus)
        for name in planning.example_names()
    ]


def test_the_samples_bound_is_below_the_gns_forecast() -> None:
    """bounds.floor takes at least B0's samples from B0 up and B / B0 of them below it, without
    running the forecast: every example's forecast (and the fixture's) is above that."""
    for wl in [workload(), *_example_workloads()]:
        b0 = wl.base_batch
        batch = np.unique(np.round(b0 * 2.0 ** (np.arange(-8, 20) / 2.0)))
        factor = efficiency.sample_factor(wl.gns, b0, batch)
        assert np.all(factor >= np.minimum(batch / b0, 1.0)), wl.name


def test_without_candidates_nothing_is_refused() -> None:
    opts = SearchOptions(deadline_hours=1e-9, budget_usd=1e-9)
    f = bounds.floor([], workload(), opts, np.array([77]))
    assert np.isnan(f.hours_p90) and np.isnan(f.cost_p90_usd)
    assert bounds.refusal(f, opts) is None
