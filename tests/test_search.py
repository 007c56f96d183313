from __future__ import annotations

import itertools

import numpy as np
import pytest

from kplan.errors import InfeasibleError, InputError
from kplan.planner.search import SearchOptions, knee_index, pareto_front, search
from tests.planner_fixtures import catalog, device_model, workload


def test_cost_objective_picks_cheapest_and_frontier_is_sane() -> None:
    plan = search(workload(), catalog(), device_model(), SearchOptions(max_nodes=16))
    assert plan.chosen.cost_usd == min(r.cost_usd for r in plan.frontier)
    hours = [r.hours for r in plan.frontier]
    cost = [r.cost_usd for r in plan.frontier]
    assert hours == sorted(hours)
    assert all(a > b for a, b in itertools.pairwise(cost))
    assert plan.considered > 1000
    assert "cheapest" in plan.reason


def test_time_objective_is_fastest_and_budget_is_respected() -> None:
    cat, dm = catalog(), device_model()
    free = search(workload(), cat, dm, SearchOptions(objective="time", max_nodes=16))
    assert free.chosen.hours == min(r.hours for r in free.frontier)
    budget = free.chosen.cost_p90_usd / 2
    capped = search(
        workload(), cat, dm, SearchOptions(objective="time", max_nodes=16, budget_usd=budget)
    )
    assert capped.chosen.cost_p90_usd <= budget
    assert capped.chosen.hours >= free.chosen.hours


def test_deadline_is_respected() -> None:
    cat, dm = catalog(), device_model()
    cheap = search(workload(), cat, dm, SearchOptions(max_nodes=16))
    deadline = cheap.chosen.hours_p90 / 3
    fast = search(workload(), cat, dm, SearchOptions(max_nodes=16, deadline_hours=deadline))
    assert fast.chosen.hours_p90 <= deadline
    assert fast.chosen.cost_usd >= cheap.chosen.cost_usd


def test_infeasible_budget_names_the_cheapest() -> None:
    with pytest.raises(InfeasibleError, match="budget") as err:
        search(workload(), catalog(), device_model(), SearchOptions(budget_usd=0.01))
    assert "cheapest plan costs" in err.value.hint


def test_filters_and_bad_filters() -> None:
    plan = search(
        workload(),
        catalog(),
        device_model(),
        SearchOptions(gpus=("A100",), markets=("on-demand",), mixed=False),
    )
    assert all(r.gpu == "A100" and r.market == "on-demand" for r in plan.plans)
    with pytest.raises(InputError, match="unknown GPU"):
        search(workload(), catalog(), device_model(), SearchOptions(gpus=("Z9",)))
    with pytest.raises(InputError, match="unknown region"):
        search(workload(), catalog(), device_model(), SearchOptions(regions=("mars-1",)))
    with pytest.raises(InputError, match="budget"):
        SearchOptions(budget_usd=-5)


def test_without_gns_the_global_batch_is_kept() -> None:
    plan = search(workload(gns=False), catalog(), device_model(), SearchOptions(max_nodes=8))
    assert {r.global_batch for r in plan.plans} == {128}
    assert any("noise scale" in n for n in plan.notes)


def test_cheapest_zone_is_used_and_spot_has_preemptions() -> None:
    plan = search(
        workload(),
        catalog(),
        device_model(),
        SearchOptions(gpus=("T4",), markets=("spot",), mixed=False, max_nodes=4),
    )
    rows = [r for r in plan.plans if r.instance_type == "g4dn.12xlarge"]
    assert rows and rows[0].zone == "us-east-1b"
    assert rows[0].expected_preemptions > 0


def test_mixed_plans_are_considered() -> None:
    plan = search(workload(), catalog(), device_model(), SearchOptions(max_nodes=8, top=50))
    assert any(len(r.groups) == 2 for r in plan.plans)
    for r in plan.plans:
        if len(r.groups) == 2:
            assert r.nodes == sum(g.nodes for g in r.groups)
            assert r.usd_per_hour == pytest.approx(sum(g.nodes * g.usd_per_hour for g in r.groups))


def test_pareto_and_knee_helpers() -> None:
    hours = np.array([1.0, 2.0, 3.0, 2.5, 10.0])
    cost = np.array([10.0, 4.0, 3.5, 5.0, 3.0])
    front = pareto_front(hours, cost)
    assert list(front) == [0, 1, 2, 4]
    assert knee_index(hours[front], cost[front]) == 1
