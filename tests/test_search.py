from __future__ import annotations

import itertools

import numpy as np
import pytest

from kplan.core.errors import InfeasibleError, InputError
from kplan.planner.search import SearchOptions, batch_grid, knee_index, pareto_front, search
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
    # the fastest within the tie tolerance, and the cheapest of those
    fastest = min(r.hours for r in free.frontier)
    tied = [r for r in free.frontier if r.hours <= fastest * (1 + free.tie_tolerance)]
    assert free.chosen.hours <= fastest * (1 + free.tie_tolerance)
    assert free.chosen.cost_usd == min(r.cost_usd for r in tied)
    strict = search(
        workload(), cat, dm, SearchOptions(objective="time", max_nodes=16, tie_tolerance=0.0)
    )
    assert strict.chosen.hours == fastest
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


def test_pinned_instance_type_and_node_range() -> None:
    opts = SearchOptions(instance_types=("G4DN.12xlarge",), min_nodes=3, max_nodes=5, top=20)
    plan = search(workload(), catalog(), device_model(), opts)
    rows = [plan.chosen, *plan.plans, *plan.frontier]
    assert {r.instance_type for r in rows} == {"g4dn.12xlarge"}  # no "a+a" spot/on-demand mix
    assert {r.nodes for r in rows} <= {3, 4, 5} and plan.chosen.nodes >= 3
    exact = search(workload(), catalog(), device_model(), SearchOptions(min_nodes=4, max_nodes=4))
    assert {r.nodes for r in (exact.chosen, *exact.plans, *exact.frontier)} == {4}
    with pytest.raises(InputError, match=r"unknown instance type 'g4dn\.12x'") as err:
        search(workload(), catalog(), device_model(), SearchOptions(instance_types=("g4dn.12x",)))
    assert "did you mean g4dn.12xlarge" in err.value.hint
    with pytest.raises(InputError, match="not a range"):
        SearchOptions(min_nodes=5, max_nodes=4)
    with pytest.raises(InputError, match="not a precision"):
        SearchOptions(precision="fp8")  # type: ignore[arg-type]


def test_batch_grid_pins_and_caps() -> None:
    w = workload()  # B0 = 128
    assert list(batch_grid(w, SearchOptions()))[-1] == 32 * 128
    assert list(batch_grid(w, SearchOptions(max_global_batch=512))) == [128, 181, 256, 362, 512]
    assert list(batch_grid(w, SearchOptions(max_global_batch=100))) == [100]
    assert list(batch_grid(w, SearchOptions(global_batch=1000))) == [1000]
    assert list(batch_grid(workload(gns=False), SearchOptions(global_batch=1000))) == [1000]


def test_pinned_batch_without_gns_is_planned_with_a_note() -> None:
    opts = SearchOptions(global_batch=512, max_nodes=8)
    plan = search(workload(gns=False), catalog(), device_model(), opts)
    assert {r.global_batch for r in plan.plans} == {512}
    assert plan.chosen.samples == pytest.approx(workload().samples_at_base)
    assert any("pinned global batch 512" in n for n in plan.notes)


def test_fixed_batch_minimum_per_gpu() -> None:
    opts = SearchOptions(fixed_global_batch=True, min_local_batch=8, top=20, mixed=False)
    plan = search(workload(), catalog(), device_model(), opts)
    for r in (plan.chosen, *plan.plans, *plan.frontier):
        assert r.global_batch == 128 and r.workers * r.accum_steps * 8 <= 128
    with pytest.raises(InfeasibleError, match="too small for 5 x"):
        search(
            workload(),
            catalog(),
            device_model(),
            SearchOptions(
                fixed_global_batch=True, min_local_batch=8, min_nodes=5, max_nodes=5,
                instance_types=("p4d.24xlarge",),
            ),
        )  # fmt: skip


def test_every_plan_states_its_precision() -> None:
    same = search(workload(), catalog(), device_model(), SearchOptions(max_nodes=4))
    assert (same.precision, same.precision_basis) == ("fp32", "measured")
    other = search(
        workload(), catalog(), device_model(), SearchOptions(max_nodes=4, precision="bf16")
    )
    assert (other.precision, other.precision_basis) == ("bf16", "projected from the profile's fp32")
    assert {r.precision for r in (other.chosen, *other.plans, *other.frontier)} == {"bf16"}
    assert "projected from fp32 to bf16" in other.uncertainty
    assert other.to_dict()["chosen"]["precision"] == "bf16"
