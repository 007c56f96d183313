"""Acceptance (issue 11): the launcher and the simulator's trace replay tell the same story.

One spot trace, replayed by ``kplan.planner.spotsim.replay`` with the job's own ``RecoveryPolicy``;
the same event sequence is then scripted on the simulated cloud (``SimProvider`` on the
``FakeClock``) and run through the real launcher: the worker's spot node is reclaimed, its zone
has no capacity so the replacement fails over to another zone of the region; that node is
reclaimed too while the whole region is out, the job waits, and capacity returns inside
``capacity_wait_s``. The launcher's ledger (instances, markets, billed seconds, dollars) and its
loss/replacement counts must match the replay's accounting.

Tolerance: the launcher sees the cloud at its monitor ticks (``check_interval_s``). Each
instance starts at most one tick after the replay's (the launcher launches a replacement at the
tick that sees the loss, or that finds capacity back), and ends at most one tick after it (the
ledger closes a row at the tick that sees the instance gone, never earlier: it must not show
less than the cloud bills). The first worker is launched once the head runs (its address is the
rendezvous), ``provisioning_s`` after the replay, which launches every node at 0.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from kplan.planner.spotsim import replay
from kplan.planner.spottrace import ADD, REMOVE, SpotTrace
from tests.launcher_fakes import SimProvider, fast_dir

JOB = "kp-replay-1"
TICK = 30.0
BOOT = 120.0  # provisioning_s = restart_s = the simulated cloud's boot time
PRICE = 0.30  # spot, the same in both zones (the replay's trace is one pool: one price)
ON_DEMAND = 0.90
AWS = Billing("aws", 60.0, 1.0, "test")
START = 200.0  # where the job starts in the trace


def _trace() -> SpotTrace:
    """Two nodes alive at the start; the older (the job's worker: the replay takes the youngest
    first) is reclaimed 1800 s in, a node is added 5 s later (capacity in the region: a
    replacement, in another zone for the launcher); that one goes 4000 s in and the pool gets
    nothing back for 1200 s (a regional outage, shorter than ``capacity_wait_s``)."""
    rows = [
        (0.0, ADD, "old"),
        (100.0, ADD, "young"),
        (START + 1800.0, REMOVE, "old"),
        (START + 1805.0, ADD, "c"),
        (START + 4000.0, REMOVE, "c"),
        (START + 5200.0, ADD, "d"),
    ]
    return SpotTrace(
        name="scripted",
        source="test",
        times_s=np.array([r[0] for r in rows]),
        kinds=np.array([r[1] for r in rows], dtype=np.int8),
        nodes=tuple(r[2] for r in rows),
        end_s=START + 30_000.0,
    )


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    folder = fast_dir(tmp_path, "replay")
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    storage = LocalStorage(folder / "store")
    storage.uri = "s3://bucket/kplan"
    with StateDB.open(folder / "kplan.db") as db:
        yield {"storage": storage, "db": db, "script": str(script)}
    shutil.rmtree(folder, ignore_errors=True)


def _launch_like(
    env: dict[str, Any],
    spec: JobSpec,
    sim_out: Any,
    deaths: dict[int, list[float]],
    region_out_at: float,
    back_at: float,
) -> tuple[SimProvider, Any, float]:
    """Run the launcher on the simulated cloud through the replay's events: each instance of a
    rank dies when the replay's instance of that slot died; zone a has no spot capacity from
    the first loss, the whole region none from ``region_out_at`` to ``back_at``; training ends
    when the replay's does. (provider, outcome, the clock's start)"""
    clock = FakeClock()
    t0 = clock.now()
    first_loss = next(e.time_s for e in sim_out.events if e.kind == "preempted")

    def preempt_after(ispec: Any) -> float | None:
        queue = deaths[ispec.node_rank]
        return queue.pop(0) - (clock.now() - t0) if queue else None

    sim = SimProvider(
        clock,
        env["storage"],
        boot_s=BOOT,
        term_latency_s=5.0,
        finish_at=t0 + sim_out.hours * 3600.0,
        preempt_after=preempt_after,
        outages=[
            ("us-east-1a", "spot", t0 + first_loss, t0 + region_out_at),
            ("us-east-1a", "spot", t0 + region_out_at, t0 + back_at),
            ("us-east-1b", "spot", t0 + region_out_at, t0 + back_at),
        ],
    )
    out = run_job(spec, Backend(sim, env["storage"]), env["db"], clock=clock, billing=AWS)
    return sim, out, t0


def test_an_injected_outage_waits_fails_over_and_bills_what_the_replay_bills(
    env: dict[str, Any],
) -> None:
    spec = JobSpec.build(
        job_id=JOB,
        cloud="aws",
        region="us-east-1",
        script=env["script"],
        nodes=tuple(NodeSpec(r, "p3.2xlarge", "spot", "us-east-1a", 1, PRICE) for r in (0, 1)),
        budget_usd=100.0,
        check_interval_s=TICK,
        grace_s=60.0,
        teardown_s=60.0,
        provision_timeout_s=600.0,
        capacity_wait_s=1800.0,
        max_replacements=4,
        checkpoint_interval_s=600.0,
        restart_s=BOOT,
        offers=(
            ZoneOffer("p3.2xlarge", "us-east-1a", "spot", PRICE),
            ZoneOffer("p3.2xlarge", "us-east-1b", "spot", PRICE),
            ZoneOffer("p3.2xlarge", "us-east-1a", "on-demand", ON_DEMAND),
        ),
    )
    policy = spec.recovery_policy()
    policy = replace(policy, provisioning_s=BOOT)
    sim_out = replay(
        _trace(),
        start_s=START,
        nodes=2,
        work_s=2 * 3600.0,
        policy=policy,
        usd_per_hour=PRICE,
        usd_per_hour_on_demand=ON_DEMAND,
        billing_min_s=60.0,
        billing_increment_s=1.0,
    )
    # The replay's story: two losses of the worker, one replaced at once, one after a wait.
    assert not sim_out.failed and (sim_out.losses, sim_out.lost_nodes) == (2, 2)
    assert sim_out.wait_s == pytest.approx(1200.0)
    assert [e.kind for e in sim_out.events] == [
        "start", "preempted", "replace", "preempted", "wait", "replace", "done",
    ]  # fmt: skip
    by_slot: dict[int, list[Any]] = {0: [], 1: []}
    for one in sim_out.instances:
        by_slot[one.slot].append(one)
    end_s = sim_out.hours * 3600.0

    # The same sequence on the simulated cloud: each instance of a rank dies when the replay's
    # instance of that slot died; zone a has no spot capacity after the first loss, the whole
    # region none during the replay's wait; training ends when the replay's does.
    deaths = {r: [i.end_s for i in by_slot[r] if i.end_s < end_s - 1e-6] for r in (0, 1)}
    wait_at = next(e.time_s for e in sim_out.events if e.kind == "wait")
    back_at = wait_at + sim_out.wait_s
    sim, out, t0 = _launch_like(env, spec, sim_out, deaths, wait_at, back_at)
    db: StateDB = env["db"]
    assert out.status == "succeeded", out.reason

    # What happened, in the launcher's words.
    kinds = [e.kind for e in db.events(JOB)]
    assert kinds.count("preempted") == sim_out.losses == out.preemptions
    assert kinds.count("recovered") == sim_out.lost_nodes
    assert [(s.node_rank, s.zone) for s in sim.launched] == [
        (0, "us-east-1a"),
        (1, "us-east-1a"),
        (1, "us-east-1b"),  # zone a is out: failover within the region
        (1, "us-east-1a"),  # after the wait, back in its own zone
    ]
    (waited,) = [e for e in db.events(JOB) if e.kind == "capacity"]
    assert waited.data is not None
    assert sim_out.wait_s <= waited.data["waited_s"] <= sim_out.wait_s + TICK

    # The ledger, instance by instance, against the replay's instances (same rank, same order).
    inst = {i.id: i for i in db.instances(JOB)}
    rows = sorted(db.ledger(JOB), key=lambda r: (inst[r.instance].node_rank, r.start))
    ours = [(inst[r.instance].node_rank, inst[r.instance].market, r) for r in rows]
    theirs = sorted(sim_out.instances, key=lambda i: (i.slot, i.launch_s))
    assert [(rank, market) for rank, market, _ in ours] == [(i.slot, i.market) for i in theirs]
    first_worker = True
    for (rank, _, row), ref in zip(ours, theirs, strict=True):
        late = BOOT + 5.0 + TICK if rank == 1 and first_worker else TICK
        first_worker = first_worker and rank != 1
        assert ref.launch_s <= row.start - t0 <= ref.launch_s + late, (rank, row, ref)
        assert ref.end_s <= row.end - t0 <= ref.end_s + TICK, (rank, row, ref)
        assert row.billed_seconds == pytest.approx(max(row.end - row.start, 60.0))
    # Node-seconds and dollars per market: within one tick per instance end, one per start,
    # and the first worker's wait for the head.
    slack = 2 * TICK * len(rows) + BOOT + 5.0
    for market in ("spot", "on-demand"):
        ledger_s = math.fsum(r.billed_seconds for _, m, r in ours if m == market)
        replay_s = math.fsum(i.billed_s for i in theirs if i.market == market)
        assert abs(ledger_s - replay_s) <= slack, (market, ledger_s, replay_s)
    assert out.spend_usd == pytest.approx(sim_out.cost_usd, abs=slack * PRICE / 3600)
    assert sim.alive() == []


def test_an_on_demand_fallback_bills_what_the_replay_bills_plus_the_spot_boot(
    env: dict[str, Any],
) -> None:
    """``allow_on_demand``: the worker is lost at the start of the replay's outage, replaced on
    demand at once, and goes back to spot when capacity returns. One deliberate difference: the
    replay ends the on-demand node when capacity returns (training down while the spot node
    boots); the launcher keeps it training until its spot successor runs, so its on-demand row
    is longer by the spot node's boot (``restart_s``). Everything else matches as above."""
    spec = JobSpec.build(
        job_id=JOB,
        cloud="aws",
        region="us-east-1",
        script=env["script"],
        nodes=tuple(NodeSpec(r, "p3.2xlarge", "spot", "us-east-1a", 1, PRICE) for r in (0, 1)),
        budget_usd=100.0,
        check_interval_s=TICK,
        grace_s=60.0,
        teardown_s=60.0,
        allow_on_demand=True,
        checkpoint_interval_s=600.0,
        restart_s=BOOT,
        offers=(
            ZoneOffer("p3.2xlarge", "us-east-1a", "spot", PRICE),
            ZoneOffer("p3.2xlarge", "us-east-1b", "spot", PRICE),
            ZoneOffer("p3.2xlarge", "us-east-1a", "on-demand", ON_DEMAND),
        ),
    )
    policy = replace(spec.recovery_policy(), provisioning_s=BOOT)
    sim_out = replay(
        _trace(),
        start_s=START,
        nodes=2,
        work_s=2 * 3600.0,
        policy=policy,
        usd_per_hour=PRICE,
        usd_per_hour_on_demand=ON_DEMAND,
    )
    kinds = [e.kind for e in sim_out.events]
    assert kinds == ["start", "preempted", "replace", "preempted", "on_demand", "to_spot", "done"]
    (od_ref,) = [i for i in sim_out.instances if i.market == "on-demand"]
    back_at = next(e.time_s for e in sim_out.events if e.kind == "to_spot")
    loss_at = next(e.time_s for e in sim_out.events if e.kind == "on_demand")
    end_s = sim_out.hours * 3600.0
    deaths = {
        r: [i.end_s for i in sim_out.instances if i.slot == r and i.market == "spot"
            and i.end_s < end_s - 1e-6]
        for r in (0, 1)
    }  # fmt: skip
    sim, out, t0 = _launch_like(env, spec, sim_out, deaths, loss_at, back_at)
    assert out.status == "succeeded", out.reason
    db: StateDB = env["db"]
    assert out.preemptions == sim_out.losses
    assert [e.kind for e in db.events(JOB)].count("spot-return") == 1
    inst = {i.id: i for i in db.instances(JOB)}
    (od,) = [r for r in db.ledger(JOB) if inst[r.instance].market == "on-demand"]
    assert od_ref.launch_s <= od.start - t0 <= od_ref.launch_s + TICK
    # Ends once its spot successor (launched at the first tick from back_at) is running and
    # the tick after that sees it terminated.
    assert od_ref.end_s + BOOT <= od.end - t0 <= od_ref.end_s + BOOT + 3 * TICK
    assert od.usd == pytest.approx(od.billed_seconds * ON_DEMAND / 3600)
    spot_ledger = math.fsum(
        r.billed_seconds for r in db.ledger(JOB) if inst[r.instance].market == "spot"
    )
    spot_replay = math.fsum(i.billed_s for i in sim_out.instances if i.market == "spot")
    assert abs(spot_ledger - spot_replay) <= 2 * TICK * 5 + BOOT + 5.0
    assert sim.alive() == []
