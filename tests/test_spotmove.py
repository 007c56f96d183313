"""The move rule (kplan/planner/spotmove.py, issue 27 item 3) on two-pool synthetic traces."""

from __future__ import annotations

import numpy as np
import pytest

from kplan.planner.catalog import StoragePrice
from kplan.planner.deadline import DeadlineRule
from kplan.planner.spot import RecoveryPolicy
from kplan.planner.spotmove import (
    MoveTerms,
    Pool,
    break_even_s,
    move_cost,
    replay_pools,
)
from kplan.planner.spotreplay import replay_many
from kplan.planner.spottrace import ADD, REMOVE, SpotTrace

H = 3600.0
SPOT, OD = 1.0, 3.0  # $/node-hour


def _trace(name: str, events: list[tuple[float, int, str]], end_s: float) -> SpotTrace:
    ev = sorted(events)
    return SpotTrace(
        name=name,
        source="synthetic",
        times_s=np.array([e[0] for e in ev], dtype=float),
        kinds=np.array([e[1] for e in ev], dtype=np.int8),
        nodes=tuple(e[2] for e in ev),
        end_s=end_s,
    )


def _price(region: str, per_gb: float) -> StoragePrice:
    return StoragePrice("aws", region, 0.023, 0.08, per_gb, 0.09, 0.09, "test", "2026-11-01")


STORAGE = {
    ("aws", "us-east-1"): _price("us-east-1", 0.02),
    ("aws", "us-east-2"): _price("us-east-2", 0.05),
}


def _pools(
    back_after_s: float, *, nodes: int = 1, name_b: str = "us-east-2", region_b: str = "us-east-2"
) -> list[Pool]:
    """Pool A loses its nodes at 1 h and has none again for ``back_after_s``; B never loses."""
    a_ev = [(0.0, ADD, f"a{i}") for i in range(nodes)]
    a_ev += [(1 * H, REMOVE, f"a{i}") for i in range(nodes)]
    a_ev += [(1 * H + back_after_s, ADD, f"a{i}'") for i in range(nodes)]
    b_ev = [(0.0, ADD, f"b{i}") for i in range(nodes)]
    return [
        Pool("us-east-1", "us-east-1", _trace("A", a_ev, 40 * H), SPOT, OD),
        Pool(name_b, region_b, _trace("B", b_ev, 40 * H), SPOT, OD),
    ]


def _policy(deadline_h: float | None = 8.0) -> RecoveryPolicy:
    return RecoveryPolicy(
        checkpoint_interval_s=1800.0,
        checkpoint_s=10.0,
        allow_on_demand=True,
        deadline_s=None if deadline_h is None else deadline_h * H,
    )


def test_pool_a_dies_and_b_lives_the_job_moves_at_the_break_even_and_pays_the_egress_exactly() -> (
    None
):
    pools = _pools(back_after_s=20 * H)
    terms = MoveTerms("aws", checkpoint_gb=50.0, copy_gbps=1.0, storage=STORAGE)
    pol = _policy(8.0)
    (out,) = replay_pools(pools, [0.0], nodes=1, work_s=4 * H, policy=pol, terms=terms)
    (mv,) = out.moves
    # egress: the checkpoint's size x the source region's price to another region, exactly
    assert mv.egress_usd == pytest.approx(50.0 * 0.02, abs=1e-12)
    assert out.egress_usd == pytest.approx(1.0, abs=1e-12)
    assert mv.copy_s == pytest.approx(50.0 * 8 / 1.0)
    # the break-even: copy 400 s + $1 / (1 node x ($3 - $1) / 3600 s) = 400 + 1800 s after the loss
    cost = move_cost(terms, pools[0], pools[1])
    assert break_even_s(cost, 1, OD, SPOT) == pytest.approx(2200.0)
    assert mv.time_s == pytest.approx(1 * H + 2200.0)
    assert (mv.from_pool, mv.to_pool) == ("us-east-1", "us-east-2")
    # the deadline holds, and the cost counts the egress on top of the instances
    assert not out.failed and out.hours * H <= pol.deadline_s  # type: ignore[operator]
    assert out.cost_usd == pytest.approx(out.replay.cost_usd + 1.0)
    assert sum(i.usd for i in out.replay.instances) == pytest.approx(out.replay.cost_usd)
    assert {i.pool for i in out.replay.instances} == {"us-east-1", "us-east-2"}
    # staying pays on demand for the rest of the job: moving is cheaper here
    (stay,) = replay_many(
        pools[0].trace, [0.0], nodes=1, work_s=4 * H, policy=pol, usd_per_hour=SPOT,
        usd_per_hour_on_demand=OD,
    )  # fmt: skip
    assert out.cost_usd < stay.cost_usd


