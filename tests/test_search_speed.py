"""The planner's shortcuts give the values of the direct computation (issue 24, item 5): the
frontier mask of every row in one sort (rows of equal hours too), the frontiers' complex-key
sort against ``np.lexsort``, the traffic columns of ``compression.sync_time``,
a compression option's grid built on its type's shared dense grid, and the shown rows told apart
before a PlanRow is built. Timing is measured in bench/estimate_speed.py, not here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from kplan.planner import compression, efficiency, perfmodel
from kplan.planner.candidates import Candidate, batch_grid, candidates, with_compression
from kplan.planner.catalog import Catalog
from kplan.planner.choose import shown_key, top_distinct
from kplan.planner.devices import DeviceModel
from kplan.planner.frontier import _order, front_mask, pareto_front
from kplan.planner.pricing import TypeGrid, _dense_grid, price_candidates, type_grid
from kplan.planner.searchopts import SearchOptions
from kplan.planner.table import Table
from kplan.planner.workload import Workload
from tests.planner_fixtures import catalog, device_model, workload

Ints = NDArray[np.intp]


@pytest.mark.parametrize("seed", range(8))
def test_front_mask_with_shared_hours_is_pareto_front_per_row(seed: int) -> None:
    """Rows with the same hours and costs scaled by a price (a type's on-demand regions), with
    exact ties in hours and in cost, and one row whose costs rank otherwise inside a tie: each
    row keeps the points ``pareto_front`` keeps for it alone (ties to the first)."""
    rng = np.random.default_rng(seed)
    n = 60
    base_h = rng.choice([1.0, 1.5, 2.0, 2.5, 3.0], size=n)  # many ties in hours
    base_c = np.round(rng.uniform(1, 4, n), 1)  # and in cost
    hours = np.tile(base_h, (6, 1))
    price = np.array([[1.0], [2.0], [1.0], [0.5], [3.0], [1.0]])
    cost = base_c[None, :] * price
    cost[5] = np.round(rng.uniform(1, 4, n), 1)  # same hours, costs ranked otherwise
    hours[2] = np.round(rng.uniform(1, 3, n), 1)  # its own hours
    finite = np.ones((6, n), dtype=bool)
    finite[3] = rng.random(n) > 0.3  # another row's hours once masked
    mask = front_mask(hours, cost, finite)
    for r in range(6):
        idx = np.flatnonzero(finite[r])
        want = np.zeros(n, dtype=bool)
        want[idx[pareto_front(hours[r, idx], cost[r, idx])]] = True
        assert np.array_equal(mask[r], want), r


def _params(gradient_bytes: float, bucket: float | None) -> perfmodel.PerfParams:
    return perfmodel.PerfParams(
        0.01, 1e-3, 2.0, 1e-3, 0.02, 1e-5, 2e-3, 0.2, 3e-5, 0.1, 0.1,
        gradient_bytes=gradient_bytes, bucket_bytes=bucket,
    )  # fmt: skip


@pytest.mark.parametrize("spec", ["none", "fp16", "powersgd:4", "topk:0.01:ar", "topk:0.05:ag"])
@pytest.mark.parametrize("part", ["all", "overlapped", "blocking"])
def test_sync_time_columns_are_traffic_per_entry(spec: str, part: str) -> None:
    """``sync_time`` from the worker-count columns equals the formula applied to each entry's
    own ``traffic`` (single nodes and single workers included), collectives too."""
    p = _params(1e8, 25e6)
    c = compression.parse(spec)
    shapes = compression.assumed_shapes(1e8)
    rng = np.random.default_rng(2)
    nodes = np.concatenate([[1.0, 1.0, 2.0], rng.integers(1, 65, 30).astype(float)])
    workers = nodes * np.concatenate([[1.0, 4.0, 1.0], rng.choice([1.0, 2.0, 4.0, 8.0], 30)])
    got, colls = compression.sync_time(p, c, shapes, nodes, workers, 0.4, part, 0.01)  # type: ignore[arg-type]
    nb = compression.buckets(p, shapes) if c.kind != "none" else 1
    for j, (n, k) in enumerate(zip(nodes, workers, strict=True)):
        t = compression.traffic(c, shapes, int(k), 0.0, 0.0)
        inter = n > 1
        alpha = 0.0 if part == "blocking" else (p.inter_alpha if inter else p.intra_alpha)
        beta = (p.inter_beta if inter else p.intra_beta) / 1e8
        lat = p.inter_lat if inter else p.intra_lat
        two = 1.0 + p.two_node if n == 2 else 1.0
        if part == "all":
            b, h, wait = t.bytes, t.hops, 0.0
        elif part == "blocking":
            b, h, wait = t.blocking_bytes, t.blocking_hops, 0.01 if t.barrier else 0.0
        else:
            b, h, wait = t.bytes - t.blocking_bytes, t.hops - t.blocking_hops, 0.0
        want = two * (alpha + beta * b * 0.4 + lat * h * nb) + wait if k > 1 else 0.0
        assert math.isclose(got[j], want, rel_tol=1e-12, abs_tol=1e-15), (n, k)
        assert colls[j] == t.collective


def test_compression_grid_on_the_shared_dense_grid_is_the_same() -> None:
    """A compression option's grid built on its type's dense grid equals the one built alone."""
    wl = workload()
    opts = SearchOptions(max_nodes=8)
    cands, _ = candidates(wl, catalog(), device_model(), opts)
    cands = with_compression(cands, opts)
    grid = batch_grid(wl, opts)
    factors = efficiency.sample_factor(wl.gns, wl.base_batch, grid)
    sigma = efficiency.log_sigma(wl.gns, wl.base_batch, grid)
    compared = 0
    for c in cands:
        dense = _dense_grid(c, wl, opts, grid, factors, sigma)
        alone = type_grid(c, wl, opts, grid, factors, sigma)
        shared = type_grid(c, wl, opts, grid, factors, sigma, dense)
        assert (alone is None) == (shared is None)
        if alone is not None and shared is not None:
            for f in ("nodes", "accum", "batch", "local", "step", "samples", "train_s", "sigma"):
                assert np.array_equal(getattr(alone, f), getattr(shared, f)), (c.compression, f)
            compared += c.compression != "none"
    assert compared > 0


def test_node_pairs_are_the_distinct_pairs_and_price_the_same_steps() -> None:
    """A type grid's (nodes, workers) pairs read from its ascending node counts equal the
    unique over the grid, and a compression option's step times with them equal those
    without; a grid out of node order gets None (the caller's unique then)."""
    wl = workload()
    opts = SearchOptions(max_nodes=8)
    cands, _ = candidates(wl, catalog(), device_model(), opts)
    grid = batch_grid(wl, opts)
    factors = efficiency.sample_factor(wl.gns, wl.base_batch, grid)
    sigma = efficiency.log_sigma(wl.gns, wl.base_batch, grid)
    compared = 0
    for c in cands:
        tg = _dense_grid(c, wl, opts, grid, factors, sigma)
        if tg is None:
            continue
        g = c.inst.gpu_count
        workers = tg.nodes * g
        pairs = compression.node_pairs(tg.nodes, g)
        assert pairs is not None
        for a, b in zip(pairs, compression.distinct_pairs(tg.nodes, workers), strict=True):
            assert np.array_equal(a, b)
        for spec in ("fp16", "powersgd:4", "topk:0.01:ag"):
            comp = compression.parse(spec)
            shapes = compression.assumed_shapes(wl.gradient_bytes)
            args = (c.pred.params, comp, shapes, tg.nodes, workers, tg.local, tg.accum, 0.01)
            with_pairs = compression.step_time(*args, pairs=pairs)
            assert np.array_equal(with_pairs, compression.step_time(*args))
            compared += 1
    assert compared > 0
    assert compression.node_pairs(np.array([2.0, 1.0]), 4) is None


def test_shown_key_is_the_plan_rows_key() -> None:
    """The key told before building a row is the built row's (cloud, type, market), and the
    distinct rows are the first of each key in order."""
    wl = workload()
    opts = SearchOptions(max_nodes=8)
    cands, _ = candidates(wl, catalog(), device_model(), opts)
    grid = batch_grid(wl, opts)
    table: Table = price_candidates(cands, wl, opts, grid, 10.0).table
    order = np.argsort(table.cost, kind="stable")
    rows = top_distinct(order, table, cands, wl, 1000)
    keys = [(r.cloud, r.instance_type, r.market) for r in rows]
    assert len(set(keys)) == len(keys) > 1
    want = list(dict.fromkeys(shown_key(int(i), table, cands) for i in order))
    assert keys == want


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_complex_key_order_is_lexsort(seed: int) -> None:
    """The frontiers' one-pass sort is ``np.lexsort((cost, hours))``: by hours, then cost, then
    position, with ties (rounded values) and infinities (rows masked out) in both keys."""
    rng = np.random.default_rng(seed)
    hours = np.round(rng.uniform(1, 3, (4, 200)), 1)
    cost = np.round(rng.uniform(1, 3, (4, 200)), 1)
    hours[rng.random(hours.shape) < 0.1] = np.inf
    cost[rng.random(cost.shape) < 0.1] = np.inf
    assert np.array_equal(_order(hours, cost), np.lexsort((cost, hours), axis=-1))
    for r in range(4):
        assert np.array_equal(_order(hours[r], cost[r]), np.lexsort((cost[r], hours[r])))


def test_compression_candidates_are_replaced_copies() -> None:
    """``with_compression`` builds each option's candidates field by field: every field is the
    dense candidate's, except the option and its statistics (``dataclasses.replace``'s)."""
    from dataclasses import fields, replace

    opts = SearchOptions(max_nodes=8)
    dense, _ = candidates(workload(), catalog(), device_model(), opts)
    both = with_compression(dense, opts)
    assert len(both) > len(dense) and both[: len(dense)] == dense
    for i, c in enumerate(both[len(dense) :]):
        src = dense[i % len(dense)]
        assert c == replace(src, compression=c.compression, compression_stat=c.compression_stat)
        assert c.compression != "none" and c.compression_stat is not None
    assert {f.name for f in fields(Candidate)} == {
        "offer",
        "inst",
        "pred",
        "preempt_per_hour",
        "billing_min_s",
        "billing_increment_s",
        "risk",
        "on_demand_usd_per_hour",
        "compression",
        "compression_stat",
        "extras",
    }, "a new Candidate field: copy it in with_compression too"


def _pricing_case(case: int) -> tuple[Workload, Catalog, DeviceModel, SearchOptions]:
    """Two fixture workloads, then shipped examples on the shipped catalog (one spot-only)."""
    if case < 2:
        markets = ("spot", "on-demand") if case == 0 else ("on-demand",)
        opts = SearchOptions(max_nodes=32, markets=markets)
        return workload(), catalog(), device_model(), opts
    from kplan.app import planning
    from kplan.catalogs.device_model import load_device_model
    from kplan.catalogs.loader import shipped_catalog
    from kplan.planner.workload import workload_from_profile

    name, opts = [
        ("imagenet-resnet50", SearchOptions()),
        ("bert-squad", SearchOptions()),
        ("cifar10-resnet18", SearchOptions()),
        ("yolov3", SearchOptions(markets=("spot",))),
    ][case - 2]
    cat = shipped_catalog()
    wl = workload_from_profile(planning.load_example(name), cat.gpus)
    return wl, cat, load_device_model(), opts


@pytest.mark.parametrize("case", range(6))
def test_unpriced_dominated_configurations_change_no_kept_row(
    monkeypatch: pytest.MonkeyPatch, case: int
) -> None:
    """The configurations ``_undominated`` drops before pricing (on-demand and spot members)
    are on no member's frontier: the kept table and the counts equal those of pricing every
    configuration, on the fixtures and shipped examples (one spot only)."""
    from kplan.planner import pricing

    wl, cat, dm, opts = _pricing_case(case)
    cands = with_compression(candidates(wl, cat, dm, opts)[0], opts)
    grid = batch_grid(wl, opts)
    dropped = {"on-demand only": 0, "with spot": 0}
    real = pricing._undominated

    def counted(
        tg: TypeGrid, gap: float, floor: float
    ) -> tuple[NDArray[np.bool_], NDArray[np.intp]]:
        keep, by = real(tg, gap, floor)
        dropped["with spot" if floor > -np.inf else "on-demand only"] += int((~keep).sum())
        return keep, by

    monkeypatch.setattr(pricing, "_undominated", counted)
    fast = price_candidates(cands, wl, opts, grid, 10.0)
    monkeypatch.setattr(pricing, "_groups", lambda members, *_: [(members, None)])
    full = price_candidates(cands, wl, opts, grid, 10.0)
    assert dropped["with spot" if "spot" in opts.markets else "on-demand only"] > 0
    assert (fast.considered, fast.feasible) == (full.considered, full.feasible)
    for f in ("cand", "nodes", "batch", "local", "accum", "step", "sigma", "samples"):
        assert np.array_equal(getattr(fast.table, f), getattr(full.table, f)), f
    for f in ("hours", "hours_p90", "cost", "cost_p90", "preempt", "tau"):
        assert np.array_equal(getattr(fast.table, f), getattr(full.table, f)), f


def test_budget_or_deadline_prices_every_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a budget or deadline the feasible count needs every price: nothing is dropped."""
    from kplan.planner import pricing

    def never(tg: TypeGrid) -> NDArray[np.bool_]:
        raise AssertionError("dropped configurations under a budget or deadline")

    monkeypatch.setattr(pricing, "_undominated", never)
    wl = workload()
    for opts in (SearchOptions(max_nodes=8, budget_usd=50.0), SearchOptions(deadline_hours=9.0)):
        cands = candidates(wl, catalog(), device_model(), opts)[0]
        assert price_candidates(cands, wl, opts, batch_grid(wl, opts), 10.0).considered > 0


def test_undominated_on_a_grid_out_of_node_order_is_the_same() -> None:
    """``_undominated`` on a grid whose node counts are not in order (it sorts them) drops the
    configurations it drops in order, and each dropped one names a kept one of its node count
    with a smaller ``train_s``."""
    from kplan.planner import pricing

    wl = workload()
    opts = SearchOptions(max_nodes=16)
    cands = candidates(wl, catalog(), device_model(), opts)[0]
    grid = batch_grid(wl, opts)
    factors = efficiency.sample_factor(wl.gns, wl.base_batch, grid)
    sigma = efficiency.log_sigma(wl.gns, wl.base_batch, grid)
    tg = type_grid(cands[0], wl, opts, grid, factors, sigma)
    assert tg is not None
    for gap, floor in ((0.0, -np.inf), (60.0, 60.0)):
        keep, by = pricing._undominated(tg, gap, floor)
        assert 0 < keep.sum() < len(keep)
        assert keep[by].all() and (tg.nodes[by] == tg.nodes[~keep]).all()
        assert (tg.train_s[by] < tg.train_s[~keep]).all()
        perm = np.random.default_rng(0).permutation(len(tg.nodes))
        shuffled = TypeGrid(*(getattr(tg, f)[perm] for f in pricing._GRID_FIELDS))
        keep2, by2 = pricing._undominated(shuffled, gap, floor)
        assert np.array_equal(keep2, keep[perm])
        assert keep2[by2].all() and (shuffled.nodes[by2] == shuffled.nodes[~keep2]).all()


@pytest.mark.parametrize("billing", [(60.0, 1.0), (3600.0, 3600.0), (0.0, 600.0)])
def test_unpriced_configurations_under_other_billing_and_overheads(
    monkeypatch: pytest.MonkeyPatch, billing: tuple[float, float]
) -> None:
    """Coarse billing increments (the spot gap grows with them), no billing minimum, other
    overheads and spot capacity waits: the kept table and counts are still those of pricing
    every configuration."""
    from dataclasses import replace

    from kplan.planner import costs, pricing

    wl, cat, dm, _ = _pricing_case(2)  # imagenet-resnet50 on the shipped catalog
    overheads = costs.Overheads(provisioning_s=0.0, restart_s=900.0, min_useful_fraction=0.5)
    opts = SearchOptions(overheads=overheads, allow_on_demand=False)
    cands = with_compression(candidates(wl, cat, dm, opts)[0], opts)
    bmin, binc = billing
    cands = [replace(c, billing_min_s=bmin, billing_increment_s=binc) for c in cands]
    grid = batch_grid(wl, opts)
    dropped = [0]
    real = pricing._undominated

    def counted(tg: TypeGrid, gap: float, floor: float) -> tuple[NDArray[np.bool_], Ints]:
        keep, by = real(tg, gap, floor)
        dropped[0] += int((~keep).sum())
        return keep, by

    monkeypatch.setattr(pricing, "_undominated", counted)
    fast = price_candidates(cands, wl, opts, grid, 30.0)
    assert dropped[0] > 0
    monkeypatch.setattr(pricing, "_groups", lambda members, *_: [(members, None)])
    full = price_candidates(cands, wl, opts, grid, 30.0)
    assert (fast.considered, fast.feasible) == (full.considered, full.feasible)
    assert fast.feasible < fast.considered  # some node counts are infeasible here
    for f in ("cand", "nodes", "batch", "accum", "hours", "hours_p90", "cost", "cost_p90"):
        assert np.array_equal(getattr(fast.table, f), getattr(full.table, f)), f
