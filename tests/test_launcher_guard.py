"""The budget and deadline guard: unit cases, then the property over whole simulated jobs."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from kplan.core.errors import CloudError
from kplan.launcher.clock import FakeClock
from kplan.launcher.guard import Guard, Running
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.launcher_fakes import SimProvider, fast_dir

PER_SECOND_60 = Billing("aws", 60.0, 1.0, "test")


def test_projection_uses_the_billing_minimum_and_the_horizon() -> None:
    g = Guard(budget_usd=1.0, deadline_at=None, horizon_s=100.0, billing=PER_SECOND_60)
    # 3600 $/h = 1 $/s: a live instance started 10 s ago is billed 110 s by the horizon.
    assert g.projected(0.0, [Running(start=0.0, usd_per_hour=3600.0)], now=10.0) == 110.0
    # A new instance pays max(horizon, minimum) = 100 s; with a 600 s minimum it pays 600 s.
    assert g.projected(0.5, [], now=0.0, new_prices=[3600.0]) == 100.5
    g600 = Guard(1.0, None, 100.0, Billing("gcp", 600.0, 1.0, "test"))
    assert g600.projected(0.0, [], now=0.0, new_prices=[3600.0]) == 600.0


def test_guard_stops_before_budget_and_deadline() -> None:
    g = Guard(budget_usd=10.0, deadline_at=1000.0, horizon_s=100.0, billing=PER_SECOND_60)
    live = [Running(0.0, 36.0)]  # 0.01 $/s
    ok = g.check(0.0, live, now=800.0)  # 900 s -> $9
    assert not ok.stop
    over = g.check(0.0, live, now=950.0)  # 1050 s -> $10.5
    assert over.stop and over.reason == "budget" and "$10.50" in over.message
    late = Guard(1e9, 1000.0, 100.0, PER_SECOND_60).check(0.0, live, now=901.0)
    assert late.stop and late.reason == "deadline"
    assert not Guard(1e9, 1000.0, 100.0, PER_SECOND_60).check(0.0, live, now=900.0).stop


# --- the property: no simulated run ends over budget or with a live instance ---------------


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    interval = draw(st.floats(10.0, 600.0))
    grace = draw(st.floats(0.0, 300.0))
    teardown = draw(st.floats(0.0, 300.0))
    n = draw(st.integers(1, 4))
    nodes = tuple(
        NodeSpec(
            r,
            "g4dn.xlarge",
            draw(st.sampled_from(["spot", "on-demand"])),
            "zone-a",
            1,
            draw(st.floats(0.01, 40.0)),  # USD per hour
        )
        for r in range(n)
    )
    return {
        "interval": interval,
        "grace": grace,
        "teardown": teardown,
        "nodes": nodes,
        "billing": Billing(
            "aws",
            draw(st.sampled_from([0.0, 60.0, 600.0])),
            draw(st.sampled_from([1.0, 60.0, 3600.0])),
            "test",
        ),
        # The budget buys between a fraction of one check and ~200 checks of the cluster.
        "budget_ticks": draw(st.floats(0.01, 200.0)),
        "deadline_ticks": draw(st.none() | st.floats(0.5, 150.0)),
        "finish_ticks": draw(st.none() | st.floats(1.0, 150.0)),
        "boot_s": draw(st.floats(0.0, 200.0)),
        "latency": draw(st.floats(0.0, 1.0)) * (grace + teardown),
        "preempt": draw(st.lists(st.none() | st.floats(1.0, 20_000.0), max_size=12)),
        "no_capacity": draw(st.sets(st.sampled_from(["zone-a", "zone-b"]), max_size=2)),
        "allow_on_demand": draw(st.booleans()),
        "exit_code": draw(st.sampled_from([0, 0, 0, 1, 143])),
    }


_ids = itertools.count()


@pytest.fixture
def db_dir(tmp_path: Path) -> Iterator[Path]:
    path = fast_dir(tmp_path, "guard")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sc=scenarios())
# found by Hypothesis: the head preempted at once with no grace and no teardown time; the restart
# never looked at the cloud before deciding its instances had not ended ("did not terminate")
@example(
    sc={
        "interval": 10.0,
        "grace": 0.0,
        "teardown": 0.0,
        "nodes": tuple(
            NodeSpec(node_rank=r, instance_type="g4dn.xlarge", market="spot", zone="zone-a",
                     gpus=1, usd_per_hour=1.0)
            for r in (0, 1)
        ),
        "billing": Billing(cloud="aws", minimum_s=0.0, increment_s=1.0, source="test"),
        "budget_ticks": 2.0,
        "deadline_ticks": None,
        "finish_ticks": None,
        "boot_s": 0.0,
        "latency": 0.0,
        "preempt": [1.0],
        "no_capacity": set(),
        "allow_on_demand": False,
        "exit_code": 0,
    }
)  # fmt: skip
def test_no_run_ends_over_budget_or_with_a_live_instance(
    sc: dict[str, object], tmp_path: Path, db_dir: Path
) -> None:
    clock = FakeClock()
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('train')\n")
    storage = LocalStorage(tmp_path / "store")
    storage.uri = "s3://bucket/kplan"
    interval = float(sc["interval"])  # type: ignore[arg-type]
    start = clock.now()
    delays = iter(sc["preempt"])  # type: ignore[call-overload]
    finish = sc["finish_ticks"]
    provider = SimProvider(
        clock,
        storage,
        boot_s=float(sc["boot_s"]),  # type: ignore[arg-type]
        term_latency_s=float(sc["latency"]),  # type: ignore[arg-type]
        finish_at=None if finish is None else start + float(finish) * interval,  # type: ignore[arg-type]
        exit_code=int(sc["exit_code"]),  # type: ignore[call-overload]
        preempt_after=lambda spec: next(delays, None),
        no_capacity={(z, "spot") for z in sc["no_capacity"]},  # type: ignore[attr-defined]
    )
    deadline_ticks = sc["deadline_ticks"]
    nodes: tuple[NodeSpec, ...] = sc["nodes"]  # type: ignore[assignment]
    per_hour = sum(n.usd_per_hour for n in nodes)
    top = max(n.usd_per_hour for n in nodes)
    spec = JobSpec.build(
        job_id=f"kp-prop-{next(_ids)}",
        cloud="aws",
        region="r",
        script=str(script),
        nodes=nodes,
        budget_usd=per_hour * float(sc["budget_ticks"]) * interval / 3600,  # type: ignore[arg-type]
        deadline_h=None if deadline_ticks is None else float(deadline_ticks) * interval / 3600,  # type: ignore[arg-type]
        allow_on_demand=bool(sc["allow_on_demand"]),
        offers=(
            ZoneOffer("g4dn.xlarge", "zone-a", "spot", top),
            ZoneOffer("g4dn.xlarge", "zone-b", "spot", top * 1.2),
            ZoneOffer("g4dn.xlarge", "zone-a", "on-demand", top * 2.5),
        ),
        check_interval_s=interval,
        grace_s=float(sc["grace"]),  # type: ignore[arg-type]
        teardown_s=float(sc["teardown"]),  # type: ignore[arg-type]
        provision_timeout_s=3 * interval + 400,
        finish_grace_s=interval,
    )
    with StateDB.open(db_dir / "kplan.db") as db:
        try:
            outcome = run_job(
                spec,
                Backend(provider, storage),
                db,
                clock=clock,
                billing=sc["billing"],  # type: ignore[arg-type]
            )
            status = outcome.status
        except CloudError as err:  # e.g. no zone had capacity for the head
            assert "capacity" in err.message or "head" in err.message, err.message
            status = "error"
        rows = db.ledger(spec.job_id)
        spent = sum(r.usd for r in rows)
        assert spent <= spec.budget_usd + 1e-9, (status, rows)
        assert db.spend(spec.job_id) == pytest.approx(spent)
        assert provider.alive() == [], status
        assert all(r.closed for r in rows)
        assert all(not i.alive for i in db.instances(spec.job_id))
        if spec.deadline_h is not None:
            assert all(r.end <= start + spec.deadline_h * 3600 + 1e-6 for r in rows)
        assert status in ("succeeded", "failed", "stopped", "error")
        event(f"status {status} {job.reason if (job := db.job(spec.job_id)) else ''}"[:40])
        job = db.job(spec.job_id)
        assert job is not None and job.status == status