def test_a_short_outage_with_a_huge_checkpoint_does_not_move_and_replays_as_staying() -> None:
    pools = _pools(back_after_s=1200.0)  # dry 20 minutes
    terms = MoveTerms("aws", checkpoint_gb=2000.0, copy_gbps=1.0, storage=STORAGE)  # $40, 4.4 h
    cost = move_cost(terms, pools[0], pools[1])
    assert break_even_s(cost, 1, OD, SPOT) > 1200.0
    for deadline in (8.0, None):
        pol = _policy(deadline)
        (out,) = replay_pools(pools, [0.0], nodes=1, work_s=4 * H, policy=pol, terms=terms)
        (stay,) = replay_many(
            pools[0].trace, [0.0], nodes=1, work_s=4 * H, policy=pol, usd_per_hour=SPOT,
            usd_per_hour_on_demand=OD,
        )  # fmt: skip
        assert out.moves == () and out.egress_usd == 0.0
        assert out.hours == stay.hours and out.cost_usd == pytest.approx(stay.cost_usd)


def test_a_move_between_zones_of_one_region_copies_nothing_and_goes_at_once() -> None:
    pools = _pools(back_after_s=20 * H, name_b="us-east-1b", region_b="us-east-1")
    terms = MoveTerms("aws", checkpoint_gb=500.0, copy_gbps=1.0, storage=STORAGE)
    assert move_cost(terms, pools[0], pools[1]).egress_usd == 0.0
    (out,) = replay_pools(pools, [0.0], nodes=1, work_s=4 * H, policy=_policy(8.0), terms=terms)
    (mv,) = out.moves
    assert mv.time_s == 1 * H and mv.egress_usd == 0.0 and mv.copy_s == 0.0


def test_a_move_the_deadline_cannot_afford_is_not_made() -> None:
    """The copy and the restart count against the slack: a 2-hour copy past the deadline's
    reserve keeps the job on demand where it is."""
    pools = _pools(back_after_s=20 * H)
    pools = [Pool(p.name, p.region, p.trace, SPOT, 30.0) for p in pools]  # on demand dear
    terms = MoveTerms("aws", checkpoint_gb=900.0, copy_gbps=1.0, storage=STORAGE)  # 7200 s copy
    pol = _policy(7.0)
    (out,) = replay_pools(pools, [0.0], nodes=1, work_s=4 * H, policy=pol, terms=terms)
    assert out.moves == ()
    (stay,) = [e for e in out.replay.events if e.kind == "stay"]
    assert not out.failed and out.hours * H <= 7.0 * H
    rule = pol.deadline_rule()
    assert isinstance(rule, DeadlineRule)
    # the move's time: break-even after the loss at 1 h; up a copy and a restart later the
    # slack would not cover the reserve
    cost = move_cost(terms, pools[0], pools[1])
    assert stay.time_s == pytest.approx(1 * H + break_even_s(cost, 1, 30.0, SPOT))
    # without a deadline the same move is made
    (free,) = replay_pools(pools, [0.0], nodes=1, work_s=4 * H, policy=_policy(None), terms=terms)
    assert len(free.moves) == 1


def test_moving_on_demand_no_dearer_than_spot_there_never_pays() -> None:
    pools = _pools(back_after_s=20 * H)
    pools[1] = Pool(pools[1].name, pools[1].region, pools[1].trace, OD, OD)
    terms = MoveTerms("aws", checkpoint_gb=1.0, copy_gbps=1.0, storage=STORAGE)
    assert break_even_s(move_cost(terms, pools[0], pools[1]), 1, OD, OD) == float("inf")
    (out,) = replay_pools(pools, [0.0], nodes=1, work_s=4 * H, policy=_policy(8.0), terms=terms)
    assert out.moves == ()


def test_without_on_demand_a_move_saves_a_job_that_staying_fails() -> None:
    pools = _pools(back_after_s=20 * H, nodes=2)
    terms = MoveTerms("aws", checkpoint_gb=1.0, copy_gbps=1.0, storage=STORAGE)
    pol = RecoveryPolicy(checkpoint_interval_s=1800.0, capacity_wait_s=900.0)
    (stay,) = replay_many(
        pools[0].trace, [0.0], nodes=2, work_s=3 * H, policy=pol, usd_per_hour=SPOT,
        usd_per_hour_on_demand=OD,
    )  # fmt: skip
    (out,) = replay_pools(pools, [0.0], nodes=2, work_s=3 * H, policy=pol, terms=terms)
    assert stay.failed
    assert not out.failed and len(out.moves) == 1
    assert out.egress_usd == pytest.approx(1.0 * 0.02)


def test_the_rule_refuses_bad_terms() -> None:
    with pytest.raises(ValueError, match="copy_gbps"):
        MoveTerms("aws", checkpoint_gb=1.0, copy_gbps=0.0)
    with pytest.raises(ValueError, match="copy_gbps"):  # a 1 GB copy in 8e300 s: no link's rate
        MoveTerms("aws", checkpoint_gb=1.0, copy_gbps=1e-300)
    with pytest.raises(ValueError, match="checkpoint_gb"):
        MoveTerms("aws", checkpoint_gb=float("nan"))
    pools = _pools(back_after_s=H)
    with pytest.raises(ValueError, match="no egress price"):
        move_cost(MoveTerms("aws", 1.0, storage={}), pools[0], pools[1])
    with pytest.raises(ValueError, match="repeat"):
        replay_pools([pools[0], pools[0]], [0.0], nodes=1, work_s=H, policy=_policy(),
                     terms=MoveTerms("aws", 1.0, storage=STORAGE))  # fmt: skip


def test_move_at_is_when_the_rent_paid_reaches_the_moves_price() -> None:
    from kplan.planner.spotmove import MoveCost, move_at

    cost = MoveCost(egress_usd=2.0, copy_s=100.0, usd_per_gb=0.02, kind="inter-region")
    u = (3.0 - 1.0) / 3600.0
    price = 2.0 + 4 * u * 100.0  # the copy stalls all 4 nodes
    # two nodes on demand from t = 50 (no stall): 2u a second
    assert move_at(cost, 4, (50.0, 50.0, 2), 3.0, 1.0) == pytest.approx(50.0 + price / (2 * u))
    # a stall of all 4 nodes long enough: 4u a second from its start
    assert move_at(cost, 4, (0.0, 1e9, 0), 3.0, 1.0) == pytest.approx(price / (4 * u))
    # a short stall (100 s), then one node on demand
    t = move_at(cost, 4, (0.0, 100.0, 1), 3.0, 1.0)
    assert t == pytest.approx(100.0 + (price - 4 * u * 100.0) / u)
    # nothing paid: never; a free move: at once; on demand no dearer than spot there: never
    assert move_at(cost, 4, (0.0, 0.0, 0), 3.0, 1.0) == float("inf")
    free = MoveCost(0.0, 0.0, 0.0, "zone")
    assert move_at(free, 4, (7.0, 7.0, 0), 3.0, 1.0) == 7.0
    assert move_at(cost, 4, (0.0, 1e9, 4), 1.0, 1.0) == float("inf")


def test_the_two_pool_hindsight_bound_lies_between_free_moves_and_staying() -> None:
    from bench.spot_deadline import bound_usd
    from bench.spot_regions import two_pool_bound_usd

    rng = np.random.default_rng(0)
    for _ in range(60):
        good_a, good_b = rng.random(30) < rng.random(), rng.random(30) < rng.random()
        work = 300.0 * float(rng.integers(1, 15))
        for lag in (0, 2):
            two = two_pool_bound_usd((good_a, good_b), 2, work, (0.4, 3.0), (0.5, lag))
            assert bound_usd(good_a | good_b, 2, work, (0.4, 3.0)) - 1e-9 <= two
            assert two <= bound_usd(good_a, 2, work, (0.4, 3.0)) + 1e-9
